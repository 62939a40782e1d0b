"""Running the demo's stages: in dependency order, the ready ones at the same time on parallel lanes.

A `Stage` names the stages it needs (``after``); `run_jobs` starts every job whose inputs are done, at most
``workers`` at once on as many lanes: one is a thread of this process (which has torch imported already),
the others are processes of a spawn-context pool, each job with one torch thread (``workers=1``: one after
another in this process). A worker dies with the demo (``PR_SET_PDEATHSIG`` on Linux), so a killed demo
leaves no stage training on; Ctrl-C or SIGTERM stop the lanes, and rerunning the demo resumes each
interrupted stage from its last checkpoint and skips the finished ones (`run_stage`).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import multiprocessing
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from postrl.runtime.interrupts import sigterm_as_interrupt

Summaries = dict[str, dict[str, Any]]
MAX_AUTO_WORKERS = 2  # the 1.5 GB memory goal: two lanes (the demo, a worker), each with torch and a model


@dataclass(frozen=True)
class Stage:
    """One row of the pipeline: run folder ``name``, ``run(config, run_dir, resume=...) -> summary``, and
    ``config(demo config wired to RUN_DIR, RUN_DIR, summaries of the stages before) -> the stage's config``.
    ``idle_seconds(demo config)`` is the expected time on an idle 2-core machine with one thread (for the
    progress line); ``after`` names the stages whose run folders or summaries it needs (each an earlier row).
    ``run`` runs in a worker process: a module-level function, its config picklable (a dataclass)."""

    name: str
    run: Callable[..., dict[str, Any]]
    config: Callable[[Any, Path, Summaries], Any]
    idle_seconds: Callable[[Any], float]
    after: tuple[str, ...] = ()


@dataclass(frozen=True)
class Job:
    """A unit of the schedule: ``name``, the jobs it needs (``after``), its idle-machine estimate in
    seconds, and ``call(results of the finished jobs) -> (function, args)``, made when the job is ready; the
    function runs in a worker, so it and its args must pickle."""

    name: str
    after: tuple[str, ...]
    seconds: float
    call: Callable[[dict[str, Any]], tuple[Callable[..., Any], tuple]]


def auto_workers(cpus: int | None = None, load: float | None = None) -> int:
    """Processes for the stages, 1 to `MAX_AUTO_WORKERS` and at most one per core: the cores plus one, less
    the cores busy now (``load``; default `busy_cores`). One other CPU-bound process on a 2-core machine
    still leaves two lanes (the demo then gets 4/3 of a core, 1.5x its idle time, where one lane would take
    2x); only when every core is busy do the stages run one at a time."""
    cpus = cpus if cpus is not None else os.cpu_count() or 1
    load = load if load is not None else busy_cores()
    return max(1, min(MAX_AUTO_WORKERS, cpus, cpus + 1 - round(load)))


def busy_cores(window: float = 0.5) -> float:
    """How many cores other processes keep busy now: the busy share of the CPU time over ``window`` seconds
    (Linux /proc/stat) times the cores. Not the 1-minute load average, which still counts a job that just
    ended (a demo run right after another one saw load 1.7 on an idle machine and took one lane). Time of
    niced processes counts as free: they yield their core to the demo (two jobs under ``nice -n 15`` made a
    demo take one lane and run 95 s where two lanes would have taken ~55)."""

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


# ---- progress -----------------------------------------------------------------------------------------------
class Progress:
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


# ---- one stage ----------------------------------------------------------------------------------------------
def run_stage(
    name: str, out: Path, fn: Callable[..., dict[str, Any]], cfg: Any, label: str = ""
) -> dict[str, Any]:
    """Run one stage into ``out/name`` unless it already finished; resume it if it was interrupted."""
    from postrl.runtime.rundir import run_state  # deferred: torch, which a worker imports with its stage

    run_dir = out / name
    done = run_dir / "summary.json"
    if done.is_file():
        summary = json.loads(done.read_text())
        print(f"{label or f'[demo] {name}'}: already done ({run_dir}), skipped", file=sys.stderr)
        return summary
    resume = run_state(run_dir) == "interrupted"
    print(f"{label or f'[demo] {name}'} → {run_dir}{' (resuming)' if resume else ''}", file=sys.stderr)
    summary = fn(cfg, run_dir, resume=resume)
    print(
        f"[demo] {name}: done in {summary.get('wall_seconds', 0):.0f}s — {_headline(name, summary)}",
        file=sys.stderr,
    )
    return summary


def _headline(name: str, s: dict[str, Any]) -> str:
    """The stage's own end-of-run numbers (its trainer's check; the report's table is the common evaluation)."""
    keys = {
        "pretrain": ["heldout_loss"],
        "sft": ["heldout_loss", "heldout_accuracy"],
        "rm": ["heldout_accuracy"],
        "ppo": ["gold_reward", "rm_score", "kl_to_ref"],
        "dpo": ["heldout_reward_accuracy", "heldout_gold_reward", "heldout_kl"],
        "grpo": ["heldout_accuracy", "kl_to_ref"],
    }.get(name.split("-")[0], ["heldout_accuracy", "heldout_loss"])
    text = ", ".join(f"{k} {s[k]:.3f}" for k in keys if isinstance(s.get(k), (int, float)))
    return (text + " (the stage's own check)") if text else "finished"


