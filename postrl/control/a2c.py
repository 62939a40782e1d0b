"""Advantage actor–critic, synchronous (A2C; Mnih et al. 2016, arXiv:1602.01783, without the asynchrony).

Each iteration collects ``n_steps`` transitions from each of ``n_envs`` envs, forms targets for the critic
and advantages for the actor from the stored (detached) values, and takes ONE gradient step on

    L = −mean[ log π(a_t|s_t) · A_t ] + vf_coef · ½ mean[(V(s_t) − R̂_t)²] − ent_coef · H[π]

The target R̂ is chosen from ``TARGETS``:
- ``one_step``: R̂_t = r_t + γ(1 − term_t)V(s_{t+1}) and A_t = δ_t, the TD error (the notes' actor–critic);
- ``n_step``:   R̂_t = r_t + γ r_{t+1} + … + γ^k V(s_{t+k}) up to the rollout's end (A2C as published);
- ``gae``:      GAE(λ) (Schulman et al. 2016).
Terminal steps never bootstrap; truncated ones bootstrap from V(final obs) (see ``buffer.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from postrl.control.buffer import Batch, RolloutBuffer, collect_rollout
from postrl.control.envs import EnvConfig, VecEnv
from postrl.control.fast.numpy_actor import use_numpy_actor
from postrl.control.loop import ControlRunConfig, Learner
from postrl.control.policies import Critic, PolicyConfig, make_actor
from postrl.core import gae, masked_whiten, reinforce_loss, td_errors, value_loss
from postrl.runtime.config import ConfigError

__all__ = ["A2CConfig", "ControlA2CConfig", "TARGETS", "a2c_loss", "build_a2c"]


@dataclass(frozen=True)
class A2CConfig:
    n_steps: int = 5
    """Steps per env in each rollout (one gradient step per rollout)."""
    target: str = "n_step"
    """Critic target / advantage: one_step (TD error), n_step (to the rollout's end) or gae."""
    gamma: float = 0.99
    """Discount γ."""
    lam: float = 0.95
    """GAE λ (target=gae only)."""
    lr: float = 7e-4
    """Learning rate."""
    anneal_lr: bool = False
    """Anneal the learning rate linearly to 0 over the run."""
    optimizer: str = "rmsprop"
    """rmsprop (α 0.99, ε 1e-5, as A2C in OpenAI baselines / SB3) or adam."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Weight of the value loss (which already holds the ½)."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    normalize_advantages: bool = False
    """Whiten the advantages of each rollout."""

    CHECKS = {  # valid ranges (postrl.runtime.config.validate)
        "n_steps": ">= 1",
        "gamma": "[0, 1]",
        "lam": "[0, 1]",
        "lr": "> 0",
        "ent_coef": ">= 0",
        "vf_coef": ">= 0",
        "max_grad_norm": "> 0",
    }


@dataclass(frozen=True)
class ControlA2CConfig:
    """A ``postrl control train --algo a2c`` run, as its config.yaml holds it: env, networks, run and
    the A2C section."""

    algo: str = "a2c"
    """Algorithm name (fixed for this config class)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Environment settings."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """Actor and critic networks."""
    run: ControlRunConfig = field(default_factory=lambda: ControlRunConfig(save_every=1000, log_every=50))
    """Budget, seed, logging, evaluation and checkpoints."""
    a2c: A2CConfig = field(default_factory=A2CConfig)
    """A2C hyperparameters."""


def _one_step(buf: RolloutBuffer, cfg: A2CConfig) -> tuple[torch.Tensor, torch.Tensor]:
    advantages = td_errors(buf.rewards, buf.values, buf.next_values(), buf.terminated, cfg.gamma)
    return advantages, advantages + buf.values  # R̂ = r + γ(1 − term)V(s') = δ + V(s)


def _n_step(buf: RolloutBuffer, cfg: A2CConfig) -> tuple[torch.Tensor, torch.Tensor]:
    # GAE with λ = 1 is exactly the n-step return to the rollout's end, minus V(s_t).
    return gae(buf.rewards, buf.values, buf.next_values(), buf.terminated, buf.episode_end, cfg.gamma, 1.0)


def _gae(buf: RolloutBuffer, cfg: A2CConfig) -> tuple[torch.Tensor, torch.Tensor]:
    return gae(
        buf.rewards, buf.values, buf.next_values(), buf.terminated, buf.episode_end, cfg.gamma, cfg.lam
    )


TARGETS: dict[str, Callable[[RolloutBuffer, A2CConfig], tuple[torch.Tensor, torch.Tensor]]] = {
    "one_step": _one_step,
    "n_step": _n_step,
    "gae": _gae,
}
OPTIMIZERS = {
    "rmsprop": lambda params, lr: torch.optim.RMSprop(params, lr=lr, alpha=0.99, eps=1e-5, foreach=True),
    "adam": lambda params, lr: torch.optim.Adam(params, lr=lr, eps=1e-5, foreach=True),
}


def a2c_loss(
    actor: nn.Module, critic: nn.Module, batch: Batch, cfg: A2CConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Policy-gradient loss with detached advantages + vf_coef · value loss − ent_coef · entropy."""
    log_probs, entropy = actor.evaluate(batch.obs, batch.actions)
    pg_loss = reinforce_loss(log_probs, batch.advantages)
    v_loss = value_loss(critic(batch.obs), batch.returns)
    entropy = entropy.mean()
    loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy
    return loss, {"policy_loss": pg_loss.detach(), "value_loss": v_loss.detach(), "entropy": entropy.detach()}


class A2C(Learner):
    def __init__(self, cfg: ControlA2CConfig, env: VecEnv):
        self.cfg = cfg.a2c
        for key, table in (("target", TARGETS), ("optimizer", OPTIMIZERS)):
            if getattr(self.cfg, key) not in table:
                raise ConfigError(f"a2c.{key}: {getattr(self.cfg, key)!r} is not one of {', '.join(table)}")
        self.actor = make_actor(env.single_observation_space, env.single_action_space, cfg.policy)
        self.critic = Critic(env.single_observation_space.shape[0], cfg.policy)
        self.params = [*self.actor.parameters(), *self.critic.parameters()]
        self.optimizer = OPTIMIZERS[self.cfg.optimizer](self.params, self.cfg.lr)
        self.buffer = RolloutBuffer(env, self.cfg.n_steps)
        self.numpy_actor = use_numpy_actor(self.actor, "a2c")
        self.modules = {"actor": self.actor, "critic": self.critic}
        self.optimizers = {"optimizer": self.optimizer}

    def iteration(self, env: VecEnv, it: int, frac_done: float) -> tuple[dict, list, int]:
        cfg, buf = self.cfg, self.buffer
        lr = cfg.lr * (1.0 - frac_done) if cfg.anneal_lr else cfg.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        episodes = collect_rollout(env, self.actor, self.critic, buf, self.numpy_actor)
        advantages, returns = TARGETS[cfg.target](buf, cfg)
        if cfg.normalize_advantages:
            advantages = masked_whiten(advantages, torch.ones_like(advantages))
        batch = buf.flatten(advantages.detach(), returns.detach())
        loss, metrics = a2c_loss(self.actor, self.critic, batch, cfg)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm, foreach=True)
        self.optimizer.step()
        return {**{k: float(v) for k, v in metrics.items()}, "lr": lr}, episodes, buf.n_envs * buf.n_steps


def build_a2c(cfg: ControlA2CConfig, env: VecEnv) -> A2C:
    return A2C(cfg, env)
