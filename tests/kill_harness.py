"""Run a ``postrl`` training command as a subprocess, SIGKILL it at seeded random moments, resume it until it
finishes, and compare the result with an uninterrupted run (used by ``tests/test_kill_resume.py``).

A run is watched by polling its folder every couple of milliseconds: that gives the uninterrupted run's
timeline (when the first checkpoint write starts, how far apart checkpoints appear) and, for the killed
runs, the moments to kill at. The ``write``, ``rename`` and ``train`` kills each aim at a checkpoint drawn
from their own part of the run (`pick_target`), so the kills spread over the whole run. The kinds of kill:

- ``early``: a uniform delay before the uninterrupted run's first checkpoint write (at once if a checkpoint
  write begins first), so the process dies while importing, building or in its first steps, often before
  its run folder exists;
- ``first``: as soon as the first checkpoint's temp folder appears: the first metrics rows are written, the
  checkpoint is not complete (what a resume must treat as "no checkpoint yet");
- ``write``: as soon as the target's temp folder (``.tmp-*``) appears, plus 0–5 ms: inside the write, the
  fsync or the rename;
- ``rename``: as soon as the target has its final name, plus 0–5 ms: in the deletion of the old checkpoints
  that follows the rename;
- ``train``: after the target appears, plus a uniform delay up to one checkpoint interval of the
  uninterrupted run: anywhere in a training step, an evaluation, the export or the summary.

A restart that already holds the last checkpoint is killed at a uniform moment of its start-up and final phase.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

POLL_S = 0.002
WRITE_WINDOW_S = 0.005
AIMED = ("write", "rename", "train")  # the kinds of kill that aim at a checkpoint (`pick_target`)
TEMP_PREFIXES = (".tmp-", ".old-", ".del-")
# Wall-clock-dependent metric keys, dropped before comparing metrics.jsonl row for row.
WALL_CLOCK_PARTS = ("seconds", "per_second", "_per_s", "rss")


def digits_reward(prompts, completions, **columns):
    """A GRPO reward that varies within a group even for an untrained model: the share of digit characters
    (of the last message's text for conversational completions, a VLM's)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


def is_wall_clock_key(key: str) -> bool:
    """``time``, ``time_*`` (GRPO's phase timings) and any key naming seconds, a rate per second or memory."""
    return key == "time" or key.startswith("time_") or any(part in key for part in WALL_CLOCK_PARTS)


# ---- watching a run folder ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Snapshot:
    """What a run folder holds at one moment: whether it exists, its ``step_*`` names, its temp entries."""

    exists: bool
    steps: frozenset[str]
    temps: frozenset[str]

    def describe(self, run_dir: Path) -> str:
        """E.g. ``ckpt 3,4*,5 + tmp``: the step folders (``*``: no state.pt, i.e. half written or half
        deleted) and whether a temp folder is present; ``no folder``, ``no ckpt``."""
        if not self.exists:
            return "no folder"
        steps = sorted(self.steps, key=_step_number)
        marks = [
            f"{_step_number(n)}{'' if (run_dir / 'checkpoints' / n / 'state.pt').is_file() else '*'}"
            for n in steps
        ]
        text = f"ckpt {','.join(marks)}" if marks else "no ckpt"
        return text + (" + tmp" if self.temps else "")


def _step_number(name: str | None) -> int:
    return int(name.split("_")[1]) if name else -1


