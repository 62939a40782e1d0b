"""Running the demo's stages: in dependency order, the ready ones at the same time on parallel lanes.

A `DemoStage` names the stages it needs (``after``); `run_jobs` starts every job whose inputs are done, at most
``workers`` at once on as many lanes: one is a thread of this process (which has torch imported already),
the others are processes of a spawn-context pool, each job with one torch thread (``workers=1``: one after
another in this process). A worker dies with the demo (``PR_SET_PDEATHSIG`` on Linux), so a killed demo
leaves no stage training on; Ctrl-C or SIGTERM stop the lanes, and rerunning the demo resumes each
interrupted stage from its last checkpoint and skips the finished ones (`run_demo_stage`).
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

from postrl.demo.schedule import DemoProgress, Job
from postrl.runtime.interrupts import sigterm_as_interrupt

Summaries = dict[str, dict[str, Any]]


@dataclass(frozen=True)
class DemoStage:
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


# ---- one stage ----------------------------------------------------------------------------------------------
def run_demo_stage(
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


def stage_jobs(stages: list[DemoStage], cfg: Any, out: Path, progress: Callable[[str], str]) -> list[Job]:
    """The stages as jobs: each runs `run_demo_stage` with the config made from the summaries of those before it,
    under the progress line ``progress(name)``."""

    def job(s: DemoStage) -> Job:
        def call(done: dict[str, Any]) -> tuple[Callable[..., Any], tuple]:
            return run_demo_stage, (s.name, out, s.run, s.config(cfg, out, done), progress(s.name))

        return Job(s.name, s.after, s.idle_seconds(cfg), call)

    return [job(s) for s in stages]


# ---- the schedule -------------------------------------------------------------------------------------------
def run_jobs(
    jobs: list[Job], workers: int, progress: DemoProgress | None = None
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
    but without a process of its own to start and to fill with torch and transformers (which this process
    has imported already). `stop` interrupts the job as Ctrl-C would (its stage resumes on the next
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


def _mark(progress: DemoProgress | None, what: str, *args: Any) -> None:
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
