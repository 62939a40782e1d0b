"""Truncation vs termination through the vector env, the buffer and GAE, with a hand-built env."""

import importlib.util

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.error import DependencyNotInstalled
from torch import nn

from postrl.control import ppo
from postrl.control.buffer import RolloutBuffer, collect_rollout
from postrl.control.envs import EnvConfig, RunningMeanStd, VecEnv, make_env
from postrl.core import gae
from postrl.runtime.config import ConfigError, load_config
from postrl.runtime.errors import UserError
from tests.control.stepping import assert_same_steps


class CounterEnv(gym.Env):
    """obs = [t]; reward 1 per step. Terminates when it reaches ``terminate_at`` (if set); the TimeLimit
    wrapper (max_episode_steps) truncates otherwise."""

    observation_space = gym.spaces.Box(-100, 100, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, terminate_at=None):
        self.terminate_at = terminate_at
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        terminated = self.terminate_at is not None and self.t >= self.terminate_at
        return np.array([float(self.t)], np.float32), 1.0, terminated, False, {}


gym.register("postrl-test/Counter-v0", entry_point=CounterEnv, max_episode_steps=3)


class LinearValue(nn.Module):
    """V(s) = 10·s + 100: distinct for every observation, so a wrong bootstrap shows."""

    def forward(self, obs):
        return 10 * obs[..., 0] + 100


class ConstantActor(nn.Module):
    def act(self, obs, deterministic=False, generator=None):
        return torch.zeros(obs.shape[0], dtype=torch.long), torch.zeros(obs.shape[0])


def _rollout(terminate_at, n_steps=4):
    env = VecEnv(EnvConfig(id="postrl-test/Counter-v0", n_envs=1, kwargs={"terminate_at": terminate_at}), 0)
    env.reset()
    buf = RolloutBuffer(env, n_steps)
    episodes = collect_rollout(env, ConstantActor(), LinearValue(), buf)
    return buf, episodes


def test_truncated_step_bootstraps_from_the_final_observation():
    buf, episodes = _rollout(terminate_at=None)  # time limit 3: steps 0,1,2 then a new episode
    assert buf.truncated[0].tolist() == [False, False, True, False]
    assert not buf.terminated.any()
    # obs 0,1,2 | 0 ; V = 100, 110, 120 | 100 ; final obs of the truncated step is 3 → V = 130
    assert buf.values[0].tolist() == [100.0, 110.0, 120.0, 100.0]
    assert buf.next_values()[0].tolist() == [110.0, 120.0, 130.0, 110.0]
    adv, ret = gae(buf.rewards, buf.values, buf.next_values(), buf.terminated, buf.episode_end, 0.5, 1.0)
    # λ = 1 return of step 2 = 1 + 0.5·V(final obs) = 66 (not 1 + 0.5·V(reset obs) = 51)
    assert ret[0, 2].item() == pytest.approx(1 + 0.5 * 130)
    assert ret[0, 0].item() == pytest.approx(1 + 0.5 * (1 + 0.5 * (1 + 0.5 * 130)))
    assert episodes == [(3, 3.0, 3)]


def test_terminated_step_does_not_bootstrap():
    buf, _ = _rollout(terminate_at=2)
    assert buf.terminated[0].tolist() == [False, True, False, True]
    assert not buf.truncated.any()
    adv, ret = gae(buf.rewards, buf.values, buf.next_values(), buf.terminated, buf.episode_end, 0.5, 1.0)
    assert ret[0].tolist() == pytest.approx([1.5, 1.0, 1.5, 1.0])


def test_episode_statistics_use_raw_rewards_when_rewards_are_normalised():
    env = VecEnv(EnvConfig(id="postrl-test/Counter-v0", n_envs=2, normalize_reward=True), 0)
    env.reset()
    rewards, episodes = [], []
    for _ in range(6):
        step = env.step(np.zeros(2, dtype=np.int64))
        rewards.append(step.rewards)
        episodes += step.episodes
    assert [e[1:] for e in episodes] == [(3.0, 3)] * 4
    assert not np.allclose(np.concatenate(rewards), 1.0)  # the learner sees scaled rewards


def test_running_mean_std_matches_numpy():
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.0, size=(1000, 3))
    rms = RunningMeanStd((3,), epsilon=0.0)
    rms.count = 0.0
    for chunk in np.split(data, 10):
        rms.update(chunk)
    np.testing.assert_allclose(rms.mean, data.mean(0), rtol=1e-10)
    np.testing.assert_allclose(rms.var, data.var(0), rtol=1e-10)
    clone = RunningMeanStd((3,))
    clone.load_state_dict(rms.state_dict())
    np.testing.assert_array_equal(clone.mean, rms.mean)


