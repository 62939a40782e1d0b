"""The clips of a running `postrl control prefs` whose people label on the page (``labeller.source: page``):
each segment drawn as the pictures of an ``rgb_array`` env of the run's id, while the training envs never
render. Two ways, chosen by the env:

- :class:`ObsClips` sets the simulator's state from each raw observation (`STATE_FROM_OBS`: classic control,
  whose state is its observation). Nothing is kept but the segments.
- :class:`ReplayClips`, for any other env that renders: each sub-env is snapshotted as data at the start of
  every rollout (`postrl.control.env_snapshot`: FrozenLake, CliffWalking, Taxi, Blackjack… whose state and
  RNG are plain attributes), and a segment is drawn by restoring its env's snapshot into the ``rgb_array`` env
  and replaying the rollout's actions up to and through the segment (the same steps and resets as the vector
  env: the same RNG draws, so the same transitions). The replayed observations are checked against the
  segment's. The snapshots and actions of the rollouts that pool segments come from are kept, and saved with
  the checkpoint, so a resumed run draws the same clips.

An env that has no ``rgb_array`` render mode, or whose state is not plain data (a Box2D world, MuJoCo data) or
does not replay, is refused with one `ConfigError` naming the env and the reason, before the run folder is made.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from postrl.control.env_snapshot import restore_envs, snapshot_envs
from postrl.control.envs import make_env
from postrl.runtime.config import ConfigError

__all__ = ["STATE_FROM_OBS", "ObsClips", "ReplayClips", "clip_renderer", "rgb_array_env"]


def _angles(*pairs: tuple[int, int]) -> Callable[[np.ndarray], list[float]]:
    return lambda o: [math.atan2(o[s], o[c]) for c, s in pairs]


STATE_FROM_OBS: dict[str, Callable[[np.ndarray], Any]] = {
    "CartPole": lambda o: np.asarray(o, dtype=np.float64),
    "MountainCar": lambda o: np.asarray(o, dtype=np.float64),
    "MountainCarContinuous": lambda o: np.asarray(o, dtype=np.float64),
    "Pendulum": lambda o: np.asarray([*_angles((0, 1))(o), o[2]]),
    "Acrobot": lambda o: np.asarray([*_angles((0, 1), (2, 3))(o), o[4], o[5]]),
}
"""The simulator state (``env.unwrapped.state``) of an observation, per env family."""

REPLAY_PROBE_STEPS = 50
"""Random steps the probe replays from a snapshot to check that an env repeats its transitions."""


def _family(env_id: str) -> str:
    return env_id.split("/")[-1].rsplit("-v", 1)[0]


def _picture(env: gym.Env, width: int) -> Any:
    from PIL import Image

    frame = Image.fromarray(env.render())
    return frame.resize((width, round(frame.height * width / frame.width)))


def _pad(frames: list, alive: torch.Tensor) -> list:
    """``frames`` of the alive steps, then the last one greyed and marked for each padding step."""
    from postrl.label.clips import ended_frame

    held = [ended_frame(frames[-1], len(frames))] * int((~alive).sum()) if frames else []
    return frames + held


def clip_renderer(env_id: str, width: int, env_kwargs: dict[str, Any]) -> ObsClips | ReplayClips:
    """The clip renderer of ``env_id``; a ConfigError naming the env when its segments cannot be drawn."""
    kwargs = {k: v for k, v in env_kwargs.items() if k != "render_mode"}
    env = rgb_array_env(env_id, kwargs, "labeller.source page")
    if _family(env_id) in STATE_FROM_OBS:
        return ObsClips(env, STATE_FROM_OBS[_family(env_id)], width)
    problem = _replay_problem(env_id, kwargs)
    if problem:
        raise ConfigError(f"labeller.source page: {env_id} cannot show its segments as clips: {problem}")
    return ReplayClips(env, width)


def rgb_array_env(env_id: str, kwargs: dict[str, Any], who: str) -> gym.Env:
    """``env_id`` made with ``render_mode="rgb_array"`` and reset, once it has drawn a picture; else a
    ConfigError (``who``: the key or command at fault) naming the env and why it cannot."""
    where = f"{who}: {env_id} cannot show its segments as clips"
    modes = list(make_env(env_id, **kwargs).metadata.get("render_modes") or [])
    if "rgb_array" not in modes:
        raise ConfigError(f"{where}: it has no rgb_array render mode (its render modes: {modes or 'none'})")
    env = make_env(env_id, render_mode="rgb_array", **kwargs)
    env.reset(seed=0)
    try:
        picture = env.render()
    except Exception as err:  # a renderer that needs what this machine lacks (a display, OpenGL)
        raise ConfigError(f"{where}: rendering raised {type(err).__name__}: {err}") from None
    if not isinstance(picture, np.ndarray) or picture.ndim != 3:
        raise ConfigError(f"{where}: render() gave {type(picture).__name__}, not an RGB picture")
    return env


def _replay_problem(env_id: str, kwargs: dict[str, Any]) -> str | None:
    """Why segments of ``env_id`` cannot be replayed from a snapshot (None when they can): a snapshot after a
    seeded reset, then the same random actions from it twice must give the same observations."""
    played, fresh = make_env(env_id, **kwargs), make_env(env_id, **kwargs)
    played.reset(seed=1)
    blob = snapshot_envs([played], None)
    if blob is None:
        return (
            "its state is not plain data (postrl replays a segment from a snapshot of the env's attributes)"
        )
    played.action_space.seed(1)
    actions = [played.action_space.sample() for _ in range(REPLAY_PROBE_STEPS)]
    restore_envs([fresh], blob)
    seen = [[_step(env, a) for a in actions] for env in (played, fresh)]
    for t, (a, b) in enumerate(zip(*seen, strict=True)):
        if not np.array_equal(a, b):
            return f"replaying its steps from a snapshot did not repeat them (step {t} differs)"
    return None


def _step(env: gym.Env, action: Any) -> np.ndarray:
    """One step as the vector env takes it (a reset after an episode's end); the observation seen next."""
    obs, _, terminated, truncated, _ = env.step(action)
    if terminated or truncated:
        obs, _ = env.reset()
    return np.asarray(obs, dtype=np.float64)


class ObsClips:
    """Draws a segment from its raw observations (`STATE_FROM_OBS`); keeps nothing of the rollouts."""

    def __init__(self, env: gym.Env, state_of: Callable[[np.ndarray], Any], width: int):
        self.env, self.state_of, self.width = env, state_of, width

    def rollout_start(self, envs: list[gym.Env], iteration: int) -> None:
        """Nothing to keep: the observations are the state."""

    def add(self, iteration: int, picks: torch.Tensor, actions: torch.Tensor, pool_size: int) -> None:
        """Nothing to keep: the observations are the state."""

    def frames(self, pool_index: int, obs: torch.Tensor, actions: torch.Tensor, alive: torch.Tensor) -> list:
        """The pictures of one segment ``obs [L, obs_dim]``, ``actions [L, ...]``, ``alive [L]``."""
        frames = []
        for t in range(int(alive.sum())):
            self.env.unwrapped.state = self.state_of(obs[t].double().numpy())
            if hasattr(self.env.unwrapped, "last_u"):  # Pendulum draws the torque
                self.env.unwrapped.last_u = float(np.asarray(actions[t]).reshape(-1)[0])
            frames.append(_picture(self.env, self.width))
        return _pad(frames, alive)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing kept."""

    def close(self) -> None:
        self.env.close()


class ReplayClips:
    """Draws a segment by replaying its rollout from a snapshot of its env at the rollout's start."""

    def __init__(self, env: gym.Env, width: int):
        self.env, self.width = env, width
        self.starts: dict[int, list[bytes]] = {}  # iteration → each sub-env's snapshot at the rollout's start
        self.actions: dict[int, torch.Tensor] = {}  # iteration → the rollout's actions [E, T, ...]
        self.origins = torch.zeros(0, 3, dtype=torch.long)  # [pool, 3]: (iteration, env, start) per segment

    def rollout_start(self, envs: list[gym.Env], iteration: int) -> None:
        """Snapshot each sub-env (``envs``: the envs as the vector env steps them, below the reward tap)."""
        blobs = [snapshot_envs([env], None) for env in envs]
        if any(b is None for b in blobs):  # the probe passed, so an attribute became live data mid-run
            raise RuntimeError("labeller.source page: a sub-env's state stopped being plain data; no clips")
        self.starts[iteration] = blobs

    def add(self, iteration: int, picks: torch.Tensor, actions: torch.Tensor, pool_size: int) -> None:
        """The segments ``picks [S, 2]`` (env, start) of this rollout join the pool (its last ``pool_size``
        kept, as `postrl.control.prefs` keeps them); rollouts no pool segment comes from are forgotten."""
        here = torch.cat([torch.full((len(picks), 1), iteration), picks.long()], dim=1)
        # as the pool: the first rollout's segments all join it, later ones push out the oldest
        self.origins = torch.cat([self.origins, here])[-pool_size:] if len(self.origins) else here
        self.actions[iteration] = actions.clone()
        used = set(self.origins[:, 0].tolist())
        for it in [it for it in self.starts if it not in used]:
            del self.starts[it]
            self.actions.pop(it, None)

    def frames(self, pool_index: int, obs: torch.Tensor, actions: torch.Tensor, alive: torch.Tensor) -> list:
        """The pictures of pool segment ``pool_index`` (``obs [L, obs_dim]`` checks the replay)."""
        iteration, e, start = self.origins[pool_index].tolist()
        restore_envs([self.env], self.starts[iteration][e])
        self.env.unwrapped.render_mode = "rgb_array"  # the snapshot is of an env that never renders
        steps = [self._env_action(a) for a in self.actions[iteration][e][: start + int(alive.sum())]]
        for action in steps[:start]:
            _step(self.env, action)
        frames = []
        for t, action in enumerate(steps[start:]):
            frames.append(_picture(self.env, self.width))
            if t + 1 < len(steps) - start:
                obs_next = _step(self.env, action)
                if not np.allclose(obs_next, obs[t + 1].double().numpy(), rtol=1e-4, atol=1e-5):
                    raise RuntimeError(
                        f"labeller.source page: replaying a segment of {self.env.spec.id} left it at step "
                        f"{t + 1}; its clip would show other behaviour than the segment labelled"
                    )
        return _pad(frames, alive)

    def _env_action(self, action: torch.Tensor) -> Any:
        """A rollout's action as the vector env sent it (`postrl.control.envs.VecEnv.to_env_actions`)."""
        space = self.env.action_space
        if isinstance(space, gym.spaces.Box):
            return np.clip(action.numpy(), space.low, space.high)
        return np.int64(action.item())

    def state_dict(self) -> dict[str, Any]:
        def as_tensor(blob: bytes) -> torch.Tensor:
            return torch.frombuffer(bytearray(blob), dtype=torch.uint8)

        return {
            "starts": {it: [as_tensor(b) for b in blobs] for it, blobs in self.starts.items()},
            "actions": dict(self.actions),
            "origins": self.origins,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.starts = {int(it): [bytes(t.numpy()) for t in ts] for it, ts in state["starts"].items()}
        self.actions = {int(it): a for it, a in state["actions"].items()}
        self.origins = state["origins"].long()

    def close(self) -> None:
        self.env.close()
