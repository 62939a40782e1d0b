"""The demo's schedule on paper: a `Job` (what it needs, its idle-machine estimate), the critical path of a set
of jobs (their wall time with unlimited lanes), and the progress line that lays the estimates on the lanes.
`postrl.demo.runner` runs the jobs."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Job:
    """A unit of the schedule: ``name``, the jobs it needs (``after``), its idle-machine estimate in
    seconds, and ``call(results of the finished jobs) -> (function, args)``, made when the job is ready; the
    function runs in a worker, so it and its args must pickle."""

    name: str
    after: tuple[str, ...]
    seconds: float
    call: Callable[[dict[str, Any]], tuple[Callable[..., Any], tuple]]


class DemoProgress:
    """The demo's progress line: stage k of n, its estimate and the time left on ``workers`` lanes (the longer
    of the remaining critical path and the remaining work shared by the lanes), rescaled by how the finished
    jobs compared with their idle-machine estimates."""

    def __init__(self, jobs: list[Job], workers: int, stages: list[str]) -> None:
        self.estimates = {j.name: j.seconds for j in jobs}
        self.after = {j.name: j.after for j in jobs}
        self.stages, self.workers = stages, workers
        self.started: dict[str, float] = {}
        self.finished: set[str] = set()
        self.spent = self.expected = 0.0

    def line(self, name: str) -> str:
        """``[demo] k/n name: about Xs, about Ys left``, for the stage starting now."""
        pace = self.spent / self.expected if self.expected > 1.0 else 1.0
        k = len([n for n in self.started if n in self.stages]) + (name not in self.started)
        return (
            f"[demo] {k}/{len(self.stages)} {name}: about {pace * self.estimates[name]:.0f}s, "
            f"about {pace * self.left():.0f}s left"
        )

    def left(self) -> float:
        """Idle-machine seconds left: what remains of each unfinished job, laid on the lanes."""
        now = time.perf_counter()
        rest = {
            n: max(0.0, s - (now - self.started[n] if n in self.started else 0.0))
            for n, s in self.estimates.items()
            if n not in self.finished
        }
        return max(critical_path(rest, self.after)[1], sum(rest.values()) / self.workers)

    def start(self, name: str) -> None:
        self.started[name] = time.perf_counter()

    def finish(self, name: str, seconds: float) -> None:
        """``name`` took ``seconds`` (its own time: a new worker's start is not the job's pace). A copy (an
        estimate under 2 s) or a stage already done (under a tenth of its estimate) does not set the pace."""
        self.finished.add(name)
        if self.estimates[name] >= 2.0 and seconds >= 0.1 * self.estimates[name]:
            self.spent += seconds
            self.expected += self.estimates[name]


def critical_path(seconds: dict[str, float], after: dict[str, tuple[str, ...]]) -> tuple[list[str], float]:
    """The chain of jobs (in dependency order, each after the one before) with the most ``seconds`` in all,
    and that sum: the demo's wall time with unlimited lanes. Jobs missing from ``seconds`` count as done."""
    best: dict[str, tuple[float, list[str]]] = {}
    for name, s in seconds.items():  # in dependency order
        before = max((best[a] for a in after.get(name, ()) if a in best), default=(0.0, []))
        best[name] = (before[0] + s, [*before[1], name])
    total, chain = max(best.values(), default=(0.0, []))
    return chain, total
