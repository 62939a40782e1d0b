"""Control the SB3 way (`postrl.control.api`): train, load, predict on one or a batch of observations with the
checkpoint's normaliser, evaluate as ``postrl control eval`` does, envs given as factories or instances, and
the ``on_iteration`` callback stopping a run early."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

import postrl.control as control
from postrl.cli import main
from postrl.control.evaluation import evaluate_policy_episodes
from postrl.control.loop import load_agent
from postrl.runtime.errors import UserError

TINY = {"ppo": {"n_steps": 32, "epochs": 2}, "run": {"eval_episodes": 3, "save_every": 0}}


def test_train_returns_an_agent_and_on_iteration_stops_early(tmp_path) -> None:
    infos = []

    def on_iteration(info) -> bool:
        infos.append(info)
        return info["iteration"] < 2  # False after the second iteration: stop (SB3's convention)

    agent = control.train(
        "ppo",
        "CartPole-v1",
        total_steps=10_000,
        seed=1,
        n_envs=2,
        out=tmp_path / "run",
        on_iteration=on_iteration,
        **TINY,
    )
    assert [i["step"] for i in infos] == [64, 128] and "loss" in " ".join(infos[0]["metrics"])
    assert agent.summary["env_steps"] == 128 and agent.config.run.seed == 1 and agent.config.env.n_envs == 2
    assert agent.summary == json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (tmp_path / "run" / "curves.png").is_file()
    action, state = agent.predict(np.zeros(4, dtype=np.float32), deterministic=True)
    assert state is None and action.shape == () and action in (0, 1)
    actions, _ = agent.predict(np.zeros((5, 4)), deterministic=True)
    assert actions.shape == (5,)
    with pytest.raises(UserError, match=r"predict: an observation of shape \(3,\); expected \(4,\)"):
        agent.predict(np.zeros(3))


def test_predict_applies_the_checkpoints_normaliser_and_clips(tmp_path) -> None:
    out = tmp_path / "pendulum"
    normalised = {"env.normalize_obs": True}  # on the algorithm's defaults (config={}: not the preset)
    control.train("ppo", "Pendulum-v1", config={}, total_steps=256, out=out, n_envs=2, **TINY, **normalised)
    agent = control.load(out)
    cfg, inner, env = load_agent(out)
    assert cfg.env.normalize_obs and not np.allclose(env.obs_rms.mean, 0)  # statistics from the checkpoint
    obs = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
    expected, _ = inner.actor.act(torch.from_numpy(env.normalize(obs)), deterministic=True)
    expected = np.clip(expected.detach().numpy(), -2.0, 2.0)
    batch, _ = agent.predict(obs, deterministic=True)
    np.testing.assert_allclose(batch, expected, rtol=1e-6)
    single, _ = agent.predict(obs[0], deterministic=True)
    np.testing.assert_allclose(single, expected[0], rtol=1e-6)
    raw, _ = inner.actor.act(torch.from_numpy(obs), deterministic=True)
    assert not np.allclose(
        raw.detach().numpy(), batch
    )  # the normaliser matters for this check to mean anything
    sampled = np.stack([agent.predict(obs[0])[0] for _ in range(5)])
    assert sampled.std() > 0 and np.all(np.abs(sampled) <= 2.0)


def test_evaluate_matches_the_command(tmp_path, capsys) -> None:
    out = tmp_path / "cartpole"
    control.train("ppo", "CartPole-v1", total_steps=128, out=out, n_envs=2, **TINY)
    mean, std = control.evaluate(out, n_episodes=4)
    cfg, inner, env = load_agent(out)
    returns = evaluate_policy_episodes(inner.actor, env, cfg, 4)
    assert (mean, std) == (float(np.mean(returns)), float(np.std(returns)))
    assert main(["control", "eval", str(out), "--episodes", "4"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["deterministic"] == {"mean": mean, "std": std}
    on_instance = control.evaluate(control.load(out), gym.make("CartPole-v1"), n_episodes=2)
    assert on_instance[0] > 0


class Corridor(gym.Env):
    """Walk right to the end of a 1-D corridor (5 cells): a custom env that no registry knows."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return np.array([-1.0], dtype=np.float32), {}

    def step(self, action):
        self.pos = max(0, self.pos + (1 if action == 1 else -1))
        done = self.pos == 4
        return np.array([self.pos / 2 - 1], dtype=np.float32), 1.0 if done else -0.1, done, False, {}


def make_corridor() -> gym.Env:
    return gym.wrappers.TimeLimit(Corridor(), max_episode_steps=20)


