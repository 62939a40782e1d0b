"""The reward model: the score sits on the last real token (padding and pad = EOS safe), hand-checked held-out
metrics (accuracy, margin, ECE, gold agreement), the loss falls and accuracy rises on a toy set, micro-batches
give the gradient of the whole batch, the config's names (old ones refused, TRL's defaults, the tiny-world
preset), the run folder (export with normalisation stats) and exact resume."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from postrl.lm.models import ScalarHeadModel, load_causal_lm
from postrl.lm.reward_model import RMConfig, rm_train_step, run_rm
from postrl.lm.reward_model.evaluation import (
    NORM_FILE,
    NormConfig,
    evaluate_pairs,
    expected_calibration_error,
    read_reward_norm,
)
from postrl.lm.reward_model.pairs import choose_loss, collate_pairs, pair_scores, rm_loss, tokenize_pairs
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig, TrainConfig, make_optimizer
from postrl.runtime.config import ConfigError, from_dict, load_config
from postrl.runtime.errors import UserError

CONFIGS = Path(__file__).parents[2] / "configs"

TOY = [
    ("Review: the pasta", " was great .", " was awful ."),
    ("Review: the soup", " was tasty and fresh .", " was cold ."),
    ("Review: the staff", " was friendly .", " was rude and slow ."),
    ("Review: the room", " was clean .", " was dirty ."),
    ("Review: the tea", " was lovely .", " was bland ."),
    ("Review: the view", " was perfect .", " was terrible ."),
]


def toy_rows(flip: bool = False) -> list[dict]:
    return [{"prompt": p, "chosen": r if flip else c, "rejected": c if flip else r} for p, c, r in TOY]


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a shared 2-core machine spin-waiting threads make tiny models 100× slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class LastIdModel(torch.nn.Module):
    """A stub reward model whose value at each position is the token id there (score = last real id)."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return input_ids.float()


def test_score_is_on_last_real_token_not_pad_after_eos(tiny_lm, tiny_tokenizer) -> None:
    rm = ScalarHeadModel.from_causal_lm(tiny_lm).eval()
    examples = tokenize_pairs(toy_rows(), tiny_tokenizer, 64)
    batch = collate_pairs(examples, tiny_tokenizer.pad_token_id)
    chosen, rejected = pair_scores(rm, batch)
    for k, e in enumerate(examples):  # each row alone, no padding at all
        for ids, got in ((e["chosen_ids"], chosen[k]), (e["rejected_ids"], rejected[k])):
            alone = torch.tensor([e["prompt_ids"] + ids])
            assert alone[0, -1] == tiny_tokenizer.eos_token_id  # the scored token is the response's EOS
            expected = rm(alone, torch.ones_like(alone))[0, -1]
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_score_ignores_pad_ids_when_pad_equals_eos(tiny_lm, tiny_tokenizer) -> None:
    """With pad = EOS the mask, not the ids, finds the last real token."""
    rm = ScalarHeadModel.from_causal_lm(tiny_lm).eval()
    examples = tokenize_pairs(toy_rows(), tiny_tokenizer, 64)
    eos = tiny_tokenizer.eos_token_id
    a = pair_scores(rm, collate_pairs(examples, tiny_tokenizer.pad_token_id))
    b = pair_scores(rm, collate_pairs(examples, eos))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_ece_hand_values() -> None:
    # Δ = 0 → confidence 0.5, and counted wrong (Δ > 0 is false): gap 0.5 in bin 0
    assert expected_calibration_error(torch.tensor([0.0])) == pytest.approx(0.5)
    # two pairs at confidence σ(2) ≈ 0.8808 (same bin), one right one wrong: |0.5 − 0.8808|
    conf = float(torch.sigmoid(torch.tensor(2.0)))
    assert expected_calibration_error(torch.tensor([2.0, -2.0])) == pytest.approx(abs(0.5 - conf), abs=1e-6)
    # all right at confidence σ(5) = 0.9933: gap 0.0067
    conf5 = float(torch.sigmoid(torch.tensor(5.0)))
    assert expected_calibration_error(torch.tensor([5.0, 5.0])) == pytest.approx(1 - conf5, abs=1e-6)


