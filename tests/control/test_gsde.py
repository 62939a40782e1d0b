"""gSDE (policy.use_sde, postrl.control.policies.GSDEActor) against its definition (Raffin et al. 2021)."""

import logging
import math
import shutil

import gymnasium as gym
import numpy as np
import pytest
import torch

from postrl.control import ppo, reinforce, trpo
from postrl.control.buffer import RolloutBuffer, collect_rollout
from postrl.control.envs import VecEnv
from postrl.control.fast.numpy_actor import numpy_actor_refusal
from postrl.control.fast.ppo_step import use_fused
from postrl.control.loop import train_from_config
from postrl.control.policies import GaussianActor, GSDEActor, PolicyConfig, make_actor
from postrl.runtime.config import ConfigError, load_config

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)


def _actor(freq=-1, log_std_init=-0.5, hidden=(8, 5)) -> GSDEActor:
    torch.manual_seed(0)
    actor = make_actor(
        OBS, ACT, PolicyConfig(hidden=hidden, use_sde=True, sde_sample_freq=freq, log_std_init=log_std_init)
    )
    with torch.no_grad():  # a log σ matrix with distinct entries, so that a transposed product would differ
        actor.log_std.add_(0.1 * torch.randn_like(actor.log_std))
    return actor


def _features(actor: GSDEActor, obs: torch.Tensor) -> torch.Tensor:
    """The last hidden layer written out: tanh(W2 tanh(W1 s + b1) + b2)."""
    l1, l2, _ = actor.net.layers
    return torch.tanh(l2(torch.tanh(l1(obs))))


def test_make_actor_builds_gsde_only_when_asked():
    assert type(make_actor(OBS, ACT, PolicyConfig())) is GaussianActor
    actor = _actor()
    assert actor.log_std.shape == (5, 2)  # [features = last hidden width, actions]
    with pytest.raises(ConfigError, match="policy.use_sde"):
        make_actor(OBS, gym.spaces.Discrete(3), PolicyConfig(use_sde=True))