@pytest.mark.parametrize("env", [make_corridor, make_corridor()], ids=["factory", "instance"])
def test_envs_given_as_python_objects(env, tmp_path) -> None:
    out = tmp_path / "corridor"
    agent = control.train("ppo", env, total_steps=128, out=out, n_envs=2, **TINY)
    assert agent.config.env.id in ("postrl/Make_corridor-v0", "postrl/Corridor-v0")
    assert control.evaluate(agent, make_corridor(), n_episodes=2)[0] <= 1.0
    del gym.registry[agent.config.env.id]  # as in a new process: the object is not saved with the run
    with pytest.raises(
        UserError, match="a Python object given to postrl.control.train; .* pass it again as env="
    ):
        control.load(out)
    assert control.load(out, env=env).predict(np.zeros(1), deterministic=True)[0] in (0, 1)


def test_bad_inputs_are_user_errors(tmp_path) -> None:
    with pytest.raises(UserError, match="unknown algorithm 'ddpg'"):
        control.train("ddpg", "CartPole-v1", out=tmp_path / "a")
    with pytest.raises(UserError, match="unknown config key 'ppo.lrr'; did you mean 'ppo.lr'"):
        control.train("ppo", "CartPole-v1", out=tmp_path / "a", ppo={"lrr": 1})
    with pytest.raises(UserError, match="env.id: unknown Gymnasium environment 'CartPol-v1'"):
        control.train("ppo", "CartPol-v1", out=tmp_path / "a")
    with pytest.raises(
        UserError, match="env: expected a Gymnasium id, a gymnasium.Env or a factory; got int"
    ):
        control.train("ppo", 3, out=tmp_path / "a")
    assert not (tmp_path / "a").exists()


# ---- #41 item 7: predict refuses observations that are not what the env's observation space holds ----------
@pytest.mark.parametrize(
    ("observation", "message"),
    [
        (np.array(["a", "b", "c", "d"]), r"predict: observations of dtype <U1 \(not numbers\)"),
        ("abcd", r"predict: observations of dtype <U4 \(not numbers\)"),
        (np.array([1.0, None, 0.0, 0.0], dtype=object), r"predict: observation element \(1,\) is None"),
        ([[0.0, 0.0, 0.0, 0.0], [0.0, "x", 0.0, 0.0]], r"observations of dtype <U32 \(not numbers\)"),
        ([[0.0] * 4, [0.0] * 3], r"predict: observations that are not one rectangular array"),
        (np.array([0.0, np.nan, 0.0, 0.0]), r"predict: observation element \(1,\) is nan"),
        (np.array([[0.0] * 4, [0.0, 0.0, 0.0, -np.inf]]), r"predict: observation element \(1, 3\) is -inf"),
        (np.zeros(4, dtype=np.complex64), r"predict: observations of dtype complex64 \(not numbers\)"),
        (np.zeros((2, 2)), r"predict: an observation of shape \(2, 2\); expected \(4,\)"),
    ],
)
def test_predict_refuses_what_the_observation_space_does_not_hold(tmp_path, observation, message) -> None:
    agent = control.train(
        "ppo", "CartPole-v1", total_steps=32, seed=0, n_envs=1, out=tmp_path / "run", **TINY
    )
    with pytest.raises(UserError, match=message) as info:
        agent.predict(observation, deterministic=True)
    assert "Box(" in str(info.value) and "(4,)" in str(info.value) and "float32" in str(info.value)
    assert agent.predict([0, 0, 0, 0], deterministic=True)[0] in (0, 1)  # integers and lists are numbers
    assert agent.predict(np.zeros(4, dtype=object), deterministic=True)[0] in (0, 1)


# ---- #41 item 11: the seeds README's Python section gives for postrl.control.evaluate ---------------------
def _own_loop(agent, seeds: list[int]) -> list[float]:
    """A user's loop: one CartPole episode per seed, the agent's deterministic actions."""
    returns = []
    for seed in seeds:
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(agent.predict(obs, deterministic=True)[0])
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    return returns


def test_evaluate_uses_the_seeds_the_readme_gives(tmp_path) -> None:
    agent = control.train(
        "ppo", "CartPole-v1", total_steps=64, seed=3, n_envs=1, out=tmp_path / "run", **TINY
    )
    for seed, base in ((None, 10_000 + 100 * 3), (7, 10_000 + 100 * 7)):  # the run's env: 10000 + 100·s + i
        own = _own_loop(agent, [base + i for i in range(3)])
        assert control.evaluate(agent, n_episodes=3, seed=seed) == (np.mean(own), np.std(own))
    for seed, base in ((None, 10_000), (7, 7)):  # an env passed in: seed + i (10000 + i by default)
        own = _own_loop(agent, [base + i for i in range(3)])
        assert control.evaluate(agent, "CartPole-v1", n_episodes=3, seed=seed) == (np.mean(own), np.std(own))
