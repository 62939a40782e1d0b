"""What the machine gives the demo and what the demo costs it: how many lanes to run (the cores free now),
CPU seconds of this process and its workers, and the peak resident memory of all of them together."""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time

MAX_AUTO_WORKERS = 2  # the 1.5 GB memory goal: two lanes (the demo, a worker), each with torch and a model


def auto_workers(cpus: int | None = None, load: float | None = None) -> int:
    """Processes for the stages, 1 to `MAX_AUTO_WORKERS` and at most one per core: the cores plus one, less
    the cores busy now (``load``; default `busy_cores`). One other CPU-bound process on a 2-core machine
    still leaves two lanes (the demo then gets 4/3 of a core where one lane would get 1); only when every
    core is busy do the stages run one at a time."""
    cpus = cpus if cpus is not None else os.cpu_count() or 1
    load = load if load is not None else busy_cores()
    return max(1, min(MAX_AUTO_WORKERS, cpus, cpus + 1 - round(load)))


def busy_cores(window: float = 0.5) -> float:
    """How many cores other processes keep busy now: the busy share of the CPU time over ``window`` seconds
    (Linux /proc/stat) times the cores. Not the 1-minute load average, which still counts a job that just
    ended. Time of niced processes counts as free: they yield their core to the demo."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        # user nice system idle iowait irq softirq steal (guest is in user); free: idle, iowait, nice
        free = fields[1] + fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields[:8]), free

    try:
        total0, free0 = sample()
        time.sleep(window)
        total1, free1 = sample()
    except (OSError, ValueError, IndexError):
        return os.getloadavg()[0]
    spent = total1 - total0
    return (os.cpu_count() or 1) * (spent - (free1 - free0)) / spent if spent > 0 else 0.0


def cpu_seconds() -> float:
    """User + system CPU time of this process and its finished (joined) children: the workers' time counts
    once the pool is shut down."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class MemorySampler:
    """The largest sum of resident memory of this process and its live child processes (the workers),
    sampled every ``interval`` seconds in a thread (Linux: /proc; elsewhere only this process's peak). Not
    their proportional share (PSS): reading /proc's smaps_rollup that often would cost a good part of a core."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval, self.peak_bytes = interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            pids = [os.getpid(), *child_pids(os.getpid())]
            self.peak_bytes = max(self.peak_bytes, sum(rss_bytes(pid) for pid in pids))
            if self._stop.wait(self.interval):
                return

    @property
    def peak_mb(self) -> float:
        return self.peak_bytes / 2**20


def child_pids(pid: int) -> list[int]:
    """The live child processes of ``pid`` (Linux /proc; [] elsewhere)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
    return found


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` now (0 when it is gone or /proc is missing)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
