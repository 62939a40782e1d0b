"""Env snapshots as data (``postrl.control.env_snapshot``): exact resume of classic control without pickle, and
checkpoint files that would run code when unpickled are refused or ignored, never executed."""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import threading

import gymnasium as gym
import numpy as np
import pytest

from postrl.control import ppo
from postrl.control.envs import EnvConfig, VecEnv
from postrl.control.loop import train_from_config
from postrl.runtime.config import load_config
from postrl.runtime.errors import UserError

CLASSIC = ["CartPole-v1", "Acrobot-v1", "Pendulum-v1", "MountainCar-v0"]


def _random_actions(env: VecEnv, rng: np.random.Generator) -> np.ndarray:
    if env._continuous:
        return rng.uniform(-3, 3, size=(env.n_envs, 1)).astype(np.float32)
    return rng.integers(0, env.single_action_space.n, size=env.n_envs)


@pytest.mark.parametrize("env_id", CLASSIC)
def test_restored_envs_continue_bit_for_bit(env_id):
    """Step, snapshot, restore into envs built with another seed: the next 40 steps (episodes end every 9
    steps, so the resets draw from each env's restored RNG) are identical to the original envs'."""
    cfg = EnvConfig(id=env_id, n_envs=2, normalize_obs=True, kwargs={"max_episode_steps": 9})
    original, rng = VecEnv(cfg, seed=3), np.random.default_rng(0)
    original.reset()
    for _ in range(13):  # mid-episode: TimeLimit's elapsed steps are 4 in both envs
        original.step(_random_actions(original, rng))
    blob = original.snapshot()
    assert blob is not None
    resumed = VecEnv(cfg, seed=99)
    resumed.load_state_dict(original.state_dict())
    resumed.restore(blob)
    np.testing.assert_array_equal(resumed.obs, original.obs)
    ended = 0
    for _ in range(40):
        actions = _random_actions(original, rng)
        a, b = original.step(actions), resumed.step(actions)
        for name in ("obs", "rewards", "terminated", "truncated", "final_obs"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None), name
            if x is not None:
                np.testing.assert_array_equal(x, y, err_msg=name)
        assert a.episodes == b.episodes
        ended += len(a.episodes)
    assert ended >= 8


