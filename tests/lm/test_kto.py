"""`postrl kto`: TRL's unpaired format (and preference pairs unpaired), the mismatched pairs of the KL reference
point, the trainer's loss against `postrl.core.kto_loss` on log-probs computed by hand (each completion alone,
no padding), gradient accumulation equal to one batch, exact resume, bad input refused with one line."""

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
from postrl.core import kto_loss
from postrl.lm.data import unpair
from postrl.lm.kto import KTOConfig, KTOLossConfig, run_kto
from postrl.lm.kto.algorithm import kto_train_step, load_examples
from postrl.lm.kto.build import REF_FILE, batch_loss, kl_reference_point, reference_completion_log_probs
from postrl.lm.kto.data import collate_kto_rows, tokenize
from postrl.lm.models import TinyLMConfig, build_tiny_lm, load_causal_lm
from postrl.lm.rollout import response_forward
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig, TrainConfig, make_optimizer

TASK = {"n_pairs_train": 16, "n_pairs_test": 6, "n_sft_train": 8, "n_sft_test": 8}
CPU = torch.device("cpu")
SMALL = ("run.device=cpu", "train.max_length=64")  # the tiny model has 128 positions


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def ref_dir(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer) -> Path:
    """A second tiny Llama (another seed) as the reference, so that r ≠ 0 and z0 ≠ 0 from the first step."""
    path = tmp_path_factory.mktemp("kto_ref")
    config = TinyLMConfig(
        n_layers=2, hidden_size=32, n_heads=4, intermediate_size=64, max_position_embeddings=128
    )
    ids = {f"{k}_id": getattr(tiny_tokenizer, f"{k}_id") for k in ("pad_token", "eos_token", "bos_token")}
    build_tiny_lm(len(tiny_tokenizer), config, seed=7, **ids).save_pretrained(str(path))
    tiny_tokenizer.save_pretrained(str(path))
    return path


def _cfg(model: Path, ref: Path | None = None, **kw) -> KTOConfig:
    base = KTOConfig(
        model=str(model),
        ref_model=None if ref is None else str(ref),
        data="task:reviews",
        task=TASK,
        train=TrainConfig(batch_size=4, max_length=64),
        optim=OptimConfig(lr=1e-3, warmup_steps=0, min_lr_ratio=1.0),
        run=RunConfig(steps=4, eval_every=2, save_every=2, keep_last=0, log_every=1, device="cpu"),
        eval_size=6,
        eval_samples=2,
        plots=False,
    )
    return replace(base, **kw)


