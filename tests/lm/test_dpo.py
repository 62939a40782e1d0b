"""`postrl dpo`: the trainer's first batch against `postrl.core.dpo_loss` on log-probs recomputed by hand (each
response alone, no padding), the stored reference log-probs against a fresh computation, exact resume (without
recomputing the reference), TRL's preference formats (explicit and implicit prompt, conversational, a target
column with ties), bad input refused with one line, the keys in --list-keys, and (slow) that it learns."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from postrl.cli import main
from postrl.core import dpo_loss
from postrl.lm.dpo import DPOConfig, DPOLossConfig, run_dpo
from postrl.lm.dpo import algorithm as dpo_algorithm
from postrl.lm.dpo.build import REF_FILE, load_pairs, reference_pair_log_probs
from postrl.lm.models import TinyLMConfig, build_tiny_lm, load_causal_lm
from postrl.lm.rollout import response_forward
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig, TrainConfig, batch_order

TASK = {"n_pairs_train": 24, "n_pairs_test": 8, "n_sft_train": 8, "n_sft_test": 8}


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def ref_dir(tmp_path_factory: pytest.TempPathFactory, tiny_lm_dir: Path, tiny_tokenizer) -> Path:
    """A second tiny Llama (another seed) as the reference, so that h ≠ 0 from the first step."""
    path = tmp_path_factory.mktemp("dpo_ref")
    config = TinyLMConfig(
        n_layers=2, hidden_size=32, n_heads=4, intermediate_size=64, max_position_embeddings=128
    )
    ids = {f"{k}_id": getattr(tiny_tokenizer, f"{k}_id") for k in ("pad_token", "eos_token", "bos_token")}
    build_tiny_lm(len(tiny_tokenizer), config, seed=7, **ids).save_pretrained(str(path))
    tiny_tokenizer.save_pretrained(str(path))
    return path


def _cfg(model: Path, ref: Path | None = None, **kw) -> DPOConfig:
    base = DPOConfig(
        model=str(model),
        ref_model=None if ref is None else str(ref),
        data="task:reviews",
        task=TASK,
        train=TrainConfig(batch_size=4, max_length=64),
        optim=OptimConfig(lr=1e-3, warmup_steps=0, min_lr_ratio=1.0),
        run=RunConfig(steps=4, eval_every=2, save_every=2, keep_last=0, log_every=1, device="cpu"),
        eval_size=8,
        eval_samples=4,
        plots=False,
    )
    return replace(base, **kw)


def _alone_log_probs(model: torch.nn.Module, prompt: list[int], response: list[int]) -> float:
    """Σ log π(response | prompt) from one unpadded forward: the hand computation."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    P = len(prompt)
    return float(sum(logp[P - 1 + t, tok] for t, tok in enumerate(response)))


def _hand_pairs(model: torch.nn.Module, examples: list[dict]) -> torch.Tensor:
    return torch.tensor(
        [
            [
                _alone_log_probs(model, e["prompt_ids"], e["chosen_ids"]),
                _alone_log_probs(model, e["prompt_ids"], e["rejected_ids"]),
            ]
            for e in examples
        ],
        dtype=torch.float64,
    )


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_first_batch_loss_equals_core_dpo_loss_from_hand_log_probs(
    loss_type: str, tiny_lm_dir: Path, ref_dir: Path, tiny_tokenizer, tmp_path: Path
) -> None:
    """The logged loss of step 1 is dpo_loss of the first batch's pairs with every log-prob recomputed alone:
    the padding, the shared prompt forward and the stored reference are all exact."""
    cfg = _cfg(tiny_lm_dir, ref_dir, dpo=DPOLossConfig(beta=0.3, loss_type=loss_type))
    cfg = replace(cfg, run=replace(cfg.run, steps=1, eval_every=0), eval_samples=0)
    run_dpo(cfg, tmp_path / "run")
    logged = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[1])  # 0: the start eval
    assert logged["step"] == 1
    train, _, _ = load_pairs(cfg, tiny_tokenizer)
    first = [train[i] for i in batch_order(len(train), cfg.train.batch_size, cfg.run.seed, 0)[0]]
    policy, reference = load_causal_lm(tiny_lm_dir), load_causal_lm(ref_dir)
    pi, ref = _hand_pairs(policy, first), _hand_pairs(reference, first)
    target = torch.tensor([e["target"] for e in first], dtype=torch.float64)
    loss, stats = dpo_loss(pi[:, 0], pi[:, 1], ref[:, 0], ref[:, 1], 0.3, loss_type, target)
    assert abs(logged["loss"] - float(loss)) < 1e-5
    assert abs(logged["reward_margin"] - float(stats["reward_margin"])) < 1e-5
    assert logged["reward_accuracy"] == pytest.approx(float(stats["reward_accuracy"]))
    assert abs(float(loss) - (0.6931 if loss_type == "sigmoid" else 0.0)) > 1e-3  # h ≠ 0: a real check


