"""GRPO: a step raises the best response's log-probability, zero-variance groups give no gradient, gradient
accumulation is exact for every loss type, μ = 1 behaves as documented, β = 0 loads no reference, a bad reward
function stops the run, prompts do not repeat within a step, resume is exact, the old config keys are errors
that name the new ones, and the tiny-world preset holds the values the defaults had before they became TRL's."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

import postrl.lm.grpo.build as grpo_setup
from postrl.core import group_advantages, overlong_penalty
from postrl.lm.data import encode_completions, encode_prompts, join_prompt_response
from postrl.lm.grpo import (
    MU_ONE_NOTE,
    GRPOConfig,
    GRPOLossConfig,
    backward_grpo_minibatch,
    optimise_grpo,
    policy_log_probs,
    run_grpo,
)
from postrl.lm.grpo.rollouts import PromptStream
from postrl.lm.rewards import RewardError
from postrl.lm.rollout import SamplingConfig, response_forward
from postrl.lm.rollout.batch import RolloutBatch
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig
from postrl.runtime.config import load_config
from postrl.runtime.errors import ConfigError
from postrl.runtime.logging import read_jsonl
from tests.lm.resume_check import assert_same_weights, interrupt_after, rows_without_times
from tests.tolerances import reordered_float32_sum_atol

PRESET = Path(__file__).resolve().parents[2] / "configs" / "grpo-arithmetic.yaml"


# ---- reward functions used by the runs below (imported by spec) ------------------------------------------------
def digits_reward(prompts, completions, **columns):
    """Varies within a group for an untrained model: the share of digit characters."""
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


def constant_reward(prompts, completions, **columns):
    return [1.0] * len(completions)


def broken_reward(prompts, completions, **columns):
    raise KeyError("no such column")


# ---- a fixed batch -------------------------------------------------------------------------------------------
def _fixed_batch(model, tokenizer, rewards, prompts=("What is 1+1?",), responses=(" 2", " 3", " 45", " 7")):
    """G = len(responses) responses per prompt, old log-probs = the current policy's."""
    G = len(responses)
    p = encode_prompts(tokenizer, [q for q in prompts for _ in range(G)])
    r = encode_completions(tokenizer, list(responses) * len(prompts))
    joined = join_prompt_response(p, r, tokenizer.pad_token_id)
    P = joined["input_ids"].shape[1] - joined["response_mask"].shape[1]
    with torch.no_grad():
        old, _ = policy_log_probs(
            response_forward(model), joined["input_ids"], joined["attention_mask"], P, 1.0
        )
    advantages = group_advantages(torch.tensor(rewards, dtype=torch.float32), G)
    return RolloutBatch(
        joined["input_ids"], joined["attention_mask"], P, joined["response_mask"], old, advantages, old
    )


def _sequence_log_probs(model, batch):
    with torch.no_grad():
        lp, _ = policy_log_probs(
            response_forward(model), batch.input_ids, batch.attention_mask, batch.prompt_len, 1.0
        )
    return lp.sum(-1)


