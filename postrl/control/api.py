"""Control the Stable-Baselines3 way: ``train`` an agent, ``load`` it back, ``predict`` actions, ``evaluate``.

    import postrl.control

    agent = postrl.control.train("ppo", "CartPole-v1", total_steps=20_000, seed=0, out="runs/cartpole")
    action, _ = agent.predict(obs, deterministic=True)        # one observation, or a batch [N, *obs_shape]
    mean, std = postrl.control.evaluate(agent, n_episodes=10)
    agent = postrl.control.load("runs/cartpole")             # the run folder is the saved agent

`train` is ``postrl control train`` (or ``control prefs`` for ``algo="prefs"``): the same config resolution
(the shipped preset ``<algo>-<env>`` unless ``config=`` is given, then ``total_steps``/``seed``, then keyword
overrides nested as ``ppo={"lr": 3e-4}`` or dotted as ``**{"ppo.lr": 3e-4}``), the same run folder and checks;
a bad input raises `postrl.runtime.errors.UserError`. ``env`` is a Gymnasium id, a factory returning a
``gymnasium.Env`` or an env instance (copied for each parallel env); a Python env is registered as
``postrl/<Name>-v0``, and loading or resuming its run in another process needs it passed again (``env=``).
``on_iteration(info) -> bool`` is called after every iteration (``info``: step, iteration, metrics, run_dir);
returning ``False`` stops the run early, as SB3's callbacks do.

`Agent.predict` follows SB3: ``predict(observation, state=None, episode_start=None, deterministic=False)``
returns ``(actions, None)``; the observation is normalised with the checkpoint's statistics and Box actions
are clipped to the action space. An observation that the env's observation space cannot hold (not numbers,
None, NaN or inf, another shape) is a `UserError` naming the space. `evaluate` returns ``(mean, std)`` of the
episode returns, as SB3's ``evaluate_policy``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from postrl.control import loop
from postrl.control.commands import train_config
from postrl.control.evaluation import evaluate_policy_episodes
from postrl.runtime import callbacks
from postrl.runtime.config import from_dict, read_yaml, to_dict
from postrl.runtime.errors import UserError
from postrl.runtime.overrides import apply_overrides, plain
from postrl.runtime.rundir import run_state

__all__ = ["Agent", "evaluate", "load", "train"]

NAMESPACE = "postrl"  # Gymnasium namespace of the envs given as Python objects


# ---- envs given as Python objects ------------------------------------------------------------------------
def env_id(env: Any, name: str | None = None) -> str:
    """A Gymnasium id for ``env``: an id as is; an env made by ``gym.make`` its own id; a factory or any other
    instance registered as ``name`` (default ``postrl/<Name>-v0``; an instance is deep-copied for each env
    postrl makes)."""
    if isinstance(env, str):
        return env
    if isinstance(env, gym.Env):
        spec = env.spec
        if (
            spec is not None
            and spec.id in gym.registry
            and gym.registry[spec.id].entry_point == spec.entry_point
        ):
            return spec.id
        label, factory = type(env.unwrapped).__name__, _copies(env)
    elif callable(env):
        label, factory = getattr(env, "__name__", type(env).__name__), env
    else:
        raise UserError(
            f"env: expected a Gymnasium id, a gymnasium.Env or a factory; got {type(env).__name__}"
        )
    if name is None:
        label = re.sub(r"\W", "", label.replace("<lambda>", "Lambda")) or "Env"
        name = f"{NAMESPACE}/{label[0].upper()}{label[1:]}-v0"
    if name in gym.registry:
        del gym.registry[name]  # the latest object given under this name wins
    gym.register(name, entry_point=factory, disable_env_checker=True)
    return name


def _copies(env: gym.Env) -> Callable[..., gym.Env]:
    def factory(**kwargs: Any) -> gym.Env:
        return copy.deepcopy(env)

    return factory


def _check_registered(env: str, run_dir: Path) -> None:
    if env.startswith(f"{NAMESPACE}/") and env not in gym.registry:
        raise UserError(
            f"{run_dir} was trained on env {env!r}, a Python object given to postrl.control.train; it is not "
            "saved with the run: pass it again as env= (a factory or an instance)"
        )


def _run_env(run_dir: Path) -> str:
    """The env id in a run folder's config.yaml ("" when there is none)."""
    path = run_dir / "config.yaml"
    env = read_yaml(path).get("env") if path.is_file() else None
    return str(env.get("id", "")) if isinstance(env, dict) else ""


