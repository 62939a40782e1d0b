"""REINFORCE (Williams 1992), with an optional learned state-value baseline.

As in the notes' pseudocode, each iteration samples full episodes with the current policy π_θ, computes
the returns backward, G_t = r_t + γ G_{t+1}, and ascends

    ∇J ≈ mean_t[ γ^t (G_t − b(s_t)) ∇ log π_θ(a_t|s_t) ]

where b ≡ 0 without a baseline, and otherwise b = V_φ is fit to the returns by regression (a few Adam steps
on ½(V_φ(s_t) − G_t)² per batch, after the policy step so the weights use the baseline of the previous
batch, independent of the actions being weighted). The γ^t factor is the notes' (and the theorem's);
``gamma_t_weights: false`` drops it, as most implementations do.

Episodes: each of the ``n_envs`` sub-environments plays exactly one episode per iteration, from a reset
seeded by (seed, iteration); a finished env waits for the others (it is not stepped), so every sampled
episode is complete, on-policy and counted once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from postrl.control.envs import EnvConfig, VecEnv
from postrl.control.loop import ControlRunConfig, Learner
from postrl.control.policies import Critic, PolicyConfig, make_actor
from postrl.core import discounted_returns, reinforce_loss, value_loss
from postrl.runtime.config import ConfigError

__all__ = [
    "ControlReinforceConfig",
    "Episodes",
    "ReinforceConfig",
    "build_reinforce",
    "collect_episodes",
    "policy_gradient_weights",
]


@dataclass(frozen=True)
class ReinforceConfig:
    gamma: float = 0.99
    """Discount γ."""
    lr: float = 1e-3
    """Adam learning rate of the policy."""
    baseline: bool = True
    """Subtract a learned state-value baseline b(s_t) = V_φ(s_t) from the returns."""
    baseline_lr: float = 1e-3
    """Adam learning rate of the baseline."""
    baseline_steps: int = 10
    """Regression steps of the baseline per batch of episodes."""
    gamma_t_weights: bool = True
    """Weight step t by γ^t as in the policy-gradient theorem (the notes' pseudocode)."""
    max_grad_norm: float | None = None
    """Global gradient-norm clip of the policy step; null: none."""

    CHECKS = {  # valid ranges (postrl.runtime.config.validate)
        "gamma": "[0, 1]",
        "lr": "> 0",
        "baseline_lr": "> 0",
        "baseline_steps": ">= 0",
        "max_grad_norm": "> 0",
    }


@dataclass(frozen=True)
class ControlReinforceConfig:
    """A ``postrl control train --algo reinforce`` run, as its config.yaml holds it: env, networks, run and
    the REINFORCE section."""

    algo: str = "reinforce"
    """Algorithm name (fixed for this config class)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Environment settings (n_envs = episodes per batch; sync envs, no normalisation)."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """Actor and baseline networks."""
    run: ControlRunConfig = field(default_factory=lambda: ControlRunConfig(save_every=100, log_every=10))
    """Budget, seed, logging, evaluation and checkpoints."""
    reinforce: ReinforceConfig = field(default_factory=ReinforceConfig)
    """REINFORCE hyperparameters."""


@dataclass
class Episodes:
    """A batch of complete episodes, padded to the longest: ``[n_episodes, T_max]`` with a mask."""

    obs: torch.Tensor  # [E, T, obs_dim]
    actions: torch.Tensor  # [E, T] or [E, T, act_dim]
    rewards: torch.Tensor  # [E, T]
    mask: torch.Tensor  # [E, T] bool, True on real steps
    terminated: torch.Tensor  # [E] the episode ended in a terminal state (not a time limit)


@torch.no_grad()
def collect_episodes(env: VecEnv, actor: nn.Module, seed: int) -> Episodes:
    """One complete episode per sub-env of ``env`` (sync), stepping only the envs still running."""
    envs = env.sub_envs("reinforce")
    if envs is None:
        raise ConfigError(
            "reinforce needs env.async_=false (it steps each sub-env to the end of its episode)"
        )
    obs = [np.asarray(e.reset(seed=seed + i)[0], dtype=np.float32) for i, e in enumerate(envs)]
    traj = [{"obs": [], "actions": [], "rewards": []} for _ in envs]
    running, terminated = list(range(len(envs))), [False] * len(envs)
    while running:
        actions, _ = actor.act(torch.from_numpy(np.stack([obs[i] for i in running])))
        still = []
        for i, action in zip(running, actions.numpy(), strict=True):
            traj[i]["obs"].append(obs[i])
            traj[i]["actions"].append(action)
            next_obs, reward, term, trunc, _ = envs[i].step(env.to_env_actions(action))
            traj[i]["rewards"].append(float(reward))
            obs[i] = np.asarray(next_obs, dtype=np.float32)
            terminated[i] = bool(term)
            if not (term or trunc):
                still.append(i)
        running = still
    return _pad(traj, terminated)


def _pad(traj: list[dict], terminated: list[bool]) -> Episodes:
    n, t_max = len(traj), max(len(t["rewards"]) for t in traj)
    first = traj[0]
    obs = torch.zeros((n, t_max, *first["obs"][0].shape))
    actions = torch.zeros(
        (n, t_max, *np.shape(first["actions"][0])), dtype=torch.as_tensor(first["actions"][0]).dtype
    )
    rewards, mask = torch.zeros((n, t_max)), torch.zeros((n, t_max), dtype=torch.bool)
    for i, t in enumerate(traj):
        k = len(t["rewards"])
        obs[i, :k] = torch.from_numpy(np.stack(t["obs"]))
        actions[i, :k] = torch.as_tensor(np.stack(t["actions"]))
        rewards[i, :k] = torch.tensor(t["rewards"])
        mask[i, :k] = True
    return Episodes(obs, actions, rewards, mask, torch.tensor(terminated))


def policy_gradient_weights(
    episodes: Episodes, cfg: ReinforceConfig, baseline: nn.Module | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights γ^t (G_t − b(s_t)) ``[E, T]``, returns G_t ``[E, T]``), zero on padding.

    G is computed backward within each episode; padding holds zero reward and ends nothing, so it adds
    nothing to the real steps' returns. A truncated episode's tail is not bootstrapped (no critic).
    """
    returns = discounted_returns(episodes.rewards, torch.zeros_like(episodes.mask), cfg.gamma)
    weights = returns
    if baseline is not None:
        with torch.no_grad():
            weights = returns - baseline(episodes.obs)
    if cfg.gamma_t_weights:
        t = torch.arange(episodes.rewards.shape[-1], dtype=returns.dtype)
        weights = weights * cfg.gamma**t
    return weights * episodes.mask, returns


class Reinforce(Learner):
    needs_env_reset = True

    def __init__(self, cfg: ControlReinforceConfig, env: VecEnv):
        self.cfg, self.seed = cfg.reinforce, cfg.run.seed
        self.actor = make_actor(env.single_observation_space, env.single_action_space, cfg.policy)
        self.optimizer = torch.optim.Adam(self.actor.parameters(), lr=self.cfg.lr)
        self.modules, self.optimizers = {"actor": self.actor}, {"optimizer": self.optimizer}
        self.baseline = None
        if self.cfg.baseline:
            self.baseline = Critic(env.single_observation_space.shape[0], cfg.policy)
            self.baseline_opt = torch.optim.Adam(self.baseline.parameters(), lr=self.cfg.baseline_lr)
            self.modules["baseline"], self.optimizers["baseline"] = self.baseline, self.baseline_opt

    def iteration(self, env: VecEnv, it: int, frac_done: float) -> tuple[dict, list, int]:
        episodes = collect_episodes(env, self.actor, seed=self.seed * 1_000_003 + it * env.n_envs)
        weights, returns = policy_gradient_weights(episodes, self.cfg, self.baseline)
        log_probs, entropy = self.actor.evaluate(episodes.obs, episodes.actions)  # [E, T]
        loss = reinforce_loss(log_probs, weights, episodes.mask)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.max_grad_norm is not None:
            nn.utils.clip_grad_norm_(self.actor.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        metrics = {
            "policy_loss": float(loss.detach()),
            "episode_length": float(episodes.mask.sum(1).float().mean()),
        }
        if self.baseline is not None:
            metrics["baseline_loss"] = self._fit_baseline(episodes, returns)
        lengths = episodes.mask.sum(1).tolist()
        ends = np.cumsum(lengths)  # episodes are reported as if played one after another
        finished = [
            (int(end), float(ret), int(n))
            for end, ret, n in zip(ends, episodes.rewards.sum(1).tolist(), lengths, strict=True)
        ]
        return metrics, finished, int(sum(lengths))

    def _fit_baseline(self, episodes: Episodes, returns: torch.Tensor) -> float:
        for _ in range(self.cfg.baseline_steps):
            loss = value_loss(self.baseline(episodes.obs), returns, mask=episodes.mask)
            self.baseline_opt.zero_grad(set_to_none=True)
            loss.backward()
            self.baseline_opt.step()
        return float(loss.detach())


def build_reinforce(cfg: ControlReinforceConfig, env: VecEnv) -> Reinforce:
    if cfg.env.normalize_obs or cfg.env.normalize_reward:
        raise ConfigError("reinforce does not support env.normalize_obs / env.normalize_reward")
    if cfg.policy.use_sde:  # its episodes run on a shrinking set of envs: no per-env exploration weights
        raise ConfigError("'policy.use_sde': reinforce does not support gSDE (ppo, a2c and trpo do)")
    return Reinforce(cfg, env)
