"""The demo's scheduler (`postrl.demo.runner`) on stand-in stages that sleep: dependency order, a failing
stage, a killed demo that leaves no worker behind and resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from postrl.demo.machine import auto_workers, busy_cores
from postrl.demo.runner import DemoStage, ThreadLane, run_jobs, stage_jobs
from postrl.demo.schedule import DemoProgress, Job, critical_path
from postrl.runtime.errors import UserError

REPO = Path(__file__).resolve().parents[1]


def fake_stage(cfg: dict, run_dir: Path, resume: bool = False) -> dict:
    """A stand-in trainer: marks its run folder as started, logs the call, sleeps, fails or finishes."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "checkpoints").mkdir(exist_ok=True)  # an interrupted run from here on
    started = time.time()
    with open(run_dir.parent / "calls.jsonl", "a") as f:
        f.write(json.dumps({"name": run_dir.name, "resume": resume, "pid": os.getpid(), "t": started}) + "\n")
    while time.time() < started + cfg["seconds"]:
        time.sleep(0.01)
    meet = cfg.get("meet")  # wait (up to 60 s) until stage ``meet`` has started too: both run at once
    while meet and not any(c["name"] == meet for c in calls(run_dir.parent)) and time.time() < started + 60:
        time.sleep(0.01)
    if cfg.get("fail"):
        raise UserError(f"{run_dir.name} failed on purpose")
    summary = {"wall_seconds": cfg["seconds"], "started": started, "ended": time.time()}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return summary


def rows(seconds: dict[str, float], fail: str = "", meet: bool = False) -> list[DemoStage]:
    """a; b after a; c independent; d after b and c — each sleeping ``seconds[name]`` (``meet``: b and c
    each wait for the other to start)."""
    after = {"a": (), "b": ("a",), "c": (), "d": ("b", "c")}
    other = {"b": "c", "c": "b"} if meet else {}

    def config(name: str, s: float):
        return lambda c, out, done: {"seconds": s, "fail": name == fail, "meet": other.get(name)}

    return [DemoStage(n, fake_stage, config(n, s), lambda c: 1.0, after[n]) for n, s in seconds.items()]


def run(out: Path, stages: list[DemoStage], workers: int = 2) -> dict:
    names = [s.name for s in stages]
    jobs = stage_jobs(stages, None, out, lambda name: progress.line(name))
    progress = DemoProgress(jobs, workers, names)
    return run_jobs(jobs, workers, progress)[0]


def calls(out: Path) -> list[dict]:
    path = out / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead: its parent has not reaped it yet
        return f.read().split(")")[-1].split()[0] != "Z"


def test_stages_start_after_what_they_need_and_run_side_by_side(tmp_path):
    done = run(tmp_path, rows({"a": 0.2, "b": 0.1, "c": 0.1, "d": 0.1}, meet=True))
    assert set(done) == {"a", "b", "c", "d"}
    assert done["b"]["started"] >= done["a"]["ended"]
    assert done["d"]["started"] >= max(done["b"]["ended"], done["c"]["ended"])
    assert done["c"]["ended"] - done["c"]["started"] < 30 and done["b"]["ended"] - done["b"]["started"] < 30
    pids = {c["pid"] for c in calls(tmp_path)}
    assert len(pids) == 2 and os.getpid() in pids  # one lane is this process (a thread), one a worker process


def test_one_worker_runs_in_this_process_in_order(tmp_path):
    done = run(tmp_path, rows({"a": 0.0, "b": 0.0, "c": 0.0, "d": 0.0}), workers=1)
    assert [c["name"] for c in calls(tmp_path)] == ["a", "b", "c", "d"] and list(done) == ["a", "b", "c", "d"]
    assert {c["pid"] for c in calls(tmp_path)} == {os.getpid()}


def test_a_failing_stage_stops_the_demo_with_its_error(tmp_path):
    with pytest.raises(UserError, match="b failed on purpose"):
        run(tmp_path, rows({"a": 0.0, "b": 0.2, "c": 30.0, "d": 0.0}, fail="b", meet=True))  # c has started
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["wall_seconds"] == 0.0  # left intact
    assert not (tmp_path / "d").exists()
    c = next(c for c in calls(tmp_path) if c["name"] == "c")
    # the stage beside it was stopped (it resumes on the next run), not left on: its worker or this lane
    assert not (c["pid"] != os.getpid() and alive(c["pid"]))
    assert not any(t.name == "demo-lane" and t.is_alive() for t in threading.enumerate())
    assert not (tmp_path / "c" / "summary.json").exists()