def test_log_prob_is_the_gaussian_with_state_dependent_variance():
    actor = _actor()
    obs = torch.randn(6, 3)
    actor.reset_noise(6)
    with torch.no_grad():
        actions, log_probs = actor.act(obs)
        f = _features(actor, obs)
        mean = actor.net(obs)
        sigma2 = torch.exp(actor.log_std) ** 2  # [F, A]
        var = torch.stack([(f[i, :, None] ** 2 * sigma2).sum(0) for i in range(6)]) + 1e-6
        expected = torch.distributions.Normal(mean, var.sqrt()).log_prob(actions).sum(-1)
        hand = -0.5 * (((actions - mean) ** 2 / var) + torch.log(2 * math.pi * var)).sum(-1)
    torch.testing.assert_close(log_probs, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(log_probs, hand, rtol=1e-5, atol=1e-5)
    evaluated, entropy = actor.evaluate(obs, actions)
    torch.testing.assert_close(evaluated.detach(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        entropy.detach(), torch.distributions.Normal(mean, var.sqrt()).entropy().sum(-1), rtol=1e-5, atol=1e-5
    )


def test_noise_is_features_times_the_envs_weights_and_stays_until_resampled():
    actor = _actor()
    actor.reset_noise(4)
    eps = actor.exploration.clone()
    assert eps.shape == (4, 5, 2)
    for _ in range(2):  # two different states, the same ε_e
        obs = torch.randn(4, 3)
        with torch.no_grad():
            actions, _ = actor.act(obs)
            f, mean = _features(actor, obs), actor.net(obs)
        for e in range(4):
            torch.testing.assert_close(actions[e] - mean[e], f[e] @ eps[e], rtol=1e-5, atol=1e-6)
        assert torch.equal(actor.exploration, eps)
    actor.reset_noise(4)
    assert not torch.equal(actor.exploration, eps)


def test_weights_are_drawn_from_n_0_sigma2():
    actor = _actor(log_std_init=-1.0, hidden=(4,))
    with torch.no_grad():
        actor.log_std.fill_(-1.0)
    torch.manual_seed(3)
    actor.reset_noise(20_000)
    std = actor.exploration.std(dim=0)
    torch.testing.assert_close(std, torch.full_like(std, math.exp(-1.0)), rtol=0.03, atol=0.0)


def test_deterministic_action_is_the_mean():
    actor = _actor()
    obs = torch.randn(5, 3)
    actions, log_probs = actor.act(obs, deterministic=True)
    torch.testing.assert_close(actions, actor.net(obs).detach())
    assert torch.isfinite(log_probs).all()


def test_gradient_reaches_log_sigma_but_not_the_features_through_the_variance():
    actor = _actor()
    obs, actions = torch.randn(7, 3), torch.randn(7, 2)
    log_probs, _ = actor.evaluate(obs, actions)
    log_probs.sum().backward()
    assert actor.log_std.grad is not None and actor.log_std.grad.abs().sum() > 0
    # the hidden layers learn through μ only (f(s) detached in σ(s), SB3's learn_features=False):
    # the same gradient as a loss on μ alone with σ(s) held fixed
    grads = [p.grad.clone() for p in actor.net.parameters()]
    actor.zero_grad()
    f, mean = actor.features_and_mean(obs)
    std = actor.std_of(f).detach()
    torch.distributions.Normal(mean, std).log_prob(actions).sum().backward()
    for g, p in zip(grads, actor.net.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad)


def test_kl_is_zero_to_itself_and_positive_after_a_change():
    actor = _actor()
    obs = torch.randn(9, 3)
    old = tuple(p.detach() for p in actor.dist_params(obs))
    torch.testing.assert_close(actor.kl(old, obs), torch.zeros(9), atol=1e-6, rtol=0)
    with torch.no_grad():
        actor.log_std.add_(0.3)
    assert (actor.kl(old, obs) > 0).all()


class _Counting(GSDEActor):
    draws = 0

    def reset_noise(self, n_envs, generator=None):
        type(self).draws += 1
        super().reset_noise(n_envs, generator)


@pytest.mark.parametrize(("freq", "draws"), [(-1, 1), (0, 1), (4, 3), (1, 10)])
def test_rollout_draws_at_its_start_and_every_sde_sample_freq_steps(freq, draws):
    cfg = load_config(
        ppo.ControlPPOConfig, None, ["env.id=Pendulum-v1", "env.n_envs=2", "policy.use_sde=true"]
    )
    env = VecEnv(cfg.env, 0)
    env.reset()
    _Counting.draws = 0
    actor = _Counting(3, 1, PolicyConfig(hidden=(8, 8), use_sde=True, sde_sample_freq=freq))
    buf = RolloutBuffer(env, 10)
    collect_rollout(env, actor, None, buf)
    assert _Counting.draws == draws  # t = 0 and every freq steps: freq 4 → t = 0, 4, 8
    env.close()


def test_ppo_auto_takes_autograd_and_says_why_fused_refuses(caplog):
    cfg = load_config(ppo.ControlPPOConfig, "ppo-pendulum", ["policy.use_sde=true", "env.n_envs=2"])
    env = VecEnv(cfg.env, 0)
    with caplog.at_level(logging.INFO):
        agent = ppo.build_ppo(cfg, env)
    assert agent.fused is False
    assert "gSDE" in caplog.text and "autograd" in caplog.text
    assert "gSDE" in numpy_actor_refusal(agent.actor)
    fused = load_config(ppo.ControlPPOConfig, "ppo-pendulum", ["policy.use_sde=true", "ppo.backend=fused"])
    with pytest.raises(ConfigError, match="gSDE"):
        use_fused(fused.ppo.backend, agent.actor, agent.critic)
    env.close()


def test_reinforce_refuses_gsde():
    cfg = load_config(reinforce.ControlReinforceConfig, None, ["env.id=Pendulum-v1", "policy.use_sde=true"])
    with pytest.raises(ConfigError, match="use_sde"):
        reinforce.build_reinforce(cfg, VecEnv(cfg.env, 0))


@pytest.mark.parametrize("algo", [ppo, trpo])
def test_gsde_run_resumes_bit_exactly(tmp_path, algo):
    """ε is drawn from the checkpointed torch RNG at every rollout start, so a resume changes nothing."""
    keys = ["env.id=Pendulum-v1", "env.n_envs=2", "policy.use_sde=true", "policy.sde_sample_freq=4"]
    keys += ["policy.hidden=[16,16]", "run.steps=192", "run.eval_episodes=1", "run.save_every=1"]
    keys += ["run.keep_last=10"]
    keys += ["ppo.n_steps=32", "ppo.batch_size=32", "ppo.epochs=2"] if algo is ppo else ["trpo.n_steps=32"]
    cfg = load_config(ppo.ControlPPOConfig if algo is ppo else trpo.ControlTRPOConfig, None, keys)
    train_from_config(cfg, tmp_path / "a")
    ckpts = tmp_path / "a" / "checkpoints"
    final = (ckpts / "step_00000192" / "actor.safetensors").read_bytes()
    for step in sorted(ckpts.glob("step_*"))[2:]:  # keep steps 64 and 128 of 64, 128, 192
        shutil.rmtree(step)
    (tmp_path / "a" / "summary.json").unlink()
    train_from_config(cfg, tmp_path / "a", resume=True)
    assert (ckpts / "step_00000192" / "actor.safetensors").read_bytes() == final
