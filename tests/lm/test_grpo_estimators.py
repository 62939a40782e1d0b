"""The policy-gradient family on the GRPO trainer: grpo.advantage picks the estimator (each batch's advantages
are the core function's on the same rewards), grpo.importance_level reaches `grpo_loss` (GSPO), the RLOO, GSPO
and DAPO presets load, and a bad estimator name is a one-line error that names the key."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest
import torch

import postrl.lm.grpo.objective as grpo_objective
import postrl.lm.grpo.rollouts as grpo_rollouts
from postrl.core import group_advantages, reinforce_pp_advantages, rloo_advantages
from postrl.lm.grpo import GRPOConfig, GRPOLossConfig, run_grpo
from postrl.lm.rollout import SamplingConfig
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig
from postrl.runtime.config import load_config
from postrl.runtime.errors import ConfigError
from postrl.runtime.logging import read_jsonl
from tests.tolerances import reordered_float32_sum_atol

REWARDS = torch.tensor([1.0, 0.0, 0.5, 0.25, 2.0, 2.0, 2.0, 2.0, 0.0, 3.0, 1.0, 1.0], dtype=torch.float64)
G = 4

CORE = {  # the estimator → the core function it must equal
    "grpo": lambda r: group_advantages(r, G, 1e-4, scale=True),
    "dr_grpo": lambda r: group_advantages(r, G, 1e-4, scale=False),
    "rloo": lambda r: rloo_advantages(r, G),
    "reinforce_pp": lambda r: reinforce_pp_advantages(r, G),
}


def digits_reward(prompts, completions, **columns):
    """Varies within a group for an untrained model: the share of digit characters."""
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


def _config(tiny_lm_dir, **grpo) -> GRPOConfig:
    """One tiny step: 2 prompts × G = 4 responses of ≤ 4 tokens, β 0."""
    return GRPOConfig(
        model=str(tiny_lm_dir),
        task={"n_train": 40, "n_test": 6},
        max_prompt_length=64,
        rewards=[f"{__name__}:digits_reward", "task:arithmetic"],
        sampling=SamplingConfig(max_new_tokens=4),
        grpo=GRPOLossConfig(**{"group_size": G, "prompts_per_step": 2, "beta": 0.0, **grpo}),
        optim=OptimConfig(lr=2e-4, warmup_steps=0, min_lr_ratio=1.0),
        run=RunConfig(steps=1, eval_every=0, save_every=0, log_every=1, device="cpu", threads=1),
        eval_size=2,
        eval_at_start=False,
    )


@pytest.mark.parametrize("advantage", sorted(CORE))
def test_each_estimator_is_its_core_function(advantage):
    g = GRPOLossConfig(group_size=G, advantage=advantage)
    torch.testing.assert_close(grpo_rollouts.compute_advantages(REWARDS, g), CORE[advantage](REWARDS))


def test_the_default_is_grpo_and_scale_rewards_false_is_dr_grpo():
    assert GRPOLossConfig().advantage == "grpo" and GRPOLossConfig().importance_level == "token"
    unscaled = GRPOLossConfig(group_size=G, scale_rewards=False)
    dr = GRPOLossConfig(group_size=G, advantage="dr_grpo")
    torch.testing.assert_close(
        grpo_rollouts.compute_advantages(REWARDS, unscaled), grpo_rollouts.compute_advantages(REWARDS, dr)
    )
    # dr_grpo ignores scale_rewards; rloo is G/(G − 1) times dr_grpo
    torch.testing.assert_close(grpo_rollouts.compute_advantages(REWARDS, dr), CORE["dr_grpo"](REWARDS))
    torch.testing.assert_close(CORE["rloo"](REWARDS), CORE["dr_grpo"](REWARDS) * G / (G - 1))


def _spy(monkeypatch) -> dict[str, list]:
    """Record the rewards each step's advantages are computed from, and what `grpo_loss` receives."""
    seen: dict[str, list] = {"rewards": [], "advantages": [], "importance_level": []}
    compute, loss = grpo_rollouts.compute_advantages, grpo_objective.grpo_loss

    def compute_spy(rewards, g):
        seen["rewards"].append(rewards.clone())
        return compute(rewards, g)

    def loss_spy(*args, **kwargs):
        seen["advantages"].append(args[3].detach().clone())
        seen["importance_level"].append(kwargs.get("importance_level", "token"))
        return loss(*args, **kwargs)

    monkeypatch.setattr(grpo_rollouts, "compute_advantages", compute_spy)
    monkeypatch.setattr(grpo_objective, "grpo_loss", loss_spy)  # where the loss is looked up
    return seen


