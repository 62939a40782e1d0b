"""Rollout storage for the on-policy agents (A2C, TRPO, PPO) and the loop that fills it.

Every per-step tensor is ``[n_envs, n_steps]``: time on the LAST dimension, as ``postrl.core`` expects.

Bootstrapping (the part CleanRL gets wrong): ``next_values[:, t]`` is V of the state after step t.
Within an episode that is ``values[:, t + 1]`` (or V of the observation after the rollout, for the last
step). When step t ended the episode, the vector env has already reset that sub-env, so
``values[:, t + 1]`` belongs to the *next* episode and is replaced: by V(final observation) when the episode
was truncated (time limit: the MDP goes on, so we bootstrap), and by 0 when it terminated (``gae`` zeroes
it anyway through ``terminated``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from postrl.control.envs import VecEnv
from postrl.control.fast.numpy_actor import NumpyActor

__all__ = ["Batch", "RolloutBuffer", "collect_rollout"]


@dataclass
class Batch:
    """A flattened rollout ``[N = n_envs · n_steps]`` for minibatch updates."""

    obs: torch.Tensor  # [N, obs_dim]
    actions: torch.Tensor  # [N] (discrete) or [N, act_dim]
    log_probs: torch.Tensor  # [N] log π_old(a|s)
    values: torch.Tensor  # [N] V_old(s)
    advantages: torch.Tensor  # [N]
    returns: torch.Tensor  # [N] critic targets

    def __len__(self) -> int:
        return self.log_probs.shape[0]

    def take(self, idx: torch.Tensor) -> Batch:
        return Batch(
            *(
                t[idx]
                for t in (self.obs, self.actions, self.log_probs, self.values, self.advantages, self.returns)
            )
        )


class RolloutBuffer:
    """Pre-allocated ``[n_envs, n_steps, ...]`` storage of one rollout."""

    def __init__(self, env: VecEnv, n_steps: int):
        n, obs_shape = env.n_envs, env.single_observation_space.shape
        space = env.single_action_space
        discrete = not hasattr(space, "low")
        self.n_envs, self.n_steps = n, n_steps
        self.obs = torch.zeros((n, n_steps, *obs_shape))  # [E, T, obs_dim]
        self.actions = (
            torch.zeros((n, n_steps), dtype=torch.long)
            if discrete
            else torch.zeros((n, n_steps, *space.shape))
        )
        self.log_probs = torch.zeros((n, n_steps))  # [E, T]
        self.rewards = torch.zeros((n, n_steps))
        self.values = torch.zeros((n, n_steps))
        self.final_values = torch.zeros((n, n_steps))  # V(final obs) where truncated
        self.terminated = torch.zeros((n, n_steps), dtype=torch.bool)
        self.truncated = torch.zeros((n, n_steps), dtype=torch.bool)
        self.last_values = torch.zeros(n)  # V(obs after the last step)

    @property
    def episode_end(self) -> torch.Tensor:
        return self.terminated | self.truncated

    def next_values(self) -> torch.Tensor:
        """``[E, T]`` V(s_{t+1}) with the autoreset correction described in the module docstring."""
        shifted = torch.cat([self.values[:, 1:], self.last_values.unsqueeze(-1)], dim=-1)
        out = torch.where(self.truncated, self.final_values, shifted)
        return torch.where(self.terminated, torch.zeros_like(out), out)

    def flatten(self, advantages: torch.Tensor, returns: torch.Tensor) -> Batch:
        n = self.n_envs * self.n_steps
        return Batch(
            self.obs.reshape(n, *self.obs.shape[2:]),  # [E*T, obs_dim]
            self.actions.reshape(n, *self.actions.shape[2:]),
            self.log_probs.reshape(n),
            self.values.reshape(n),
            advantages.reshape(n),
            returns.reshape(n),
        )


@torch.no_grad()
def collect_rollout(
    env: VecEnv, actor: nn.Module, critic: nn.Module | None, buf: RolloutBuffer, numpy_actor: bool = False
) -> list[tuple[int, float, int]]:
    """Step ``env`` for ``buf.n_steps`` steps with the current policy, filling ``buf``.

    Only the actor runs inside the loop: ``actor.act``, or with ``numpy_actor`` its copy in numpy, which
    draws the same actions (the fast path of `postrl.control.fast.numpy_actor`; the caller checks that the
    actor allows it). A gSDE actor (``policy.use_sde``) draws new exploration weights at the first step and every
    ``sde_sample_freq`` steps. The critic is evaluated once, after it, on all ``n_envs · n_steps``
    observations (and the final observations of truncated steps) in one batch: the same values as a call
    per step, at a fraction of the cost for small networks.

    Returns the episodes that ended, as ``(env steps into this rollout, return, length)``.
    """
    episodes: list[tuple[int, float, int]] = []
    # numpy views of the buffer's tensors (shared memory): a numpy row write is cheaper than a torch one
    views = [t.numpy() for t in (buf.obs, buf.actions, buf.log_probs, buf.rewards)]
    np_obs, np_actions, np_log_probs, np_rewards = views
    np_terminated, np_truncated = buf.terminated.numpy(), buf.truncated.numpy()
    truncations: list[tuple[np.ndarray, int, np.ndarray]] = []  # (env rows, step, final obs of those rows)
    obs = env.obs
    policy = NumpyActor(actor) if numpy_actor else None
    uniforms = None if policy is None else policy.draws(buf.n_steps, buf.n_envs)  # the rollout's in one call
    sde_freq = getattr(actor, "sde_sample_freq", 0) if getattr(actor, "use_sde", False) else None
    for t in range(buf.n_steps):
        if sde_freq is not None and (t == 0 or sde_freq > 0 and t % sde_freq == 0):
            actor.reset_noise(buf.n_envs)  # gSDE: new exploration weights (policies.GSDEActor)
        if policy is not None:  # numpy: a third of the cost of torch ops on 8 observations
            actions, log_probs = policy.act(obs, None if uniforms is None else uniforms[t])
        else:
            actions, log_probs = (x.numpy() for x in actor.act(torch.from_numpy(obs)))
        np_obs[:, t], np_actions[:, t], np_log_probs[:, t] = obs, actions, log_probs
        step = env.step(actions)
        np_rewards[:, t], np_terminated[:, t], np_truncated[:, t] = (
            step.rewards,
            step.terminated,
            step.truncated,
        )
        if step.final_obs is not None:
            rows = np.flatnonzero(step.truncated)
            truncations.append((rows, t, step.final_obs[rows]))
        if step.episodes:
            episodes += [((t + 1) * env.n_envs, ret, length) for _, ret, length in step.episodes]
        obs = step.obs
    if critic is not None:
        n_envs, n_steps = buf.n_envs, buf.n_steps
        values = critic(
            torch.cat([buf.obs.reshape(n_envs * n_steps, *buf.obs.shape[2:]), torch.from_numpy(obs)])
        )
        buf.values.copy_(values[: n_envs * n_steps].reshape(n_envs, n_steps))
        buf.last_values = values[n_envs * n_steps :].clone()
        buf.final_values.zero_()
        if truncations:
            final_values = critic(torch.from_numpy(np.concatenate([final for _, _, final in truncations])))
            rows = torch.from_numpy(np.concatenate([rows for rows, _, _ in truncations]))
            steps = torch.tensor([t for rows, t, _ in truncations for _ in rows], dtype=torch.long)
            buf.final_values[rows, steps] = final_values
    return episodes
