"""Each algorithm: its targets/weights against hand-computed values, and a short run that must learn."""

import numpy as np
import pytest
import torch

from postrl.control import a2c, ppo, reinforce, trpo
from postrl.control.buffer import collect_rollout
from postrl.control.envs import VecEnv
from postrl.control.loop import train_from_config
from postrl.runtime.config import load_config

RANDOM_CARTPOLE = 22.0  # mean return of the uniform random policy on CartPole-v1


def test_reinforce_weights_by_hand():
    ep = reinforce.Episodes(
        obs=torch.zeros(1, 3, 1),
        actions=torch.zeros(1, 3, dtype=torch.long),
        rewards=torch.tensor([[1.0, 2.0, 0.0]]),  # 2 real steps + padding
        mask=torch.tensor([[True, True, False]]),
        terminated=torch.tensor([True]),
    )
    cfg = reinforce.ReinforceConfig(gamma=0.5, gamma_t_weights=True)
    weights, returns = reinforce.policy_gradient_weights(ep, cfg, None)
    # G_1 = 2, G_0 = 1 + 0.5·2 = 2; weights γ^t G_t = [2, 0.5·2]
    assert returns[0, :2].tolist() == [2.0, 2.0]
    assert weights[0].tolist() == [2.0, 1.0, 0.0]

    class Half(torch.nn.Module):
        def forward(self, obs):
            return torch.full(obs.shape[:-1], 0.5)

    no_discount = reinforce.ReinforceConfig(gamma=0.5, gamma_t_weights=False)
    weights, _ = reinforce.policy_gradient_weights(ep, no_discount, Half())
    assert weights[0].tolist() == [1.5, 1.5, 0.0]  # G − b


def test_a2c_targets_one_step_and_n_step():
    cfg = load_config(a2c.ControlA2CConfig, None, ["env.n_envs=2", "a2c.n_steps=6"])
    env = VecEnv(cfg.env, 0)
    env.reset()
    agent = a2c.build_a2c(cfg, env)
    buf = agent.buffer
    collect_rollout(env, agent.actor, agent.critic, buf)
    adv, ret = a2c.TARGETS["one_step"](buf, cfg.a2c)
    nonterm = ~buf.terminated
    expected = buf.rewards + 0.99 * nonterm * buf.next_values()
    torch.testing.assert_close(ret, expected)
    torch.testing.assert_close(adv, expected - buf.values)
    _, ret_n = a2c.TARGETS["n_step"](buf, cfg.a2c)
    # last step: n-step and one-step targets coincide
    torch.testing.assert_close(ret_n[:, -1], expected[:, -1])


def test_trpo_step_stays_in_the_trust_region_and_improves_the_surrogate():
    torch.manual_seed(0)
    cfg = load_config(trpo.ControlTRPOConfig, None, ["env.n_envs=2", "trpo.n_steps=256", "trpo.max_kl=0.005"])
    env = VecEnv(cfg.env, 0)
    env.reset()
    agent = trpo.build_trpo(cfg, env)
    metrics, _, _ = agent.iteration(env, 0, 0.0)
    assert metrics["step_accepted"] == 1.0
    assert 0 < metrics["kl"] <= 0.005
    assert metrics["surrogate_improvement"] > 0


def _quick(config_class, overrides, tmp_path):
    cfg = load_config(config_class, None, ["run.eval_episodes=10", "run.save_every=0", *overrides])
    return train_from_config(cfg, tmp_path / "run")


@pytest.mark.parametrize(
    ("config_class", "overrides"),
    [
        (reinforce.ControlReinforceConfig, ["run.steps=6000", "reinforce.lr=0.005"]),
        (a2c.ControlA2CConfig, ["run.steps=10000", "a2c.optimizer=adam", "a2c.lr=0.002"]),
        (
            trpo.ControlTRPOConfig,
            ["run.steps=6144", "env.n_envs=2", "trpo.n_steps=512", "trpo.critic_epochs=5"],
        ),
    ],
    ids=["reinforce", "a2c", "trpo"],
)
def test_short_runs_beat_the_random_policy(config_class, overrides, tmp_path):
    summary = _quick(config_class, overrides, tmp_path)
    assert summary["train_return_ma20"] > 2 * RANDOM_CARTPOLE, summary


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ppo_zoo_preset_solves_cartpole(seed, tmp_path):
    from postrl.control.commands import control_preset_path

    cfg = load_config(ppo.ControlPPOConfig, control_preset_path("ppo", "CartPole-v1"), [f"run.seed={seed}"])
    summary = train_from_config(cfg, tmp_path / "run")
    assert summary["eval_return_mean"] >= 475


def test_reinforce_rejects_normalisation():
    from postrl.runtime.config import ConfigError

    cfg = load_config(reinforce.ControlReinforceConfig, None, ["env.normalize_obs=true", "env.n_envs=1"])
    with pytest.raises(ConfigError, match="normalize"):
        reinforce.build_reinforce(cfg, VecEnv(cfg.env, 0))


def test_pendulum_gaussian_agent_runs(tmp_path):
    summary = _quick(
        ppo.ControlPPOConfig,
        [
            "env.id=Pendulum-v1",
            "env.n_envs=2",
            "ppo.n_steps=64",
            "run.steps=256",
            "env.normalize_obs=true",
        ],
        tmp_path,
    )
    assert np.isfinite(summary["eval_return_mean"])