@pytest.mark.parametrize("advantage", ["rloo", "reinforce_pp"])
def test_a_run_trains_on_the_chosen_estimators_advantages(advantage, tiny_lm_dir, tmp_path, monkeypatch):
    seen = _spy(monkeypatch)
    run_grpo(_config(tiny_lm_dir, advantage=advantage), tmp_path / "run")
    (rewards,) = seen["rewards"]
    expected = CORE[advantage](rewards)
    trained = torch.cat(seen["advantages"])
    assert trained.shape == expected.shape  # the minibatch may be permuted: compare as multisets
    torch.testing.assert_close(trained.sort().values, expected.sort().values)


def test_sequence_importance_reaches_the_loss(tiny_lm_dir, tmp_path, monkeypatch):
    seen = _spy(monkeypatch)
    run_grpo(_config(tiny_lm_dir, importance_level="sequence", epochs=2), tmp_path / "run")
    assert seen["importance_level"] and set(seen["importance_level"]) == {"sequence"}
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert len(rows) == 1 and torch.isfinite(torch.tensor(rows[0]["loss"]))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("rloo-arithmetic", {"advantage": "rloo", "importance_level": "token", "beta": 0.04}),
        ("gspo-arithmetic", {"advantage": "grpo", "importance_level": "sequence", "beta": 0.04}),
        (
            "dapo-arithmetic",
            {"loss_type": "token", "clip_eps_high": 0.28, "dynamic_sampling": True, "beta": 0.0},
        ),
    ],
)
def test_the_family_presets_load(name, expected):
    cfg = load_config(GRPOConfig, name)
    assert {k: getattr(cfg.grpo, k) for k in expected} == expected
    if name == "dapo-arithmetic":
        assert 0 < cfg.grpo.overlong_buffer <= cfg.sampling.max_new_tokens


def test_an_unknown_estimator_is_a_one_line_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"grpo\.advantage") as err:
        load_config(GRPOConfig, "grpo-arithmetic", ["grpo.advantage=foo"])
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"grpo\.importance_level"):
        load_config(GRPOConfig, None, ["grpo.importance_level=word"])


def test_reinforce_pp_whitens_over_every_ranks_rows(monkeypatch):
    """Two ranks, simulated: each passes its own groups' rewards, the all-reduce sums both ranks' vectors;
    the concatenated advantages are one process's (the whitening's mean and variance are global)."""
    g = GRPOLossConfig(group_size=G, advantage="reinforce_pp")
    rewards = torch.cat([REWARDS, torch.tensor([0.5, 1.5, 0.0, 2.0], dtype=torch.float64)])  # 2 groups a rank
    half = rewards.numel() // 2
    shares = [rewards[:half], rewards[half:]]
    sent: list[torch.Tensor] = []

    def all_reduce_sum(t):  # rank 0's call records its vector; the "sum" adds rank 1's, placed alike
        sent.append(t.clone())
        other = torch.zeros_like(t)
        r = 1 - grpo_rollouts.dist.rank()
        other[r * half : (r + 1) * half] = shares[r]
        return t + other

    monkeypatch.setattr(grpo_rollouts.dist, "world_size", lambda: 2)
    parts = []
    for rank in (0, 1):
        monkeypatch.setattr(grpo_rollouts.dist, "rank", lambda rank=rank: rank)
        monkeypatch.setattr(grpo_rollouts.dist, "all_reduce_sum", all_reduce_sum)
        parts.append(grpo_rollouts.compute_advantages(shares[rank], g))
    torch.testing.assert_close(torch.cat(parts), CORE["reinforce_pp"](rewards), rtol=0, atol=0)
    # each rank alone would whiten differently: the test can fail
    assert not torch.allclose(
        torch.cat([CORE["reinforce_pp"](s) for s in shares]), CORE["reinforce_pp"](rewards)
    )


def test_the_trl_defaults_preset_is_trls_grpo_config():
    """grpo-trl-arithmetic against TRL 1.16's GRPOConfig defaults (written down here; the slow test below
    reads them from TRL itself when its venv exists)."""
    cfg = load_config(GRPOConfig, "grpo-trl-arithmetic")
    g, o = cfg.grpo, cfg.optim
    assert (g.group_size * g.prompts_per_step, g.group_size) == (
        8,
        8,
    )  # per_device_train_batch_size, num_generations
    assert (g.beta, g.epochs, g.clip_eps, g.clip_eps_high, g.loss_type) == (0.0, 1, 0.2, None, "token")
    assert (g.advantage, g.scale_rewards, g.adv_eps, g.importance_level) == ("grpo", True, 1e-4, "token")
    assert (o.lr, o.warmup_steps, o.min_lr_ratio, o.betas, o.weight_decay, o.max_grad_norm) == (
        1e-6, 0, 0.0, (0.9, 0.999), 0.0, 1.0
    )  # fmt: skip
    assert (cfg.sampling.temperature, cfg.sampling.top_k, cfg.sampling.top_p) == (1.0, 0, 1.0)
    assert (cfg.run.seed, cfg.run.log_every, cfg.run.save_every) == (42, 10, 500)