def finished_stages(out: Path, names: list[str]) -> dict[str, float]:
    """The stages of ``names`` that an earlier run finished under ``out`` (their summary.json), with the wall
    seconds each took: a rerun skips them, so its own time leaves them out."""
    done = {name: out / name / "summary.json" for name in names}
    return {
        n: float(json.loads(f.read_text()).get("wall_seconds") or 0.0) for n, f in done.items() if f.is_file()
    }


def stage_jobs(stages: list[Stage], cfg: Any, out: Path, progress: Callable[[str], str]) -> list[Job]:
    """The stages as jobs: each runs `run_stage` with the config made from the summaries of those before it,
    under the progress line ``progress(name)``."""

    def job(s: Stage) -> Job:
        def call(done: dict[str, Any]) -> tuple[Callable[..., Any], tuple]:
            return run_stage, (s.name, out, s.run, s.config(cfg, out, done), progress(s.name))

        return Job(s.name, s.after, s.idle_seconds(cfg), call)

    return [job(s) for s in stages]


# ---- the schedule -------------------------------------------------------------------------------------------
def run_jobs(
    jobs: list[Job], workers: int, progress: Progress | None = None
) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """Run every job once its ``after`` jobs are done, at most ``workers`` at a time in worker processes
    (``workers=1``: one after another in this process, in the list's order); returns each job's result and
    its ``{"wall_seconds", "cpu_seconds"}`` by name. A job that raises stops the others (their run folders
    resume on the next run) and its error is raised here; so are Ctrl-C and SIGTERM."""
    names = [j.name for j in jobs]
    for k, j in enumerate(jobs):
        if unknown := [a for a in j.after if a not in names[:k]]:
            raise ValueError(f"job {j.name!r} needs {unknown}, which are not jobs before it")
    results: dict[str, Any] = {}
    usage: dict[str, dict[str, float]] = {}
    if workers <= 1:
        for j in jobs:
            fn, args = j.call(results)
            _mark(progress, "start", j.name)
            results[j.name], usage[j.name] = timed(fn, *args)
            _mark(progress, "finish", j.name, usage[j.name]["wall_seconds"])
        return results, usage
    pending, running = list(jobs), {}
    rank = {j.name: -seconds for j, seconds in zip(jobs, _longest_path_from(jobs), strict=True)}
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(workers - 1, mp_context=ctx, initializer=init_worker, initargs=(os.getpid(),))
    here = ThreadLane()
    try:
        with sigterm_as_interrupt():
            while pending or running:
                ready = sorted(
                    (j for j in pending if all(a in results for a in j.after)), key=lambda j: rank[j.name]
                )
                for j in ready[: workers - len(running)]:
                    pending.remove(j)
                    fn, args = j.call(results)
                    _mark(progress, "start", j.name)
                    lane = here if here.free else pool  # the longest ready chain here: no process to start
                    running[lane.submit(timed, fn, *args)] = j.name
                finished, _ = wait(running, timeout=1.0, return_when=FIRST_COMPLETED)
                for future in finished:
                    name = running.pop(future)
                    results[name], usage[name] = future.result()  # a job's error stops the demo here
                    _mark(progress, "finish", name, usage[name]["wall_seconds"])
    except BaseException:
        here.stop()
        stop_workers(pool, running)
        raise
    pool.shutdown()  # joined: their CPU time is now in RUSAGE_CHILDREN
    return results, usage


