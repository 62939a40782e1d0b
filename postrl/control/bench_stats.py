"""The statistics of ``postrl control bench`` (`postrl.control.bench`), the way rliable publishes results:
the interquartile mean (IQM), its percentile interval from a stratified bootstrap, and the aggregate over the
seeds' final evaluation means."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["BOOTSTRAP_REPS", "aggregate", "interquartile_mean", "stratified_bootstrap_ci"]

BOOTSTRAP_REPS = 10_000
"""Bootstrap resamples of the IQM's interval (seeded, so the interval repeats)."""


def interquartile_mean(values: Sequence[float]) -> float:
    """The mean of the middle half: ⌊n/4⌋ values cut from each end of the sorted list (= scipy's
    ``trim_mean(x, 0.25)``, rliable's IQM)."""
    xs = sorted(float(v) for v in values)
    if not xs:
        raise ValueError("interquartile_mean of no values")
    k = int(0.25 * len(xs))
    middle = xs[k : len(xs) - k]
    return sum(middle) / len(middle)


def stratified_bootstrap_ci(
    scores: Sequence[Sequence[float]],
    statistic: Callable[[Sequence[float]], float] | None = None,
    reps: int = BOOTSTRAP_REPS,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile interval of ``statistic`` (default: the IQM) over stratified bootstrap resamples, rliable's
    practice.

    ``scores[task]`` are the runs of one task; each resample draws, within every task, as many runs as it has
    with replacement (task t's indices: ``rng.integers(0, n_t, (reps, n_t))``, tasks in order), and applies
    ``statistic`` to all drawn runs together. Seeded: the same inputs give the same interval.
    """
    import numpy as np  # deferred: `postrl --help` stays light

    tasks = [np.asarray(s, dtype=np.float64) for s in scores]
    if not tasks or any(t.size == 0 for t in tasks):
        raise ValueError("stratified_bootstrap_ci needs at least one run in every task")
    rng = np.random.default_rng(seed)
    drawn = np.concatenate([t[rng.integers(0, t.size, (reps, t.size))] for t in tasks], axis=1)
    if statistic is None:  # the IQM of every resample at once
        drawn.sort(axis=1)
        k = int(0.25 * drawn.shape[1])
        stats = drawn[:, k : drawn.shape[1] - k].mean(axis=1)
    else:
        stats = np.array([statistic(row) for row in drawn])
    alpha = (1.0 - confidence) / 2
    lo, hi = np.quantile(stats, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def aggregate(values: Sequence[float], target: float | None, seed: int = 0) -> dict[str, Any]:
    """Mean, std (ddof 0), median, min, max, IQM with its 95% stratified-bootstrap interval and the fraction of
    ``values`` ≥ ``target`` (None without a target)."""
    xs = [float(v) for v in values]
    n = len(xs)
    if n == 0:
        return {"n_seeds": 0}
    mean = sum(xs) / n
    srt = sorted(xs)
    median = srt[n // 2] if n % 2 else (srt[n // 2 - 1] + srt[n // 2]) / 2
    lo, hi = stratified_bootstrap_ci([xs], seed=seed)
    met = None if target is None else sum(x >= target for x in xs)
    return {
        "n_seeds": n,
        "mean": mean,
        "std": math.sqrt(sum((x - mean) ** 2 for x in xs) / n),
        "median": median,
        "min": srt[0],
        "max": srt[-1],
        "iqm": interquartile_mean(xs),
        "iqm_ci95": [lo, hi],
        "target": target,
        "seeds_meeting_target": met,
        "fraction_meeting_target": None if met is None else met / n,
    }
