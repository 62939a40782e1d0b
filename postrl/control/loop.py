"""The training loop every control algorithm shares: run folder, logging, evaluation, checkpoints, resume.

An algorithm file (``ppo.py``, ``a2c.py``, …) provides a run config dataclass (``ControlPPOConfig``, …) and
a builder (``build_ppo(cfg, env)``, …) returning a :class:`Learner` whose ``iteration`` collects experience
and updates the networks once; :func:`algorithm` finds both by the config's ``algo:`` name. This file runs the
iterations and does everything around them; the evaluation episodes are ``evaluation.py``.

Exact resume. Checkpoints are taken at iteration boundaries and hold the networks, optimizers, every RNG
state, the step counters, the normaliser statistics and a data-only snapshot of the sub-environments (their
simulator state, including each env's own RNG and elapsed time steps; ``env_snapshot.py``: loading it never
runs code). A resumed run therefore continues bit-for-bit as the uninterrupted run would have. Envs whose
state is not plain data (Box2D, MuJoCo, subprocess envs), and checkpoints of older postrl versions whose
snapshot was a pickle (never loaded), are instead reset with a seed derived from (seed, iteration); such a
resume is not exact and says so on stderr.

Under ``torchrun`` (PPO only) every rank runs this loop on its own envs; what differs is in ``ranks.py``.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from postrl.control import ranks
from postrl.control.envs import VecEnv
from postrl.control.evaluation import evaluate_policy_episodes, record_gif
from postrl.runtime import callbacks
from postrl.runtime.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from postrl.runtime.config import ConfigError, load_config, read_yaml, validate
from postrl.runtime.distributed import broadcast_object, is_main, reduce_metrics, world_size
from postrl.runtime.errors import UserError
from postrl.runtime.plots import write_curves
from postrl.runtime.progress import Progress
from postrl.runtime.rundir import open_run
from postrl.runtime.seeding import seed_everything

__all__ = [
    "ALGORITHMS",
    "ControlAlgorithm",
    "Learner",
    "ControlRunConfig",
    "evaluate_policy_episodes",
    "load_agent",
    "train_from_config",
]

ALGORITHMS = {  # the `algo:` of a config.yaml → (module, its run config class, its learner builder)
    "reinforce": ("postrl.control.reinforce", "ControlReinforceConfig", "build_reinforce"),
    "a2c": ("postrl.control.a2c", "ControlA2CConfig", "build_a2c"),
    "trpo": ("postrl.control.trpo", "ControlTRPOConfig", "build_trpo"),
    "ppo": ("postrl.control.ppo", "ControlPPOConfig", "build_ppo"),
    # PPO on a reward learned from segment preferences
    "prefs": ("postrl.control.prefs", "ControlPrefsConfig", "build_prefs"),
}
# Score thresholds of "solved" used for steps_to_threshold (the peer benchmark's, else the env spec's).
THRESHOLDS = {"CartPole-v1": 475.0, "Acrobot-v1": -100.0, "Pendulum-v1": -200.0}
WINDOW = 20  # episodes in the training moving average


@dataclass(frozen=True)
class ControlRunConfig:
    """How long a run lasts, how often it logs, evaluates and checkpoints (the LM trainers' ``run`` section,
    less what does not apply to control: device, dtype, parallel)."""

    steps: int = 100_000
    """Environment steps to train for (rounded up to whole iterations)."""
    seed: int = 0
    """Seed of python, numpy, torch and the environments."""
    save_every: int = 50
    """Checkpoint every this many iterations, not env steps (and always at the end); 0: only at the end."""
    keep_last: int = 3
    """How many of the newest checkpoints to keep (0: all)."""
    log_every: int = 1
    """Log metrics every this many iterations."""
    eval_every: int = 0
    """Also evaluate every this many env steps during training (0: only at the end)."""
    max_seconds: float | None = None
    """Also stop after this many seconds of training (evaluation excluded; rank 0's clock), at the end of an
    iteration; null: no time limit. The learning-rate and clip schedules still run over run.steps."""
    threads: int | None = 1
    """torch.set_num_threads for training (1 is fastest for small MLPs; null: torch's default)."""
    tensorboard: bool = False
    """Also write TensorBoard event files."""
    eval_episodes: int = 20
    """Episodes of the final deterministic evaluation (seeds 10000 + 100·seed + i)."""
    gif: bool = False
    """Write eval.gif of one deterministic episode at the end (env must render rgb_array)."""

    CHECKS = {  # valid ranges (postrl.runtime.config.validate)
        "steps": ">= 1",
        "seed": ">= 0",
        "save_every": ">= 0",
        "keep_last": ">= 0",
        "log_every": ">= 1",
        "eval_every": ">= 0",
        "max_seconds": "> 0",
        "threads": ">= 1",
        "eval_episodes": ">= 1",
    }
    RENAMED = {  # old key → new (postrl.runtime.config)
        "total_steps": "steps",
        "torch_threads": "threads",
        "checkpoint_every": "save_every",
        "keep_checkpoints": "keep_last",
    }


class Learner(abc.ABC):
    """What the loop needs from an algorithm (see ppo.PPOLearner for a full example)."""

    actor: nn.Module
    modules: dict[str, nn.Module]
    optimizers: dict[str, torch.optim.Optimizer]
    needs_env_reset: bool = False  # True: the agent resets the env itself (e.g. full-episode REINFORCE)

    @abc.abstractmethod
    def iteration(self, env: VecEnv, it: int, frac_done: float) -> tuple[dict[str, Any], list, int]:
        """Collect and learn once, ``frac_done`` (env steps so far / total) into the run.

        Returns (metrics, episodes as [(env steps into the iteration, return, length)], env steps taken).
        """

    def attach(self, run_dir: Path) -> None:  # noqa: B027  (optional: most learners need no files of their own)
        """Called once the run folder is open, before the first iteration (prefs: the labelling folder)."""

    def close(self) -> None:  # noqa: B027
        """Called when the run ends or fails (prefs: stops the labelling page)."""


@dataclass(frozen=True)
class ControlAlgorithm:
    """What the loop, the API and the bench need of an algorithm file."""

    config: type
    """The config class of a whole run (what config.yaml holds), e.g. ``ControlPPOConfig``."""
    build: Callable[[Any, VecEnv], Learner]
    """``build(cfg, env)``: the learner of a config, e.g. ``build_ppo``."""


def algorithm(name: str) -> ControlAlgorithm:
    """Algorithm ``name`` (the ``algo:`` key of its config), its module imported on first use."""
    if name not in ALGORITHMS:
        raise ConfigError(f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}")
    module_name, config, build = ALGORITHMS[name]
    module = importlib.import_module(module_name)
    return ControlAlgorithm(config=getattr(module, config), build=getattr(module, build))


@dataclass
class _Progress:
    """Counters that a checkpoint carries."""

    iteration: int = 0
    env_steps: int = 0
    train_seconds: float = 0.0
    episodes: int = 0
    recent: deque = dataclasses.field(default_factory=lambda: deque(maxlen=WINDOW))
    steps_to_threshold: int | None = None

    def record(self, episodes: list, base_steps: int, threshold: float | None) -> None:
        for offset, ret, _length in episodes:
            self.episodes += 1
            self.recent.append(ret)
            full = len(self.recent) == WINDOW
            if (
                self.steps_to_threshold is None
                and threshold is not None
                and full
                and np.mean(self.recent) >= threshold
            ):
                self.steps_to_threshold = base_steps + offset

    def state_dict(self) -> dict[str, Any]:
        state = dataclasses.asdict(self)
        state["recent"] = list(self.recent)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, deque(value, maxlen=WINDOW) if key == "recent" else value)


def train_from_config(
    cfg: Any, run_dir: str | Path, resume: bool = False, overwrite: bool = False
) -> dict[str, Any]:
    """Train ``cfg.algo`` on ``cfg.env``; write the run folder; return the summary. The config, the env
    and the agent are built and checked before the run folder is touched (`postrl.runtime.rundir`)."""
    validate(cfg)
    info = ranks.setup(cfg.algo)
    run_dir = Path(run_dir)
    if cfg.run.threads is not None:
        torch.set_num_threads(cfg.run.threads)
    seed_everything(cfg.run.seed, info.rank)
    env = VecEnv(cfg.env, ranks.env_seed(cfg.run.seed, cfg.env.n_envs))
    agent = algorithm(cfg.algo).build(cfg, env)
    progress = _Progress()
    logger, ckpt = open_run(run_dir, cfg, resume=resume, overwrite=overwrite, tensorboard=cfg.run.tensorboard)
    if ckpt is not None:
        rows = _restore(ckpt, agent, env, progress, cfg.run.seed)
        logger.resume_at(progress.env_steps, rows)
    elif not agent.needs_env_reset:
        env.reset()
    ranks.broadcast_modules(agent.modules)
    threshold = THRESHOLDS.get(cfg.env.id, getattr(env.env.spec, "reward_threshold", None))
    agent.attach(run_dir)
    try:
        _loop(cfg, run_dir, agent, env, progress, logger, threshold)
        return _finish(cfg, run_dir, agent, env, progress, logger, threshold)
    finally:
        agent.close()


def _loop(cfg, run_dir: Path, agent: Learner, env: VecEnv, progress: _Progress, logger, threshold) -> None:
    """Iterate until ``run.steps`` env steps (or ``run.max_seconds``): learn, log, evaluate, checkpoint."""
    total, run, main = cfg.run.steps, cfg.run, is_main()
    bar_off = None if main else True
    done = progress.env_steps >= total or _out_of_time(run, progress.train_seconds)
    with Progress(total, f"{cfg.algo} {cfg.env.id}", "step", bar_off, progress.env_steps) as bar:
        while not done:
            # Training time counts everything but evaluation (logging and checkpoints included), as
            # the peer benchmark times SB3's learn().
            start, eval_seconds = time.perf_counter(), 0.0
            it, moments = progress.iteration, ranks.normaliser_moments(env)
            metrics, episodes, n_steps = agent.iteration(env, it, progress.env_steps / total)
            ranks.sync_normalisers(env, moments)
            episodes, n_steps = ranks.gather_episodes(episodes, n_steps, env.n_envs)
            progress.record(episodes, progress.env_steps, threshold)
            progress.iteration, progress.env_steps = it + 1, progress.env_steps + n_steps
            elapsed = progress.train_seconds + time.perf_counter() - start
            done = progress.env_steps >= total or _out_of_time(run, elapsed)
            row = _row(reduce_metrics(metrics), progress)
            stop, error = _on_iteration(progress.env_steps, it + 1, row, run_dir)
            done = done or stop
            if main and run.eval_every and _crossed(progress.env_steps, n_steps, run.eval_every):
                eval_start = time.perf_counter()
                row["eval_return"] = float(
                    np.mean(evaluate_policy_episodes(agent.actor, env, cfg, run.eval_episodes))
                )
                eval_seconds = time.perf_counter() - eval_start
            if (it + 1) % run.log_every == 0 or "eval_return" in row or done:
                logger.log(progress.env_steps, row)
            bar.update(n_steps, ret=row.get("train_return_ma20"))
            progress.train_seconds += time.perf_counter() - start - eval_seconds
            if done or error or run.save_every and (it + 1) % run.save_every == 0:
                save_start = time.perf_counter()
                _save(run_dir, agent, env, progress, cfg, logger.rows)
                progress.train_seconds += time.perf_counter() - save_start
            if error is not None:  # the user's callback raised: this iteration is checkpointed (resumable)
                raise UserError(error)


def _on_iteration(step: int, iteration: int, row: dict, run_dir: Path) -> tuple[bool, str | None]:
    """The Python API's on_iteration after every iteration, the last one included (`callbacks.poll`): rank 0
    calls it and its ``(stop, error)`` is every rank's."""
    if not callbacks.active():
        return False, None
    info = {"step": step, "iteration": iteration, "metrics": row, "run_dir": str(run_dir)}
    stop, error = broadcast_object(callbacks.poll(info) if is_main() else (False, None))
    return bool(stop) and error is None, error


def _finish(cfg, run_dir: Path, agent: Learner, env: VecEnv, progress: _Progress, logger, threshold) -> dict:
    """Final evaluation (excluded from steps_per_second), optional GIF, curves.png and summary.json, last (rank
    0; the other ranks return its summary)."""
    if not is_main():
        env.close()
        return broadcast_object(None)
    returns = evaluate_policy_episodes(agent.actor, env, cfg, cfg.run.eval_episodes)
    if cfg.run.gif:
        record_gif(agent.actor, env, cfg, run_dir / "eval.gif")
    env.close()
    summary = {
        "algo": cfg.algo,
        "env_id": cfg.env.id,
        "seed": cfg.run.seed,
        "eval_return_mean": float(np.mean(returns)),
        "eval_return_std": float(np.std(returns)),
        "env_steps": progress.env_steps,
        "train_seconds": round(progress.train_seconds, 3),
        "steps_per_second": round(progress.env_steps / max(progress.train_seconds, 1e-9), 1),
        "train_episodes": progress.episodes,
        "train_return_ma20": float(np.mean(progress.recent)) if progress.recent else None,
        "threshold": threshold,
        "steps_to_threshold": progress.steps_to_threshold,
    }
    title = f"{cfg.algo} on {cfg.env.id} (seed {cfg.run.seed})"
    # the curves before summary.json, which marks the run done (a kill in between leaves it to resume)
    write_curves(run_dir, ["train_return_ma20", "eval_return"], title=title)
    summary = logger.finish(summary)
    return broadcast_object(summary)


def _out_of_time(run: ControlRunConfig, train_seconds: float) -> bool:
    """Whether ``train_seconds`` reach ``run.max_seconds`` (rank 0's clock decides, so every rank stops at
    the same iteration)."""
    return run.max_seconds is not None and bool(broadcast_object(train_seconds >= run.max_seconds))


def _crossed(steps: int, per_iteration: int, every: int) -> bool:
    """True when ``steps`` just crossed a multiple of ``every``."""
    return steps // every != (steps - per_iteration) // every


def _row(metrics: dict[str, Any], progress: _Progress) -> dict[str, Any]:
    row = {k: float(v) for k, v in metrics.items()}
    row["episodes"] = progress.episodes
    if progress.recent:
        row["train_return_ma20"] = float(np.mean(progress.recent))
    return row


def _save(
    run_dir: Path, agent: Learner, env: VecEnv, progress: _Progress, cfg: Any, metrics_rows: int
) -> Path | None:
    rank_states, snapshots = ranks.gather_rank_states(
        env
    )  # a collective: every rank takes part, rank 0 writes
    if not is_main():
        return None
    extra = {
        "progress": progress.state_dict(),
        "env": env.state_dict(),
        "agent": agent_state(agent),
        "metrics_rows": metrics_rows,
    }
    if world_size() > 1:
        extra.update(world_size=world_size(), ranks=rank_states)
    return save_checkpoint(
        run_dir / "checkpoints",
        progress.env_steps,
        modules=agent.modules,
        optimizers=agent.optimizers,
        extra=extra,
        keep_last=cfg.run.keep_last,
        write_files=ranks.write_snapshots(snapshots),
    )


def agent_state(agent: Learner) -> dict[str, Any]:
    return agent.state_dict() if hasattr(agent, "state_dict") else {}


def _restore(ckpt: Path, agent: Learner, env: VecEnv, progress: _Progress, seed: int) -> int | None:
    """Load checkpoint ``ckpt`` into the agent, env and counters; returns the count of metrics rows it
    recorded (None for a checkpoint written before postrl recorded it)."""
    state = load_checkpoint(ckpt, modules=agent.modules, optimizers=agent.optimizers)
    extra = state["extra"]
    progress.load_state_dict(extra["progress"])
    env.load_state_dict(extra["env"])
    if hasattr(agent, "load_state_dict"):
        agent.load_state_dict(extra["agent"])
    if not ranks.restore_rank(ckpt, extra, env) and not agent.needs_env_reset:
        reseed = ranks.env_seed(seed * 1_000_003 + progress.iteration, env.n_envs)
        print(
            f"postrl: the envs of {ckpt} could not be saved; they are reset with seed {reseed} "
            "(the resumed run is not bit-identical to an uninterrupted one)",
            file=sys.stderr,
        )
        env.reset(seed=reseed)
    return extra.get("metrics_rows")


def load_agent(run_dir: str | Path) -> tuple[Any, Learner, VecEnv]:
    """Config, agent (latest checkpoint's weights) and a training env with its normaliser state, for eval."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{run_dir} is not a run folder (no config.yaml)")
    algo_name = read_yaml(run_dir / "config.yaml").get("algo", "ppo")
    cfg = load_config(algorithm(algo_name).config, run_dir / "config.yaml")
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    if ckpt is None:
        raise ConfigError(f"{run_dir} has no checkpoint")
    env = VecEnv(dataclasses.replace(cfg.env, n_envs=1, async_=False), cfg.run.seed, training=False)
    agent = algorithm(algo_name).build(cfg, env)
    state = load_checkpoint(ckpt, modules=agent.modules, restore_rng=False)
    env.load_state_dict({**state["extra"]["env"], "disc_return": [0.0], "ep_return": [0.0], "ep_length": [0]})
    return cfg, agent, env