# ---- training --------------------------------------------------------------------------------------------
def _config(
    algo: str, env: str | None, config: Any, total_steps: Any, seed: Any, run_dir: Path | None
) -> Any:
    """The config as ``postrl control train`` resolves it (preset or ``config``, then the flags)."""
    config_class = loop.algorithm(algo).config
    if dataclasses.is_dataclass(config) and not isinstance(config, type) or isinstance(config, dict):
        base = to_dict(config) if not isinstance(config, dict) else plain(config)
        flags = {"env.id": env, "run.steps": total_steps, "run.seed": seed}
        return apply_overrides(
            config_class, from_dict(config_class, base), {k: v for k, v in flags.items() if v is not None}
        )
    return train_config(
        algo, env=env, config=config, total_steps=total_steps, seed=seed,
        resume=run_dir if run_dir is not None else None,
    )  # fmt: skip


def train(
    algo: str = "ppo",
    env: Any = None,
    *,
    total_steps: int | None = None,
    seed: int | None = None,
    n_envs: int | None = None,
    out: str | os.PathLike[str] | None = None,
    config: Any = None,
    resume: bool = False,
    overwrite: bool = False,
    on_iteration: Callable[[dict[str, Any]], Any] | None = None,
    **overrides: Any,
) -> Agent:
    """Train ``algo`` (reinforce, a2c, trpo, ppo, prefs) on ``env``; returns the trained `Agent` (its run
    folder, summary and config attached). ``n_envs``: parallel envs (``env.n_envs``); the env section's other
    keys are dotted overrides (``**{"env.normalize_obs": True}``). See the module docstring for the rest."""
    if algo not in loop.ALGORITHMS:
        raise UserError(f"unknown algorithm {algo!r}; choose one of {', '.join(loop.ALGORITHMS)}")
    if resume and out is None:
        raise UserError("postrl.control.train: resume=True needs out= (the run folder to continue)")
    if out is not None and not isinstance(out, (str, os.PathLike)):  # as postrl.sft(...) checks it
        raise UserError(
            f"postrl.control.train: out= is the run folder's path, got {type(out).__name__} {out!r}"
        )
    recorded = _run_env(Path(out)) if resume else ""
    name = recorded if recorded.startswith(f"{NAMESPACE}/") else None
    env_name = env_id(env, name) if env is not None else None
    cfg = _config(algo, env_name, config, total_steps, seed, Path(out) if resume else None)
    flags = {"run.steps": total_steps, "run.seed": seed, "env.n_envs": n_envs}  # also on resume
    cfg = apply_overrides(type(cfg), cfg, {**{k: v for k, v in flags.items() if v is not None}, **overrides})
    run_dir = Path(out) if out is not None else Path(f"runs/{cfg.algo}-{cfg.env.id}-s{cfg.run.seed}")
    _check_registered(cfg.env.id, run_dir)
    resume = resume or (run_state(run_dir) == "interrupted" and not overwrite)  # as the command does
    if algo == "prefs":
        from postrl.control.prefs import run as run_fn
    else:
        run_fn = loop.train_from_config
    with callbacks.on_iteration(on_iteration):
        summary = run_fn(cfg, run_dir, resume=resume, overwrite=overwrite)
    agent = load(run_dir)
    agent.summary = summary
    return agent


# ---- loading and acting ----------------------------------------------------------------------------------
class Agent:
    """A trained policy loaded from its run folder (the latest checkpoint's weights and normaliser)."""

    def __init__(
        self, run_dir: Path, cfg: Any, agent: loop.Learner, env: Any, summary: dict[str, Any] | None
    ):
        self.run_dir, self.config, self.summary = run_dir, cfg, summary
        self.actor = agent.actor.eval()
        self._env = env  # a one-env VecEnv holding the checkpoint's observation statistics
        self.observation_space = env.single_observation_space
        self.action_space = env.single_action_space
        self._generator = torch.Generator().manual_seed(cfg.run.seed)

    def __repr__(self) -> str:
        return f"Agent({self.config.algo} on {self.config.env.id}, run_dir={str(self.run_dir)!r})"

    @torch.no_grad()
    def predict(
        self,
        observation: Any,
        state: Any = None,
        episode_start: Any = None,
        deterministic: bool = False,
    ) -> tuple[np.ndarray, None]:
        """SB3's ``predict``: ``(actions, None)`` for one observation (``obs_shape``) or a batch
        (``[N, *obs_shape]``); sampled unless ``deterministic`` (argmax, or the Gaussian mean). ``state`` and
        ``episode_start`` are accepted for SB3's signature (the MLP policies have no recurrent state)."""
        obs = check_observations(observation, self.observation_space)
        single = obs.shape == tuple(self.observation_space.shape)
        batch = obs[None] if single else obs
        x = torch.from_numpy(self._env.normalize(batch))
        actions, _ = self.actor.act(x, deterministic=deterministic, generator=self._generator)
        actions = self._env.to_env_actions(actions.numpy())
        return (actions[0] if single else actions), None