def _names(folder: Path) -> list[str]:
    try:
        return [entry.name for entry in os.scandir(folder)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def snapshot(run_dir: Path) -> Snapshot:
    top = _names(run_dir)
    ckpts = _names(run_dir / "checkpoints")
    temps = {f"checkpoints/{n}" for n in ckpts if n.startswith(".tmp-")} | {
        n for n in top if n.startswith(".tmp-")
    }
    steps = {n for n in ckpts if n.startswith("step_")}
    return Snapshot(run_dir.is_dir(), frozenset(steps), frozenset(temps))


@dataclass
class Timeline:
    """The uninterrupted run: seconds from its start to its first checkpoint write and to its exit, the
    typical time between two new checkpoints, the checkpoints' step numbers in the order they appeared, and
    the seconds from the last checkpoint to the exit (final evaluation, export, summary)."""

    first_write_s: float
    exit_s: float
    checkpoint_interval_s: float
    steps: list[int]
    tail_s: float


def _spawn(argv: list[str], log: Path, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with open(log, "ab") as out:
        out.write(f"\n$ postrl {' '.join(argv)}\n".encode())
        out.flush()
        return subprocess.Popen(
            [sys.executable, "-m", "postrl.cli", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,  # its own process group: the kill reaches any child it starts
        )


def _tail(log: Path, n: int = 1500) -> str:
    return log.read_text(errors="replace")[-n:]


def run_uninterrupted(
    argv: list[str], run_dir: Path, log: Path, cwd: Path, timeout_s: float = 300
) -> Timeline:
    """Run ``postrl argv`` to the end, watching ``run_dir``; raise with the log's tail if it fails."""
    proc = _spawn(argv, log, cwd)
    start = time.perf_counter()
    first_write, seen, appeared, order = None, set(), [], []
    while proc.poll() is None:
        now = time.perf_counter() - start
        if now > timeout_s:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise AssertionError(f"uninterrupted run exceeded {timeout_s} s:\n{_tail(log)}")
        snap = snapshot(run_dir)
        if first_write is None and (snap.steps or any(t.startswith("checkpoints/") for t in snap.temps)):
            first_write = now
        if snap.steps - seen:
            appeared.append(now)
            order += sorted(map(_step_number, snap.steps - seen))
        seen |= snap.steps
        time.sleep(POLL_S)
    exit_s = time.perf_counter() - start
    if proc.returncode != 0:
        raise AssertionError(f"uninterrupted run failed (rc {proc.returncode}):\n{_tail(log)}")
    gaps = sorted(b - a for a, b in zip(appeared, appeared[1:], strict=False))
    interval = gaps[len(gaps) // 2] if gaps else 0.05
    first = first_write if first_write is not None else exit_s
    tail = exit_s - (appeared[-1] if appeared else first)
    return Timeline(first, exit_s, max(interval, POLL_S), order, tail)


# ---- killing and resuming ---------------------------------------------------------------------------------
@dataclass
class KillLog:
    """What happened to the killed run: where each kill landed, what each restart resumed from."""

    kills: list[str] = field(default_factory=list)
    resumed_from: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)


def intact_step(run_dir: Path) -> str:
    """The newest ``step_*`` with a ``state.pt`` (what a resume should continue from), or ``-``."""
    ckpts = run_dir / "checkpoints"
    steps = [n for n in _names(ckpts) if n.startswith("step_") and (ckpts / n / "state.pt").is_file()]
    return str(_step_number(max(steps, key=_step_number))) if steps else "-"


def pick_target(timeline: Timeline, done: int, slot: int, n_slots: int, rng: random.Random) -> int | None:
    """The checkpoint step a kill aims at: uniform in the ``slot``-th of ``n_slots`` equal parts of the
    uninterrupted run's checkpoints (so the kills spread over the whole run), among those after ``done``
    (the killed run's newest); None when it has them all (it will only start up and finish)."""
    steps = timeline.steps
    part = steps[slot * len(steps) // n_slots : (slot + 1) * len(steps) // n_slots]
    ahead = [s for s in part if s > done] or [s for s in steps if s > done]
    return rng.choice(ahead) if ahead else None


def _trigger(kind: str, snap: Snapshot, armed: Snapshot, target: int | None) -> bool:
    """Whether the moment ``kind`` waits for has come (``armed``: the folder once the checkpoint before
    ``target`` existed)."""
    if kind == "write":  # a new temp folder, or a new checkpoint whose temp came and went between two polls
        return bool(snap.temps - armed.temps or snap.steps - armed.steps)
    return target is not None and _has_step(snap, target)  # rename, train


def _wait_and_kill(
    proc: subprocess.Popen,
    run_dir: Path,
    kind: str,
    target: int | None,
    rng: random.Random,
    timeline: Timeline,
) -> str | None:
    """Kill ``proc`` at a moment of ``kind`` (``write``, ``rename``, ``train``: aimed at checkpoint ``target``);
    None if it exited first, else where the kill landed. With no ``target`` left, the kill lands at a uniform
    moment of the restart's start-up and final phase."""
    start = time.perf_counter()
    label, fire_at, window = kind, None, WRITE_WINDOW_S
    if kind == "early":
        fire_at = rng.uniform(0.0, 0.9 * timeline.first_write_s)
    elif kind == "first":  # the first checkpoint's write, killed as soon as it is seen
        kind, target, window = "write", timeline.steps[0], 0.0
    elif target is None:  # the restart holds the last checkpoint: it only starts up and finishes
        label = f"{kind} after the last checkpoint"
        fire_at = rng.uniform(0.0, timeline.first_write_s + timeline.tail_s)
    if kind == "train":
        window = timeline.checkpoint_interval_s
    previous = max((s for s in timeline.steps if target is not None and s < target), default=None)
    armed = None
    while proc.poll() is None:
        now = time.perf_counter() - start
        snap = snapshot(run_dir)
        if kind == "early" and (snap.steps or any(t.startswith("checkpoints/") for t in snap.temps)):
            fire_at = now  # the first checkpoint is being written: kill before it is complete
        elif fire_at is None and armed is None and (previous is None or _has_step(snap, previous)):
            armed = snap  # the checkpoint before the target exists: the next write is the target's
        elif fire_at is None and armed is not None and _trigger(kind, snap, armed, target):
            fire_at = now + rng.uniform(0.0, window)
        if fire_at is not None and now >= fire_at:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return f"{label} ({snapshot(run_dir).describe(run_dir)})"
        time.sleep(POLL_S)
    return None


def _has_step(snap: Snapshot, step: int) -> bool:
    return any(_step_number(name) == step for name in snap.steps)


def kill_and_resume(
    first: list[str],
    resume: Callable[[int, Path], list[str]],
    run_dir: Path,
    kinds: list[str],
    rng: random.Random,
    timeline: Timeline,
    log: Path,
    cwd: Path,
    record: KillLog,
    timeout_s: float = 300,
) -> KillLog:
    """Start ``postrl first``, kill it once per entry of ``kinds``, restarting with ``resume(k, run_dir)`` after
    the k-th kill, then let the last restart finish; ``record`` fills as it goes. Raises if a restart fails
    (with the log's tail)."""
    argv = first
    deadline = time.perf_counter() + timeout_s
    for k, kind in enumerate([*kinds, None]):
        if k > 0:
            record.resumed_from.append(
                intact_step(run_dir) + ("" if "--resume" in argv else " (same command)")
            )
        proc, started = _spawn(argv, log, cwd), time.perf_counter()
        landed = None
        if kind is not None:
            done = max(map(_step_number, snapshot(run_dir).steps), default=-1)
            aimed = [i for i, name in enumerate(kinds) if name in AIMED]
            target = pick_target(timeline, done, aimed.index(k), len(aimed), rng) if k in aimed else None
            landed = _wait_and_kill(proc, run_dir, kind, target, rng, timeline)
        record.seconds.append(time.perf_counter() - started)
        if landed is None:
            while proc.poll() is None and time.perf_counter() < deadline:
                time.sleep(0.05)
            record.seconds[-1] = time.perf_counter() - started
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise AssertionError(f"killed run exceeded {timeout_s} s:\n{_tail(log)}")
            if proc.returncode != 0:
                raise AssertionError(
                    f"restart {k} ({' '.join(argv[:3])}) failed with rc {proc.returncode} after kills "
                    f"{record.kills}:\n{_tail(log)}"
                )
            return record
        record.kills.append(landed)
        argv = resume(k + 1, run_dir)
    return record


# ---- comparing the two runs -------------------------------------------------------------------------------
def compare_weights(a_dir: Path, b_dir: Path, patterns: list[str]) -> list[str]:
    """Mismatches between the safetensors files matching ``patterns`` under A and under B (tensor by tensor)."""
    problems = []
    for pattern in patterns:
        a_files = sorted(a_dir.glob(pattern))
        if not a_files:
            problems.append(f"A has no {pattern}")
        for a_file in a_files:
            rel = a_file.relative_to(a_dir)
            if not (b_dir / rel).is_file():
                problems.append(f"B lacks {rel}")
                continue
            a, b = load_file(str(a_file)), load_file(str(b_dir / rel))
            if a.keys() != b.keys():
                problems.append(f"{rel}: tensor names differ")
            differ = [name for name in a if name in b and not torch.equal(a[name], b[name])]
            if differ:
                problems.append(f"{rel}: {len(differ)}/{len(a)} tensors differ (e.g. {differ[0]})")
    return problems


def metric_rows(path: Path, dropped: set[str]) -> list[dict]:
    """The rows of ``metrics.jsonl`` without wall-clock keys (added to ``dropped``); a malformed line raises."""
    rows = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise AssertionError(f"{path}:{lineno}: malformed line ({err.msg}): {line[:80]!r}") from None
        dropped.update(k for k in row if is_wall_clock_key(k))
        rows.append({k: v for k, v in row.items() if not is_wall_clock_key(k)})
    return rows


def compare_metrics(a_dir: Path, b_dir: Path, dropped: set[str]) -> list[str]:
    """How B's metrics.jsonl differs from A's, row for row (wall-clock keys dropped)."""
    if not (b_dir / "metrics.jsonl").is_file():
        return ["B has no metrics.jsonl"]
    try:
        a, b = metric_rows(a_dir / "metrics.jsonl", dropped), metric_rows(b_dir / "metrics.jsonl", dropped)
    except AssertionError as err:
        return [str(err)]
    problems = []
    if len(a) != len(b):
        problems.append(f"{len(b)} rows, A has {len(a)}")
    for i, (row_a, row_b) in enumerate(zip(a, b, strict=False)):
        if row_a != row_b:
            keys = sorted(k for k in row_a.keys() | row_b.keys() if row_a.get(k) != row_b.get(k))
            problems.append(
                f"row {i} (A step {row_a.get('step')}, B step {row_b.get('step')}) differs in {keys[:4]}"
            )
            break
    return problems


def leftovers(run_dir: Path) -> list[str]:
    """Everything a finished run should not hold: temp entries anywhere (``.tmp-*``, ``.old-*``, ``.del-*`` and
    the ``.NAME.*.tmp`` files of atomic writes), anything under ``checkpoints/`` that is not a ``step_*``
    folder, and ``step_*`` folders without a readable ``state.pt`` or with a safetensors file that fails to load."""
    found = []
    for folder, dirs, files in os.walk(run_dir):
        for name in [*dirs, *files]:
            if name.startswith(TEMP_PREFIXES) or (name.startswith(".") and name.endswith(".tmp")):
                found.append(str((Path(folder) / name).relative_to(run_dir)))
    ckpts = run_dir / "checkpoints"
    for name in sorted(_names(ckpts)):
        path = ckpts / name
        if name.startswith(TEMP_PREFIXES):
            continue  # already listed
        if not (name.startswith("step_") and path.is_dir()):
            found.append(f"checkpoints/{name}")
            continue
        try:
            torch.load(path / "state.pt", weights_only=True)
        except Exception as err:  # noqa: BLE001 (any failure to read is a leftover)
            found.append(f"checkpoints/{name} (state.pt: {type(err).__name__})")
            continue
        for file in sorted(path.rglob("*.safetensors")):
            try:
                load_file(str(file))
            except Exception as err:  # noqa: BLE001
                found.append(f"{file.relative_to(run_dir)} ({type(err).__name__})")
    return found
