"""Trust Region Policy Optimization (Schulman et al. 2015, arXiv:1502.05477) with a GAE critic.

One iteration:
1. collect ``n_steps`` steps from each env; GAE advantages and λ-returns (``postrl.core.gae``);
2. natural-gradient step on the surrogate L(θ) = mean[ π_θ(a|s)/π_old(a|s) · A ]:
   g = ∇L, solve F x = g by conjugate gradient with Fisher-vector products F v = ∇(∇KL̄ · v) + damping·v
   (KL̄ = mean_s KL(π_old ‖ π_θ), its Hessian at θ_old is the Fisher matrix), scale to the trust region,
   β = √(2δ / xᵀFx), and backtrack along βx until the surrogate really improves (a fraction
   ``accept_ratio`` of the linear prediction) and KL̄ ≤ δ (``postrl.core.backtracking_line_search``);
3. fit the critic to the λ-returns with a few epochs of Adam minibatches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from postrl.control.buffer import Batch, RolloutBuffer, collect_rollout
from postrl.control.envs import EnvConfig, VecEnv
from postrl.control.fast.numpy_actor import use_numpy_actor
from postrl.control.loop import ControlRunConfig, Learner
from postrl.control.policies import Critic, PolicyConfig, make_actor
from postrl.core import (
    backtracking_line_search,
    conjugate_gradient,
    flat_grad,
    flat_params,
    gae,
    masked_whiten,
    ppo_clip_loss,
    set_flat_params,
    value_loss,
)

__all__ = ["ControlTRPOConfig", "TRPOConfig", "build_trpo", "surrogate_loss"]


@dataclass(frozen=True)
class TRPOConfig:
    n_steps: int = 1024
    """Steps per env in each rollout."""
    gamma: float = 0.99
    """Discount γ."""
    lam: float = 0.98
    """GAE λ."""
    max_kl: float = 0.01
    """Trust-region size δ: the mean KL(π_old ‖ π) a step may reach."""
    cg_iters: int = 10
    """Conjugate-gradient iterations."""
    cg_damping: float = 0.1
    """Damping added to the Fisher-vector product (F + damping·I)."""
    max_backtracks: int = 10
    """Line-search halvings before the step is rejected."""
    accept_ratio: float = 0.1
    """Minimum ratio of actual to predicted surrogate improvement."""
    normalize_advantages: bool = True
    """Whiten the advantages of each rollout."""
    critic_lr: float = 1e-3
    """Adam learning rate of the critic."""
    critic_epochs: int = 10
    """Passes of critic regression over the rollout per iteration."""
    critic_batch_size: int = 128
    """Minibatch size of the critic regression."""

    CHECKS = {  # valid ranges (postrl.runtime.config.validate)
        "n_steps": ">= 1",
        "gamma": "[0, 1]",
        "lam": "[0, 1]",
        "max_kl": "> 0",
        "cg_iters": ">= 1",
        "cg_damping": ">= 0",
        "max_backtracks": ">= 0",
        "accept_ratio": "[0, 1]",
        "critic_lr": "> 0",
        "critic_epochs": ">= 0",
        "critic_batch_size": ">= 1",
    }


@dataclass(frozen=True)
class ControlTRPOConfig:
    """A ``postrl control train --algo trpo`` run, as its config.yaml holds it: env, networks, run and
    the TRPO section."""

    algo: str = "trpo"
    """Algorithm name (fixed for this config class)."""
    env: EnvConfig = field(default_factory=lambda: EnvConfig(n_envs=2))
    """Environment settings."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """Actor and critic networks."""
    run: ControlRunConfig = field(default_factory=lambda: ControlRunConfig(save_every=10))
    """Budget, seed, logging, evaluation and checkpoints."""
    trpo: TRPOConfig = field(default_factory=TRPOConfig)
    """TRPO hyperparameters."""


def surrogate_loss(actor: nn.Module, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """−L(θ) = −mean[ρ A], TRPO's importance-sampled surrogate, negated into a loss.

    It is PPO's clipped surrogate with ε = ∞ (no clipping), so the math stays in ``postrl.core``.
    """
    log_probs, _ = actor.evaluate(batch.obs, batch.actions)
    return ppo_clip_loss(log_probs, batch.log_probs, batch.advantages, math.inf)


class TRPO(Learner):
    def __init__(self, cfg: ControlTRPOConfig, env: VecEnv):
        self.cfg = cfg.trpo
        self.actor = make_actor(env.single_observation_space, env.single_action_space, cfg.policy)
        self.critic = Critic(env.single_observation_space.shape[0], cfg.policy)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=self.cfg.critic_lr, eps=1e-5)
        self.buffer = RolloutBuffer(env, self.cfg.n_steps)
        self.numpy_actor = use_numpy_actor(self.actor, "trpo")
        self.modules = {"actor": self.actor, "critic": self.critic}
        self.optimizers = {"critic": self.critic_opt}

    def iteration(self, env: VecEnv, it: int, frac_done: float) -> tuple[dict, list, int]:
        cfg, buf = self.cfg, self.buffer
        episodes = collect_rollout(env, self.actor, self.critic, buf, self.numpy_actor)
        advantages, returns = gae(
            buf.rewards, buf.values, buf.next_values(), buf.terminated, buf.episode_end, cfg.gamma, cfg.lam
        )
        if cfg.normalize_advantages:
            advantages = masked_whiten(advantages, torch.ones_like(advantages))
        batch = buf.flatten(advantages, returns)
        metrics = self.policy_step(batch)
        metrics["value_loss"] = self.fit_critic(batch)
        return metrics, episodes, buf.n_envs * buf.n_steps

    def policy_step(self, batch: Batch) -> dict[str, float]:
        """One natural-gradient step inside the KL trust region, accepted by backtracking line search."""
        cfg, actor = self.cfg, self.actor
        old_dist = tuple(p.detach() for p in actor.dist_params(batch.obs))
        loss, _ = surrogate_loss(actor, batch)
        grad = flat_grad(loss, actor)  # ∇(−L)

        def fisher_vector_product(v: torch.Tensor) -> torch.Tensor:
            kl = actor.kl(old_dist, batch.obs).mean()
            grad_kl = flat_grad(kl, actor, create_graph=True)
            return flat_grad(grad_kl @ v, actor) + cfg.cg_damping * v

        direction = conjugate_gradient(fisher_vector_product, -grad, cfg.cg_iters)  # ≈ F⁻¹ ∇L
        quad = direction @ fisher_vector_product(direction)  # xᵀFx
        full_step = direction * torch.sqrt(2 * cfg.max_kl / quad.clamp_min(1e-12))
        expected_improve = -(grad @ full_step)  # first-order decrease of −L

        def loss_at(x: torch.Tensor) -> float:
            set_flat_params(actor, x)
            return float(surrogate_loss(actor, batch)[0])

        def within_trust_region(x: torch.Tensor) -> bool:
            set_flat_params(actor, x)
            return float(actor.kl(old_dist, batch.obs).mean()) <= cfg.max_kl

        theta = flat_params(actor)
        accepted, theta_new = backtracking_line_search(
            loss_at,
            theta,
            full_step,
            expected_improve,
            cfg.max_backtracks,
            cfg.accept_ratio,
            constraint=within_trust_region,
        )
        set_flat_params(actor, theta_new)
        with torch.no_grad():
            kl = float(actor.kl(old_dist, batch.obs).mean())
            new_loss = float(surrogate_loss(actor, batch)[0])
        return {
            "surrogate_improvement": float(loss.detach()) - new_loss,
            "expected_improvement": float(expected_improve),
            "kl": kl,
            "step_accepted": float(accepted),
        }

    def fit_critic(self, batch: Batch) -> float:
        cfg, n = self.cfg, len(batch)
        for _ in range(cfg.critic_epochs):
            order = torch.randperm(n)
            for start in range(0, n, cfg.critic_batch_size):
                idx = order[start : start + cfg.critic_batch_size]
                loss = value_loss(self.critic(batch.obs[idx]), batch.returns[idx])
                self.critic_opt.zero_grad(set_to_none=True)
                loss.backward()
                self.critic_opt.step()
        return float(loss.detach())


def build_trpo(cfg: ControlTRPOConfig, env: VecEnv) -> TRPO:
    return TRPO(cfg, env)