@pytest.mark.parametrize("loss_type", ["grpo", "token", "dr_grpo"])
def test_a_step_raises_the_log_prob_of_the_best_response(tiny_lm, tiny_tokenizer, loss_type):
    batch = _fixed_batch(tiny_lm, tiny_tokenizer, rewards=[1.0, 0.0, 0.0, 0.0])
    before = _sequence_log_probs(tiny_lm, batch)
    opt = torch.optim.AdamW(tiny_lm.parameters(), lr=1e-2)
    cfg = GRPOLossConfig(group_size=4, beta=0.04, loss_type=loss_type)
    stats = optimise_grpo(tiny_lm, opt, batch, cfg, temperature=1.0, max_len=8, max_grad_norm=1.0)
    after = _sequence_log_probs(tiny_lm, batch)
    assert after[0] > before[0] + 0.05  # the rewarded response became more likely
    # and more likely relative to the others (they share the space and EOS tokens, so may rise too)
    assert after[0] - after[1:].mean() > before[0] - before[1:].mean() + 0.05
    assert stats["clip_fraction"] == 0.0 and stats["kl"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_zero_variance_groups_give_zero_policy_gradient(tiny_lm, tiny_tokenizer, beta):
    batch = _fixed_batch(tiny_lm, tiny_tokenizer, rewards=[0.5, 0.5, 0.5, 0.5])
    assert torch.equal(batch.advantages, torch.zeros(4))
    cfg = GRPOLossConfig(group_size=4, beta=beta)
    backward_grpo_minibatch(tiny_lm, batch, cfg, temperature=1.0, max_len=8)
    for p in tiny_lm.parameters():
        # k3's gradient vanishes where π = π_ref, so nothing but the (zero) advantages could move the policy
        assert p.grad is None or float(p.grad.abs().max()) < 1e-7


def _grads(model):
    return [p.grad.detach().clone() if p.grad is not None else None for p in model.parameters()]


@pytest.mark.parametrize("loss_type", ["grpo", "token", "dr_grpo"])
def test_four_micro_batches_equal_one_batch(tiny_lm_dir, tiny_tokenizer, loss_type):
    from postrl.lm.models import load_causal_lm

    grads = []
    for accum in (1, 4):  # one batch of 8 vs 4 micro-batches of 2
        model = load_causal_lm(tiny_lm_dir)
        batch = _fixed_batch(
            model,
            tiny_tokenizer,
            rewards=[1.0, 0.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.25],
            prompts=("What is 1+1?", "What is 12+30?"),
        )
        # off-policy old log-probs and a different reference, so that the ratio, the clip and k3 all act
        g = torch.Generator().manual_seed(0)
        batch.old_log_probs = (
            batch.old_log_probs + 0.3 * torch.randn(8, 4, generator=g)
        ) * batch.response_mask
        batch.ref_log_probs = (
            batch.ref_log_probs - 0.2 * torch.rand(8, 4, generator=g)
        ) * batch.response_mask
        cfg = GRPOLossConfig(group_size=4, beta=0.1, grad_accum=accum, loss_type=loss_type)
        stats = backward_grpo_minibatch(model, batch, cfg, temperature=1.0, max_len=8)
        grads.append((stats, _grads(model)))
    assert grads[0][0]["loss"] == pytest.approx(grads[1][0]["loss"], abs=1e-6)
    assert grads[0][0]["clip_fraction"] > 0
    positions = batch.input_ids.numel()  # each weight's gradient sums over every (row, position)
    for a, b in zip(grads[0][1], grads[1][1], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=reordered_float32_sum_atol(a, positions))


def test_overlong_penalty_by_hand():
    lengths = torch.tensor([2, 6, 7, 8])
    got = overlong_penalty(lengths, max_len=8, buffer_len=4, penalty=1.0)
    assert got.tolist() == pytest.approx([0.0, -0.5, -0.75, -1.0])
    assert overlong_penalty(lengths, 8, 0, 1.0).tolist() == [0.0] * 4


def test_prompts_do_not_repeat_within_a_step_and_the_order_is_a_function_of_position():
    stream = PromptStream(10, seed=3)
    steps = [stream.take(4, set()) for _ in range(6)]  # 24 draws: crosses two epoch boundaries
    assert all(len(set(s)) == 4 for s in steps)
    assert sorted(i for s in steps[:2] for i in s) == sorted(set(i for s in steps[:2] for i in s))
    resumed = PromptStream(10, seed=3, position=8)
    assert [resumed.take(4, set()) for _ in range(4)] == steps[2:]
    # asked for repeats (fewer prompts than a step needs): the stream just wraps
    assert len(PromptStream(3, seed=0).take(7)) == 7


# ---- whole runs on the tiny model ------------------------------------------------------------------------------
def _config(tiny_lm_dir, run=None, grpo=None, **kw) -> GRPOConfig:
    """A tiny run: 2 prompts × G = 4 responses of ≤ 4 tokens, β 0.04, AdamW 2e-4 constant, 4 steps."""
    base = dict(
        model=str(tiny_lm_dir),
        task={"n_train": 40, "n_test": 6},
        max_prompt_length=64,
        rewards=[f"{__name__}:digits_reward", "task:arithmetic"],
        sampling=SamplingConfig(max_new_tokens=4),
        grpo=GRPOLossConfig(
            **{"group_size": 4, "prompts_per_step": 2, "beta": 0.04, "loss_type": "grpo", **(grpo or {})}
        ),
        optim=OptimConfig(lr=2e-4, warmup_steps=0, min_lr_ratio=1.0),
        run=RunConfig(
            **{"steps": 4, "eval_every": 2, "save_every": 2, "log_every": 1, "device": "cpu", "threads": 1}
            | (run or {})
        ),
        eval_size=6,
    )
    return GRPOConfig(**{**base, **kw})


def test_mu_one_has_ratio_one_and_says_so(tiny_lm_dir, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="postrl.lm.grpo"):
        summary = run_grpo(_config(tiny_lm_dir, run={"steps": 2}), tmp_path / "run")
    assert MU_ONE_NOTE in caplog.text
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert len(rows) == 2
    for r in rows:
        assert r["clip_fraction"] == 0.0
        assert r["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
        assert abs(r["loss"]) < 1e-2  # zero-mean advantages (+ β·k3 ≈ 0 on the first steps)
        for key in ("reward_std", "zero_std_fraction", "entropy", "completion_length_max", "time_generate"):
            assert key in r
    for key in ("heldout_accuracy", "kl_to_ref", "wall_seconds", "peak_rss_mb", "heldout_accuracy_sampled"):
        assert key in summary
    assert (tmp_path / "run" / "curves.png").is_file()
    assert (tmp_path / "run" / "model" / "config.json").is_file()


def test_beta_zero_never_builds_a_reference_model(tiny_lm_dir, tmp_path, monkeypatch):
    loaded = []
    real = grpo_setup.load_causal_lm

    def counting(*args, **kwargs):
        loaded.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(grpo_setup, "load_causal_lm", counting)
    summary = run_grpo(_config(tiny_lm_dir, run={"steps": 1}, grpo={"beta": 0.0}), tmp_path / "run")
    assert loaded == [str(tiny_lm_dir)]  # the policy only
    assert summary["kl_to_ref"] is None
    run_grpo(_config(tiny_lm_dir, run={"steps": 1}), tmp_path / "run2")
    assert len(loaded) == 3  # β > 0: policy + reference


def test_a_bad_reward_function_stops_the_run_with_its_name(tiny_lm_dir, tmp_path):
    cfg = _config(tiny_lm_dir, rewards=[f"{__name__}:broken_reward"], eval_at_start=False)
    with pytest.raises(
        RewardError,
        match=r"broken_reward \(.*test_grpo.py:broken_reward\) raised KeyError.*sample 0: prompt='What is",
    ):
        run_grpo(cfg, tmp_path / "run")


def test_dynamic_sampling_refills_and_counts_zero_std_groups(tiny_lm_dir, tmp_path):
    cfg = _config(
        tiny_lm_dir,
        rewards=[f"{__name__}:constant_reward"],
        run={"steps": 1},
        grpo={"dynamic_sampling": True, "max_refills": 2},
    )
    run_grpo(cfg, tmp_path / "run")
    row = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r][0]
    assert row["zero_std_fraction"] == 1.0 and row["refill_rounds"] == 2
    assert row["generated_tokens"] <= 3 * 2 * 4 * 4 and row["loss"] == 0.0


def test_resume_is_exact(tiny_lm_dir, tmp_path):
    cfg = _config(tiny_lm_dir, run={"keep_last": 5}, grpo={"epochs": 2, "minibatches": 2})
    run_grpo(cfg, tmp_path / "a")
    run_grpo(cfg, tmp_path / "b")
    # interrupt "b" after its step-2 checkpoint: remove what steps 3-4 wrote, then resume
    interrupt_after(tmp_path / "b", 2)
    torch.manual_seed(123)  # nothing may depend on the RNG state left behind
    run_grpo(cfg, tmp_path / "b", resume=True)
    assert_same_weights(tmp_path / "a", tmp_path / "b")
    assert rows_without_times(tmp_path / "a") == rows_without_times(tmp_path / "b")
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["steps"] == 4


def test_cli_stage_lists_keys(capsys):
    from postrl.cli import main

    assert main(["grpo", "--list-keys"]) == 0
    out = capsys.readouterr().out
    assert "grpo.clip_eps_high" in out and "grpo.loss_type" in out and "sampling.temperature" in out


def test_the_arithmetic_preset_holds_the_tiny_world_values():
    """configs/grpo-arithmetic.yaml reproduces the run the defaults gave before they became TRL's."""
    cfg = load_config(GRPOConfig, PRESET, ["run.max_seconds=60"])
    assert cfg.grpo.prompts_per_step == 32 and cfg.grpo.group_size == 8 and cfg.task == {"digits": 3}
    assert (cfg.grpo.beta, cfg.grpo.loss_type, cfg.grpo.epochs) == (0.04, "grpo", 1)
    assert (cfg.max_prompt_length, cfg.sampling.max_new_tokens, cfg.eval_size) == (256, 8, 200)
    assert cfg.optim == OptimConfig(lr=2e-4, warmup_steps=0, min_lr_ratio=1.0, betas=(0.9, 0.95))
    assert cfg.run == RunConfig(
        steps=300, eval_every=10, save_every=50, log_every=1, threads=1, max_seconds=60
    )


def test_defaults_are_trls_for_a_real_model():
    cfg = GRPOConfig()
    assert (cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.betas) == (1e-6, 0, (0.9, 0.999))
    assert (cfg.grpo.group_size, cfg.sampling.max_new_tokens, cfg.max_prompt_length) == (8, 256, 512)
    assert (cfg.grpo.beta, cfg.grpo.clip_eps, cfg.grpo.epochs) == (0.0, 0.2, 1)
    assert cfg.grpo.loss_type == "token"  # TRL's "dapo": the mean over every response token of the step


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("max_steps=3", "run.steps"),
        ("seed=1", "run.seed"),
        ("eval_every=5", "run.eval_every"),
        ("save_every=5", "run.save_every"),
        ("keep_last=1", "run.keep_last"),
        ("log_every=1", "run.log_every"),
        ("max_seconds=9", "run.max_seconds"),
        ("device=cpu", "run.device"),
        ("dtype=float32", "run.dtype"),
        ("threads=1", "run.threads"),
        ("parallel=fsdp", "run.parallel"),
        ("tensorboard=true", "run.tensorboard"),
        ("eval_prompts=10", "eval_size"),
        ("grpo.mu=2", "grpo.epochs"),
    ],
)
def test_an_old_key_is_an_error_that_names_the_new_one(old, new):
    key = old.split("=")[0]
    with pytest.raises(ConfigError, match=rf"'{key}' was renamed: use '{new}'"):
        load_config(GRPOConfig, overrides=[old])


