"""PPO's fused path (`postrl.control.fast`: the hand-written minibatch gradient, the numpy actor) equals the
reference path (autograd through `ppo_actor_critic_loss`, ``actor.act``), and ``ppo.backend`` chooses between them."""

from __future__ import annotations

import dataclasses
import logging

import gymnasium as gym
import numpy as np
import pytest
import torch

from postrl.control import ppo
from postrl.control.buffer import Batch, collect_rollout
from postrl.control.envs import VecEnv
from postrl.control.fast import numpy_actor, ppo_grad, ppo_step
from postrl.control.policies import Critic, PolicyConfig, make_actor
from postrl.control.ppo import PPOHyperparams, ppo_actor_critic_loss
from postrl.core import gae
from postrl.runtime.config import ConfigError, load_config

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
@pytest.mark.parametrize("vf_clip", [None, 0.2])
def test_hand_gradient_equals_autograd(discrete, activation, ent_coef, vf_clip):
    actor, critic, batch = setup(discrete, activation)
    cfg = dataclasses.replace(PPOHyperparams(), ent_coef=ent_coef, vf_clip=vf_clip, vf_coef=0.7)
    loss, ref_stats = ppo_actor_critic_loss(actor, critic, batch, cfg, clip_eps=0.2)
    loss.backward()
    ref = gradients(actor, critic)
    stats = ppo_grad.minibatch_gradient(actor, critic, batch, 0.2, cfg.vf_coef, ent_coef, vf_clip)
    assert 0 < float(stats["clip_fraction"]) < 1  # both branches of the clipped surrogate are exercised
    for got, want in zip(gradients(actor, critic), ref, strict=True):
        assert torch.allclose(got, want, atol=1e-6, rtol=1e-5), (got - want).abs().max()
    assert stats.keys() == ref_stats.keys()
    for key in stats:
        assert torch.allclose(stats[key], ref_stats[key], atol=1e-6), key


@pytest.mark.parametrize("tanh_via_sigmoid", [True, False])
def test_both_ways_of_computing_tanh_give_autograds_gradient(tanh_via_sigmoid):
    """The forward's tanh as 2σ(2u) − 1 (AMD CPUs) or torch's tanh (elsewhere): the same gradient either way."""
    actor, critic, batch = setup(True, "tanh")
    cfg = dataclasses.replace(PPOHyperparams(), ent_coef=0.05, vf_coef=0.7)
    ppo_actor_critic_loss(actor, critic, batch, cfg, clip_eps=0.2)[0].backward()
    ref = gradients(actor, critic)
    gradient = ppo_grad.HandGradient(actor, critic, tanh_via_sigmoid=tanh_via_sigmoid)
    assert gradient.actor_net.via_sigmoid is tanh_via_sigmoid
    gradient(gradient.prepare(batch), 0.2, cfg.vf_coef, cfg.ent_coef, None)
    for got, want in zip(gradients(actor, critic), ref, strict=True):
        assert torch.allclose(got, want, atol=1e-6, rtol=1e-5), (got - want).abs().max()


@pytest.mark.parametrize("discrete", [True, False])
def test_the_fused_step_builds_no_graph_in_grad_mode(discrete):
    """It reads detached views of the parameters (no torch.no_grad() per call): in grad mode nothing it returns
    or writes carries a graph, and the step is the one taken under no_grad."""
    steps = []
    for grad_mode in (True, False):
        actor, critic, batch = setup(discrete, "tanh")
        step = ppo_step.FusedStep(
            actor, critic, lr=1e-2, adam_eps=1e-5, max_grad_norm=0.5, vf_coef=0.5, ent_coef=0.01, vf_clip=None
        )
        with torch.set_grad_enabled(grad_mode):
            stats = step(batch, 0.2)
        assert stats.grad_fn is None and not stats.requires_grad
        assert step.flat.param.grad.grad_fn is None and step.flat.param.requires_grad
        steps.append((stats, step.flat.param.detach().clone()))
    assert torch.equal(steps[0][0], steps[1][0]) and torch.equal(steps[0][1], steps[1][1])


