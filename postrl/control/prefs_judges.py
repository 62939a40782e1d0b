"""Judges of segment pairs for `postrl control prefs` (``labeller.source``): labellers that answer at once.

A judge is called ``judge(first, second) -> labels [P]``: for each pair of segments (`Segments` ``[P, L]``),
P(σ¹ ≻ σ²) in [0, 1] (1: the first is better, 0: the second, 0.5: equally good), the target of the reward
model's cross-entropy (`postrl.core.preference_loss`, soft targets included).

    synthetic        `ReturnJudge`: the true returns compared, Christiano et al.'s synthetic oracle (§3.1):
                     0.5 within ``tie_tolerance``, a non-tie label flipped with ``flip_prob``
    fn:MODULE:NAME   `FunctionJudge`: a Python function ``(first, second) -> P(first preferred)`` of two
                     segments, each a dict of numpy arrays ``obs [L, obs_dim]``, ``actions [L]`` (or
                     ``[L, act_dim]``), ``true_rewards [L]`` and ``alive [L]`` (false on the padding after a
                     termination). Imported by module path (``importlib``), never evaluated. A function that
                     reads ``true_rewards`` is a rule judge; one that reads only obs and actions judges what a
                     person watching the clips sees.
    rm:RUN_DIR       `RewardModelJudge`: the reward-model ensemble of an earlier prefs run (its latest
                     checkpoint), P = σ(ŝ¹ − ŝ²) of the members' mean segment scores.

People on the labelling page answer later, while the agent trains: ``prefs_people.py``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import gymnasium as gym
import numpy as np
import torch

from postrl.control.prefs_config import ControlPrefsConfig, SegmentLabellerConfig
from postrl.control.prefs_reward import RewardEnsemble, Segments, synthetic_labels
from postrl.runtime.checkpoint import latest_checkpoint, load_checkpoint
from postrl.runtime.config import ConfigError, load_config
from postrl.runtime.errors import UserError

SOURCES = ("synthetic", "page", "fn:MODULE:FUNCTION", "rm:RUN_DIR")


class SegmentJudge(Protocol):
    def __call__(self, first: Segments, second: Segments) -> torch.Tensor:
        """P(first ≻ second) ``[P]`` for segments ``[P, L]``."""
        ...


class ReturnJudge:
    """The synthetic labeller: 1 if the first segment's true return is higher, 0 if lower, 0.5 within
    ``tie_tolerance``; non-tie labels flipped with ``flip_prob`` (torch's global generator, so that a
    resumed run draws the same flips)."""

    def __init__(self, tie_tolerance: float = 0.0, flip_prob: float = 0.0):
        self.tie_tolerance, self.flip_prob = tie_tolerance, flip_prob

    def __call__(self, first: Segments, second: Segments) -> torch.Tensor:
        return synthetic_labels(
            first.true_returns(), second.true_returns(), self.tie_tolerance, self.flip_prob
        )


def segment_dict(seg: Segments, i: int) -> dict[str, np.ndarray]:
    """Segment ``i`` of ``seg`` as the dict of numpy arrays a function judge receives."""
    return {
        "obs": seg.obs[i].numpy(),
        "actions": seg.actions[i].numpy(),
        "true_rewards": seg.true_rewards[i].numpy(),
        "alive": seg.alive[i].numpy(),
    }


class FunctionJudge:
    """``fn(first: dict, second: dict) -> float``, called once per pair; every answer must be a probability."""

    def __init__(self, fn: Callable[[dict, dict], float], spec: str):
        self.fn, self.spec = fn, spec

    def __call__(self, first: Segments, second: Segments) -> torch.Tensor:
        out = []
        for i in range(len(first)):
            p = self.fn(segment_dict(first, i), segment_dict(second, i))
            if isinstance(p, bool) or not isinstance(p, (int, float, np.floating)) or not 0 <= float(p) <= 1:
                raise UserError(
                    f"labeller.source {self.spec}: returned {p!r}; expected P(first preferred) in [0, 1]"
                )
            out.append(float(p))
        return torch.tensor(out, dtype=torch.float32)


class RewardModelJudge:
    """An earlier prefs run's reward-model ensemble: σ(mean_k ŝ_k(σ¹) − mean_k ŝ_k(σ²))."""

    def __init__(self, model: RewardEnsemble):
        self.model = model.eval()

    @torch.no_grad()
    def __call__(self, first: Segments, second: Segments) -> torch.Tensor:
        diff = (self.model.scores(first) - self.model.scores(second)).mean(0)  # (P,)
        return torch.sigmoid(diff)


def _function(spec: str) -> FunctionJudge:
    module_name, _, name = spec[len("fn:") :].rpartition(":")
    if not module_name or not name:
        raise ConfigError(
            f"labeller.source {spec!r}: expected fn:MODULE:FUNCTION (a module path, e.g. my_judges:by_angle)"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        raise ConfigError(
            f"labeller.source {spec!r}: cannot import module {err.name!r} (is it on PYTHONPATH?)"
        ) from None
    except Exception as err:  # the user's module failed while importing: theirs to fix
        raise ConfigError(
            f"labeller.source {spec!r}: importing {module_name} raised {type(err).__name__}: {err}"
        ) from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"labeller.source {spec!r}: {module_name} has no function {name!r}")
    return FunctionJudge(fn, spec)


def _reward_model(spec: str, obs_dim: int, action_space: gym.Space) -> RewardModelJudge:
    run_dir = Path(spec[len("rm:") :]).expanduser()
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"labeller.source {spec!r}: {run_dir} is not a prefs run folder (no config.yaml)")
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    if ckpt is None:
        raise ConfigError(f"labeller.source {spec!r}: {run_dir} has no checkpoint")
    cfg = load_config(ControlPrefsConfig, run_dir / "config.yaml")
    model = RewardEnsemble(obs_dim, action_space, cfg.reward_model)
    try:
        load_checkpoint(ckpt, modules={"reward_model": model}, restore_rng=False)
    except FileNotFoundError:
        raise ConfigError(
            f"labeller.source {spec!r}: {ckpt} holds no reward model (not a prefs run)"
        ) from None
    except RuntimeError:
        raise ConfigError(
            f"labeller.source {spec!r}: its reward model was trained on {cfg.env.id}, whose observations or "
            "actions do not fit this run's env"
        ) from None
    return RewardModelJudge(model)


def load_segment_judge(
    labeller: SegmentLabellerConfig, obs_dim: int, action_space: gym.Space
) -> SegmentJudge:
    """The judge of ``labeller.source`` (not ``page``); a bad spec is a `ConfigError` naming it."""
    source = labeller.source
    if source == "synthetic":
        return ReturnJudge(labeller.tie_tolerance, labeller.flip_prob)
    if source.startswith("fn:"):
        return _function(source)
    if source.startswith("rm:"):
        return _reward_model(source, obs_dim, action_space)
    raise ConfigError(f"labeller.source {source!r}: expected one of {', '.join(SOURCES)}")