def test_box_actions_are_clipped_only_when_sent_to_the_env():
    env = VecEnv(EnvConfig(id="Pendulum-v1", n_envs=2), 0)
    actions = np.array([[5.0], [-0.5]], np.float32)
    np.testing.assert_array_equal(env.to_env_actions(actions), [[2.0], [-0.5]])
    assert actions[0, 0] == 5.0


@pytest.mark.parametrize(
    ("env_id", "suggested"),
    [
        ("CartPol-v1", ["CartPole-v1"]),
        ("cartpole-v1", ["CartPole-v1"]),
        ("CartPole-v9", ["CartPole-v1", "CartPole-v0"]),  # the same family's versions
        ("Pendulum", ["Pendulum-v1"]),
    ],
)
def test_unknown_env_id_names_the_closest_registered_ids(env_id, suggested):
    with pytest.raises(UserError, match=f"unknown Gymnasium environment '{env_id}'") as err:
        VecEnv(EnvConfig(id=env_id, n_envs=1), 0)
    assert str(err.value).startswith("env.id")
    suggestions = str(err.value).split("closest registered ids: ")[1].split(", ")
    assert suggestions[0] == suggested[0] and set(suggested) <= set(suggestions)


def _raises(error: Exception):
    def entry_point(**kwargs):
        raise error

    return entry_point


@pytest.mark.parametrize(
    ("error", "extra"),
    [
        (DependencyNotInstalled('Box2D is not installed, run `pip install "gymnasium[box2d]"`'), "box2d"),
        (ModuleNotFoundError("No module named 'mujoco'", name="mujoco"), "mujoco"),
        (ModuleNotFoundError("No module named 'ale_py'", name="ale_py"), "atari"),
    ],
)
def test_a_missing_optional_dependency_names_the_env_and_the_extra(error, extra):
    env_id = "postrl-test/NeedsExtra-v0"
    gym.register(env_id, entry_point=_raises(error))
    try:
        with pytest.raises(
            UserError, match=f"env.id='{env_id}' needs a package that is not installed"
        ) as err:
            VecEnv(EnvConfig(id=env_id, n_envs=1), 0)
    finally:
        del gym.registry[env_id]
    assert f'pip install "postrl[{extra}]"' in str(err.value)


def test_atari_ids_without_ale_py_name_the_atari_extra():
    if importlib.util.find_spec("ale_py") is not None:
        pytest.skip("ale_py is installed")
    with pytest.raises(UserError, match=r'pip install "postrl\[atari\]"'):
        make_env("ALE/Pong-v5")


def test_an_unknown_env_keyword_names_env_kwargs_and_the_valid_ones():
    with pytest.raises(UserError, match="env.kwargs: CartPole-v1 takes no keyword 'gravity'") as err:
        VecEnv(EnvConfig(id="CartPole-v1", n_envs=1, kwargs={"gravity": 1.0}), 0)
    assert "valid: disable_env_checker, max_episode_steps, render_mode, sutton_barto_reward" in str(err.value)


def test_env_config_ranges_are_checked():
    with pytest.raises(ConfigError, match="'env.n_envs' must be >= 1, got 0"):
        load_config(ppo.ControlPPOConfig, None, ["env.n_envs=0"])


@pytest.mark.parametrize(
    ("env_id", "kwargs", "normalize"),
    [("CartPole-v1", {"max_episode_steps": 12}, False), ("Pendulum-v1", {"max_episode_steps": 7}, True)],
)
def test_in_process_stepping_equals_gymnasium_sync_vector_env(env_id, kwargs, normalize):
    """`VecEnv` steps a SyncVectorEnv's sub-envs itself; gymnasium's own step gives the same results:
    observations, rewards, both flags, final observations of truncated steps, episodes."""
    cfg = EnvConfig(
        id=env_id,
        n_envs=3,
        normalize_obs=normalize,
        normalize_reward=normalize,
        kwargs=kwargs,
        backend="gymnasium",  # CartPole's numpy backend: tests/control/test_cartpole_batch.py
    )
    ours, theirs = VecEnv(cfg, seed=5), VecEnv(cfg, seed=5)
    assert ours._in_process
    theirs._in_process = False
    np.testing.assert_array_equal(ours.reset(), theirs.reset())
    rng = np.random.default_rng(0)

    def actions_of(obs):
        if ours._continuous:
            return rng.uniform(-3, 3, size=(3, 1)).astype(np.float32)  # beyond the bounds: clipped
        return rng.integers(0, 2, size=3)

    ended = assert_same_steps(ours, theirs, actions_of, 60)
    assert ended["truncated"] > 0 and (ours._continuous or ended["terminated"] > 0)