def test_hand_gradient_replaces_the_old_gradient():
    actor, critic, batch = setup(True, "tanh")
    ppo_grad.minibatch_gradient(actor, critic, batch, 0.2, 0.5, 0.0, None)
    first = gradients(actor, critic)
    ppo_grad.minibatch_gradient(actor, critic, batch, 0.2, 0.5, 0.0, None)  # not accumulated
    assert all(torch.equal(a, b) for a, b in zip(first, gradients(actor, critic), strict=True))


def _tempered(actor):
    """``actor`` turned into an instance of a subclass that changes its forward."""

    class Tempered(type(actor)):
        def evaluate(self, obs, actions, with_entropy=True):
            return super().evaluate(obs / 2, actions, with_entropy)

    actor.__class__ = Tempered
    return actor


def test_the_fused_path_refuses_networks_it_does_not_write_out():
    """A subclass may change the forward that the hand gradient and the numpy actor copy: autograd then."""
    actor, critic, _ = setup(True, "tanh")
    assert ppo_grad.fused_refusal(actor, critic) is None and numpy_actor.numpy_actor_refusal(actor) is None
    assert "Linear" in ppo_grad.fused_refusal(actor, torch.nn.Linear(3, 1))
    _tempered(actor)
    assert "Tempered" in ppo_grad.fused_refusal(
        actor, critic
    ) and "Tempered" in numpy_actor.numpy_actor_refusal(actor)


def test_backend_auto_takes_the_fused_path_for_postrls_mlps_and_says_so(caplog):
    actor, critic, _ = setup(False, "relu")
    with caplog.at_level(logging.INFO, logger="postrl.control.fast.ppo_step"):
        assert ppo_step.use_fused("auto", actor, critic)
        assert ppo_step.use_fused("fused", actor, critic)
        assert not ppo_step.use_fused("autograd", actor, critic)
    auto, fused, autograd = (r.getMessage() for r in caplog.records)
    assert "ppo.backend=auto: the fused path runs" in auto and "fused path runs" in fused
    assert "ppo.backend=autograd" in autograd


def test_backend_auto_refuses_a_custom_actor_and_says_why(caplog):
    actor, critic, _ = setup(True, "tanh")
    _tempered(actor)
    with caplog.at_level(logging.INFO, logger="postrl.control.fast.ppo_step"):
        assert not ppo_step.use_fused("auto", actor, critic)
    (record,) = caplog.records
    assert record.levelno == logging.INFO
    assert "autograd path" in record.getMessage() and "Tempered" in record.getMessage()


def test_backend_fused_on_a_custom_actor_is_a_config_error(monkeypatch):
    """At build, before the run folder is touched: the message names the key and the reason."""
    with pytest.raises(ConfigError, match=r"'ppo.backend' is fused, but the actor is a .*Tempered"):
        ppo_step.use_fused("fused", _tempered(setup(True, "tanh")[0]), setup(True, "tanh")[1])
    monkeypatch.setattr(ppo, "make_actor", lambda *args: _tempered(make_actor(*args)))
    cfg = load_config(ppo.ControlPPOConfig, None, ["env.n_envs=1", "ppo.backend=fused"])
    with pytest.raises(ConfigError, match="Tempered"):
        ppo.build_ppo(cfg, VecEnv(cfg.env, 0))
    cfg = load_config(ppo.ControlPPOConfig, None, ["env.n_envs=1"])  # auto: autograd for the custom actor
    assert not ppo.build_ppo(cfg, VecEnv(cfg.env, 0)).fused


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("overrides", [[], ["ppo.batch_size=16", "ppo.target_kl=1e-6", "ppo.ent_coef=0.01"]])
def test_ppo_update_by_hand_equals_the_update_through_autograd(env_id, overrides):
    """A whole `PPO.update` (20 or 2 epochs, whole-rollout or shuffled minibatches, target-KL stop, the
    statistics it logs): the same parameters and metrics by either backend."""
    base = [f"env.id={env_id}", "env.n_envs=4", "ppo.n_steps=16", *overrides]
    base.append(f"ppo.epochs={20 if not overrides else 3}")
    cfg = load_config(ppo.ControlPPOConfig, None, base)
    env = VecEnv(cfg.env, 0)
    env.reset()
    torch.manual_seed(0)
    by_hand = ppo.build_ppo(load_config(ppo.ControlPPOConfig, None, [*base, "ppo.backend=fused"]), env)
    by_autograd = ppo.build_ppo(load_config(ppo.ControlPPOConfig, None, [*base, "ppo.backend=autograd"]), env)
    assert by_hand.fused and not by_autograd.fused
    for name in ("actor", "critic"):
        by_autograd.modules[name].load_state_dict(by_hand.modules[name].state_dict())
    collect_rollout(env, by_hand.actor, by_hand.critic, by_hand.buffer)
    buf = by_hand.buffer
    advantages, returns = gae(
        buf.rewards, buf.values, buf.next_values(), buf.terminated, buf.episode_end, 0.99, 0.95
    )
    batch = buf.flatten(advantages, returns)
    results = []
    for agent in (by_hand, by_autograd):
        agent.actor.zero_grad(set_to_none=True)  # PPO must re-attach the flat gradient's views
        torch.manual_seed(1)  # the same minibatch shuffles
        results.append(agent.update(batch, clip_eps=0.2))
    (hand, auto) = results
    assert hand.keys() == auto.keys() and hand["epochs"] == auto["epochs"]
    assert hand["epochs"] == (1 if overrides else 20)  # with target_kl, the first epoch's KL stops it
    for key in hand:
        assert hand[key] == pytest.approx(auto[key], rel=1e-4, abs=1e-6), key
    _assert_same_networks(by_hand, by_autograd)


