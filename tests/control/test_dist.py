"""The torchrun code path of classic-control PPO (``postrl.control.ranks``) in this one process: inside a gloo
process group of world size 1 it all-reduces gradients and advantage moments, gathers episodes and rank
states, and must train exactly as without a group; the other algorithms refuse torchrun."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as tdist
from safetensors.torch import load_file

from postrl.control import ranks
from postrl.control.envs import EnvConfig
from postrl.control.loop import ControlRunConfig, train_from_config
from postrl.control.ppo import ControlPPOConfig, PPOHyperparams
from postrl.core import masked_whiten
from postrl.runtime.errors import UserError
from postrl.runtime.logging import read_jsonl


@pytest.fixture
def group(tmp_path):
    """A gloo process group of one rank (what torchrun --nproc_per_node 1 makes)."""
    tdist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    tdist.destroy_process_group()


def _config() -> ControlPPOConfig:
    return ControlPPOConfig(
        env=EnvConfig(n_envs=4),
        ppo=PPOHyperparams(n_steps=16, batch_size=32, epochs=2, target_kl=0.5),
        run=ControlRunConfig(steps=3 * 64, eval_episodes=2, save_every=2),
    )


def test_whiten_in_a_group_is_the_plain_whitening(group):
    x = torch.randn(37, dtype=torch.float64)
    torch.testing.assert_close(ranks.whiten(x), masked_whiten(x, torch.ones_like(x)))


def test_whiten_without_a_group_is_the_plain_whitening():
    x = torch.randn(37, dtype=torch.float64)
    torch.testing.assert_close(ranks.whiten(x), masked_whiten(x, torch.ones_like(x)))
    one_row = torch.zeros(1, dtype=torch.float64)  # a single row whitens to 0, as in masked_whiten
    torch.testing.assert_close(ranks.whiten(x[:1]), one_row)


def test_training_in_a_group_of_one_equals_no_group(tmp_path):
    train_from_config(_config(), tmp_path / "plain")
    tdist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        train_from_config(_config(), tmp_path / "group")
    finally:
        tdist.destroy_process_group()
    plain, grouped = (read_jsonl(tmp_path / run / "metrics.jsonl") for run in ("plain", "group"))
    assert [r["step"] for r in grouped] == [r["step"] for r in plain] == [64, 128, 192]
    for a, b in zip(plain, grouped, strict=True):
        assert a.get("train_return_ma20") == b.get("train_return_ma20")
        assert a["policy_loss"] == pytest.approx(b["policy_loss"], abs=1e-6)
    for name in ("actor", "critic"):
        a, b = (load_file(str(tmp_path / run / "checkpoints" / "step_00000192" / f"{name}.safetensors"))
                for run in ("plain", "group"))  # fmt: skip
        for key, x in a.items():
            torch.testing.assert_close(x, b[key], atol=1e-6, rtol=1e-6)
    summary = json.loads((tmp_path / "group" / "summary.json").read_text())
    assert summary["env_steps"] == 192


@pytest.mark.parametrize("algo", ["reinforce", "a2c", "trpo", "prefs"])
def test_other_algorithms_refuse_torchrun(monkeypatch, tmp_path, algo):
    from postrl.control.loop import algorithm

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserError, match="only ppo runs under torchrun"):
        train_from_config(algorithm(algo).config(), tmp_path)
    assert not (tmp_path / "metrics.jsonl").exists()


def test_resume_needs_the_same_world_size(tmp_path):
    with pytest.raises(UserError, match="written by 2 process"):
        ranks.restore_rank(tmp_path, {"world_size": 2}, env=None)
