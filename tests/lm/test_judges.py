"""Judges (RLAIF): the pairwise math by hand, the reward judge against the gold reward, the generative judge
against log-probabilities computed alone by hand, position bias removed, the OpenAI-compatible endpoint judge
against a REAL local server (Starlette/uvicorn serving a tiny Llama trained here by `postrl sft` to answer A or
B), and `postrl judge` (the file it writes, bad input as one line, an endpoint that is down)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from postrl.cli import main
from postrl.lm.data import load_rows
from postrl.lm.judges import (
    JudgePrompt,
    debiased_probability,
    hard_label,
    judge_sft_rows,
    load_judge,
    pairwise_probability,
    preference_rows,
)
from postrl.lm.judges.generative import GenerativeJudge
from postrl.lm.models import load_causal_lm
from postrl.lm.tasks import review_language as lang

PAIRS = [
    ("Review of the pasta:", " was fresh and tasty .", " was cold ."),
    ("Review of the soup at the diner:", " was bland .", " was really delicious ."),
    ("Review of the bread:", " was stale stale .", " was warm ."),
]


def test_pairwise_math_by_hand() -> None:
    assert pairwise_probability(2.0, 0.0) == pytest.approx(1 / (1 + math.exp(-2)), abs=1e-15)
    assert pairwise_probability(-1000.0, 0.0) == 0.0 and pairwise_probability(1000.0, 0.0) == 1.0
    assert pairwise_probability(math.log(0.3), math.log(0.1)) == pytest.approx(0.75, abs=1e-15)
    # p* = 0.7 seen through a judge that adds δ = 0.1 to whatever is shown as A: 0.8 and 0.3 + 0.1
    assert debiased_probability(0.8, 0.4) == pytest.approx(0.7, abs=1e-15)
    assert debiased_probability(1.0, 1.0) == 0.5  # "always A" says nothing
    assert [hard_label(p) for p in (0.9, 0.1, 0.5)] == [1.0, 0.0, 0.5]
    assert hard_label(0.52, tie_tolerance=0.05) == 0.5


def test_preference_rows_put_the_preferred_first_with_its_probability() -> None:
    rows = [{"prompt": "p", "first": "x", "second": "y", "id": 3}] * 2
    out = preference_rows(rows, [0.8, 0.25])
    assert out[0] == {"prompt": "p", "chosen": "x", "rejected": "y", "target": 0.8, "id": 3}
    assert out[1] == {"prompt": "p", "chosen": "y", "rejected": "x", "target": 0.75, "id": 3}
    assert [r["target"] for r in preference_rows(rows, [0.8, 0.5], hard=True)] == [1.0, 0.5]


def test_reward_judge_is_sigma_of_the_gold_score_difference() -> None:
    judge = load_judge("task:reviews")
    prompts, first, second = (list(x) for x in zip(*PAIRS, strict=True))
    got = judge(prompts, first, second)
    for (p, a, b), value in zip(PAIRS, got, strict=True):
        d = lang.gold_reward_one(p, a) - lang.gold_reward_one(p, b)
        assert value == pytest.approx(1 / (1 + math.exp(-d)), abs=1e-12)
    assert got[0] > 0.5 > got[1]  # fresh and tasty beats cold; bland loses to delicious
    hard = load_judge("task:reviews", hard=True)(prompts, first, second)
    assert hard == [hard_label(p) for p in got]


def test_rm_judge_is_sigma_of_the_reward_model_scores_computed_alone(
    tiny_lm, tiny_tokenizer, tmp_path: Path
) -> None:
    """rm:PATH: each response scored alone (prompt + response + EOS, the value at EOS), p = σ(s₁ − s₂)."""
    from postrl.lm.models import ScalarHeadModel

    rm = ScalarHeadModel.from_causal_lm(tiny_lm, seed=3)
    rm.save_pretrained(tmp_path / "rm")
    tiny_tokenizer.save_pretrained(str(tmp_path / "rm"))
    prompts, first, second = (list(x) for x in zip(*PAIRS, strict=True))
    got = load_judge(f"rm:{tmp_path / 'rm'}")(prompts, first, second)

    def alone(p: str, c: str) -> float:
        ids = torch.tensor(
            [tiny_tokenizer(p + c, add_special_tokens=False)["input_ids"] + [tiny_tokenizer.eos_token_id]]
        )
        with torch.no_grad():
            return float(rm(ids, torch.ones_like(ids))[0, -1])

    for (p, a, b), value in zip(PAIRS, got, strict=True):
        assert value == pytest.approx(1 / (1 + math.exp(-(alone(p, a) - alone(p, b)))), abs=1e-6)
    assert max(abs(v - 0.5) for v in got) > 1e-4


def _alone(model: torch.nn.Module, ids: list[int], answer: list[int]) -> float:
    """Σ log p(answer | ids) from one unpadded forward: the hand computation."""
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids + answer])).logits[0].double(), -1)
    return float(sum(logp[len(ids) - 1 + t, tok] for t, tok in enumerate(answer)))


def test_generative_judge_equals_log_probs_computed_alone() -> None:
    """On the built-in base model (pretrained: its verdicts are not all ½), batches of 2 pairs, padded."""
    from postrl.lm import base_model
    from postrl.lm.tokenizer import load_tokenizer

    prompt = JudgePrompt(("be positive", "be fluent"))
    judge = GenerativeJudge.from_folder(str(base_model.path()), prompt, batch_size=2)
    model, tiny_tokenizer = load_causal_lm(base_model.path()), load_tokenizer(base_model.path())
    a_ids, b_ids = (tiny_tokenizer(s, add_special_tokens=False)["input_ids"] for s in (" A", " B"))
    prompts, first, second = (list(x) for x in zip(*PAIRS, strict=True))
    got = judge(prompts, first, second)
    for (p, x, y), value in zip(PAIRS, got, strict=True):
        orders = []
        for u, v in ((x, y), (y, x)):
            ids = tiny_tokenizer(prompt.render(p, u, v), add_special_tokens=False)["input_ids"]
            la, lb = _alone(model, ids, a_ids), _alone(model, ids, b_ids)
            orders.append(math.exp(la) / (math.exp(la) + math.exp(lb)))
        assert value - 0.5 == pytest.approx(0.5 * (orders[0] - orders[1]), abs=1e-6, rel=1e-4)
    # both orders averaged: swapping the pair gives the complement, whatever the model prefers by position
    swapped = judge(prompts, second, first)
    for p, q in zip(got, swapped, strict=True):
        assert p + q == pytest.approx(1.0, abs=1e-12)
    assert max(abs(p - 0.5) for p in got) > 1e-3  # a real model's verdicts, not a constant


def test_judge_sft_rows_teach_both_orders() -> None:
    rows = [
        {"prompt": "Review of the pasta:", "chosen": " was good .", "rejected": " was bad .", "target": 1.0},
        {"prompt": "Review of the pasta:", "chosen": " was ok .", "rejected": " was fine .", "target": 0.5},
    ]
    prompt = JudgePrompt(("be positive",))
    out = judge_sft_rows(rows, prompt)
    assert out == [
        {"prompt": "Principles: be positive.\nPrompt: Review of the pasta:\nA: was good .\nB: was bad .\nBetter:",
         "completion": " A"},
        {"prompt": "Principles: be positive.\nPrompt: Review of the pasta:\nA: was bad .\nB: was good .\nBetter:",
         "completion": " B"},
    ]  # fmt: skip


# ---- the OpenAI-compatible endpoint ------------------------------------------------------------------------
SHORT = JudgePrompt(("be positive",))


@pytest.fixture(scope="module")
def chat_judge_dir(tmp_path_factory: pytest.TempPathFactory, tiny_lm_dir: Path) -> Path:
    """The tiny Llama after a short `postrl sft` on chat-formatted comparisons (system: the principles; user:
    the pair; assistant: "A" or "B", the gold reward's choice): a real model that answers A or B."""
    from postrl.lm.sft import SFTConfig, run_sft
    from postrl.lm.spine import RunConfig
    from postrl.lm.tasks import get_task
    from postrl.lm.trainer import OptimConfig, TrainConfig

    work = tmp_path_factory.mktemp("chat_judge")
    labelled = get_task("reviews", n_pairs_train=200, label_noise=0.0).preference_rows("train")
    rows = []
    for row in judge_sft_rows(labelled, SHORT):
        pair = row["prompt"].split("\n", 1)[1].rsplit("\n", 1)[0]  # the question between principles and cue
        user = pair + "\nAnswer A or B."
        rows.append(
            {
                "prompt": [
                    {"role": "system", "content": SHORT.principles()},
                    {"role": "user", "content": user},
                ],
                "completion": [{"role": "assistant", "content": row["completion"].strip()}],
            }
        )
    data = work / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = SFTConfig(
        model=str(tiny_lm_dir), data=str(data), train=TrainConfig(batch_size=16, max_length=128),
        optim=OptimConfig(lr=3e-3, warmup_steps=0, min_lr_ratio=1.0),
        run=RunConfig(steps=40, eval_every=0, save_every=0, device="cpu", threads=1), eval_size=0,
    )  # fmt: skip
    run_sft(cfg, work / "run")
    return work / "run" / "model"


def _chat_probability(model, tokenizer, prompt, a, b) -> float:
    """p(A) by hand from the full next-token distribution after the chat prompt (not a top-k list)."""
    messages = [
        {"role": "system", "content": SHORT.principles()},
        {"role": "user", "content": SHORT.question(prompt, a, b) + "\nAnswer A or B."},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].double(), -1)
    a_id, b_id = (tokenizer(s, add_special_tokens=False)["input_ids"][0] for s in ("A", "B"))
    assert int(logp.argmax()) in (a_id, b_id)  # the trained model answers with a letter
    return float(torch.sigmoid(logp[a_id] - logp[b_id]))


