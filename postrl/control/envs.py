"""Vector environments for the control agents: autoreset, truncation, episode statistics, normalisation.

One design choice runs through this file. Gymnasium 1.x vector envs reset a finished sub-env automatically;
we create them in ``AutoresetMode.SAME_STEP``, so the observation returned by ``step`` after a finished
episode is already the first observation of the next one, and the last observation of the finished episode
is ``infos["final_obs"]``. The learner needs that final observation for exactly one thing: a *truncated*
step (time limit) bootstraps from V(final obs), a *terminated* one does not (its next value is 0).
``terminated`` and ``truncated`` are therefore kept apart all the way into ``postrl.core.gae``.

Normalisation (for continuous control) follows Gymnasium's ``NormalizeObservation`` / ``NormalizeReward``
(running mean and variance, rewards scaled by the std of the discounted return), but lives here so that the
final observation is normalised with the same statistics and the statistics travel with the checkpoint.

A checkpoint's env snapshot is data only (``env_snapshot.py``): loading a checkpoint never runs code.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec, load_env_creator
from gymnasium.vector.utils import iterate

from postrl.control.env_snapshot import restore_envs, snapshot_envs
from postrl.control.fast.cartpole import CartPoleBatch, use_batch
from postrl.runtime.errors import ConfigError, UserError

__all__ = ["EXTRAS", "EnvConfig", "RunningMeanStd", "StepResult", "VecEnv", "make_env", "make_vec_env"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnvConfig:
    id: str = "CartPole-v1"
    """Registered Gymnasium environment id (e.g. CartPole-v1, Acrobot-v1, Pendulum-v1, HalfCheetah-v5)."""
    n_envs: int = 8
    """Number of parallel environments in the vector env."""
    async_: bool = False
    """Step the envs in subprocesses (gymnasium AsyncVectorEnv) instead of in this process."""
    normalize_obs: bool = False
    """Normalise observations with a running mean and std (saved with the checkpoint)."""
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return (saved with the checkpoint)."""
    clip_obs: float = 10.0
    """Clip normalised observations to [-clip_obs, clip_obs]."""
    clip_reward: float = 10.0
    """Clip normalised rewards to [-clip_reward, clip_reward]."""
    reward_gamma: float = 0.99
    """Discount of the return whose std scales the rewards (normalize_reward)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for gymnasium.make (e.g. {render_mode: rgb_array})."""
    backend: Literal["auto", "gymnasium", "numpy"] = "auto"
    """How the copies are stepped: gymnasium (a Gymnasium vector env of gym.make envs), numpy (every copy in
    one set of numpy operations: CartPole-v0/v1, the same observations, rewards and episodes as gymnasium's:
    postrl.control.fast.cartpole) or auto (numpy where it can run, else gymnasium; the choice and the reason
    are logged at info level). An algorithm that steps each copy by itself (reinforce, prefs) takes gymnasium
    under auto."""

    CHECKS = {  # valid ranges (postrl.runtime.config.validate)
        "n_envs": ">= 1",
        "clip_obs": "> 0",
        "clip_reward": "> 0",
        "reward_gamma": "[0, 1]",
    }


EXTRAS = {"box2d": ("box2d",), "mujoco": ("mujoco",), "atari": ("ale_py", "ale-py", "atari")}
"""The pip extras of postrl that install a family of Gymnasium envs, and the words that mark the family in
an env's entry point or in the error of its missing package."""


def make_env(env_id: str, **kwargs: Any) -> gym.Env:
    """``gym.make``; an unknown id, a missing optional package or an unknown keyword is a UserError."""
    spec = _registered_spec(env_id)
    try:
        return gym.make(env_id, **kwargs)
    except (gym.error.DependencyNotInstalled, ImportError) as err:
        haystack = f"{spec.entry_point} {getattr(err, 'name', '')} {err}".lower()
        extra = next((e for e, words in EXTRAS.items() if any(w in haystack for w in words)), None)
        fix = f'pip install "postrl[{extra}]"' if extra else "install the missing package"
        raise UserError(f"env.id={env_id!r} needs a package that is not installed ({err}); {fix}") from err
    except TypeError as err:
        bad = re.search(r"unexpected keyword argument '(\w+)'", str(err))
        if bad is None:
            raise
        valid = ", ".join(_valid_kwargs(spec))
        raise UserError(f"env.kwargs: {env_id} takes no keyword '{bad.group(1)}'; valid: {valid}") from err
    except (ValueError, AssertionError) as err:  # a keyword's value the env refuses (gymnasium's own checks)
        raise UserError(f"env.kwargs: {env_id} refuses {kwargs}: {' '.join(str(err).split())}") from err