def test_reference_log_probs_equal_a_fresh_computation(
    tiny_lm_dir: Path, ref_dir: Path, tiny_tokenizer, tmp_path: Path
) -> None:
    cfg = _cfg(tiny_lm_dir, ref_dir, eval_samples=0, run=RunConfig(steps=1, eval_every=0, device="cpu"))
    run_dpo(cfg, tmp_path / "run")
    saved = load_file(str(tmp_path / "run" / REF_FILE))
    train, evals, _ = load_pairs(cfg, tiny_tokenizer)
    reference = load_causal_lm(ref_dir)
    for name, examples in (("train", train), ("heldout", evals)):
        assert saved[name].shape == (len(examples), 2)
        torch.testing.assert_close(saved[name].double(), _hand_pairs(reference, examples), atol=2e-5, rtol=0)
        other = reference_pair_log_probs(
            response_forward(reference, gradients=False),
            examples,
            tiny_tokenizer.pad_token_id,
            torch.device("cpu"),
            5,
        )
        torch.testing.assert_close(other, saved[name], atol=2e-5, rtol=0)  # batching never matters


def test_resume_is_exact_and_reads_the_stored_reference(
    tiny_lm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _cfg(tiny_lm_dir)
    summary = run_dpo(cfg, tmp_path / "a")
    assert summary["steps"] == 4 and "heldout_kl" in summary and "heldout_gold_reward" in summary
    assert "heldout_gold_reward_greedy" in summary and "heldout_rm_score" not in summary  # no reward_model
    assert summary["heldout_reward_accuracy_start"] == 0.0  # π = π_ref: every h is exactly 0
    straight = load_causal_lm(tmp_path / "a" / "model")
    run_dpo(cfg, tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "step_00000004")
    shutil.rmtree(tmp_path / "b" / "model")
    (tmp_path / "b" / "summary.json").unlink()

    def no_recompute(*args, **kwargs):
        raise AssertionError("the resumed run recomputed the reference log-probs")

    monkeypatch.setattr(dpo_algorithm, "reference_pair_log_probs", no_recompute)
    run_dpo(cfg, tmp_path / "b", resume=True)
    resumed = load_causal_lm(tmp_path / "b" / "model")
    for (name, p), q in zip(straight.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    rows = [(tmp_path / r / "metrics.jsonl").read_text() for r in ("a", "b")]

    def strip(text: str) -> list[dict]:
        return [{k: v for k, v in json.loads(x).items() if "time" not in k} for x in text.splitlines()]

    assert strip(rows[0]) == strip(rows[1])
    loaded = load_causal_lm(
        tmp_path / "b" / "checkpoints" / "step_00000002"
    )  # a checkpoint is a model folder
    assert loaded.config.vocab_size == straight.config.vocab_size


def test_a_run_resumed_from_its_last_checkpoint_has_the_same_summary(
    tiny_lm_dir: Path, tmp_path: Path
) -> None:
    """Killed after its last checkpoint, before summary.json: the resume trains no step, and its summary still
    holds the last step's numbers (loss, reward accuracy), which the checkpoint keeps."""
    cfg = _cfg(tiny_lm_dir)
    straight = run_dpo(cfg, tmp_path / "a")
    run_dpo(cfg, tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "model")
    (tmp_path / "b" / "summary.json").unlink()
    resumed = run_dpo(cfg, tmp_path / "b", resume=True)

    def numbers(summary: dict) -> dict:
        timing = ("seconds", "per_second", "peak_rss")
        return {k: v for k, v in summary.items() if not any(t in k for t in timing)}

    assert straight["loss"] is not None and numbers(resumed) == numbers(straight)


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_trl_preference_formats_give_the_same_pairs(
    tiny_lm_dir: Path, tiny_tokenizer, tmp_path: Path
) -> None:
    """Explicit prompt, implicit prompt (TRL's shared start), conversational; a target column with ties."""
    # the answers differ from their first word on: an implicit prompt is the whole shared start (TRL)
    texts = [
        ("Review of the pasta:", " great and fresh .", " awful ."),
        ("Review of the soup:", " fresh .", " cold ."),
    ]
    explicit = [
        {"prompt": p, "chosen": c, "rejected": r, "target": t}
        for (p, c, r), t in zip(texts, (1.0, 0.5), strict=True)
    ]
    implicit = [
        {"chosen": p + c, "rejected": p + r, "target": t}
        for (p, c, r), t in zip(texts, (1.0, 0.5), strict=True)
    ]
    chat = [
        {
            "prompt": [{"role": "user", "content": p}],
            "chosen": [{"role": "assistant", "content": c}],
            "rejected": [{"role": "assistant", "content": r}],
        }
        for p, c, r in texts
    ]
    got = {}
    for name, rows in (("explicit", explicit), ("implicit", implicit), ("chat", chat)):
        data = _jsonl(tmp_path / f"{name}.jsonl", rows * 10)
        cfg = _cfg(tiny_lm_dir, data=str(data), task={})
        train, evals, task = load_pairs(cfg, tiny_tokenizer)
        assert task is None and len(train) + len(evals) == 20
        got[name] = train
    for a, b in zip(got["explicit"], got["implicit"], strict=True):
        assert (a["chosen_ids"], a["rejected_ids"], a["target"]) == (
            b["chosen_ids"],
            b["rejected_ids"],
            b["target"],
        )
    assert [e["target"] for e in got["explicit"][:2]] == [1.0, 0.5]
    assert got["chat"][0]["chosen_ids"] == got["explicit"][0]["chosen_ids"]  # same answer tokens + EOS
    assert tiny_tokenizer.decode(got["chat"][0]["prompt_ids"]).startswith("<|user|>")


def test_a_tie_pulls_the_margin_to_zero(
    tiny_lm_dir: Path, ref_dir: Path, tiny_tokenizer, tmp_path: Path
) -> None:
    """Trained on ties only (target 0.5), the sigmoid loss is minimised at h = 0: the margin shrinks."""
    rows = [
        {
            "prompt": "Review of the pasta:",
            "chosen": " was great .",
            "rejected": " was awful .",
            "target": 0.5,
        }
    ] * 20
    data = _jsonl(tmp_path / "ties.jsonl", rows)
    cfg = _cfg(tiny_lm_dir, ref_dir, data=str(data), task={}, eval_samples=0, eval_data=str(data))
    cfg = replace(cfg, run=replace(cfg.run, steps=15, eval_every=0))
    summary = run_dpo(cfg, tmp_path / "run")
    assert abs(summary["heldout_reward_margin"]) < 0.5 * abs(summary["heldout_reward_margin_start"])


def test_list_keys_shows_the_dpo_keys(capsys) -> None:
    """Every key with the value a run with no overrides resolves to (tests/test_cli.py's check, for dpo)."""
    import dataclasses
    import re

    from postrl.runtime.config import load_config

    assert main(["dpo", "--list-keys"]) == 0
    out = capsys.readouterr().out
    printed = dict(re.findall(r"^  (\S+) = (.*)$", out, flags=re.M))

    def leaves(cfg, prefix=""):
        for f in dataclasses.fields(cfg):
            value = getattr(cfg, f.name)
            if dataclasses.is_dataclass(value):
                yield from leaves(value, f"{prefix}{f.name}.")
            else:
                yield prefix + f.name, value

    for key, value in leaves(load_config(DPOConfig)):
        assert printed[key] == repr(value), key
    for key in (
        "dpo.beta = 0.1",
        "dpo.loss_type = 'sigmoid'",
        "eval_samples",
        "reward_model",
        "optim.lr = 1e-06",
    ):
        assert key in out


@pytest.mark.parametrize(
    "override, named",
    [
        ("dpo.beta=0", "dpo.beta"),
        ("dpo.loss_type=hinge", "dpo.loss_type"),
        ("beta=0.1", "'dpo.beta'"),
        ("train.packing=true", "train.packing"),
        ("sampling.greedy=true", "sampling.greedy"),
    ],
)
def test_bad_input_is_one_line_and_touches_nothing(
    override: str, named: str, tiny_lm_dir: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "run"
    code = main(["dpo", "--model", str(tiny_lm_dir), "--out", str(out), "run.device=cpu", override])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("postrl: error:") and named in err[0], err
    assert not out.exists()


def test_sft_rows_are_named_by_file_and_line(tiny_lm_dir: Path, tmp_path: Path, capsys) -> None:
    data = _jsonl(tmp_path / "sft.jsonl", [{"prompt": "a", "completion": "b"}] * 3)
    code = main(
        [
            "dpo",
            "--model",
            str(tiny_lm_dir),
            "--data",
            str(data),
            "--out",
            str(tmp_path / "r"),
            "run.device=cpu",
            "train.max_length=64",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "sft.jsonl:1" in err and "chosen" in err


@pytest.mark.slow
def test_dpo_learns_the_preferences(tiny_lm_dir: Path, tmp_path: Path) -> None:
    """From a random tiny Llama, 60 steps on the reviews task's labelled pairs: the held-out implicit reward
    ranks most held-out pairs the labeller's way and the held-out loss falls below log 2."""
    cfg = _cfg(
        tiny_lm_dir,
        task={"n_pairs_train": 1000, "n_pairs_test": 200},
        dpo=DPOLossConfig(beta=0.1),
        train=TrainConfig(batch_size=32, max_length=64),
        optim=OptimConfig(lr=3e-3, warmup_steps=5, min_lr_ratio=0.1),
        run=RunConfig(steps=60, eval_every=0, save_every=0, device="cpu"),
        eval_size=200,
        eval_samples=0,
    )
    summary = run_dpo(cfg, tmp_path / "run")
    assert summary["heldout_loss"] < 0.6
    assert summary["heldout_reward_accuracy"] > 0.7


def test_frontier_helpers(tiny_lm_dir: Path, tmp_path: Path) -> None:
    """Best-of-n's analytic KL, a run's checkpoints read back as policies, and the chart."""
    from postrl.lm.dpo.frontier import (
        best_of_n_kl,
        checkpoints,
        frontier_points,
        load_policy,
        plot_frontier,
    )
    from postrl.lm.tasks import get_task

    assert best_of_n_kl(1) == 0.0 and best_of_n_kl(2) == pytest.approx(math.log(2) - 0.5)
    assert best_of_n_kl(64) == pytest.approx(math.log(64) - 63 / 64)
    cfg = _cfg(
        tiny_lm_dir,
        eval_samples=0,
        run=RunConfig(steps=2, eval_every=0, save_every=1, keep_last=0, device="cpu"),
    )
    run_dpo(cfg, tmp_path / "run")
    found = checkpoints(tmp_path / "run")
    assert [step for step, _ in found] == [1, 2] and all(p.name == "model.safetensors" for _, p in found)
    policy, exported = load_policy(tiny_lm_dir, found[-1][1]), load_causal_lm(tmp_path / "run" / "model")
    for (name, p), q in zip(policy.state_dict().items(), exported.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    # without a reward model: every checkpoint's gold reward and KL, no proxy; the SFT policy first, at KL 0
    measured = frontier_points(
        {"DPO": tmp_path / "run"}, tiny_lm_dir, None, get_task("reviews"), n=4, max_new_tokens=4
    )
    assert [(p["method"], p["step"]) for p in measured] == [("sft", 0), ("DPO", 1), ("DPO", 2)]
    assert measured[0]["kl"] == pytest.approx(0.0, abs=1e-5)
    assert measured[2]["kl"] != pytest.approx(0.0, abs=1e-5)  # k1 on 4 samples: either sign
    assert all(p["proxy"] is None and isinstance(p["gold"], float) for p in measured)
    points = [{"method": "sft", "step": 0, "kl": 0.0, "gold": 0.1, "proxy": 1.0}]
    points += [
        {"method": "best-of-n", "n": n, "kl": best_of_n_kl(n), "gold": 0.1 * n, "proxy": n} for n in (1, 2, 4)
    ]
    points += [{"method": "DPO", "step": s, "kl": 0.5 * s, "gold": 0.2 * s, "proxy": s} for s in (1, 2)]
    assert plot_frontier(points, tmp_path / "f.png").stat().st_size > 1000


def test_value_at_kl_reads_the_first_crossing_of_a_path() -> None:
    """Gold at matched KL: linear between the two points of the first segment that reaches each KL (hand
    values); a later dip of the KL and a KL the run never reaches."""
    from postrl.lm.dpo.frontier import value_at_kl

    path = [(0.0, 0.0), (1.0, 1.0), (3.0, 2.0), (2.0, 5.0), (4.0, 6.0)]
    # 0.5: (0,0)-(1,1) → 0.5; 2: (1,1)-(3,2) → 1.5, not the later (2,5); 3.5: the dip 3 → 2 skipped,
    # (2,5)-(4,6) → 5 + 1.5/2 = 5.75; 4: the last point; 5: never reached
    got = value_at_kl(path, [0.0, 0.5, 2.0, 3.5, 4.0, 5.0])
    assert got[:5] == pytest.approx([0.0, 0.5, 1.5, 5.75, 6.0]) and got[5] is None
    with pytest.raises(ValueError, match="no points"):
        value_at_kl([], [1.0])