def test_an_old_key_in_a_yaml_file_is_named_with_the_file(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("grpo:\n  mu: 2\nmax_steps: 10\n")
    with pytest.raises(ConfigError, match=r"'(grpo\.mu|max_steps)' was renamed: use .* \(in .*old\.yaml\)"):
        load_config(GRPOConfig, path)


@pytest.mark.slow
def test_a_short_run_raises_the_reward(tiny_lm_dir, tmp_path):
    cfg = _config(
        tiny_lm_dir,
        rewards=[f"{__name__}:digits_reward"],
        run={"steps": 40, "eval_every": 0, "save_every": 0},
        eval_at_start=False,
        grpo={"group_size": 8, "prompts_per_step": 4, "beta": 0.0},
        optim=OptimConfig(lr=1e-2, warmup_steps=0, min_lr_ratio=1.0),
    )
    run_grpo(cfg, tmp_path / "run")
    rewards = [r["reward_mean"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "reward_mean" in r]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.2


def test_a_run_has_the_same_metrics_padding_free_or_not(tiny_lm_dir, tmp_path, monkeypatch, caplog):
    """Four steps with GRPO's loss and reference scoring padding-free (`PackedForward`, the default for the
    float32 tiny Llama) and padded (`FusedForward`, as before it): every logged reward, loss, KL, ratio and
    gradient norm equal to float32 rounding (the same responses are sampled: the weights agree that closely)."""
    import postrl.lm.grpo.engine as engine
    import postrl.lm.rollout.forwards as forwards
    from tests.lm.test_packed_forward import assert_same_metrics

    chosen = []
    original = engine.response_forward

    def spy(*args, **kwargs):
        forward = original(*args, **kwargs)
        chosen.append(type(forward).__name__)
        return forward

    monkeypatch.setattr(engine, "response_forward", spy)
    cfg = _config(tiny_lm_dir, run={"eval_every": 0, "save_every": 0})
    with caplog.at_level(logging.INFO, logger="postrl.lm.grpo.engine"):
        run_grpo(cfg, tmp_path / "packed")
    assert chosen[:3] == ["PackedForward"] * 3  # the loss's, the old and the reference forward
    assert "grpo: the loss runs PackedForward (padding-free" in caplog.text
    monkeypatch.setattr(forwards, "packed_refusal", lambda *a, **k: "off in this test")
    run_grpo(cfg, tmp_path / "padded")
    assert chosen[3:6] == ["FusedForward"] * 3
    assert_same_metrics(tmp_path / "packed", tmp_path / "padded")
