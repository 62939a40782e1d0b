"""Tabular methods on small discrete MDPs (Sutton & Barto 2018, chapters 4 and 6).

- ``value_iteration``: V(s) ← max_a Σ_{s'} p(s'|s,a)[r + γ(1 − done)V(s')] until the Bellman optimality
  residual is below ``tol``, using the model ``env.unwrapped.P`` (FrozenLake, CliffWalking, Taxi…).
- ``sarsa`` (on-policy TD control): Q(s,a) ← Q(s,a) + α[r + γ Q(s',a') − Q(s,a)], a' ~ ε-greedy.
- ``q_learning`` (off-policy): Q(s,a) ← Q(s,a) + α[r + γ max_a' Q(s',a') − Q(s,a)].
On CliffWalking the two learn different paths (Example 6.6): Q-learning the optimal one along the cliff
edge, SARSA — which accounts for its own ε-exploration — a safer one further away.

Tables are numpy arrays; nothing here needs torch.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np

__all__ = [
    "bellman_backup",
    "greedy_path",
    "q_learning",
    "q_learning_target",
    "sarsa",
    "sarsa_target",
    "td_control",
    "value_iteration",
]


def bellman_backup(model: dict, v: np.ndarray, gamma: float) -> np.ndarray:
    """Q(s, a) = Σ_{s'} p(s'|s,a)[r + γ(1 − done)V(s')] for every (s, a): ``[n_states, n_actions]``."""
    n_states, n_actions = len(model), len(model[0])
    q = np.zeros((n_states, n_actions))
    for s in range(n_states):
        for a in range(n_actions):
            q[s, a] = sum(p * (r + gamma * (1.0 - done) * v[s2]) for p, s2, r, done in model[s][a])
    return q


def value_iteration(
    env: gym.Env, gamma: float = 0.99, tol: float = 1e-10, max_iters: int = 100_000
) -> tuple[np.ndarray, np.ndarray]:
    """Optimal values V* ``[n_states]`` and a greedy optimal policy ``[n_states]`` from the env's model."""
    model = env.unwrapped.P
    v = np.zeros(len(model))
    for _ in range(max_iters):
        q = bellman_backup(model, v, gamma)
        v_new = q.max(axis=1)
        if np.max(np.abs(v_new - v)) < tol:
            v = v_new
            break
        v = v_new
    return v, bellman_backup(model, v, gamma).argmax(axis=1)


def sarsa_target(
    q: np.ndarray, reward: float, next_state: int, next_action: int, done: bool, gamma: float
) -> float:
    """r + γ Q(s', a') with a' the action the ε-greedy policy will take (0 bootstrap at a terminal)."""
    return reward + (0.0 if done else gamma * q[next_state, next_action])


def q_learning_target(
    q: np.ndarray, reward: float, next_state: int, next_action: int, done: bool, gamma: float
) -> float:
    """r + γ max_a' Q(s', a') whatever the behaviour policy does next (0 bootstrap at a terminal)."""
    return reward + (0.0 if done else gamma * q[next_state].max())


def _epsilon_greedy(q_row: np.ndarray, epsilon: float, rng: np.random.Generator) -> int:
    if rng.random() < epsilon:
        return int(rng.integers(len(q_row)))
    best = np.flatnonzero(q_row == q_row.max())
    return int(best[0]) if len(best) == 1 else int(best[rng.integers(len(best))])  # ties broken at random


def td_control(
    env: gym.Env,
    target: Callable[..., float],
    episodes: int = 500,
    alpha: float = 0.5,
    gamma: float = 1.0,
    epsilon: float = 0.1,
    seed: int = 0,
    max_steps: int = 10_000,
) -> tuple[np.ndarray, list[float]]:
    """ε-greedy TD control with the given ``target``; returns (Q ``[S, A]``, return of every episode)."""
    rng = np.random.default_rng(seed)
    env = env.unwrapped  # the wrappers' checks cost more than these environments' own step
    n_states, n_actions = env.observation_space.n, env.action_space.n
    q = np.zeros((n_states, n_actions))
    returns = []
    for episode in range(episodes):
        state, _ = env.reset(seed=seed + episode)
        action = _epsilon_greedy(q[state], epsilon, rng)
        total = 0.0
        for _ in range(max_steps):
            next_state, reward, terminated, truncated, _ = env.step(action)
            next_action = _epsilon_greedy(q[next_state], epsilon, rng)
            q[state, action] += alpha * (
                target(q, reward, next_state, next_action, terminated, gamma) - q[state, action]
            )
            state, action, total = next_state, next_action, total + reward
            if terminated or truncated:
                break
        returns.append(total)
    return q, returns


def sarsa(env: gym.Env, **kwargs) -> tuple[np.ndarray, list[float]]:
    """On-policy TD control (Sutton & Barto, section 6.4)."""
    return td_control(env, sarsa_target, **kwargs)


def q_learning(env: gym.Env, **kwargs) -> tuple[np.ndarray, list[float]]:
    """Off-policy TD control (Watkins 1989; Sutton & Barto, section 6.5)."""
    return td_control(env, q_learning_target, **kwargs)


def greedy_path(env: gym.Env, q: np.ndarray, max_steps: int = 100) -> list[int]:
    """States visited by the greedy policy argmax_a Q(s, a) from the start state (deterministic envs)."""
    state, _ = env.reset(seed=0)
    path = [int(state)]
    for _ in range(max_steps):
        state, _, terminated, truncated, _ = env.step(int(q[state].argmax()))
        path.append(int(state))
        if terminated or truncated:
            break
    return path
