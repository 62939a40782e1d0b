"""Clips of the segments a running `postrl control prefs` asks people to label (`postrl.control.prefs_clips`):
envs whose state is not their observation are replayed from a snapshot (here FrozenLake, one-hot encoded for
the MLP policies, slippery: its RNG decides every move), and an env that cannot be drawn is one error line."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv
from PIL import Image, ImageChops, ImageSequence

from postrl.cli import main
from postrl.control import prefs
from postrl.control.prefs_clips import ReplayClips, clip_renderer
from postrl.control.prefs_reward import cut_segments, pick_segments
from postrl.runtime.config import ConfigError, load_config
from tests.control.test_prefs import assert_same_weights, interrupted_copy, tiny_cartpole_cfg

pytest.importorskip("starlette")

LAKE, DARK, LIVE = "postrl-test/OneHotFrozenLake-v0", "postrl-test/NoPictures-v0", "postrl-test/LiveState-v0"


class OneHotFrozenLake(gym.ObservationWrapper):
    """Slippery FrozenLake 4x4 with its cell one-hot encoded (a flat Box, as the MLP policies take)."""

    def __init__(self, render_mode: str | None = None):
        super().__init__(FrozenLakeEnv(render_mode=render_mode, is_slippery=True))
        self.observation_space = gym.spaces.Box(0.0, 1.0, (16,), np.float32)

    def observation(self, s: int) -> np.ndarray:
        return np.eye(16, dtype=np.float32)[s]


class NoPictures(gym.Env):
    """An env with no render mode at all."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode: str | None = None):
        self.render_mode = render_mode

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 1.0, False, False, {}


class LiveState(NoPictures):
    """Renders, but holds state that is not plain data (as a Box2D world or MuJoCo data is)."""

    metadata = {"render_modes": ["rgb_array"]}

    def reset(self, seed=None, options=None):
        self.world = object()
        return super().reset(seed=seed)

    def render(self):
        return np.zeros((8, 8, 3), np.uint8)


for env_id, entry in ((LAKE, OneHotFrozenLake), (DARK, NoPictures), (LIVE, LiveState)):
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=entry, max_episode_steps=40)


def _lake_cfg(*overrides):
    page = ["labeller.source=page", "labeller.page.serve=false", "labeller.page.wait=none"]
    labels = ["prefs.label_budget=12", "prefs.initial_labels=6", "labeller.page.clip_width=64"]
    return tiny_cartpole_cfg(f"env.id={LAKE}", *page, *labels, *overrides)


def test_a_tabular_env_run_writes_clips_that_replay_its_segments(tmp_path):
    """control prefs on one-hot FrozenLake asks for pairs whose clips are GIFs of the segments' moves: a
    picture per step (GIF merges repeated pictures, their durations summed) that changes wherever the elf
    changes cell, so the clip shows the segment (the replay is also checked against its observations)."""
    run = tmp_path / "run"
    summary = prefs.run(_lake_cfg(), run)
    rows = [json.loads(line) for line in (run / "labelling" / "pairs.jsonl").read_text().splitlines()]
    assert len(rows) == summary["pairs_asked"] == 12
    moving = 0
    for side in (r[s] for r in rows for s in ("first", "second")):
        gif = Image.open(run / "labelling" / side["clip"])
        frames = [f.convert("RGB") for f in ImageSequence.Iterator(gif)]
        assert len(frames) <= len(side["obs"]) == 10
        cells = [int(np.argmax(o)) for o, alive in zip(side["obs"], side["alive"], strict=True) if alive]
        moves = sum(a != b for a, b in zip(cells, cells[1:], strict=False))
        distinct = 1 + sum(
            ImageChops.difference(a, b).getbbox() is not None
            for a, b in zip(frames, frames[1:], strict=False)
        )
        assert distinct >= 1 + moves
        moving += moves > 0
    assert moving > len(rows) // 2  # the frames of many clips differ


