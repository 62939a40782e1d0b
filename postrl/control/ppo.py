"""Proximal Policy Optimization with GAE (Schulman et al. 2017, arXiv:1707.06347).

One iteration: collect ``n_steps`` steps from each of ``n_envs`` envs with π_old, compute GAE advantages
and λ-returns (``postrl.core.gae``), then take ``epochs`` passes of minibatch Adam steps on

    L = L_clip(θ) + vf_coef · L_V(φ) − ent_coef · H[π_θ]

with the implementation details that matter (Engstrom et al. 2020; Huang et al. 2022, "The 37
Implementation Details of PPO"): per-minibatch advantage normalisation, optional value clipping, global
gradient-norm clipping, linear annealing of the learning rate and of ε, Adam ε = 1e-5, and an early stop of
the epochs when the approximate KL passes ``target_kl``. Truncated episodes bootstrap from V(final obs).

Each minibatch step is ``ReferenceStep`` below: the gradient of `ppo_actor_critic_loss` through autograd,
``clip_grad_norm_`` and ``torch.optim.Adam``. ``backend`` may swap in a step that computes the same update
faster for postrl's own MLPs (`postrl.control.fast`, pinned to this one by tests/control/test_ppo_grad.py);
it is chosen once, when PPO is built, and ``auto`` logs which step runs and why the other was refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch
from torch import nn

from postrl.control import ranks
from postrl.control.buffer import Batch, RolloutBuffer, collect_rollout
from postrl.control.envs import EnvConfig, VecEnv
from postrl.control.fast import flat, ppo_step
from postrl.control.loop import ControlRunConfig, Learner
from postrl.control.policies import Critic, PolicyConfig, make_actor
from postrl.core import gae, ppo_clip_loss, value_loss

__all__ = ["ControlPPOConfig", "PPOHyperparams", "build_ppo", "ppo_actor_critic_loss"]


@dataclass(frozen=True)
class PPOHyperparams:
    n_steps: int = 128
    """Steps per env in each rollout (the rollout is n_envs · n_steps transitions)."""
    batch_size: int = 256
    """Minibatch size for the gradient steps."""
    epochs: int = 4
    """Passes over the rollout per iteration."""
    gamma: float = 0.99
    """Discount γ."""
    lam: float = 0.95
    """GAE λ."""
    lr: float = 2.5e-4
    """Adam learning rate (actor and critic)."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly to 0 over the run."""
    clip_eps: float = 0.2
    """Clipping ε of the surrogate ratio."""
    anneal_clip: bool = False
    """Anneal ε linearly to 0 over the run (rl-zoo's lin_0.2)."""
    vf_clip: float | None = None
    """ε of PPO's clipped value loss; null disables value clipping."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Weight of the value loss (which already holds the ½ of ½(V − R̂)²)."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    target_kl: float | None = None
    """Stop the epochs early when the approximate KL(π_old‖π) exceeds this; null: never."""
    normalize_advantages: bool = True
    """Whiten advantages per minibatch."""
    adam_eps: float = 1e-5
    """Adam ε (1e-5 as in the PPO reference implementation)."""
    backend: Literal["auto", "fused", "autograd"] = "auto"
    """How each minibatch step is taken: autograd (ppo_actor_critic_loss, backward, clip_grad_norm_, torch.optim.Adam; the
    rollout's actor in torch), fused (the gradient written out, Adam on one flat tensor and the actor in
    numpy, for postrl's MLP actor and critic: postrl.control.fast; the same numbers to float32 rounding) or
    auto (fused when the networks allow it, else autograd; the choice and the reason are logged at info
    level)."""
    CHECKS = {  # valid ranges (postrl.runtime.config.validate)
        "n_steps": ">= 1",
        "batch_size": ">= 1",
        "epochs": ">= 1",
        "gamma": "[0, 1]",
        "lam": "[0, 1]",
        "lr": "> 0",
        "clip_eps": "> 0",
        "vf_clip": "> 0",
        "ent_coef": ">= 0",
        "vf_coef": ">= 0",
        "max_grad_norm": "> 0",
        "target_kl": "> 0",
        "adam_eps": "> 0",
    }
    RENAMED = {"n_epochs": "epochs", "clip_vf": "vf_clip"}  # old key → new (postrl.runtime.config)


@dataclass(frozen=True)
class ControlPPOConfig:
    """A ``postrl control train --algo ppo`` run, as its config.yaml holds it: env, networks, run and
    the PPO section (``PPOConfig`` is the language-model stage's)."""

    algo: str = "ppo"
    """Algorithm name (fixed for this config class)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Environment settings."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """Actor and critic networks."""
    run: ControlRunConfig = field(default_factory=ControlRunConfig)
    """Budget, seed, logging, evaluation and checkpoints."""
    ppo: PPOHyperparams = field(default_factory=PPOHyperparams)
    """PPO hyperparameters."""


def ppo_actor_critic_loss(
    actor: nn.Module, critic: nn.Module, batch: Batch, cfg: PPOHyperparams, clip_eps: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO objective on one minibatch: clipped surrogate + vf_coef · value loss − ent_coef · entropy.

    ``batch.advantages`` are used as given (``PPOLearner.update`` whitens them per minibatch).
    """
    log_probs, entropy = actor.evaluate(batch.obs, batch.actions, with_entropy=cfg.ent_coef != 0)
    values = critic(batch.obs)
    pg_loss, stats = ppo_clip_loss(log_probs, batch.log_probs, batch.advantages, clip_eps)
    old_values = None if cfg.vf_clip is None else batch.values
    v_loss = value_loss(values, batch.returns, old_values=old_values, clip_eps=cfg.vf_clip)
    loss = pg_loss + cfg.vf_coef * v_loss
    stats = {"policy_loss": pg_loss.detach(), "value_loss": v_loss.detach(), **stats}
    if entropy is not None:  # skipped when ent_coef = 0: it would cost a quarter of the forward pass
        entropy = entropy.mean()
        loss = loss - cfg.ent_coef * entropy
        stats["entropy"] = entropy.detach()
    return loss, stats


class MinibatchStep(Protocol):
    """One gradient step on a minibatch; ``ppo.backend`` chooses which one PPO takes, once, at build time."""

    optimizer: torch.optim.Optimizer
    names: tuple[str, ...]
    """The statistics of the row a step returns, in order."""

    def __call__(self, mb: Batch, clip_eps: float) -> torch.Tensor:
        """Step the actor and critic on ``mb``; return its statistics as a row ``[1, k]``."""


class ReferenceStep:
    """The minibatch step as the notes write it: the gradient of `ppo_actor_critic_loss` through autograd, its mean over
    ranks, the global-norm clip and an Adam step on the actor's and critic's parameters."""

    def __init__(self, actor: nn.Module, critic: nn.Module, cfg: PPOHyperparams):
        self.actor, self.critic, self.cfg = actor, critic, cfg
        self.params = [*actor.parameters(), *critic.parameters()]
        # fused=True: torch's one-kernel Adam, the default per-tensor loop's arithmetic to float32 rounding, and
        # the kernel the fast path runs on the parameters as one tensor
        self.optimizer = torch.optim.Adam(self.params, lr=cfg.lr, eps=cfg.adam_eps, fused=True)
        # a checkpoint of the fast path (and of every PPO run before this step existed) holds that one tensor
        self.optimizer.register_load_state_dict_pre_hook(flat.split_flat_state)
        self.names: tuple[str, ...] = ()

    def __call__(self, mb: Batch, clip_eps: float) -> torch.Tensor:
        self.optimizer.zero_grad()
        loss, stats = ppo_actor_critic_loss(self.actor, self.critic, mb, self.cfg, clip_eps)
        loss.backward()
        ranks.sync_grads(self.params)  # the mean over ranks (nothing in one process)
        nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        self.optimizer.step()
        self.names = tuple(stats)
        return torch.stack(list(stats.values()))[None]


def make_step(cfg: PPOHyperparams, actor: nn.Module, critic: nn.Module) -> MinibatchStep:
    """The minibatch step of ``cfg.backend`` (logs which runs and, under ``auto``, why the other was refused)."""
    if not ppo_step.use_fused(cfg.backend, actor, critic):
        return ReferenceStep(actor, critic, cfg)
    return ppo_step.FusedStep(
        actor,
        critic,
        lr=cfg.lr,
        adam_eps=cfg.adam_eps,
        max_grad_norm=cfg.max_grad_norm,
        vf_coef=cfg.vf_coef,
        ent_coef=cfg.ent_coef,
        vf_clip=cfg.vf_clip,
    )


class PPOLearner(Learner):
    def __init__(
        self, cfg: ControlPPOConfig, env: VecEnv, rollout_hook: Callable[[RolloutBuffer], None] | None = None
    ):
        """``rollout_hook(buf)``, when given, is called after each rollout is collected and before GAE; it
        may rewrite ``buf.rewards`` in place (e.g. with a learned reward: ``postrl.control.prefs``). None
        (the default) leaves PPO exactly as it is."""
        self.cfg = cfg.ppo
        self.rollout_hook = rollout_hook
        self.actor = make_actor(env.single_observation_space, env.single_action_space, cfg.policy)
        self.critic = Critic(env.single_observation_space.shape[0], cfg.policy)
        self.buffer = RolloutBuffer(env, self.cfg.n_steps)
        self.step = make_step(self.cfg, self.actor, self.critic)
        self.fused = isinstance(self.step, ppo_step.FusedStep)  # the rollout's actor then runs in numpy
        self.optimizer = self.step.optimizer
        self.modules = {"actor": self.actor, "critic": self.critic}
        self.optimizers = {"optimizer": self.optimizer}

    def iteration(self, env: VecEnv, it: int, frac_done: float) -> tuple[dict, list, int]:
        cfg, buf = self.cfg, self.buffer
        frac = 1.0 - frac_done  # linear annealing: 1 at the start → 0 at the end of the run
        lr = cfg.lr * frac if cfg.anneal_lr else cfg.lr
        clip_eps = cfg.clip_eps * frac if cfg.anneal_clip else cfg.clip_eps
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        episodes = collect_rollout(env, self.actor, self.critic, buf, numpy_actor=self.fused)
        if self.rollout_hook is not None:
            self.rollout_hook(buf)
        advantages, returns = gae(
            buf.rewards, buf.values, buf.next_values(), buf.terminated, buf.episode_end, cfg.gamma, cfg.lam
        )
        batch = buf.flatten(advantages, returns)
        metrics = self.update(batch, clip_eps)
        metrics.update(lr=lr, clip_eps=clip_eps, explained_variance=_explained_variance(batch))
        return metrics, episodes, buf.n_envs * buf.n_steps

    def update(self, batch: Batch, clip_eps: float) -> dict[str, float]:
        cfg, n = self.cfg, len(batch)
        batch_size = ranks.local_batch_size(cfg.batch_size)  # this rank's share (all of it in one process)
        full_batch = batch_size >= n
        if full_batch:  # one minibatch: whiten once, and no shuffle (the loss is a mean over it)
            batch = self._whiten(batch)
        history: list[torch.Tensor] = []  # per minibatch, the statistics `self.step.names` as a row [1, k]
        epochs = 0
        for _ in range(cfg.epochs):
            epochs += 1
            order = None if full_batch else torch.randperm(n)
            for start in range(0, n, batch_size):
                mb = batch if full_batch else self._whiten(batch.take(order[start : start + batch_size]))
                history.append(self.step(mb, clip_eps))
            approx_kl = history[-1][0, self.step.names.index("approx_kl")]
            if cfg.target_kl is not None and ranks.mean_over_ranks(approx_kl) > cfg.target_kl:
                break
        out = dict(zip(self.step.names, torch.cat(history).mean(0).tolist(), strict=True))
        out["epochs"] = epochs
        if "entropy" not in out and self.fused:
            out["entropy"] = self.step.gradient.mean_entropy(batch.obs)
        elif "entropy" not in out:
            with torch.no_grad():
                out["entropy"] = float(self.actor.evaluate(batch.obs, batch.actions)[1].mean())
        return out

    def _whiten(self, batch: Batch) -> Batch:
        if not self.cfg.normalize_advantages or len(batch) < 2:
            return batch
        adv = ranks.whiten(batch.advantages)  # over every rank's rows
        return Batch(batch.obs, batch.actions, batch.log_probs, batch.values, adv, batch.returns)


def _explained_variance(batch: Batch) -> float:
    """1 − Var[R̂ − V] / Var[R̂]: how much of the return the critic explains (1 is perfect)."""
    var = batch.returns.var()
    return float("nan") if var == 0 else float(1 - (batch.returns - batch.values).var() / var)


def build_ppo(cfg: ControlPPOConfig, env: VecEnv) -> PPOLearner:
    return PPOLearner(cfg, env)