def _assert_same_networks(a, b):
    for name in ("actor", "critic"):
        for (key, got), want in zip(
            a.modules[name].state_dict().items(), b.modules[name].state_dict().values(), strict=True
        ):
            assert torch.allclose(got, want, atol=1e-5, rtol=1e-4), (name, key, (got - want).abs().max())


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_iterations_by_either_backend_agree(env_id):
    """Rollouts (numpy actor vs ``actor.act``), GAE and updates, three iterations: the same episodes and,
    to float32 rounding, the same networks and metrics."""
    runs = {}
    for backend in ("fused", "autograd"):
        overrides = [f"env.id={env_id}", "env.n_envs=4", "ppo.n_steps=32", "ppo.batch_size=64"]
        cfg = load_config(ppo.ControlPPOConfig, None, [*overrides, "ppo.epochs=4", f"ppo.backend={backend}"])
        torch.manual_seed(0)
        env = VecEnv(cfg.env, 0)
        env.reset()
        agent = ppo.build_ppo(cfg, env)
        runs[backend] = agent, [agent.iteration(env, it, it / 3) for it in range(3)]
    (fused, fused_out), (autograd, autograd_out) = runs["fused"], runs["autograd"]
    for (m1, episodes1, n1), (m2, episodes2, n2) in zip(fused_out, autograd_out, strict=True):
        assert n1 == n2 and [e[:1] + e[2:] for e in episodes1] == [e[:1] + e[2:] for e in episodes2]
        assert m1 == pytest.approx(m2, rel=1e-4, abs=1e-6)
    _assert_same_networks(fused, autograd)


def test_the_clip_mask_is_cores():
    """(ρ − clip ρ)·A > 0, the mask the gradient uses, is `clipped_surrogate`'s, at and around the band's
    edges and for A = 0, ±tiny, ±large."""
    from postrl.core import clipped_surrogate

    eps = 0.2
    edges = torch.tensor([0.8, 1.2])
    ratio = torch.cat(
        [edges, torch.nextafter(edges, torch.zeros(2)), torch.nextafter(edges, torch.full((2,), 9.0))]
    )
    ratio = torch.cat([ratio, torch.tensor([0.0, 0.5, 1.0, 1.5, 1e6])])
    advantages = torch.tensor([0.0, 1e-30, -1e-30, 1.0, -1.0, 1e6, -1e6])
    ratio, advantages = (x.reshape(-1) for x in torch.meshgrid(ratio, advantages, indexing="ij"))
    clipped_ratio = ratio.clamp(1 - eps, 1 + eps)
    mask = torch.mul(ratio - clipped_ratio, -advantages) < 0
    assert torch.equal(mask, clipped_surrogate(ratio, advantages, eps)[1])
    assert mask.any() and not mask.all()
