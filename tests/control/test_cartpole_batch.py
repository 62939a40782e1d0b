"""env.backend=numpy (postrl.control.fast.cartpole.CartPoleBatch) against the Gymnasium path it stands in for:
the same seeds give the same observations, rewards, flags, final observations and episodes, bit for bit."""

import logging

import numpy as np
import pytest

from postrl.control.envs import EnvConfig, VecEnv
from postrl.runtime.config import ConfigError
from tests.control.stepping import assert_same_steps


def _pair(n_envs: int, seed: int, **kwargs) -> tuple[VecEnv, VecEnv]:
    ours = VecEnv(EnvConfig(id="CartPole-v1", n_envs=n_envs, kwargs=kwargs, backend="numpy"), seed)
    theirs = VecEnv(EnvConfig(id="CartPole-v1", n_envs=n_envs, kwargs=kwargs, backend="gymnasium"), seed)
    assert ours.batched and not theirs.batched
    return ours, theirs


def test_random_actions_and_short_time_limit_match_gymnasium():
    """Random pushes: many terminations, and truncations at 30 steps (resets drawn from each copy's RNG)."""
    ours, theirs = _pair(3, seed=5, max_episode_steps=30)
    np.testing.assert_array_equal(ours.reset(), theirs.reset())
    rng = np.random.default_rng(0)
    ended = assert_same_steps(ours, theirs, lambda obs: rng.integers(0, 2, size=3), 600)
    assert ended["terminated"] > 20 and ended["truncated"] > 5


def test_a_balancing_policy_reaches_the_500_step_limit_as_gymnasium():
    """A hand-written controller keeps the pole up for CartPole-v1's full 500 steps: truncation at the
    registered limit, the final observation of the truncated step, and 500-step episodes."""
    ours, theirs = _pair(4, seed=11)
    np.testing.assert_array_equal(ours.reset(), theirs.reset())
    rng = np.random.default_rng(1)

    def controller(obs):
        push = (obs[:, 2] + 0.5 * obs[:, 3] + 0.01 * obs[:, 0] + 0.1 * obs[:, 1] > 0).astype(np.int64)
        flip = rng.random(4) < 0.05
        return np.where(flip, 1 - push, push)

    ended = assert_same_steps(ours, theirs, controller, 1500)
    assert ended["truncated"] >= 4


def test_time_limit_and_termination_on_the_same_step_keep_both_flags():
    """max_episode_steps=1: every step truncates; with a pole started past 12° it also terminates."""
    ours, theirs = _pair(2, seed=0, max_episode_steps=1)
    ours.reset(), theirs.reset()
    ours.env.state[2, 0] = 0.3  # copy 0 is past the angle limit after its next step
    theirs.env.envs[0].unwrapped.state[2] = 0.3
    ours.obs = theirs.obs = ours.obs.copy()
    ended = assert_same_steps(ours, theirs, lambda obs: np.zeros(2, dtype=np.int64), 3)
    assert ended["both"] == 1 and ended["truncated"] == 6


@pytest.mark.parametrize("source", ["numpy", "gymnasium"])
def test_snapshots_restore_across_backends(source):
    """A checkpoint's env snapshot is the same file whichever backend wrote it: restored into the other
    backend (built with another seed), the next steps are those of the original."""
    cfg = EnvConfig(id="CartPole-v1", n_envs=2, kwargs={"max_episode_steps": 9}, backend=source)
    original, rng = VecEnv(cfg, seed=3), np.random.default_rng(0)
    original.reset()
    for _ in range(13):
        original.step(rng.integers(0, 2, size=2))
    other = "gymnasium" if source == "numpy" else "numpy"
    resumed = VecEnv(
        EnvConfig(id="CartPole-v1", n_envs=2, kwargs={"max_episode_steps": 9}, backend=other), 99
    )
    resumed.load_state_dict(original.state_dict())
    resumed.restore(original.snapshot())
    np.testing.assert_array_equal(resumed.obs, original.obs)
    ended = assert_same_steps(original, resumed, lambda obs: rng.integers(0, 2, size=2), 40)
    assert ended["truncated"] + ended["terminated"] >= 8


def test_auto_takes_numpy_for_cartpole_only_and_says_why(caplog):
    with caplog.at_level(logging.INFO, logger="postrl.control.fast.cartpole"):
        assert VecEnv(EnvConfig(id="CartPole-v1", n_envs=2), 0).batched
        assert not VecEnv(EnvConfig(id="Pendulum-v1", n_envs=2), 0).batched
        assert not VecEnv(
            EnvConfig(id="CartPole-v1", n_envs=2, kwargs={"render_mode": "rgb_array"}), 0
        ).batched
    text = caplog.text
    assert "env.backend=auto: 2 copies" not in text  # the message names the env, not the count
    assert "CartPole-v1 copies stepped at once in numpy" in text
    assert "Pendulum-v1 has no batched numpy copy" in text
    assert "env.kwargs ['render_mode'] change the env" in text


def test_numpy_backend_refuses_what_it_cannot_reproduce():
    with pytest.raises(
        ConfigError, match="'env.backend' is numpy, but Pendulum-v1 has no batched numpy copy"
    ):
        VecEnv(EnvConfig(id="Pendulum-v1", n_envs=2, backend="numpy"), 0)
    with pytest.raises(ConfigError, match="env.async_ asks for subprocesses"):
        VecEnv(EnvConfig(id="CartPole-v1", n_envs=2, async_=True, backend="numpy"), 0)


def test_an_algorithm_that_steps_each_copy_gets_gymnasium_envs():
    """reinforce and prefs step sub-envs one by one: auto rebuilds the env as Gymnasium's; numpy refuses."""
    env = VecEnv(EnvConfig(id="CartPole-v1", n_envs=2), 0)
    assert env.batched
    envs = env.sub_envs("reinforce")
    assert not env.batched and len(envs) == 2
    numpy_env = VecEnv(EnvConfig(id="CartPole-v1", n_envs=2, backend="numpy"), 0)
    with pytest.raises(ConfigError, match="reinforce steps each env by itself: use env.backend=auto"):
        numpy_env.sub_envs("reinforce")