def test_a_resumed_tabular_run_draws_the_same_clips(tmp_path):
    """The snapshots the clips are replayed from are saved with each checkpoint: a run resumed halfway asks for
    the same pairs (segments of rollouts before the resume among them) and draws the same clips."""
    straight = tmp_path / "straight"
    cfg = _lake_cfg("run.save_every=1", "run.keep_last=20", "prefs.label_until=1.0")
    prefs.run(cfg, straight)
    interrupted = interrupted_copy(straight, tmp_path / "interrupted")  # killed after the 2nd of 4 iterations
    metrics = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    asked = int(next(m["pairs_asked"] for m in metrics if m.get("step") == 128))
    assert 0 < asked < 12  # pairs are asked after the resume too
    folder = interrupted / "labelling"
    kept = (folder / "pairs.jsonl").read_text().splitlines()[:asked]  # what the run had asked when killed
    (folder / "pairs.jsonl").write_text("".join(line + "\n" for line in kept))
    drawn = {json.loads(line)[side]["clip"] for line in kept for side in ("first", "second")}
    for clip in (folder / "media").iterdir():
        if f"media/{clip.name}" not in drawn:
            clip.unlink()
    prefs.run(load_config(prefs.ControlPrefsConfig, interrupted / "config.yaml"), interrupted, resume=True)
    lines = (straight / "labelling" / "pairs.jsonl").read_text()
    assert (interrupted / "labelling" / "pairs.jsonl").read_text() == lines
    clips = sorted(p.name for p in (straight / "labelling" / "media").iterdir())
    assert sorted(p.name for p in (interrupted / "labelling" / "media").iterdir()) == clips
    for name in clips:
        a = (straight / "labelling" / "media" / name).read_bytes()
        assert (interrupted / "labelling" / "media" / name).read_bytes() == a
    assert_same_weights(straight, interrupted)


def test_a_replay_that_leaves_the_segment_is_an_error():
    """Clips never show other behaviour than the segment labelled: a segment whose observations the replay
    of its rollout does not reach raises."""
    clips = clip_renderer(LAKE, 32, {})
    assert isinstance(clips, ReplayClips)
    envs = [gym.make(LAKE) for _ in range(2)]
    first_obs = [env.reset(seed=e)[0] for e, env in enumerate(envs)]
    clips.rollout_start(envs, iteration=0)
    actions = torch.randint(4, (2, 12), generator=torch.Generator().manual_seed(0))
    obs, term = torch.zeros(2, 12, 16), torch.zeros(2, 12, dtype=torch.bool)
    for e, env in enumerate(envs):  # as the vector env steps them: a reset after an episode's end
        o = first_obs[e]
        for t in range(12):
            obs[e, t] = torch.as_tensor(o)
            o, _, terminated, truncated, _ = env.step(int(actions[e, t]))
            term[e, t] = bool(terminated)
            if terminated or truncated:
                o, _ = env.reset()
    picks = pick_segments(term, torch.zeros_like(term), 6, 4)
    segs = cut_segments(obs, actions, torch.zeros(2, 12), term, picks, 6)
    clips.add(0, picks, actions, pool_size=8)
    k = int(torch.argmax(segs.alive.sum(-1)))  # the segment with the most steps before an episode ends
    assert segs.alive[k].sum() >= 2
    assert len(clips.frames(k, segs.obs[k], segs.actions[k], segs.alive[k])) == 6
    wrong = segs.obs[k].clone()
    wrong[1] = wrong[1].roll(1)  # another cell at step 1
    with pytest.raises(RuntimeError, match="left it at step 1"):
        clips.frames(k, wrong, segs.actions[k], segs.alive[k])


@pytest.mark.parametrize(
    ("env_id", "reason"),
    [
        (DARK, "it has no rgb_array render mode"),
        (LIVE, "its state is not plain data"),
    ],
)
def test_an_env_whose_clips_cannot_be_drawn_is_one_error_line(tmp_path, capsys, env_id, reason):
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=f"{env_id} cannot show its segments as clips: {reason}"):
        prefs.run(tiny_cartpole_cfg(f"env.id={env_id}", "labeller.source=page", "labeller.page.port=0"), out)
    assert not out.exists()
    code = main(["control", "prefs", "--env", env_id, "--labeller", "page", "--out", str(out)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("postrl: error:") and env_id in lines[0]
    assert reason in lines[0] and not out.exists()


def test_postrl_label_env_of_an_env_without_pictures_is_one_error_line(tmp_path, capsys):
    out = tmp_path / "labels"
    code = main(["label", "--env", DARK, "--n", "2", "--out", str(out)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("postrl: error: postrl label --env:")
    assert f"{DARK} cannot show its segments as clips: it has no rgb_array render mode" in lines[0]
    assert not (out / "pairs.jsonl").exists()