class ThreadLane:
    """One lane of the schedule in this process: a job at a time in a thread, as a worker process runs one,
    but without a process of its own to start and to fill with torch and transformers (~340 MB, which this
    process has imported already). `stop` interrupts the job as Ctrl-C would (its stage resumes on the next
    run)."""

    def __init__(self) -> None:
        self.future: Future | None = None
        self.thread: threading.Thread | None = None

    @property
    def free(self) -> bool:
        return self.future is None or self.future.done()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()

        def run() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as error:  # noqa: BLE001 - the scheduler raises it (KeyboardInterrupt too)
                    future.set_exception(error)

        self.future, self.thread = future, threading.Thread(target=run, name="demo-lane", daemon=True)
        self.thread.start()
        return future

    def stop(self, timeout: float = 10.0) -> None:
        """Raise KeyboardInterrupt in the running job (at its next Python line) and wait for it to end."""
        thread = self.thread
        if thread is None or not thread.is_alive() or thread.ident is None:
            return
        raise_in = ctypes.pythonapi.PyThreadState_SetAsyncExc
        raise_in(ctypes.c_ulong(thread.ident), ctypes.py_object(KeyboardInterrupt))
        thread.join(timeout)


def timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, dict[str, float]]:
    """``fn(*args)`` and its wall and CPU seconds (its process's, one job at a time in a worker; its thread's
    in this process's lane)."""
    wall, cpu = time.perf_counter(), _own_cpu_seconds()
    result = fn(*args)
    spent = {"wall_seconds": time.perf_counter() - wall, "cpu_seconds": _own_cpu_seconds() - cpu}
    if sys.platform.startswith("linux"):  # hand the job's freed heap back, so the next one starts lean
        with contextlib.suppress(AttributeError, OSError):
            ctypes.CDLL(None).malloc_trim(0)
    return result, {k: round(v, 2) for k, v in spent.items()}


def _own_cpu_seconds() -> float:
    """This process's CPU seconds, or this thread's off the main thread (the demo's own lane)."""
    who = resource.RUSAGE_SELF
    if threading.current_thread() is not threading.main_thread():
        who = getattr(resource, "RUSAGE_THREAD", who)
    own = resource.getrusage(who)
    return own.ru_utime + own.ru_stime


def _longest_path_from(jobs: list[Job]) -> list[float]:
    """Each job's estimate plus the longest chain of estimates that waits on it: the ready job with the longest
    one starts first (the critical path sets the demo's wall time)."""
    tail: dict[str, float] = {}
    for j in reversed(jobs):
        tail[j.name] = j.seconds + max((tail[k.name] for k in jobs if j.name in k.after), default=0.0)
    return [tail[j.name] for j in jobs]


def _mark(progress: Progress | None, what: str, *args: Any) -> None:
    if progress is not None:
        getattr(progress, what)(*args)


def stop_workers(pool: ProcessPoolExecutor, running: dict[Future, str]) -> None:
    """Stop the pool's processes now (SIGTERM, then SIGKILL after 10 s): their stages resume on the next run."""
    for future in running:
        future.cancel()
    children = multiprocessing.active_children()
    for proc in children:
        proc.terminate()
    for proc in children:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
    pool.shutdown(wait=False, cancel_futures=True)


def init_worker(parent: int) -> None:
    """A worker's start: die with the demo (Linux: the kernel sends SIGKILL when the parent dies, even by
    SIGKILL), and leave Ctrl-C to the demo, which stops its workers."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() != parent:  # the demo died before the line above: nothing would stop this worker
            os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# ---- what it costs ------------------------------------------------------------------------------------------
def cpu_seconds() -> float:
    """User + system CPU time of this process and its finished (joined) children: the workers' time counts
    once the pool is shut down."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class MemorySampler:
    """The largest sum of resident memory of this process and its live child processes (the workers),
    sampled every ``interval`` seconds in a thread (Linux: /proc; elsewhere only this process's peak). Not
    their proportional share (PSS): /proc's smaps_rollup costs ~10 ms of CPU a read, 14% of a core here."""

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
