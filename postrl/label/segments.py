"""Pairs for Gymnasium: two segments of a policy's (or random) behaviour, each an animated clip to watch.

As Christiano et al. (2017) showed people short clips: episodes are rendered with ``render_mode="rgb_array"``
while a policy acts (a control run folder's agent, `postrl.control.api.load`, or uniform random actions),
cut into segments of ``length`` steps as `postrl.control.prefs_reward.extract_segments` cuts them (within
one episode; after a termination the segment is padding: ``alive`` false, true reward 0, the last picture
held and greyed), and each segment is saved as a looping GIF. The pairs file holds the segments' numbers in
the fields of `postrl.control.prefs_reward.Segments`, so the labels train the same reward model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from postrl.control.api import load as load_agent
from postrl.control.prefs_clips import rgb_array_env
from postrl.label.clips import ended_frame, save_clip
from postrl.runtime.checkpoint import atomic_write_text
from postrl.runtime.errors import UserError

CLIPS = "clips"


def _episode(env: Any, act: Any, seed: int, width: int) -> dict[str, Any]:
    """One episode: observations, actions, rewards, whether it terminated, and its pictures (``width`` px)."""
    obs, _ = env.reset(seed=seed)
    steps: dict[str, list] = {"obs": [], "actions": [], "rewards": [], "frames": []}
    while True:
        frame = Image.fromarray(env.render())
        steps["frames"].append(frame.resize((width, round(frame.height * width / frame.width))))
        action = act(obs)
        steps["obs"].append(np.asarray(obs, dtype=np.float64).tolist())
        steps["actions"].append(np.asarray(action).tolist())
        obs, reward, terminated, truncated, _ = env.step(action)
        steps["rewards"].append(float(reward))
        if terminated or truncated:
            steps["terminated"] = bool(terminated)
            return steps


def _cut(ep: dict[str, Any], start: int, length: int) -> tuple[dict[str, Any], list[Image.Image]]:
    """Steps ``start`` .. ``start + length`` of an episode, padded after a termination."""
    stop = min(start + length, len(ep["obs"]))
    pad = length - (stop - start)
    seg = {
        "obs": ep["obs"][start:stop] + [ep["obs"][stop - 1]] * pad,
        "actions": ep["actions"][start:stop] + [ep["actions"][stop - 1]] * pad,
        "true_rewards": ep["rewards"][start:stop] + [0.0] * pad,
        "alive": [True] * (stop - start) + [False] * pad,
    }
    return seg, ep["frames"][start:stop] + [ended_frame(ep["frames"][stop - 1], stop - start)] * pad


def _starts(ep: dict[str, Any], length: int) -> list[int]:
    """Non-overlapping segment starts; a tail shorter than ``length`` only when the episode terminated
    (padding stands for the absorbing state; after a time-limit truncation what follows is unknown)."""
    n = len(ep["obs"])
    starts = list(range(0, n - length + 1, length))
    tail = starts[-1] + length if starts else 0
    if ep["terminated"] and tail < n:
        starts.append(tail)
    return starts


def segment_pairs(
    env_id: str,
    out_file: Path,
    n: int = 20,
    length: int = 25,
    policy: str | None = None,
    seed: int = 0,
    fps: int = 15,
    width: int = 320,
) -> Path:
    """Write ``out_file`` with ``n`` segment pairs and their clips (``clips/`` beside it)."""
    if n < 1 or length < 1 or fps < 1 or width < 16:
        raise UserError("--n, --length and --fps must be ≥ 1 (and the clip width ≥ 16) to make segment pairs")
    agent = load_agent(policy) if policy is not None else None
    env = rgb_array_env(env_id, {}, "postrl label --env")
    rng = np.random.default_rng(seed)
    env.action_space.seed(seed)

    def act(obs: Any) -> Any:
        return agent.predict(obs)[0] if agent is not None else env.action_space.sample()

    segments: list[tuple[dict, list]] = []
    for episode in range(10_000):
        ep = _episode(env, act, seed + episode, width)
        segments += [_cut(ep, s, length) for s in _starts(ep, length)]
        if len(segments) >= 4 * n:  # some choice, and segments from several episodes
            break
    env.close()
    if len(segments) < 2 * n:
        raise UserError(f"{env_id}: only {len(segments)} segments of {length} steps in 10000 episodes")
    order = rng.permutation(len(segments))[: 2 * n]
    clips = out_file.parent / CLIPS
    clips.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        row: dict[str, Any] = {"env": env_id}
        for side, k in (("first", order[2 * i]), ("second", order[2 * i + 1])):
            seg, frames = segments[k]
            name = f"{CLIPS}/pair{i}-{side}.gif"
            save_clip(frames, out_file.parent / name, fps)
            row[side] = {**seg, "clip": name}
        rows.append(row)
    atomic_write_text(out_file, "".join(json.dumps(r) + "\n" for r in rows))
    return out_file