def _registered_spec(env_id: str) -> EnvSpec:
    """The registry entry of ``env_id``, or a UserError naming the closest registered ids."""
    if env_id not in gym.registry and env_id.lower().startswith("ale/"):
        # Atari ids are registered by importing ale_py, which gymnasium does not do by itself
        if importlib.util.find_spec("ale_py") is None:
            raise UserError(
                f'env.id={env_id!r} is an Atari env and needs ale_py: pip install "postrl[atari]"'
            )
        importlib.import_module("ale_py")
    if env_id in gym.registry:
        return gym.registry[env_id]
    ids = sorted(gym.registry)
    by_lower = {k.lower(): k for k in ids}
    close = difflib.get_close_matches(env_id.lower(), list(by_lower), n=5, cutoff=0.6)

    def family(k: str) -> str:
        return re.sub(r"-v\d+$", "", k).lower()

    same_family = [k for k in ids if family(k) == family(env_id)]
    suggestions = list(dict.fromkeys([by_lower[k] for k in close] + same_family))  # the closest first
    hint = (
        f"closest registered ids: {', '.join(suggestions)}"
        if suggestions
        else 'list them with python -c "import gymnasium; gymnasium.pprint_registry()"'
    )
    raise UserError(f"env.id: unknown Gymnasium environment {env_id!r}; {hint}")


def _valid_kwargs(spec: EnvSpec) -> list[str]:
    """The keywords ``gym.make`` accepts for ``spec``: its own and the env constructor's named ones."""
    names = {"max_episode_steps", "disable_env_checker"}
    creator = spec.entry_point
    try:
        creator = load_env_creator(creator) if isinstance(creator, str) else creator
        params = inspect.signature(creator).parameters.values()
    except (TypeError, ValueError):  # a builtin or C constructor: no signature to read
        return sorted(names)
    positional_or_keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return sorted(names | {p.name for p in params if p.kind in positional_or_keyword})


