import gymnasium as gym
import numpy as np
import pytest

from postrl.control.tabular import bellman_backup, greedy_path, q_learning, sarsa, value_iteration


def test_value_iteration_satisfies_the_bellman_optimality_equation():
    env = gym.make("FrozenLake-v1")
    v, policy = value_iteration(env, gamma=0.99)
    q = bellman_backup(env.unwrapped.P, v, 0.99)
    np.testing.assert_allclose(v, q.max(axis=1), atol=1e-8)  # V* = max_a Σ p [r + γ V*]
    np.testing.assert_array_equal(q[np.arange(len(v)), policy], q.max(axis=1))
    assert v[15] == 0 and v[5] == 0  # the goal and the holes are terminal
    assert 0.5 < v[0] < 0.6  # slippery 4×4 FrozenLake: V*(start) ≈ 0.54 at γ = 0.99


def test_value_iteration_policy_reaches_the_goal_in_the_deterministic_lake():
    env = gym.make("FrozenLake-v1", is_slippery=False)
    v, policy = value_iteration(env, gamma=0.9)
    assert v[0] == pytest.approx(0.9**5)  # shortest path: 6 steps, the reward of 1 on the last
    state, _ = env.reset(seed=0)
    for _ in range(6):
        state, reward, terminated, _, _ = env.step(int(policy[state]))
    assert terminated and reward == 1.0


def _edge_cells(path):
    """Cells of the path on the cliff's edge: row 2, columns 1–10 (column 11 leads into the goal)."""
    return [s for s in path if s // 12 == 2 and 1 <= s % 12 <= 10]


def test_q_learning_and_sarsa_learn_their_different_cliffwalking_paths():
    env = gym.make("CliffWalking-v1")
    q_q, q_returns = q_learning(env, episodes=500, alpha=0.5, epsilon=0.1, seed=0)
    q_s, s_returns = sarsa(env, episodes=500, alpha=0.5, epsilon=0.1, seed=0)
    q_path, s_path = greedy_path(env, q_q), greedy_path(env, q_s)
    assert q_path[-1] == 47 and s_path[-1] == 47  # both greedy policies reach the goal
    assert len(q_path) - 1 == 13  # optimal: up, 11 × right along the cliff edge (row 2), down
    assert len(_edge_cells(q_path)) == 10
    assert len(s_path) - 1 > 13 and not _edge_cells(s_path)  # SARSA keeps away from the edge
    # ... and, exploring with ε = 0.1, SARSA's online returns are better (Sutton & Barto, Figure 6.4)
    assert np.mean(s_returns[-100:]) > np.mean(q_returns[-100:])