def test_heldout_metrics_by_hand(tiny_tokenizer) -> None:
    """Scores = id of the EOS (same for every row) → Δ = 0 for all; then swap in distinct last tokens."""
    rows = [
        {"prompt": "Review: the pasta", "chosen": " was great", "rejected": " was good", "target": 1.0},
        {"prompt": "Review: the soup", "chosen": " was bad", "rejected": " was okay", "target": 0.5},
    ]
    examples = tokenize_pairs(rows, tiny_tokenizer, 64)
    for e in examples:  # strip the EOS so the last token is the adjective's last token
        e["chosen_ids"], e["rejected_ids"] = e["chosen_ids"][:-1], e["rejected_ids"][:-1]
    d0 = examples[0]["chosen_ids"][-1] - examples[0]["rejected_ids"][-1]
    m = evaluate_pairs(LastIdModel(), examples, 0, torch.device("cpu"), "soft", gold=[(1.0, 0.5), (0.0, 0.0)])
    assert m["heldout_accuracy"] == (1.0 if d0 > 0 else 0.0)  # the tie (row 1) is not counted
    assert m["heldout_margin"] == pytest.approx(float(d0))
    assert m["gold_accuracy"] == (1.0 if d0 > 0 else 0.0)  # gold tie (row 1) not counted either
    d1 = examples[1]["chosen_ids"][-1] - examples[1]["rejected_ids"][-1]

    def soft(d: torch.Tensor, p: float) -> torch.Tensor:
        logsig = torch.nn.functional.logsigmoid
        return -(p * logsig(d) + (1 - p) * logsig(-d))

    expected = (soft(torch.tensor(float(d0)), 1.0) + soft(torch.tensor(float(d1)), 0.5)) / 2
    assert m["heldout_loss"] == pytest.approx(float(expected), rel=1e-5)


def test_loss_choice_and_margin(tiny_tokenizer) -> None:
    rows = [dict(r, margin=0.5) for r in toy_rows()]
    examples = tokenize_pairs(rows, tiny_tokenizer, 64)
    assert choose_loss("auto", examples) == "pairwise"
    with pytest.raises(UserError, match="soft"):
        choose_loss("soft", examples)
    batch = collate_pairs(examples, 0)
    torch.testing.assert_close(batch["margin"], torch.full((len(TOY),), 0.5))
    assert choose_loss("auto", tokenize_pairs(toy_rows(), tiny_tokenizer, 64)) == "soft"
    with pytest.raises(UserError, match="margin"):
        choose_loss("auto", examples[:2] + tokenize_pairs(toy_rows()[:1], tiny_tokenizer, 64))


def test_overlong_pairs_are_dropped_or_cut(tiny_tokenizer) -> None:
    rows = toy_rows()
    full = tokenize_pairs(rows, tiny_tokenizer, 64)
    limit = min(len(e["prompt_ids"]) + max(len(e["chosen_ids"]), len(e["rejected_ids"])) for e in full)
    assert len(tokenize_pairs(rows, tiny_tokenizer, limit, "drop")) < len(rows)
    cut = tokenize_pairs(rows, tiny_tokenizer, limit, "truncate")
    assert len(cut) == len(rows)
    assert all(len(e["prompt_ids"]) + len(e["chosen_ids"]) <= limit for e in cut)


@pytest.mark.parametrize("loss", ["soft", "pairwise"])
def test_training_lowers_loss_and_learns_toy_preferences(tiny_lm, tiny_tokenizer, loss) -> None:
    torch.manual_seed(0)
    rm = ScalarHeadModel.from_causal_lm(tiny_lm)
    batch = collate_pairs(tokenize_pairs(toy_rows(), tiny_tokenizer, 64), tiny_tokenizer.pad_token_id)
    opt, _ = make_optimizer(rm, OptimConfig(lr=1e-2, warmup_steps=0), 15)
    first, metrics0 = rm_loss(rm, batch, loss)
    for _ in range(15):
        value, _ = rm_loss(rm, batch, loss)
        value.backward()
        opt.step()
        opt.zero_grad()
    last, metrics = rm_loss(rm, batch, loss)
    assert float(last.detach()) < 0.5 * float(first.detach())
    assert metrics["accuracy"] == 1.0


