"""The page's HTTP routes (Starlette's test client): judgements reach the folder, media come only from the
folder, and segment pairs become the `Pairs` the control reward model trains on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from postrl.cli import main  # noqa: E402
from postrl.label.app import Labelling, make_app  # noqa: E402
from postrl.label.pairs import swapped  # noqa: E402
from postrl.label.segments import segment_pairs  # noqa: E402


def _vlm_pairs(tmp_path: Path) -> Path:
    Image.new("RGB", (8, 8), (200, 30, 30)).save(tmp_path / "red.png")
    rows = [
        {
            "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}],
            "responses": ["red", "blue"],
            "images": ["red.png"],
        }
    ]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_routes_judge_and_serve_only_the_folder(tmp_path):
    out = tmp_path / "lab"
    client = TestClient(make_app(Labelling(out, _vlm_pairs(tmp_path))))
    assert "Left is better" in client.get("/").text
    state = client.get("/api/state", params={"labeller": "ada"}).json()
    assert (state["pair"], state["total"], state["done"]) == (0, 1, 0)
    view = client.get("/api/pair/0").json()
    assert view["images"] == ["/media/0/image0"] and {view["left"], view["right"]} == {"red", "blue"}
    picture = client.get("/media/0/image0")
    assert picture.status_code == 200 and picture.headers["content-type"] == "image/png"
    for bad in ("/media/0/image1", "/media/0/left", "/media/1/image0", "/media/0/..%2F..%2Fpairs.jsonl"):
        assert client.get(bad).status_code == 404, bad
    assert client.get("/media/0/../../etc/passwd").status_code == 404
    assert (
        client.post("/api/judge", json={"labeller": "../x", "pair": 0, "choice": "left"}).status_code == 400
    )
    assert (
        client.post("/api/judge", json={"labeller": "ada", "pair": 0, "choice": "maybe"}).status_code == 400
    )

    state = client.post("/api/judge", json={"labeller": "ada", "pair": 0, "choice": "right"}).json()
    assert state["pair"] is None and state["done"] == 1
    assert client.post("/api/judge", json={"labeller": "ada", "pair": 0, "choice": "left"}).status_code == 409
    row = json.loads((out / "preferences.jsonl").read_text())
    assert row["chosen"] == view["right"] and row["images"] == [
        "media/" + sorted(p.name for p in (out / "media").iterdir())[0]
    ]
    assert Image.open(out / row["images"][0]).getpixel((0, 0)) == (200, 30, 30)  # the picture, in the folder


def test_segment_pairs_label_and_train_the_reward_model(tmp_path):
    from postrl.control.prefs_reward import (
        Pairs,
        RewardEnsemble,
        RewardModelConfig,
        accuracy,
        train_reward_model,
    )

    src = segment_pairs("CartPole-v1", tmp_path / "src" / "pairs.jsonl", n=6, length=10, seed=1)
    labelling = Labelling(tmp_path / "lab", src)
    client = TestClient(make_app(labelling))
    for i in range(6):
        view = client.get(f"/api/pair/{i}").json()
        clip = client.get(view["left"])
        assert clip.status_code == 200 and clip.content[:6] == b"GIF89a"
        assert Image.open(tmp_path / "lab" / labelling.pairs[i]["first"]["clip"]).n_frames >= 2
        # a person who prefers the segment with more true reward (ties: equal)
        left, right = (labelling.pairs[i]["second"], labelling.pairs[i]["first"]) if swapped(i) else (
            labelling.pairs[i]["first"], labelling.pairs[i]["second"])  # fmt: skip
        diff = sum(left["true_rewards"]) - sum(right["true_rewards"])
        choice = "left" if diff > 0 else "right" if diff < 0 else "tie"
        client.post("/api/judge", json={"labeller": "ada", "pair": i, "choice": choice})

    rows = [json.loads(line) for line in (tmp_path / "lab" / "preferences.jsonl").read_text().splitlines()]
    pairs = Pairs.from_rows(rows)
    true_first, true_second = pairs.first.true_returns(), pairs.second.true_returns()
    expected = torch.where(true_first > true_second, 1.0, torch.where(true_first < true_second, 0.0, 0.5))
    assert torch.equal(pairs.labels, expected)  # label = P(first ≻ second), whatever side it was shown on
    assert pairs.first.obs.shape == (6, 10, 4) and pairs.first.actions.dtype == torch.long
    torch.manual_seed(0)
    model = RewardEnsemble(4, __import__("gymnasium").spaces.Discrete(2), RewardModelConfig(ensemble=1))
    train_reward_model(model, torch.optim.Adam(model.parameters(), 1e-2), pairs, 50, 6)
    if (pairs.labels != 0.5).any():
        assert accuracy(model, pairs, pairs.labels) == 1.0


def test_cli_errors_are_one_line_before_the_folder_is_touched(tmp_path, capsys):
    out = tmp_path / "lab"
    cases = [
        (["--pairs", "x.jsonl", "--env", "CartPole-v1"], "give one of --pairs, --model, --env"),
        (["--model", "m"], "--model and --prompts go together"),
        (["--port", "0", "--pairs", "x"], "--port 0"),
        ([], "no pairs there yet"),
        (["--pairs", str(tmp_path / "missing.jsonl")], "no such file"),
        (["--pairs", "x", "--question", "two\nlines"], "--question"),
        (["--pairs", "x", "--question", " "], "expected one line of 1 to 300 characters"),
    ]
    for argv, message in cases:
        assert main(["label", "--out", str(out), *argv, "--no-serve"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("postrl: error:") and message in err and err.count("\n") == 1, err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "x", "responses": ["a", "a"]}) + "\n")
    assert main(["label", "--out", str(out), "--pairs", str(bad), "--no-serve"]) == 2
    assert "bad.jsonl:1: the two responses are the same" in capsys.readouterr().err
    bad.write_text("\n" + json.dumps({"prompt": "x", "responses": ["a", "b"], "images": ["gone.png"]}) + "\n")
    assert main(["label", "--out", str(out), "--pairs", str(bad), "--no-serve"]) == 2
    assert "bad.jsonl:2: field 'images': no such file" in capsys.readouterr().err
    assert not out.exists()


def test_the_question_asked_of_each_pair_is_kept_in_the_folder(tmp_path, capsys):
    out, pairs = tmp_path / "lab", _vlm_pairs(tmp_path)
    assert TestClient(make_app(Labelling(out, pairs))).get("/api/pair/0").json()["question"] == (
        "Which response is better?"
    )
    argv = ["label", "--out", str(out), "--question", "Which colour is right?", "--no-serve"]
    assert main(argv) == 0 and "1 lm pairs ready" in capsys.readouterr().out
    restarted = Labelling(out)  # a later start without --question asks the same
    assert TestClient(make_app(restarted)).get("/api/pair/0").json()["question"] == "Which colour is right?"
    segments = segment_pairs("CartPole-v1", tmp_path / "seg" / "pairs.jsonl", 1, length=5, seed=0)
    view = TestClient(make_app(Labelling(tmp_path / "seg-lab", segments))).get("/api/pair/0").json()
    assert view["question"] == "Which segment shows the better behaviour?"


def test_segments_of_a_trained_policy_and_of_continuous_actions(tmp_path):
    from postrl import control
    from postrl.control.prefs_reward import Pairs

    run = tmp_path / "run"
    tiny = {"ppo": {"n_steps": 32, "epochs": 2}, "run": {"eval_episodes": 3, "save_every": 0}}
    control.train("ppo", "CartPole-v1", total_steps=128, out=run, n_envs=2, **tiny)
    src = segment_pairs("CartPole-v1", tmp_path / "a" / "pairs.jsonl", n=2, length=8, policy=str(run))
    first = json.loads(src.read_text().splitlines()[0])["first"]
    assert len(first["obs"]) == 8 and all(a in (0, 1) for a in first["actions"])

    src = segment_pairs("Pendulum-v1", tmp_path / "b" / "pairs.jsonl", n=2, length=5, seed=3)
    rows = [{**json.loads(line), "label": 1.0} for line in src.read_text().splitlines()]
    pairs = Pairs.from_rows(rows)
    assert pairs.first.actions.shape == (2, 5, 1) and pairs.first.actions.is_floating_point()
    assert bool(pairs.first.alive.all())  # Pendulum never terminates: no padding


def test_two_samples_per_prompt_from_a_model_folder(tmp_path):
    from postrl.label.pairs import read_pairs
    from postrl.label.sample import sample_lm_pairs
    from postrl.lm import base_model

    prompts = tmp_path / "prompts.jsonl"
    chat = [{"prompt": [{"role": "user", "content": f"Review of the soup {i}:"}]} for i in range(4)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in chat))
    out = sample_lm_pairs(
        str(base_model.path()), str(prompts), tmp_path / "pairs.jsonl", n=4, max_new_tokens=12
    )
    pairs = read_pairs(out)  # the checks: two different, non-empty responses per pair
    assert 1 <= len(pairs) <= 4 and all(p["prompt"] in [r["prompt"] for r in chat] for p in pairs)
    assert all(r[0]["role"] == "assistant" for p in pairs for r in p["responses"])  # chat stays chat


def test_a_page_on_localhost_answers_only_localhost_names(tmp_path):
    import http.client
    from urllib.parse import urlsplit

    from postrl.label.app import running

    src = tmp_path / "pairs.jsonl"
    src.write_text(json.dumps({"prompt": "p", "responses": ["a", "b"]}) + "\n")
    with running(Labelling(tmp_path / "lab", src)) as url:
        port = urlsplit(url).port
        for host, status in ((f"127.0.0.1:{port}", 200), (f"localhost:{port}", 200), ("evil.example", 400)):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/api/pair/0", headers={"Host": host})  # as a DNS-rebinding page would
            assert conn.getresponse().status == status, host
            conn.close()