def check_observations(observation: Any, space: gym.spaces.Box) -> np.ndarray:
    """``observation`` as a float64 array of shape ``space.shape`` or ``[N, *space.shape]``; anything else
    (strings, None, NaN or ±inf, a ragged list, another shape) is a `UserError` naming ``space``: a policy
    fed a NaN returns an action all the same, so a bad observation would pass silently."""
    shape = tuple(space.shape)
    expected = (
        f"expected {shape} or a batch (N, {', '.join(map(str, shape))}) of finite numbers (the env's {space})"
    )
    try:
        obs = np.asarray(observation)
    except ValueError:  # numpy refuses ragged nested lists
        raise UserError(f"predict: observations that are not one rectangular array; {expected}") from None
    if obs.dtype == object:
        for index, value in np.ndenumerate(obs):
            if value is None or not isinstance(value, (int, float, np.integer, np.floating, np.bool_)):
                raise UserError(f"predict: observation element {index} is {value!r}; {expected}")
        obs = obs.astype(np.float64)
    if not (
        np.issubdtype(obs.dtype, np.integer) or np.issubdtype(obs.dtype, np.floating) or obs.dtype == bool
    ):
        raise UserError(f"predict: observations of dtype {obs.dtype} (not numbers); {expected}")
    if obs.shape != shape and tuple(obs.shape[1:]) != shape:
        raise UserError(f"predict: an observation of shape {obs.shape}; {expected}")
    bad = ~np.isfinite(obs.astype(np.float64, copy=False))
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        raise UserError(f"predict: observation element {index} is {obs[index]}; {expected}")
    return obs.astype(np.float64, copy=False)


def load(run_dir: str | os.PathLike[str], env: Any = None) -> Agent:
    """The agent of a run folder written by `train` or ``postrl control train`` (``env``: the env object a
    run trained on a Python env was given, when loading it in another process)."""
    run_dir = Path(run_dir)
    recorded = _run_env(run_dir)
    if env is not None:
        env_id(env, recorded if recorded.startswith(f"{NAMESPACE}/") else None)
    _check_registered(recorded, run_dir)
    cfg, agent, vec_env = loop.load_agent(run_dir)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    return Agent(run_dir, cfg, agent, vec_env, summary)


def evaluate(
    agent: Agent | str | os.PathLike[str],
    env: Any = None,
    n_episodes: int = 10,
    deterministic: bool = True,
    seed: int | None = None,
) -> tuple[float, float]:
    """``(mean, std)`` of the returns of ``n_episodes`` episodes, as SB3's ``evaluate_policy``.

    ``agent``: an `Agent` or a run folder. ``env`` None: the run's env, episodes seeded as ``postrl control
    eval`` seeds them (10000 + 100·s + i, s = ``seed`` or else the run's seed, so the numbers match the
    command's); a Gymnasium id, a factory or an instance: episodes on it, one after another (seeds ``seed`` + i,
    10000 + i when ``seed`` is None)."""
    if not isinstance(agent, Agent):
        agent = load(agent)
    if n_episodes < 1:
        raise UserError(f"n_episodes must be >= 1, got {n_episodes}")
    if env is None:
        returns = evaluate_policy_episodes(
            agent.actor, agent._env, agent.config, n_episodes, deterministic=deterministic, seed=seed
        )
    else:
        returns = _episodes(
            agent, _instance(env), n_episodes, deterministic, 10_000 if seed is None else seed
        )
    return float(np.mean(returns)), float(np.std(returns))


def _instance(env: Any) -> gym.Env:
    if isinstance(env, gym.Env):
        return env
    if isinstance(env, str):
        from postrl.control.envs import make_env

        return make_env(env)
    if callable(env):
        return env()
    raise UserError(f"env: expected a Gymnasium id, a gymnasium.Env or a factory; got {type(env).__name__}")


def _episodes(agent: Agent, env: gym.Env, n: int, deterministic: bool, seed: int) -> list[float]:
    returns = []
    for i in range(n):
        obs, _ = env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            action, _ = agent.predict(obs, deterministic=deterministic)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = bool(terminated or truncated)
        returns.append(total)
    return returns