class GradientSnapshot:
    """An optimiser stand-in that keeps the gradients ``step()`` sees."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.grads = model, {}

    def step(self) -> None:
        self.grads = {n: p.grad.clone() for n, p in self.model.named_parameters() if p.grad is not None}

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.model.zero_grad(set_to_none=set_to_none)


@pytest.mark.parametrize("loss", ["soft", "pairwise"])
def test_micro_batches_give_the_gradient_of_the_whole_batch(tiny_lm, tiny_tokenizer, loss) -> None:
    """7 pairs in 1 or 3 micro-batches (3 + 3 + 1: the last one's mean must weigh 1/7, not 1/3) take the step
    of the mean loss over all 7 pairs computed in one batch."""
    torch.manual_seed(0)
    rm = ScalarHeadModel.from_causal_lm(tiny_lm)
    rows = toy_rows() + [{"prompt": "Review: the bread", "chosen": " was warm .", "rejected": " was stale ."}]
    pairs = tokenize_pairs(rows, tiny_tokenizer, 64)
    pad = tiny_tokenizer.pad_token_id
    value, _ = rm_loss(
        rm, collate_pairs(pairs, pad), loss
    )  # the independent formulation: one batch, one mean
    value.backward()
    whole = {n: p.grad.clone() for n, p in rm.named_parameters()}
    rm.zero_grad(set_to_none=True)
    optim, cpu, every = OptimConfig(max_grad_norm=None), torch.device("cpu"), list(range(len(pairs)))
    for grad_accum in (1, 3):
        snapshot = GradientSnapshot(rm)
        train = TrainConfig(grad_accum=grad_accum)
        out = rm_train_step(rm, snapshot, pairs, every, train, optim, loss, pad, cpu)
        assert out["loss"] == pytest.approx(float(value.detach()), rel=1e-5)
        for name, grad in whole.items():
            torch.testing.assert_close(snapshot.grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ({"eval_pairs": 100}, "eval_size"),
        ({"device": "cpu"}, "run.device"),
        ({"threads": 1}, "run.threads"),
        ({"tensorboard": True}, "run.tensorboard"),
        ({"train": {"max_steps": 5}}, "run.steps"),  # an old key under a section that still exists
        ({"train": {"seed": 1}}, "run.seed"),
        ({"train": {"eval_every": 5}}, "run.eval_every"),
        ({"train": {"parallel": "fsdp"}}, "run.parallel"),
        ({"train": {"optim": {"lr": 1e-4}}}, "optim"),
    ],
)
def test_an_old_key_is_an_error_that_names_the_new_one(old: dict, new: str) -> None:
    with pytest.raises(ConfigError, match=f"use '{new}'"):
        from_dict(RMConfig, old)


def test_defaults_suit_a_real_model_and_the_preset_holds_the_tiny_worlds_values() -> None:
    """The defaults are TRL's (RewardConfig: max_length 1024; its reward-model recipe: lr 1e-5, batch 8, AdamW
    β2 0.999, no warmup); configs/rm-reviews.yaml holds what `postrl rm` used before, for the tiny LM."""
    cfg = RMConfig()
    assert (cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.betas) == (1e-5, 0, (0.9, 0.999))
    assert (cfg.train.batch_size, cfg.train.max_length, cfg.eval_size) == (8, 1024, 500)
    tiny = load_config(RMConfig, CONFIGS / "rm-reviews.yaml")
    assert tiny.train == TrainConfig(batch_size=32, max_length=48)
    assert tiny.optim == OptimConfig(lr=3e-4, warmup_steps=20, min_lr_ratio=0.1, betas=(0.9, 0.95))
    assert tiny.run == RunConfig(steps=250, eval_every=50, save_every=125, log_every=10, threads=1)
    assert (tiny.eval_size, tiny.norm.samples, tiny.task) == (500, 512, {"perturb_fraction": 0.3})


def _cfg(model_dir: Path, **run) -> RMConfig:
    return RMConfig(
        model=str(model_dir),
        data="task:reviews",
        task={"n_pairs_train": 48, "n_pairs_test": 24},
        train=TrainConfig(batch_size=8, max_length=48),
        optim=OptimConfig(lr=3e-4, warmup_steps=2),
        run=RunConfig(steps=4, eval_every=2, save_every=2, log_every=1, device="cpu", **run),
        norm=NormConfig(samples=8, max_new_tokens=6),
    )


def test_run_rm_folder_and_exact_resume(tiny_lm_dir: Path, tmp_path: Path) -> None:
    cfg = _cfg(tiny_lm_dir)
    summary = run_rm(cfg, tmp_path / "a")
    for key in ("heldout_accuracy", "heldout_ece", "gold_accuracy", "sft_score_mean", "sft_score_std"):
        assert key in summary
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["steps"] == 4
    assert summary["heldout_pairs"] == 24  # n_pairs_test, all under eval_size: behind heldout_accuracy's SE
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "heldout_loss" in r] == [2, 4]  # run.eval_every, the last step once
    assert rows[-1]["heldout_accuracy"] == summary["heldout_accuracy"]
    assert (tmp_path / "a" / "curves.png").is_file()
    norm = read_reward_norm(tmp_path / "a" / "model")
    assert norm is not None and norm["n"] == 8 and norm["std"] > 0 and "gold_std" in norm
    loaded = ScalarHeadModel.from_pretrained(tmp_path / "a" / "model")
    load_causal_lm(tiny_lm_dir)  # the SFT init is untouched and still loads
    # interrupted after step 2: drop the later checkpoint and the export, then resume
    cfg = replace(cfg, plots=False)
    run_rm(cfg, tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "step_00000004")
    shutil.rmtree(tmp_path / "b" / "model")
    run_rm(cfg, tmp_path / "b", resume=True)
    resumed = ScalarHeadModel.from_pretrained(tmp_path / "b" / "model")
    for (name, p), q in zip(loaded.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    assert json.loads((tmp_path / "b" / "model" / NORM_FILE).read_text()) == norm