def test_endpoint_judge_against_a_real_local_server(chat_judge_dir: Path) -> None:
    pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from postrl.lm.tokenizer import load_tokenizer
    from tests.lm.openai_server import serve

    model, tokenizer = load_causal_lm(chat_judge_dir), load_tokenizer(chat_judge_dir)
    prompts, first, second = (list(x) for x in zip(*PAIRS, strict=True))
    with serve(chat_judge_dir) as url:
        judge = load_judge(f"openai:{url}", constitution=SHORT.constitution)
        assert judge.model == "tiny"  # the first model the endpoint lists
        got = judge(prompts, first, second)
    for (p, x, y), value in zip(PAIRS, got, strict=True):
        want = 0.5 * (
            _chat_probability(model, tokenizer, p, x, y) + 1 - _chat_probability(model, tokenizer, p, y, x)
        )
        assert value == pytest.approx(want, abs=1e-6)
    assert len(set(round(v, 6) for v in got)) > 1  # the model's own verdicts, pair by pair


def test_cli_judges_a_pairs_file_through_the_endpoint(chat_judge_dir: Path, tmp_path: Path, capsys) -> None:
    pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from tests.lm.openai_server import serve

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": p, "first": a, "second": b}) + "\n" for p, a, b in PAIRS))
    out = tmp_path / "prefs.jsonl"
    with serve(chat_judge_dir) as url:
        code = main(["judge", "--judge", f"openai:{url}", "--pairs", str(pairs), "--out", str(out),
                     "--constitution", "be positive"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    rows = load_rows(str(out), "prefs")  # postrl's preference loader reads it
    assert len(rows) == 3 and all(0.5 <= r["target"] <= 1 for r in rows)


def test_cli_writes_trl_preferences_with_targets(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    # a preference file relabelled: chosen/rejected are read as first/second
    pairs.write_text(
        "".join(json.dumps({"prompt": p, "chosen": a, "rejected": b}) + "\n" for p, a, b in PAIRS)
    )
    out = tmp_path / "out.jsonl"
    assert main(["judge", "--judge", "task:reviews", "--pairs", str(pairs), "--out", str(out)]) == 0
    rows = load_rows(str(out), "prefs")
    assert [r["chosen"] for r in rows] == [PAIRS[0][1], PAIRS[1][2], PAIRS[2][2]]
    for r in rows:
        d = lang.gold_reward_one(r["prompt"], r["chosen"]) - lang.gold_reward_one(r["prompt"], r["rejected"])
        assert r["target"] == pytest.approx(1 / (1 + math.exp(-d)), abs=1e-12)


@pytest.mark.parametrize(
    "record, named",
    [
        ({"prompt": "p", "first": "x"}, "pairs.jsonl:2: field 'second'"),
        ({"prompt": 3, "first": "x", "second": "y"}, "pairs.jsonl:2: field 'prompt'"),
        ({"prompt": "p", "first": " ", "second": "y"}, "pairs.jsonl:2: field 'first'"),
    ],
)
def test_bad_pairs_are_one_line_naming_file_and_line(record, named, tmp_path: Path, capsys) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        json.dumps({"prompt": "p", "first": "x", "second": "y"}) + "\n" + json.dumps(record) + "\n"
    )
    out = tmp_path / "out.jsonl"
    code = main(["judge", "--judge", "task:reviews", "--pairs", str(pairs), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("postrl: error:") and named in err[0], err
    assert not out.exists()


@pytest.mark.parametrize(
    "spec, named",
    [
        ("openai:http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1 cannot be reached"),
        ("lm:/nonexistent/judge", "/nonexistent/judge"),
        ("judge", "judge spec 'judge'"),
    ],
)
def test_a_judge_that_cannot_run_is_one_line(spec, named, tmp_path: Path, capsys) -> None:
    if spec.startswith("openai:"):
        pytest.importorskip("openai")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "p", "first": "x", "second": "y"}) + "\n")
    out = tmp_path / "out.jsonl"
    code = main(["judge", "--judge", spec, "--pairs", str(pairs), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("postrl: error:") and named in err[0], err
    assert not out.exists()