class RunningMeanStd:
    """Running mean and variance of a stream of arrays (parallel algorithm of Chan et al., 1979)."""

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4):
        self.mean = np.zeros(shape, dtype=np.float64)
        self.var = np.ones(shape, dtype=np.float64)
        self.count = epsilon

    def update(self, x: np.ndarray) -> None:
        """Fold a batch ``x: [N, *shape]`` into the statistics."""
        batch_mean, batch_var, n = x.mean(axis=0), x.var(axis=0), x.shape[0]
        delta, total = batch_mean - self.mean, self.count + n
        m2 = self.var * self.count + batch_var * n + delta**2 * self.count * n / total
        self.mean, self.var, self.count = self.mean + delta * n / total, m2 / total, total

    def state_dict(self) -> dict[str, Any]:
        return {"mean": self.mean.tolist(), "var": self.var.tolist(), "count": float(self.count)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mean = np.asarray(state["mean"], dtype=np.float64)
        self.var = np.asarray(state["var"], dtype=np.float64)
        self.count = float(state["count"])


@dataclass
class StepResult:
    """One vector step. Arrays are ``[n_envs, ...]``; ``obs`` already holds the next episode's first obs."""

    obs: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: np.ndarray | None
    """``[n_envs, *obs_shape]`` (normalised like ``obs``) where truncated, else None when no env truncated."""
    episodes: list[tuple[int, float, int]]
    """(env index, raw return, length) of every episode that ended in this step."""


def check_spaces(env_id: str, obs_space: gym.Space, action_space: gym.Space) -> None:
    """The spaces postrl.control's MLP policies take: a flat Box observation, a Discrete or 1-D Box action;
    anything else is a UserError naming the env (before the run folder is made)."""
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        hint = (
            " (one-hot encode it with a gymnasium ObservationWrapper and register that env)"
            if isinstance(obs_space, gym.spaces.Discrete)
            else ""
        )
        raise UserError(
            f"env.id={env_id!r} has observation space {obs_space}; postrl.control's MLP policies take a flat "
            f"Box (a vector of numbers){hint}"
        )
    if not isinstance(action_space, gym.spaces.Discrete) and not (
        isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1
    ):
        raise UserError(
            f"env.id={env_id!r} has action space {action_space}; postrl.control's policies take Discrete or "
            "a 1-D Box"
        )


class VecEnv:
    """A Gymnasium vector env in SAME_STEP autoreset mode, with episode statistics and normalisation."""

    def __init__(self, cfg: EnvConfig, seed: int, training: bool = True):
        kwargs = dict(cfg.kwargs)
        probe = make_env(cfg.id, **kwargs)  # validates the id with a readable error
        probe.close()
        check_spaces(cfg.id, probe.observation_space, probe.action_space)
        self.cfg, self.seed, self.training = cfg, seed, training
        self._build(use_batch(cfg.backend, cfg.id, cfg.kwargs, cfg.async_))
        self.n_envs = cfg.n_envs
        self.single_observation_space = self.env.single_observation_space
        self.single_action_space = self.env.single_action_space
        obs_shape = self.single_observation_space.shape
        self.obs_rms = RunningMeanStd(obs_shape) if cfg.normalize_obs else None
        self.ret_rms = RunningMeanStd(()) if cfg.normalize_reward else None
        self._disc_return = np.zeros(cfg.n_envs, dtype=np.float64)
        self._ep_return = np.zeros(cfg.n_envs, dtype=np.float64)
        self._ep_length = np.zeros(cfg.n_envs, dtype=np.int64)
        self.obs: np.ndarray | None = None
        box = self.single_action_space
        self._low = getattr(box, "low", None)
        self._high = getattr(box, "high", None)
        self._continuous = isinstance(box, gym.spaces.Box)
        self._obs_dtype = self.single_observation_space.dtype

    def _build(self, batched: bool) -> None:
        """``self.env``: a `CartPoleBatch` (``batched``) or a Gymnasium vector env in SAME_STEP mode."""
        cfg = self.cfg
        if batched:
            self.env = CartPoleBatch(cfg.id, cfg.n_envs, cfg.kwargs.get("max_episode_steps"))
        else:
            self.env = gym.make_vec(
                cfg.id,
                num_envs=cfg.n_envs,
                vectorization_mode="async" if cfg.async_ else "sync",
                vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
                **cfg.kwargs,
            )
        self.batched = batched
        # Box observations in a SyncVectorEnv: stepped by `_step_in_process` (other spaces and async: gymnasium)
        self._in_process = isinstance(self.env, gym.vector.SyncVectorEnv) and isinstance(
            self.env.single_observation_space, gym.spaces.Box
        )

    def sub_envs(self, who: str) -> list[gym.Env] | None:
        """The in-process sub-envs, for an algorithm (``who``) that steps each one by itself; None when they
        run in subprocesses. Under ``env.backend=auto`` a batched env is rebuilt as Gymnasium's here (call
        it before the first reset); under ``numpy`` that is a ConfigError."""
        if self.batched:
            if self.cfg.backend == "numpy":
                raise ConfigError(
                    f"'env.backend' is numpy, which steps every copy at once; {who} steps each env by itself: "
                    "use env.backend=auto or gymnasium"
                )
            log.info("env.backend=auto: gymnasium vector env, %s steps each sub-env by itself", who)
            self._build(False)
        return getattr(self.env, "envs", None)

    # -- normalisation -------------------------------------------------------------------------------
    def normalize(self, obs: np.ndarray) -> np.ndarray:
        """Normalise ``obs`` with the current statistics (no update); float32."""
        if self.obs_rms is None:
            return obs.astype(np.float32, copy=False)
        z = (obs - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + 1e-8)
        return np.clip(z, -self.cfg.clip_obs, self.cfg.clip_obs).astype(np.float32)

    def _scale_rewards(self, rewards: np.ndarray, done: np.ndarray) -> np.ndarray:
        if self.ret_rms is None:
            return rewards.astype(np.float32, copy=False)
        self._disc_return = self._disc_return * self.cfg.reward_gamma + rewards
        if self.training:
            self.ret_rms.update(self._disc_return)
        self._disc_return[done] = 0.0
        scaled = rewards / np.sqrt(self.ret_rms.var + 1e-8)
        return np.clip(scaled, -self.cfg.clip_reward, self.cfg.clip_reward).astype(np.float32)

    def _observe(self, raw: np.ndarray) -> np.ndarray:
        if self.obs_rms is not None and self.training:
            self.obs_rms.update(raw)
        return self.normalize(raw)

    # -- stepping ------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> np.ndarray:
        """Reset every sub-env (seeded ``seed, seed+1, ...``); returns normalised obs ``[n_envs, *obs_shape]``."""
        raw, _ = self.env.reset(seed=self.seed if seed is None else seed)
        self._ep_return[:] = 0.0
        self._ep_length[:] = 0
        self._disc_return[:] = 0.0
        self.obs = self._observe(raw)
        return self.obs

    def to_env_actions(self, actions: np.ndarray) -> np.ndarray:
        """Box actions are clipped to the bounds only here, when sent to the env."""
        if self._continuous:
            return np.clip(actions, self._low, self._high)
        return actions

    def _step_in_process(self, actions: np.ndarray) -> tuple[np.ndarray, ...]:
        """``SyncVectorEnv.step`` in SAME_STEP mode, stepping its sub-envs here: the same calls in the same
        order (so the same results: tests/control/test_envs.py), without merging every sub-env's info dict
        into batched arrays, a sizeable share of a CartPole vector step (benchmarks/control.py). Only what `step` reads is
        returned: (obs, rewards, terminated, truncated, {row: final obs})."""
        n = self.n_envs
        obs: list[Any] = [None] * n
        rewards = np.zeros(n, dtype=np.float64)
        terminated, truncated = np.zeros(n, dtype=np.bool_), np.zeros(n, dtype=np.bool_)
        final = {}
        # read afresh: a resume or `postrl.control.prefs` may replace the sub-envs
        for i, (env, action) in enumerate(
            zip(self.env.envs, iterate(self.env.action_space, actions), strict=True)
        ):
            obs[i], rewards[i], terminated[i], truncated[i], _ = env.step(action)
            if terminated[i] or truncated[i]:
                final[i] = obs[i]
                obs[i], _ = env.reset()
        return np.stack(obs).astype(self._obs_dtype, copy=False), rewards, terminated, truncated, final

    def step(self, actions: np.ndarray) -> StepResult:
        if self.batched:
            raw, rewards, terminated, truncated, finals = self.env.step(actions)
        elif self._in_process:
            raw, rewards, terminated, truncated, finals = self._step_in_process(self.to_env_actions(actions))
        else:
            raw, rewards, terminated, truncated, infos = self.env.step(self.to_env_actions(actions))
            finals = infos.get("final_obs")
        done = terminated | truncated
        self._ep_return += rewards
        self._ep_length += 1
        episodes: list[tuple[int, float, int]] = []
        final_obs = None
        if done.any():
            for i in np.flatnonzero(done):
                episodes.append((int(i), float(self._ep_return[i]), int(self._ep_length[i])))
            self._ep_return[done] = 0.0
            self._ep_length[done] = 0
            if truncated.any():
                final_obs = np.zeros_like(raw, dtype=np.float32)
                rows = np.flatnonzero(truncated)
                final_obs[rows] = self.normalize(np.stack([finals[i] for i in rows]))
        scaled = self._scale_rewards(rewards, done)
        self.obs = self._observe(raw)
        return StepResult(self.obs, scaled, terminated, truncated, final_obs, episodes)

    def close(self) -> None:
        self.env.close()

    # -- checkpointing -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Normaliser statistics and episode accumulators (plain python: safe to load with weights_only)."""
        return {
            "obs_rms": None if self.obs_rms is None else self.obs_rms.state_dict(),
            "ret_rms": None if self.ret_rms is None else self.ret_rms.state_dict(),
            "disc_return": self._disc_return.tolist(),
            "ep_return": self._ep_return.tolist(),
            "ep_length": self._ep_length.tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.obs_rms is not None and state.get("obs_rms") is not None:
            self.obs_rms.load_state_dict(state["obs_rms"])
        if self.ret_rms is not None and state.get("ret_rms") is not None:
            self.ret_rms.load_state_dict(state["ret_rms"])
        self._disc_return = np.asarray(state["disc_return"], dtype=np.float64)
        self._ep_return = np.asarray(state["ep_return"], dtype=np.float64)
        self._ep_length = np.asarray(state["ep_length"], dtype=np.int64)

    def snapshot(self) -> bytes | None:
        """The sub-envs' state and the current obs as data, for exact resume; None when a sub-env holds
        state that is not plain data (then the caller re-seeds the envs and says so), or the envs run in
        subprocesses. See :mod:`postrl.control.env_snapshot`."""
        envs = self.env.to_envs() if self.batched else getattr(self.env, "envs", None)
        return None if envs is None else snapshot_envs(envs, self.obs)

    def restore(self, blob: bytes) -> None:
        """Continue from a :meth:`snapshot` of envs of the same config; a ValueError if ``blob`` is not one.
        Either backend reads the other's snapshots (a batched env's are of Gymnasium envs in its state)."""
        if not self.batched:
            self.obs = restore_envs(self.env.envs, blob)
            return
        envs = self.env.to_envs()
        self.obs = restore_envs(envs, blob)
        self.env.from_envs(envs)


def make_vec_env(
    env_id: str,
    n_envs: int = 8,
    seed: int = 0,
    async_: bool = False,
    normalize_obs: bool = False,
    normalize_reward: bool = False,
    **kwargs: Any,
) -> VecEnv:
    """Convenience constructor: ``VecEnv(EnvConfig(...), seed)``."""
    cfg = EnvConfig(
        id=env_id,
        n_envs=n_envs,
        async_=async_,
        normalize_obs=normalize_obs,
        normalize_reward=normalize_reward,
        **kwargs,
    )
    return VecEnv(cfg, seed)
