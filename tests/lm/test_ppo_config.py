"""`postrl ppo`'s config: every old key name is an error that names the new one (the run: section, optim,
eval_size, rewards), configs/ppo-reviews.yaml holds the values tuned for the built-in tiny world (the run the
command made by default before its defaults became TRL's), and --list-keys shows the new names."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from postrl.lm.ppo import PPOConfig
from postrl.lm.ppo.advantages import KLConfig, RewardConfig
from postrl.lm.ppo.config import PPOLossConfig
from postrl.lm.rollout import SamplingConfig
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig
from postrl.runtime.config import ConfigError, load_config

PRESET = Path(__file__).resolve().parents[2] / "configs" / "ppo-reviews.yaml"


def test_cli_stage_lists_its_keys(capsys) -> None:
    from postrl.cli import main

    assert main(["ppo", "--list-keys"]) == 0
    out = capsys.readouterr().out
    for key in ("kl.beta", "reward.normalize", "gae.lam", "ppo.vf_clip", "critic", "ptx.coef", "rewards"):
        assert key in out
    for key in ("run.steps", "run.seed", "optim.lr", "critic_optim.lr", "eval_size"):
        assert f"{key} = " in out


# ---- the config ------------------------------------------------------------------------------------------
RENAMED = [
    ("steps=5", "steps", "run.steps"),
    ("seed=1", "seed", "run.seed"),
    ("save_every=5", "save_every", "run.save_every"),
    ("keep_last=1", "keep_last", "run.keep_last"),
    ("log_every=5", "log_every", "run.log_every"),
    ("eval_every=5", "eval_every", "run.eval_every"),
    ("device=cpu", "device", "run.device"),
    ("dtype=bfloat16", "dtype", "run.dtype"),
    ("threads=1", "threads", "run.threads"),
    ("parallel=fsdp", "parallel", "run.parallel"),
    ("tensorboard=true", "tensorboard", "run.tensorboard"),
    ("actor_optim.lr=1e-5", "actor_optim", "optim"),
    ("eval_samples=8", "eval_samples", "eval_size"),
    ("reward_fns=[task:reviews]", "reward_fns", "rewards"),
]


@pytest.mark.parametrize(("override", "old", "new"), RENAMED)
def test_old_key_names_are_errors_naming_the_new_ones(override: str, old: str, new: str) -> None:
    with pytest.raises(ConfigError, match=rf"^'{old}' was renamed: use '{re.escape(new)}'$"):
        load_config(PPOConfig, overrides=[override])


def test_an_old_section_in_a_config_file_is_named_with_the_file(tmp_path) -> None:
    path = tmp_path / "old.yaml"
    path.write_text("actor_optim:\n  lr: 0.00003\nrun:\n  steps: 3\n")
    with pytest.raises(
        ConfigError, match=rf"'actor_optim' was renamed: use 'optim' \(in {re.escape(str(path))}\)"
    ):
        load_config(PPOConfig, path)


def test_the_preset_holds_the_tiny_worlds_values_and_the_defaults_are_trls() -> None:
    """configs/ppo-reviews.yaml is exactly the run `postrl ppo --config configs/ppo-reviews.yaml` made before
    the defaults became TRL's (actor and critic lr 3e-6 decayed to 0, β 0.05, one minibatch, 53 tokens at
    temperature 0.7)."""
    tiny = OptimConfig(lr=3e-5, warmup_steps=0, min_lr_ratio=1.0, betas=(0.9, 0.95), max_grad_norm=1.0)
    expected = PPOConfig(
        model="runs/base/sft/model",
        reward_model="runs/rm/model",
        max_prompt_length=32,
        sampling=SamplingConfig(max_new_tokens=24, temperature=1.0),
        batch_size=64,
        ppo=PPOLossConfig(epochs=4, minibatches=4),
        kl=KLConfig(beta=0.2),
        reward=RewardConfig("rm_stats", clip=5.0, missing_eos_penalty=-1.0),
        optim=tiny,
        critic_optim=replace(tiny, lr=3e-4),
        run=RunConfig(steps=100, log_every=1, eval_every=10, save_every=50, keep_last=2, threads=1),
        eval_size=256,
    )
    assert load_config(PPOConfig, PRESET) == expected
    default = PPOConfig()
    for optim in (default.optim, default.critic_optim):
        assert (optim.lr, optim.warmup_steps, optim.min_lr_ratio, optim.betas) == (3e-6, 0, 0.0, (0.9, 0.999))
    assert (default.kl.beta, default.ppo.epochs, default.ppo.minibatches, default.gae.lam) == (
        0.05,
        4,
        1,
        0.95,
    )
    assert (default.sampling.max_new_tokens, default.sampling.temperature) == (53, 0.7)