class DataEnv(gym.Env):
    """Holds one attribute of every kind of data a snapshot keeps, and a callable it skips."""

    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, live=None):
        self.live = live
        self.scale = lambda x: 2 * x  # a callable: the fresh env's own is kept

    def fill(self):
        self.values = {
            1: (np.float32(0.1), [None, True, 2**70, "s"]),
            "nan": float("nan"),
            (2, "k"): np.arange(6, dtype=np.int16).reshape(2, 3),
        }
        self.other_rng = np.random.Generator(np.random.MT19937(7))  # its state holds a uint32 array
        self.other_rng.random(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, False, False, {}


gym.register("postrl-test/Data-v0", entry_point=DataEnv, max_episode_steps=5)


def test_every_kind_of_data_round_trips_with_its_type():
    cfg = EnvConfig(id="postrl-test/Data-v0", n_envs=1)
    env = VecEnv(cfg, 0)
    env.reset()
    env.env.envs[0].unwrapped.fill()
    restored = VecEnv(cfg, 1)
    restored.restore(env.snapshot())
    a, b = env.env.envs[0].unwrapped, restored.env.envs[0].unwrapped
    assert list(b.values) == [1, "nan", (2, "k")]
    x, items = b.values[1]
    assert type(x) is np.float32 and x == np.float32(0.1)
    assert items == [None, True, 2**70, "s"] and type(items[1]) is bool
    assert np.isnan(b.values["nan"])
    assert b.values[(2, "k")].dtype == np.int16
    np.testing.assert_array_equal(b.values[(2, "k")], a.values[(2, "k")])
    assert b.other_rng.random() == a.other_rng.random()
    assert b.np_random.random() == a.np_random.random()
    assert b.scale is not a.scale and b.scale(2) == 4


def test_live_state_is_not_snapshotted():
    """A lock stands in for a Box2D world or MuJoCo data: no snapshot, the caller re-seeds instead."""
    env = VecEnv(EnvConfig(id="postrl-test/Data-v0", n_envs=2, kwargs={"live": threading.Lock()}), 0)
    env.reset()
    assert env.snapshot() is None
    assert VecEnv(EnvConfig(id="CartPole-v1", n_envs=2, async_=True), 0).snapshot() is None


def test_a_snapshot_of_other_envs_is_refused():
    cartpole = VecEnv(EnvConfig(id="CartPole-v1", n_envs=2), 0)
    cartpole.reset()
    blob = cartpole.snapshot()
    with pytest.raises(ValueError, match="wrapped as"):
        VecEnv(EnvConfig(id="Acrobot-v1", n_envs=2), 0).restore(blob)
    with pytest.raises(ValueError, match="holds 2 envs, the config 3"):
        VecEnv(EnvConfig(id="CartPole-v1", n_envs=3), 0).restore(blob)


def test_only_known_bit_generators_are_built():
    """The tree names a bit generator; a name outside numpy's fixed list (here a module function) is refused."""
    env = VecEnv(EnvConfig(id="CartPole-v1", n_envs=1), 0)
    env.reset()
    with np.load(io.BytesIO(env.snapshot()), allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    text = bytes(arrays["tree"]).decode()
    assert '"PCG64"' in text
    arrays["tree"] = np.frombuffer(text.replace('"PCG64"', '"os.system"').encode(), np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    with pytest.raises(ValueError, match="bit generator 'os.system'"):
        VecEnv(EnvConfig(id="CartPole-v1", n_envs=1), 0).restore(buffer.getvalue())


SMALL = ["env.n_envs=2", "ppo.n_steps=16", "ppo.batch_size=8", "ppo.epochs=2", "run.eval_episodes=2"]
SMALL += ["run.save_every=1", "run.keep_last=20"]


@pytest.mark.parametrize("env_id", ["Acrobot-v1", "MountainCar-v0"])
def test_a_run_resumed_from_the_snapshot_equals_an_uninterrupted_one(tmp_path, capsys, env_id):
    """Episodes of 20 steps end inside every iteration, so the resumed envs' RNG and elapsed steps matter."""
    overrides = [f"env.id={env_id}", "env.kwargs={max_episode_steps: 20}", "run.steps=160", *SMALL]
    cfg = load_config(ppo.ControlPPOConfig, None, overrides)
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    train_from_config(cfg, straight)
    shutil.copytree(straight, interrupted)
    for ckpt in (interrupted / "checkpoints").iterdir():
        assert {p.suffix for p in ckpt.iterdir()} == {".safetensors", ".pt", ".npz"}  # no pickle
        if int(ckpt.name.split("_")[1]) > 64:  # as if killed after the 2nd of 5 iterations
            shutil.rmtree(ckpt)
    (interrupted / "summary.json").unlink()
    capsys.readouterr()
    train_from_config(cfg, interrupted, resume=True)
    assert "not bit-identical" not in capsys.readouterr().err
    last = straight / "checkpoints" / "step_00000160"
    for name in ("actor.safetensors", "critic.safetensors", "env_state.npz"):
        assert (last / name).read_bytes() == (interrupted / last.relative_to(straight) / name).read_bytes()

    def rows(run):
        lines = (run / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if k != "time"} for line in lines]

    assert rows(straight) == rows(interrupted)


class _RunsCode:
    """Unpickling this runs a shell command that creates ``marker``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def checkpoint(tmp_path):
    """A finished run's last checkpoint, and a marker file that a payload creates when it is unpickled."""
    cfg = load_config(ppo.ControlPPOConfig, None, ["env.id=CartPole-v1", "run.steps=32", *SMALL])
    train_from_config(cfg, tmp_path / "run")
    marker = tmp_path / "marker"
    pickle.loads(pickle.dumps(_RunsCode(marker)))  # noqa: S301 - the payload works when unpickled ...
    assert marker.exists()
    marker.unlink()  # ... so its absence below means it was never unpickled
    return cfg, tmp_path / "run", tmp_path / "run" / "checkpoints" / "step_00000032", marker


def test_an_old_pickled_snapshot_is_never_loaded(checkpoint, capsys):
    cfg, run, ckpt, marker = checkpoint
    (ckpt / "env_state.npz").unlink()
    (ckpt / "env_state.pkl").write_bytes(pickle.dumps({"envs": _RunsCode(marker), "obs": None}))
    capsys.readouterr()
    train_from_config(cfg, run, resume=True)
    err = capsys.readouterr().err
    assert "env_state.pkl is a pickled env snapshot (older postrl); it is not loaded" in err
    assert "not bit-identical" in err
    assert not marker.exists()


@pytest.mark.parametrize("payload", ["pickle", "object array"])
def test_a_hostile_file_under_the_snapshot_name_is_refused(checkpoint, payload):
    cfg, run, ckpt, marker = checkpoint
    if payload == "pickle":
        blob = pickle.dumps(_RunsCode(marker))
    else:  # a real .npz, whose array of python objects is a pickle inside
        buffer = io.BytesIO()
        np.savez(buffer, tree=np.array([_RunsCode(marker)], dtype=object))
        blob = buffer.getvalue()
    (ckpt / "env_state.npz").write_bytes(blob)
    with pytest.raises(UserError, match="env_state.npz is not a valid env snapshot"):
        train_from_config(cfg, run, resume=True)
    assert not marker.exists()
