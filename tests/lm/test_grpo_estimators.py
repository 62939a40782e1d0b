"""The policy-gradient family on the GRPO trainer: grpo.advantage picks the estimator (each batch's advantages
are the core function's on the same rewards), grpo.importance_level reaches `grpo_loss` (GSPO), the RLOO, GSPO
and DAPO presets load, and a bad estimator name is a one-line error that names the key."""

from __future__ import annotations

import pytest
import torch

import postrl.lm.grpo.algorithm as grpo_algorithm
import postrl.lm.grpo.rollouts as grpo_rollouts
from postrl.core import group_advantages, reinforce_pp_advantages, rloo_advantages
from postrl.lm.grpo import GRPOConfig, GRPOLossConfig, run_grpo
from postrl.lm.rollout import SamplingConfig
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig
from postrl.runtime.config import load_config
from postrl.runtime.errors import ConfigError
from postrl.runtime.logging import read_jsonl

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
    compute, loss = grpo_rollouts.compute_advantages, grpo_algorithm.grpo_loss

    def compute_spy(rewards, g):
        seen["rewards"].append(rewards.clone())
        return compute(rewards, g)

    def loss_spy(*args, **kwargs):
        seen["advantages"].append(args[3].detach().clone())
        seen["importance_level"].append(kwargs.get("importance_level", "token"))
        return loss(*args, **kwargs)

    monkeypatch.setattr(grpo_rollouts, "compute_advantages", compute_spy)
    monkeypatch.setattr(grpo_algorithm, "grpo_loss", loss_spy)
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
