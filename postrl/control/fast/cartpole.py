"""A fast path of the vector env: CartPole stepped for every copy in one set of numpy operations.

Gymnasium's ``CartPoleEnv`` steps one cart in Python (≈ 20 µs), and a vector env of 8 calls it 8 times per
step; `CartPoleBatch` applies the same equations to all copies at once (arrays ``[n_envs]``), so a vector
step costs about what one copy's did. It is the reference ``gym.make(id)`` (CartPoleEnv under TimeLimit)
made exact, not approximate:

- the dynamics are the reference's float64 expressions, term for term in the same order (so the same
  rounding: numpy's cos and sin give the same bits on an array as on a scalar), the observation its float32
  cast, the reward 1.0 on every step, termination at |x| > 2.4 or |θ| > 12°, truncation at
  ``max_episode_steps`` elapsed steps (both flags may be set on the same step, as TimeLimit sets them);
- each copy i has its own generator, seeded as ``SyncVectorEnv.reset(seed=s)`` seeds copy i (s + i) and
  drawn only by that copy's resets, so resets after an episode's end draw what the reference's draw;
- autoreset is SAME_STEP, as `postrl.control.envs.VecEnv` runs Gymnasium's: a finished copy's next episode
  starts in the same step and the last observation of the finished one is returned apart.

Gymnasium's own ``CartPoleVectorEnv`` (``vectorization_mode="vector_entry_point"``) steps the same way but
draws every copy's reset from one generator and resets on the step after the end (NEXT_STEP), so its
episodes are not the ones of ``gym.make``: this module exists to keep them the same
(tests/control/test_cartpole_batch.py steps both side by side). Snapshots for exact resume go through real
Gymnasium envs (:meth:`CartPoleBatch.to_envs` / :meth:`CartPoleBatch.from_envs`), so a run's checkpoint is
the same file whichever path stepped it.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding

from postrl.runtime.config import ConfigError

__all__ = ["IDS", "CartPoleBatch", "batch_refusal", "use_batch"]

log = logging.getLogger(__name__)

IDS = ("CartPole-v0", "CartPole-v1")
"""The registered ids `CartPoleBatch` reproduces."""


def batch_refusal(env_id: str, kwargs: dict[str, Any], async_: bool) -> str | None:
    """Why `CartPoleBatch` cannot stand in for ``gym.make_vec(env_id, **kwargs)`` (None: it can)."""
    if env_id not in IDS:
        return f"{env_id} has no batched numpy copy (only {', '.join(IDS)})"
    if async_:
        return "env.async_ asks for subprocesses"
    other = sorted(set(kwargs) - {"max_episode_steps"})
    if other:
        return f"env.kwargs {other} change the env (only max_episode_steps is reproduced)"
    return None


def use_batch(backend: str, env_id: str, kwargs: dict[str, Any], async_: bool) -> bool:
    """Whether ``env.backend`` = ``backend`` steps the copies with `CartPoleBatch`; logs which backend runs
    and, when ``auto`` refuses numpy, why. ``numpy`` for an env it cannot reproduce is a ConfigError."""
    if backend == "gymnasium":
        return False
    reason = batch_refusal(env_id, kwargs, async_)
    if reason is None:
        log.info(
            "env.backend=%s: %s copies stepped at once in numpy (postrl.control.fast.cartpole)",
            backend,
            env_id,
        )
        return True
    if backend == "numpy":
        raise ConfigError(f"'env.backend' is numpy, but {reason}; use env.backend=auto or gymnasium")
    log.info("env.backend=auto: gymnasium vector env: %s", reason)
    return False


class CartPoleBatch:
    """``n_envs`` copies of ``gym.make(env_id, max_episode_steps=...)`` stepped together (see the module
    docstring). ``state`` is ``[4, n_envs]`` float64 (x, ẋ, θ, θ̇ as rows), ``elapsed`` the steps of each
    copy's current episode, ``rngs`` each copy's generator."""

    # the reference's constants (gymnasium.envs.classic_control.cartpole.CartPoleEnv)
    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    total_mass = masspole + masscart
    polemass_length = masspole * length
    theta_threshold_radians = 12 * 2 * math.pi / 360
    x_threshold = 2.4

    def __init__(self, env_id: str, n_envs: int, max_episode_steps: int | None = None):
        self.spec = gym.spec(env_id)
        probe = gym.make(env_id)  # the spaces, exactly as the reference declares them
        self.single_observation_space, self.single_action_space = probe.observation_space, probe.action_space
        probe.close()
        self.env_id, self.n_envs = env_id, n_envs
        self.max_episode_steps = max_episode_steps or self.spec.max_episode_steps
        self.state = np.zeros((4, n_envs), dtype=np.float64)
        self.elapsed = np.zeros(n_envs, dtype=np.int64)
        self.rngs: list[np.random.Generator | None] = [None] * n_envs
        self._force = np.array([-self.force_mag, self.force_mag])  # by action: 0 pushes left, 1 right
        self._limits = np.array([[self.x_threshold], [self.theta_threshold_radians]])

    def _reset_copy(self, i: int) -> None:
        if self.rngs[i] is None:  # never seeded: as gymnasium, from fresh entropy
            self.rngs[i], _ = seeding.np_random()
        self.state[:, i] = self.rngs[i].uniform(low=-0.05, high=0.05, size=(4,))
        self.elapsed[i] = 0

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict]:
        """Reset every copy (copy i seeded ``seed + i``); the observations ``[n_envs, 4]`` float32 and an
        empty info dict, as a vector env's reset."""
        for i in range(self.n_envs):
            if seed is not None:
                self.rngs[i], _ = seeding.np_random(seed + i)
            self._reset_copy(i)
        return self.state.T.astype(np.float32), {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        """One step of every copy with ``actions`` ``[n_envs]`` in {0, 1}: (obs ``[n_envs, 4]`` float32 of
        the next episode where one ended, rewards float64, terminated, truncated, {row: final obs})."""
        force = self._force[actions]  # ±force_mag; an action of 2 or more is an IndexError
        state = self.state
        theta, theta_dot = state[2], state[3]
        costheta, sintheta = np.cos(theta), np.sin(theta)
        # the reference's expressions, in its order (https://coneural.org/florian/papers/05_cart_pole.pdf)
        temp = (force + self.polemass_length * np.square(theta_dot) * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * np.square(costheta) / self.total_mass)
        )
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        # explicit Euler, the reference's default integrator, in place: x += τẋ and θ += τθ̇ with the old
        # velocities, then ẋ += τẍ and θ̇ += τθ̈ (the same float operations as x = x + τẋ, ...)
        state[0::2] += self.tau * state[1::2]
        state[1] += self.tau * xacc
        state[3] += self.tau * thetaacc
        terminated = (np.abs(state[0::2]) > self._limits).any(axis=0)  # |x| > 2.4 or |θ| > 12°
        self.elapsed += 1
        truncated = self.elapsed >= self.max_episode_steps
        obs = state.T.astype(np.float32)  # [n_envs, 4]
        finals = {}
        done = terminated | truncated
        for i in np.flatnonzero(done) if done.any() else ():
            finals[int(i)] = obs[i].copy()
            self._reset_copy(int(i))
            obs[i] = self.state[:, i]
        return obs, np.ones(self.n_envs), terminated, truncated, finals

    def close(self) -> None:
        """Nothing to release (the counterpart of a vector env's close)."""

    # -- the same state as reference envs, for snapshots ----------------------------------------------
    def to_envs(self) -> list[gym.Env]:
        """Fresh ``gym.make`` envs holding this batch's state: copy i's cart, elapsed steps and generator."""
        envs = []
        for i in range(self.n_envs):
            env = gym.make(self.env_id, max_episode_steps=self.max_episode_steps)
            env.reset(seed=0)  # the wrappers' own flags (reset called) as in a running env
            env.unwrapped.state = self.state[:, i].copy()
            if self.rngs[i] is not None:
                env.unwrapped.np_random = self.rngs[i]
            _time_limit(env)._elapsed_steps = int(self.elapsed[i])
            envs.append(env)
        return envs

    def from_envs(self, envs: list[gym.Env]) -> None:
        """Take the state of reference envs (e.g. restored from a snapshot); as many as this batch's copies."""
        if len(envs) != self.n_envs:
            raise ValueError(f"{len(envs)} envs for a batch of {self.n_envs}")
        for i, env in enumerate(envs):
            self.state[:, i] = env.unwrapped.state
            self.rngs[i] = env.unwrapped.np_random
            self.elapsed[i] = _time_limit(env)._elapsed_steps


def _time_limit(env: gym.Env) -> gym.wrappers.TimeLimit:
    while not isinstance(env, gym.wrappers.TimeLimit):
        env = env.env
    return env