def test_this_process_lane_is_stopped_like_ctrl_c(tmp_path):
    """The job in this process's lane gets a KeyboardInterrupt and ends; its folder resumes next time."""
    lane = ThreadLane()
    future = lane.submit(fake_stage, {"seconds": 60.0}, tmp_path / "x")
    deadline = time.time() + 10
    while not calls(tmp_path) and time.time() < deadline:
        time.sleep(0.01)
    started = time.time()
    lane.stop()
    assert time.time() - started < 5 and not lane.thread.is_alive() and lane.free
    assert isinstance(future.exception(), KeyboardInterrupt)
    assert not (tmp_path / "x" / "summary.json").exists()


def test_a_job_needing_a_later_one_is_refused():
    with pytest.raises(ValueError, match="not jobs before it"):
        run(Path("/nonexistent"), rows({"b": 0.0, "a": 0.0}))


def test_auto_workers_leave_busy_cores_alone():
    assert auto_workers(cpus=2, load=0.2) == 2 and auto_workers(cpus=2, load=1.2) == 2  # one other process
    assert auto_workers(cpus=2, load=2.0) == 1 and auto_workers(cpus=2, load=5.0) == 1  # every core busy
    assert auto_workers(cpus=1, load=0.0) == 1 and auto_workers(cpus=16, load=0.0) == 2


def busy_beside(*command: str) -> float:
    spinner = subprocess.Popen([*command, sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        return busy_cores(window=0.5)
    finally:
        spinner.kill()
        spinner.wait()


@pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="reads Linux /proc/stat")
@pytest.mark.skipif(os.nice(0) > 0, reason="a niced test run's spinner would be niced too")
def test_busy_cores_sees_a_busy_process_now_not_the_load_average():
    """A process spinning now counts as (about) one busy core; the 1-minute load average would lag. The
    same process under `nice` yields its core to the demo: (about) one core less."""
    busy = busy_beside()
    assert 0.7 <= busy <= (os.cpu_count() or 1) + 0.01
    assert busy_beside("nice", "-n", "15") <= busy - 0.6


def test_critical_path_is_the_longest_chain():
    after = {"b": ("a",), "d": ("b", "c")}
    assert critical_path({"a": 1.0, "b": 2.0, "c": 5.0, "d": 1.0}, after) == (["c", "d"], 6.0)
    assert critical_path({"a": 4.0, "b": 2.0, "c": 5.0, "d": 1.0}, after) == (["a", "b", "d"], 7.0)
    assert critical_path({"b": 2.0, "d": 1.0}, after) == (["b", "d"], 3.0)  # a and c done already


def test_progress_lays_the_time_left_on_the_lanes():
    jobs = [Job("a", (), 10.0, None), Job("b", ("a",), 10.0, None), Job("c", (), 30.0, None)]
    progress = DemoProgress(jobs, 2, ["a", "b", "c"])
    assert progress.left() == 30.0  # c alone is longer than a then b, and than half of all
    assert DemoProgress(jobs, 1, ["a", "b", "c"]).left() == 50.0
    progress.start("a")
    progress.finish("a", 0.2)  # already done: says nothing about the pace
    assert progress.line("b") == "[demo] 2/3 b: about 10s, about 30s left"
    progress.finish("a", 5.0)  # twice as fast as estimated: what is left takes half as long
    assert progress.line("b") == "[demo] 2/3 b: about 5s, about 15s left"


KILLED = """
import sys
from pathlib import Path
from tests.test_demo_runner import rows, run
run(Path(sys.argv[1]), rows({"a": 0.0, "b": float(sys.argv[2]), "c": float(sys.argv[2]), "d": 0.0}))
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_demo_leaves_no_stage_running_and_resumes(tmp_path, sig):
    """Kill the demo while b and c train in its workers: both die with it (SIGKILL: the kernel kills them;
    SIGTERM: the demo stops them and exits); the rerun skips a and resumes b and c."""
    demo = subprocess.Popen([sys.executable, "-c", KILLED, str(tmp_path), "60"], cwd=REPO)
    try:
        deadline = time.time() + 60
        while len([c for c in calls(tmp_path) if c["name"] in "bc"]) < 2:
            assert time.time() < deadline and demo.poll() is None, "b and c never started"
            time.sleep(0.05)
    finally:
        demo.send_signal(sig)
        code = demo.wait(30)
    assert code != 0
    workers = [c["pid"] for c in calls(tmp_path) if c["name"] in "bc"]
    deadline = time.time() + 5
    while any(alive(pid) for pid in workers) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in workers), "a stage trained on after the demo was killed"
    if sig == signal.SIGTERM:
        return  # the resume is the SIGKILL case's
    subprocess.run([sys.executable, "-c", KILLED, str(tmp_path), "0"], cwd=REPO, check=True)
    second = calls(tmp_path)[3:]
    assert sorted((c["name"], c["resume"]) for c in second) == [("b", True), ("c", True), ("d", False)]