def _alone(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> float:
    """Σ log π(completion | prompt) from one unpadded forward in float64: the hand computation."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    return float(sum(logp[len(prompt) - 1 + t, tok] for t, tok in enumerate(completion)))


# ---- data --------------------------------------------------------------------------------------------------
def test_unpair_puts_desirable_first_swaps_low_targets_and_drops_ties():
    pairs = [
        {"prompt": "a", "chosen": "A+", "rejected": "A-"},
        {"prompt": "b", "chosen": "B+", "rejected": "B-", "target": 0.5},
        {"prompt": "c", "chosen": "C-", "rejected": "C+", "target": 0.0, "extra": 1},
    ]
    rows = unpair(pairs)
    assert [(r["prompt"], r["completion"], r["label"]) for r in rows] == [
        ("a", "A+", True), ("c", "C+", True), ("a", "A-", False), ("c", "C-", False),
    ]  # fmt: skip
    assert rows[1]["extra"] == 1 and "target" not in rows[1] and "chosen" not in rows[1]


def test_mismatched_completion_is_the_previous_row_in_each_chunk(tiny_tokenizer):
    rows = [{"prompt": f"p{i} ", "completion": f"c{i}", "label": i % 2 == 0} for i in range(5)]
    examples = tokenize(rows, tiny_tokenizer, 64, "drop", chunk=2)
    own = [e["completion_ids"] for e in examples]
    # chunks [0, 1], [2, 3], [4]: TRL's [c[-1]] + c[:-1] within each
    assert [e["kl_completion_ids"] for e in examples] == [own[1], own[0], own[3], own[2], own[4]]
    assert [e["label"] for e in examples] == [True, False, True, False, True]
    assert all(e["completion_ids"][-1] == tiny_tokenizer.eos_token_id for e in examples)


def test_a_kto_file_and_a_preference_file_both_load(tmp_path, tiny_tokenizer, tiny_lm_dir):
    kto = tmp_path / "kto.jsonl"
    kto.write_text(
        "".join(
            json.dumps({"prompt": f"q{i} ", "completion": f"a{i}", "label": i % 3 != 0}) + "\n"
            for i in range(12)
        )
    )
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text(
        "".join(
            json.dumps({"prompt": f"q{i} ", "chosen": "good", "rejected": f"bad{i}"}) + "\n" for i in range(6)
        )
    )
    train, evals, task = load_examples(_cfg(tiny_lm_dir, data=str(kto)), tiny_tokenizer)
    assert task is None and len(train) + len(evals) == 12 and len(evals) == 1
    train, evals, _ = load_examples(_cfg(tiny_lm_dir, data=str(prefs)), tiny_tokenizer)
    assert sorted(e["label"] for e in train + evals) == [False] * 6 + [True] * 6


@pytest.mark.parametrize(
    ("row", "expect"),
    [
        ({"prompt": "q", "completion": "a", "label": "yes"}, "kto.jsonl:2: field 'label': expected true"),
        ({"prompt": "q", "completion": "a", "label": 1}, "field 'label'"),
        (
            {"prompt": "q", "completion": "a"},
            "field 'label': expected true (desirable) or false (undesirable), got nothing",
        ),
        ({"prompt": "q", "label": True}, "kto.jsonl:2: missing field 'completion'"),
    ],
)
def test_bad_kto_rows_are_one_clear_line_before_the_run_folder(tmp_path, tiny_lm_dir, capsys, row, expect):
    data = tmp_path / "kto.jsonl"
    data.write_text(
        json.dumps({"prompt": "q", "completion": "a", "label": True}) + "\n" + json.dumps(row) + "\n"
    )
    out = tmp_path / "run"
    code = main(["kto", "--model", str(tiny_lm_dir), "--data", str(data), "--out", str(out), *SMALL])
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip() and "Loading weights" not in x]
    assert code == 2 and len(err) == 1 and err[0].startswith("postrl: error:") and expect in err[0], err
    assert not out.exists()


def test_one_kind_only_and_a_batch_of_one_are_refused(tmp_path, tiny_lm_dir, capsys):
    data = tmp_path / "kto.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"q{i} ", "completion": "a", "label": True}) + "\n" for i in range(8))
    )
    out = tmp_path / "run"
    assert main(["kto", "--model", str(tiny_lm_dir), "--data", str(data), "--out", str(out), *SMALL]) == 2
    assert "every row is desirable" in capsys.readouterr().err
    argv = ["kto", "--model", str(tiny_lm_dir), "--out", str(out), "train.batch_size=1"]
    assert main(argv) == 2 and "train.batch_size must be >= 2" in capsys.readouterr().err
    assert not out.exists()


# ---- the loss and the step -------------------------------------------------------------------------------
def test_first_batch_loss_equals_core_kto_loss_on_hand_log_probs(tiny_lm_dir, ref_dir, tiny_tokenizer):
    cfg = _cfg(tiny_lm_dir, ref_dir)
    train, _, _ = load_examples(cfg, tiny_tokenizer)
    batch = train[:4]
    policy, reference = load_causal_lm(tiny_lm_dir), load_causal_lm(ref_dir)
    pad = tiny_tokenizer.pad_token_id
    ref = reference_completion_log_probs(
        response_forward(reference, gradients=False), batch, pad, CPU, 3
    )  # batches of 3: the sizes do not matter
    hand_ref = torch.tensor(
        [
            [
                _alone(reference, e["prompt_ids"], e["completion_ids"]),
                _alone(reference, e["prompt_ids"], e["kl_completion_ids"]),
            ]
            for e in batch
        ],
        dtype=torch.float64,
    )
    assert torch.allclose(ref.double(), hand_ref, atol=1e-4)
    z0 = kl_reference_point(
        response_forward(policy, gradients=False), batch, ref, [([0, 1, 2, 3], 1.0)], pad, CPU
    )
    hand_kl = sum(_alone(policy, e["prompt_ids"], e["kl_completion_ids"]) for e in batch) / 4 - float(
        hand_ref[:, 1].mean()
    )
    assert float(z0) == pytest.approx(max(hand_kl, 0.0), abs=1e-4)
    loss, _ = batch_loss(
        response_forward(policy), collate_kto_rows(batch, pad), ref[:, 0], z0, KTOLossConfig(beta=0.5)
    )
    logps = torch.tensor(
        [_alone(policy, e["prompt_ids"], e["completion_ids"]) for e in batch], dtype=torch.float64
    )
    desirable = torch.tensor([e["label"] for e in batch])
    expected, _ = kto_loss(logps, hand_ref[:, 0], desirable, max(hand_kl, 0.0), 0.5)
    assert float(loss.detach()) == pytest.approx(float(expected), abs=1e-5)


def _grads_after_step(model_dir: Path, ref_dir: Path, tokenizer, grad_accum: int) -> dict[str, torch.Tensor]:
    cfg = _cfg(model_dir, ref_dir, train=TrainConfig(batch_size=6, grad_accum=grad_accum, max_length=64))
    train, _, _ = load_examples(cfg, tokenizer)
    pad = tokenizer.pad_token_id
    ref = reference_completion_log_probs(response_forward(load_causal_lm(ref_dir)), train, pad, CPU, 64)
    model = load_causal_lm(model_dir).train()
    optimizer, _ = make_optimizer(model, replace(cfg.optim, max_grad_norm=None), 1)
    optimizer.step = lambda: None  # keep the gradient for the comparison
    optimizer.zero_grad = lambda set_to_none=True: None
    forwards = response_forward(model), response_forward(model, gradients=False)
    out = kto_train_step(model, *forwards, optimizer, train, ref, list(range(6)), cfg, pad, CPU)
    assert math.isfinite(out["loss"]) and out["kl"] >= 0
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_gradient_accumulation_gives_the_one_batch_gradient(tiny_lm_dir, ref_dir, tiny_tokenizer):
    one = _grads_after_step(tiny_lm_dir, ref_dir, tiny_tokenizer, 1)
    three = _grads_after_step(tiny_lm_dir, ref_dir, tiny_tokenizer, 3)
    for name, grad in one.items():  # float32 sums over 6 rows in another grouping: eps-scale differences
        assert torch.allclose(three[name], grad, rtol=1e-4, atol=1e-6), name


# ---- the run -----------------------------------------------------------------------------------------------
def test_run_writes_the_folder_and_resumes_exactly(tmp_path, tiny_lm_dir, ref_dir):
    straight = tmp_path / "straight"
    summary = run_kto(_cfg(tiny_lm_dir, ref_dir), straight)
    assert (straight / "model" / "config.json").is_file() and (straight / REF_FILE).is_file()
    assert summary["steps"] == 4 and math.isfinite(summary["heldout_loss"]) and summary["heldout_z0"] >= 0
    assert {"heldout_rewards_desirable", "heldout_rewards_undesirable", "heldout_kl"} <= set(summary)
    cut = tmp_path / "cut"
    run_kto(_cfg(tiny_lm_dir, ref_dir, run=replace(_cfg(tiny_lm_dir).run, steps=2)), cut)
    (cut / "summary.json").unlink()  # as a run killed after its step-2 checkpoint
    shutil.rmtree(cut / "model")
    resumed = run_kto(_cfg(tiny_lm_dir, ref_dir), cut, resume=True)
    a, b = (
        load_file(str(straight / "model" / "model.safetensors")),
        load_file(str(cut / "model" / "model.safetensors")),
    )
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["loss"] == summary["loss"]

    def rows(path: Path) -> list[dict]:  # every metric but the clock's
        lines = (path / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(x).items() if "time" not in k} for x in lines]

    assert rows(straight) == rows(cut)


def test_a_refused_input_is_one_line_even_when_a_length_was_clipped(tmp_path, tiny_lm_dir, capsys):
    """The default train.max_length (1024) is clipped to the tiny model's 128 positions; that notice waits
    until the input is accepted (`postrl.runtime.notices`), so a bad row is still the one line."""
    data = tmp_path / "kto.jsonl"
    data.write_text(json.dumps({"prompt": "q", "completion": "a", "label": 1}) + "\n")
    out = tmp_path / "run"
    assert (
        main(["kto", "--model", str(tiny_lm_dir), "--data", str(data), "--out", str(out), "run.device=cpu"])
        == 2
    )
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip() and "Loading weights" not in x]
    assert len(err) == 1 and err[0].startswith("postrl: error:") and "field 'label'" in err[0], err


def test_data_export_and_check_know_kto_rows(tmp_path, capsys):
    """`postrl data export --kind kto` unpairs a task's preference pairs; `postrl data check --kind kto` reads
    them back, and names a bad label by file:line."""
    out = tmp_path / "kto.jsonl"
    assert (
        main(["data", "export", "--task", "reviews", "--kind", "kto", "--split", "test", "--out", str(out)])
        == 0
    )
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert {r["label"] for r in rows} == {True, False} and all(
        set(r) >= {"prompt", "completion"} for r in rows
    )
    assert main(["data", "check", str(out), "--kind", "kto"]) == 0
    out.write_text(out.read_text().replace('"label": true', '"label": "yes"', 1))
    assert main(["data", "check", str(out), "--kind", "kto"]) == 2
    assert f"{out}:1: field 'label'" in capsys.readouterr().err