TRL_PYTHON = Path(__file__).resolve().parents[2] / "benchmarks" / "peers" / ".venv-trl" / "bin" / "python"
TRL_FIELDS = """
import json, sys
from trl import GRPOConfig
c = GRPOConfig(output_dir=sys.argv[1], use_cpu=True)
keys = ["num_generations", "per_device_train_batch_size", "beta", "num_iterations", "epsilon", "epsilon_high",
        "loss_type", "scale_rewards", "importance_sampling_level", "learning_rate", "warmup_steps",
        "adam_beta1", "adam_beta2", "weight_decay", "max_grad_norm", "temperature", "top_k", "top_p", "seed",
        "logging_steps", "save_steps", "mask_truncated_completions", "use_bias_correction_kl",
        "steps_per_generation", "lr_scheduler_type"]
print(json.dumps({k: str(getattr(c, k)) for k in keys}))
"""


@pytest.mark.slow  # imports TRL in its own venv (~10 s)
def test_the_trl_defaults_preset_matches_trl_itself(tmp_path):
    if not TRL_PYTHON.is_file():
        pytest.skip("no TRL venv: `make peers` builds benchmarks/peers/.venv-trl")
    out = subprocess.run([str(TRL_PYTHON), "-c", TRL_FIELDS, str(tmp_path)], capture_output=True, text=True)
    trl = json.loads(out.stdout.strip().splitlines()[-1])
    cfg = load_config(GRPOConfig, "grpo-trl-arithmetic")
    g, o = cfg.grpo, cfg.optim
    ours = {
        "num_generations": g.group_size,
        "per_device_train_batch_size": g.group_size * g.prompts_per_step,
        "beta": g.beta,
        "num_iterations": g.epochs,
        "epsilon": g.clip_eps,
        "epsilon_high": g.clip_eps_high,
        "loss_type": {"token": "dapo"}[g.loss_type],
        "scale_rewards": "group" if g.scale_rewards else "none",
        "importance_sampling_level": g.importance_level,
        "learning_rate": o.lr,
        "warmup_steps": o.warmup_steps,
        "adam_beta1": o.betas[0],
        "adam_beta2": o.betas[1],
        "weight_decay": o.weight_decay,
        "max_grad_norm": o.max_grad_norm,
        "temperature": cfg.sampling.temperature,
        "top_k": cfg.sampling.top_k,
        "top_p": cfg.sampling.top_p,
        "seed": cfg.run.seed,
        "logging_steps": cfg.run.log_every,
        "save_steps": cfg.run.save_every,
        "mask_truncated_completions": g.overlong_buffer != 0,
        "use_bias_correction_kl": g.unbiased_kl,
        "steps_per_generation": g.minibatches,
        "lr_scheduler_type": "SchedulerType.LINEAR",  # postrl's is the cosine to 0 (the preset says so)
    }
    assert {k: str(v) for k, v in ours.items()} == trl


@pytest.mark.parametrize("importance_level", ["token", "sequence", "sequence_sum"])
def test_every_ratio_level_honours_each_aggregation_under_accumulation(
    tiny_lm_dir, tiny_tokenizer, importance_level
):
    """Each loss_type gives its own loss at every importance level, and 4 micro-batches of 2 give the loss
    and gradient of one batch of 8 (each aggregation's global normaliser reaches the sequence levels too)."""
    from postrl.lm.grpo.algorithm import backward_grpo_minibatch
    from postrl.lm.models import load_causal_lm
    from tests.lm.test_grpo import _fixed_batch

    start = load_causal_lm(tiny_lm_dir)
    losses = {}
    for loss_type in ("grpo", "token", "dr_grpo"):
        results = []
        for accum in (1, 4):  # one batch of 8 vs 4 micro-batches of 2
            model = copy.deepcopy(start)
            batch = _fixed_batch(
                model, tiny_tokenizer, rewards=[1.0, 0.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.25],
                prompts=("What is 1+1?", "What is 12+30?"),
            )  # fmt: skip
            g = torch.Generator().manual_seed(0)
            batch.old_log_probs = (
                batch.old_log_probs + 0.1 * torch.randn(8, 4, generator=g)
            ) * batch.response_mask
            cfg = GRPOLossConfig(
                group_size=4, beta=0.0, grad_accum=accum, loss_type=loss_type,
                importance_level=importance_level, advantage="rloo",
            )  # fmt: skip
            stats = backward_grpo_minibatch(model, batch, cfg, temperature=1.0, max_len=8)
            results.append(
                (stats["loss"], [p.grad.clone() for p in model.parameters() if p.grad is not None])
            )
        assert results[0][0] == pytest.approx(results[1][0], abs=1e-6)
        positions = batch.input_ids.numel()  # each weight's gradient sums over every (row, position)
        for a, b in zip(results[0][1], results[1][1], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=reordered_float32_sum_atol(a, positions))
        losses[loss_type] = results[0][0]
    assert len({round(v, 7) for v in losses.values()}) == 3, losses
