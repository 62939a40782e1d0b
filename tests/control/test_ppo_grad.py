"""The hand-written PPO minibatch gradient (`postrl.control.ppo_grad`) equals autograd through `ppo_loss`."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch

from postrl.control import ppo_grad
from postrl.control.buffer import Batch
from postrl.control.policies import Critic, NumpyActor, PolicyConfig, make_actor
from postrl.control.ppo import PPOConfig, ppo_loss

N = 64


def setup(discrete: bool, activation: str, seed: int = 0):
    torch.manual_seed(seed)
    cfg = PolicyConfig(hidden=(16, 8), activation=activation, log_std_init=-0.3)
    obs_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    act_space = gym.spaces.Discrete(3) if discrete else gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    actor, critic = make_actor(obs_space, act_space, cfg), Critic(3, cfg)
    for p in [*actor.parameters(), *critic.parameters()]:  # away from the init's 0.01 head and zero biases
        p.data += 0.3 * torch.randn_like(p)
    obs = torch.randn(N, 3)
    with torch.no_grad():
        actions, log_probs = actor.act(obs)
        values = critic(obs)
    batch = Batch(
        obs,
        actions,
        log_probs + 0.4 * torch.randn(N),  # an older policy: ratios far enough from 1 that clipping binds
        values + 0.5 * torch.randn(N),
        torch.randn(N),
        values + torch.randn(N),
    )
    return actor, critic, batch


def gradients(actor, critic) -> list[torch.Tensor]:
    return [p.grad.clone() for p in [*actor.parameters(), *critic.parameters()]]


@pytest.mark.parametrize("activation", ["tanh", "relu", "elu"])
@pytest.mark.parametrize("discrete", [True, False])
@pytest.mark.parametrize("ent_coef", [0.0, 0.05])
@pytest.mark.parametrize("clip_vf", [None, 0.2])
def test_hand_gradient_equals_autograd(discrete, activation, ent_coef, clip_vf):
    actor, critic, batch = setup(discrete, activation)
    cfg = dataclasses.replace(PPOConfig(), ent_coef=ent_coef, clip_vf=clip_vf, vf_coef=0.7)
    loss, ref_stats = ppo_loss(actor, critic, batch, cfg, clip_eps=0.2)
    loss.backward()
    ref = gradients(actor, critic)
    stats = ppo_grad.minibatch_gradient(actor, critic, batch, 0.2, cfg.vf_coef, ent_coef, clip_vf)
    assert 0 < float(stats["clip_fraction"]) < 1  # both branches of the clipped surrogate are exercised
    for got, want in zip(gradients(actor, critic), ref, strict=True):
        assert torch.allclose(got, want, atol=1e-6, rtol=1e-5), (got - want).abs().max()
    assert stats.keys() == ref_stats.keys()
    for key in stats:
        assert torch.allclose(stats[key], ref_stats[key], atol=1e-6), key


def test_hand_gradient_replaces_the_old_gradient():
    actor, critic, batch = setup(True, "tanh")
    ppo_grad.minibatch_gradient(actor, critic, batch, 0.2, 0.5, 0.0, None)
    first = gradients(actor, critic)
    ppo_grad.minibatch_gradient(actor, critic, batch, 0.2, 0.5, 0.0, None)  # not accumulated
    assert all(torch.equal(a, b) for a, b in zip(first, gradients(actor, critic), strict=True))


def test_supported_only_for_postrl_mlps():
    """A subclass may change the forward that the hand gradient and the numpy actor copy: autograd then."""
    actor, critic, _ = setup(True, "tanh")
    assert ppo_grad.supported(actor, critic) and NumpyActor.supports(actor)
    assert not ppo_grad.supported(actor, torch.nn.Linear(3, 1))

    class Tempered(type(actor)):
        def evaluate(self, obs, actions, with_entropy=True):
            return super().evaluate(obs / 2, actions, with_entropy)

    actor.__class__ = Tempered
    assert not ppo_grad.supported(actor, critic) and not NumpyActor.supports(actor)
