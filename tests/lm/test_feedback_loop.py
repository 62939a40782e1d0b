"""`postrl loop` / `postrl.loop`: rounds of pairs sampled from the current policy, labelled, a reward model on
every label so far and a policy update; the report per round; resume inside a round; people labelling on the
page (the loop waits, then goes on); bad input refused before the folder is touched."""

from __future__ import annotations

import json
import shutil

import pytest

import postrl
from postrl.cli import main
from postrl.runtime.errors import UserError

STAGE = {"run": {"steps": 2, "eval_every": 0, "threads": 1}, "eval_size": 4}


def _loop(model, out, **kw):
    base = dict(
        model=str(model), rounds=2, labels_per_round=6, eval_size=6, max_new_tokens=6,
        rm={**STAGE, "norm": {"samples": 8}}, policy={**STAGE, "eval_samples": 4},
    )  # fmt: skip
    return postrl.loop(out=out, **{**base, **kw})


def _rows(out):
    return [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]


def test_two_rounds_label_train_and_report(tiny_lm_dir, tmp_path):
    summary = _loop(tiny_lm_dir, tmp_path / "loop")
    rows = _rows(tmp_path / "loop")
    assert [r["round"] for r in rows] == [0, 1, 2] and [r["labels"] for r in rows] == [0, 6, 12]
    assert rows[0]["kl_to_start"] == pytest.approx(0.0, abs=1e-4) and rows[0]["rm_accuracy_on_policy"] is None
    for r in rows[1:]:
        assert isinstance(r["gold_reward"], float) and 0.0 <= r["rm_accuracy_on_policy"] <= 1.0
    two = tmp_path / "loop" / "round_02"
    assert len((two / "labels_so_far.jsonl").read_text().splitlines()) == 12  # the RM sees every label so far
    first = [
        json.loads(x) for x in (tmp_path / "loop" / "round_01" / "labels.jsonl").read_text().splitlines()
    ]
    assert set(first[0]) == {"prompt", "chosen", "rejected", "target"}
    pairs = [json.loads(x) for x in (two / "pairs.jsonl").read_text().splitlines()]
    assert all(p["responses"][0] != p["responses"][1] for p in pairs)
    # round 2's pairs are sampled from round 1's policy, whose DPO started from the given model
    policy_cfg = (two / "policy" / "config.yaml").read_text()
    assert str(tmp_path / "loop" / "round_01" / "policy" / "model") in policy_cfg
    assert summary["final"] == rows[-1]
    with pytest.raises(UserError, match="finished loop"):
        _loop(tiny_lm_dir, tmp_path / "loop", resume=True)


def test_an_interrupted_round_resumes_to_the_same_report(tiny_lm_dir, tmp_path):
    _loop(tiny_lm_dir, tmp_path / "a")
    _loop(tiny_lm_dir, tmp_path / "b")
    b = tmp_path / "b"
    # as if killed during round 2's policy update: its run folder, the report row and the summary are gone
    shutil.rmtree(b / "round_02" / "policy")
    (b / "summary.json").unlink()
    (b / "rounds.jsonl").write_text(
        "".join(line + "\n" for line in (b / "rounds.jsonl").read_text().splitlines()[:2])
    )
    _loop(tiny_lm_dir, b, resume=True)
    assert _rows(tmp_path / "a") == _rows(b)


def test_people_label_on_the_page_and_the_loop_goes_on(tiny_lm_dir, tmp_path):
    out = tmp_path / "loop"
    waiting = _loop(tiny_lm_dir, out, labeller="page", rounds=1)
    assert waiting["waiting_for_labels"] == str(out / "round_01" / "pairs.jsonl")
    assert "postrl label --pairs" in waiting["command"]
    pairs = [json.loads(x) for x in (out / "round_01" / "pairs.jsonl").read_text().splitlines()]
    page = out / "round_01" / "page"
    page.mkdir()
    rows = [
        {"prompt": p["prompt"], "chosen": p["responses"][1], "rejected": p["responses"][0]} for p in pairs
    ]
    (page / "preferences.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = _loop(tiny_lm_dir, out, labeller="page", rounds=1, resume=True)
    assert summary["final"]["labels"] == len(rows)


def test_bad_input_is_refused_before_the_folder_is_touched(tiny_lm_dir, tmp_path, capsys):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    with pytest.raises(UserError, match="labeller=synthetic needs a built-in task"):
        _loop(tiny_lm_dir, tmp_path / "x", data=str(data))
    assert not (tmp_path / "x").exists()
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "keep.txt").write_text("mine")
    assert main(["loop", "--out", str(tmp_path / "y"), f"model={tiny_lm_dir}"]) == 2
    assert "exists: --resume continues it" in capsys.readouterr().err
    assert (tmp_path / "y" / "keep.txt").read_text() == "mine"
    assert main(["loop", "--out", str(tmp_path / "z"), "model=no/such/folder"]) == 2
    assert "model: no/such/folder is not a model folder" in capsys.readouterr().err
    assert main(["loop", "--out", str(tmp_path / "z"), "rounds=0"]) == 2
    assert "rounds" in capsys.readouterr().err
    assert main(["loop", "--out", str(tmp_path / "z"), f"model={tiny_lm_dir}", "labeller=rm:no/such/rm"]) == 2
    assert "labeller: reward spec 'rm:no/such/rm': no reward-model folder there" in capsys.readouterr().err
    assert not (tmp_path / "z").exists()


def test_the_ppo_arm_learns_against_the_rounds_reward_model(tiny_lm_dir, tmp_path):
    summary = _loop(tiny_lm_dir, tmp_path / "loop", rounds=1, policy_stage="ppo", policy=STAGE)
    policy_cfg = (tmp_path / "loop" / "round_01" / "policy" / "config.yaml").read_text()
    assert str(tmp_path / "loop" / "round_01" / "rm") in policy_cfg  # the round's reward model
    assert f"ref_model: {tiny_lm_dir}" in policy_cfg  # the KL is to the starting model
    assert summary["final"]["round"] == 1 and summary["policy"].endswith("round_01/policy/model")
