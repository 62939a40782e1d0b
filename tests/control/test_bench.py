"""``postrl control bench`` (postrl.control.bench): seeds, aggregate statistics, resume, curves, errors."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from postrl import cli
from postrl.control import bench
from postrl.runtime.config import ConfigError


@pytest.mark.parametrize(
    ("text", "seeds"),
    [
        ("0-9", list(range(10))),
        ("10-19", list(range(10, 20))),
        ("7", [7]),
        ("0,3,7", [0, 3, 7]),
        ("3, 0-2, 2", [0, 1, 2, 3]),
        ("5-5", [5]),
    ],
)
def test_parse_seeds(text, seeds):
    assert bench.parse_seeds(text) == seeds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("9-0", "backwards"),
        ("", "not a seed"),
        ("a-3", "not a seed"),
        ("-1", "not a seed"),
        ("1-", "not a seed"),
        ("0-5000", "more than"),
    ],
)
def test_parse_seeds_errors(text, message):
    with pytest.raises(ConfigError, match=message):
        bench.parse_seeds(text)


def test_interquartile_mean_by_hand():
    assert bench.interquartile_mean(range(1, 11)) == pytest.approx((3 + 4 + 5 + 6 + 7 + 8) / 6)  # cut 2 + 2
    assert bench.interquartile_mean([100, 1, 3, 2]) == pytest.approx(2.5)  # cut 1 + 1: mean of 2, 3
    assert bench.interquartile_mean([4, 1, 9]) == pytest.approx(14 / 3)  # ⌊3/4⌋ = 0: the plain mean
    # scipy.stats.trim_mean(x, 0.25) on 7 values cuts ⌊1.75⌋ = 1 from each end
    assert bench.interquartile_mean([-500, 1, 2, 3, 4, 5, 900]) == pytest.approx(3.0)


def test_aggregate_by_hand():
    values = [-150.0, -180.0, -210.0, -120.0, -600.0]
    a = bench.aggregate(values, target=-200.0)
    assert a["n_seeds"] == 5
    assert a["mean"] == pytest.approx(-252.0)
    assert a["std"] == pytest.approx(np.sqrt(np.mean((np.array(values) + 252.0) ** 2)))  # ddof 0
    assert a["median"] == -180.0
    assert a["iqm"] == pytest.approx((-150 - 180 - 210) / 3)  # sorted −600 −210 −180 −150 −120, cut 1 + 1
    assert (a["min"], a["max"]) == (-600.0, -120.0)
    assert a["seeds_meeting_target"] == 3 and a["fraction_meeting_target"] == pytest.approx(0.6)
    lo, hi = a["iqm_ci95"]
    assert -600 <= lo <= a["iqm"] <= hi <= -120
    assert bench.aggregate([1.0, 3.0], None)["median"] == 2.0
    assert bench.aggregate([1.0, 3.0], None)["fraction_meeting_target"] is None


def test_bootstrap_is_seeded_and_percentile():
    rng = np.random.default_rng(5)
    x = rng.normal(size=10).tolist()
    a = bench.stratified_bootstrap_ci([x], seed=1, reps=500)
    assert a == bench.stratified_bootstrap_ci([x], seed=1, reps=500)
    assert a != bench.stratified_bootstrap_ci([x], seed=2, reps=500)
    # by hand: the same draws, the 2.5% and 97.5% quantiles of the resampled IQMs
    draws = np.random.default_rng(1).integers(0, 10, (500, 10))
    stats = [bench.interquartile_mean(np.asarray(x)[row]) for row in draws]
    assert a == pytest.approx(tuple(np.quantile(stats, [0.025, 0.975])))
    generic = bench.stratified_bootstrap_ci([x], statistic=bench.interquartile_mean, seed=1, reps=500)
    assert generic == pytest.approx(a)
    assert bench.stratified_bootstrap_ci([[4.0] * 6]) == (4.0, 4.0)


def test_bootstrap_is_stratified_by_task():
    """Every resample keeps each task's run count: a task of 0s and one of 10s always average 5."""
    lo, hi = bench.stratified_bootstrap_ci([[0.0] * 5, [10.0] * 5], statistic=np.mean, reps=200)
    assert lo == pytest.approx(5.0) and hi == pytest.approx(5.0)


def test_plot_seed_curves_writes_a_png(tmp_path):
    steps = np.linspace(0, 1000, 30)
    curves = {s: (steps.tolist(), (np.sqrt(steps) * (1 + 0.1 * s)).tolist()) for s in range(5)}
    path = bench.plot_seed_curves(curves, tmp_path / "c.png", "test", target=30.0)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert bench.plot_seed_curves({0: ([1.0], [2.0])}, tmp_path / "none.png", "t") is None


def _bench(capsys, *argv):
    code = cli.main(["control", "bench", *argv])
    return code, capsys.readouterr()


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--config", "ppo-cartpol"], "ppo-cartpole"),
        (["--config", "ppo-cartpole", "--seeds", "9-0"], "backwards"),
        (["--config", "ppo-cartpole", "--seeds", "x"], "--seeds"),
        (["--config", "ppo-cartpole", "run.seed=3"], "run.seed"),
        (["--config", "ppo-cartpole", "ppo.lrr=1"], "ppo.lrr"),
        (["--config", "ppo-cartpole", "ppo.lr=-1"], "ppo.lr"),
        (["--config", "ppo-cartpole", "--workers", "0"], "--workers"),
        (["--config", "ppo-pendulum", "policy.use_sde=true", "ppo.backend=fused"], "gSDE"),
        (["--config", "a2c-cartpole", "env.id=NoSuchEnv-v0"], "NoSuchEnv-v0"),
    ],
)
def test_bad_input_is_one_error_line_and_nothing_written(tmp_path, capsys, argv, names):
    out = tmp_path / "bench"
    code, captured = _bench(capsys, *argv, "--out", str(out))
    assert code == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("postrl: error:") and names in lines[0]
    assert not out.exists()


def test_out_of_another_config_or_not_a_bench_is_refused(tmp_path, capsys):
    spec = bench.resolve_spec("ppo-cartpole", "0", [])
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "bench.json").write_text(json.dumps({**spec.record(), "overrides": ["ppo.lr=1"]}))
    before = (tmp_path / "b" / "bench.json").read_bytes()
    code, captured = _bench(capsys, "--config", "ppo-cartpole", "--out", str(tmp_path / "b"))
    assert code == 2 and "overrides" in captured.err
    assert (tmp_path / "b" / "bench.json").read_bytes() == before
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "notes.txt").write_text("mine")
    code, captured = _bench(capsys, "--config", "ppo-cartpole", "--out", str(tmp_path / "c"))
    assert code == 2 and "not a postrl bench" in captured.err
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["notes.txt"]


TINY = ["env.n_envs=2", "ppo.n_steps=16", "ppo.batch_size=32", "ppo.epochs=1", "run.steps=64"]
TINY += ["run.eval_episodes=2", "run.save_every=1", "policy.hidden=[8]"]


_FAKE_TRAIN = """
import json, pathlib, sys, time
out = pathlib.Path(sys.argv[1]); seed = int(sys.argv[2])
resumed = out.exists()
out.mkdir(exist_ok=True)
(out / "config.yaml").write_text("run:\\n  eval_episodes: 3\\n")
rows = [{"step": 10 * i, "train_return_ma20": float(i * (seed + 1))} for i in range(1, 6)]
(out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
if seed == 99:
    sys.exit("boom")
summary = {"eval_return_mean": 100.0 * seed, "eval_return_std": 1.0, "env_steps": 50}
(out / "summary.json").write_text(json.dumps(summary))
print("resuming" if resumed else "fresh", file=sys.stderr)
"""


def test_scheduler_skips_finished_seeds_resumes_others_and_reports_failures(tmp_path, monkeypatch):
    """The bench's own logic with a stand-in for `postrl control train` (a few ms per seed)."""
    monkeypatch.setattr(
        bench,
        "train_command",
        lambda spec, out, seed: [
            sys.executable,
            "-c",
            _FAKE_TRAIN,
            str(bench.seed_dir(out, seed)),
            str(seed),
        ],
    )
    spec = bench.BenchSpec("fake", tmp_path / "fake.yaml", "ppo", "CartPole-v1", (), (1, 2, 3), 150.0)
    out = tmp_path / "b"
    said = []
    summary = bench.run_bench(spec, out, workers=2, command="c", echo=said.append)
    assert summary["seeds_finished"] == [1, 2, 3] and summary["seeds_failed"] == []
    agg = summary["eval_return"]
    assert agg["mean"] == pytest.approx(200.0) and agg["seeds_meeting_target"] == 2
    assert [json.loads(x)["eval_episodes"] for x in (out / "seeds.jsonl").read_text().splitlines()] == [3] * 3
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    usage = (out / "seed-1.usage.json").read_text()
    (out / "seed-2" / "summary.json").unlink()  # seed 2 interrupted
    said.clear()
    spec = bench.BenchSpec("fake", tmp_path / "fake.yaml", "ppo", "CartPole-v1", (), (1, 2, 3, 99), 150.0)
    summary = bench.run_bench(spec, out, workers=2, command="c", echo=said.append)
    assert said[0] == "bench: 2 of 4 seeds already finished, skipped"
    assert any("seed 2 resumed" in x for x in said) and any("seed 99 started" in x for x in said)
    assert any("seed 99 failed (exit 1): boom" in x for x in said)
    assert (out / "seed-2.log").read_text().splitlines() == ["fresh", "resuming"]
    assert (out / "seed-1.usage.json").read_text() == usage  # not rerun
    assert summary["seeds_finished"] == [1, 2, 3] and summary["seeds_failed"] == [99]


@pytest.mark.slow
def test_bench_runs_seeds_in_parallel_skips_finished_ones_and_resumes(tmp_path, capsys):
    out = tmp_path / "bench"
    argv = ["--config", "ppo-cartpole", "--seeds", "3-4", "--out", str(out), "--workers", "2", *TINY]
    code, captured = _bench(capsys, *argv)
    assert code == 0, captured.err
    rows = [json.loads(line) for line in (out / "seeds.jsonl").read_text().splitlines()]
    assert [r["seed"] for r in rows] == [3, 4]
    assert all(r["env_steps"] == 64 and r["eval_episodes"] == 2 and r["cpu_seconds"] > 0 for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval_return"]["n_seeds"] == 2 and summary["eval_return"]["target"] == 475.0
    assert summary["eval_return"]["mean"] == pytest.approx(np.mean([r["eval_return_mean"] for r in rows]))
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "seeds.csv").read_text().startswith("seed,eval_return_mean")
    usage = (out / "seed-3.usage.json").read_text()

    # finished seeds are skipped; an interrupted one (no summary.json) resumes; a new seed runs
    (out / "seed-4" / "summary.json").unlink()
    code, captured = _bench(capsys, *argv[:3], "3-5", *argv[4:])
    assert code == 0, captured.err
    assert "1 of 3 seeds already finished" in captured.out
    assert "seed 4 resumed" in captured.out and "seed 5 started" in captured.out
    assert "resuming" in (out / "seed-4.log").read_text()
    assert (out / "seed-3.usage.json").read_text() == usage
    assert json.loads((out / "seed-4.usage.json").read_text())["attempts"] == 2
    assert json.loads((out / "summary.json").read_text())["seeds_finished"] == [3, 4, 5]


def test_sigterm_stops_the_bench_and_its_children(tmp_path):
    """A `kill` of the bench (SIGTERM) stops the seeds' processes too (they would otherwise train on, orphaned)."""
    script = tmp_path / "bench_run.py"
    pids = tmp_path / "pids"
    script.write_text(
        "import sys\n"
        "from pathlib import Path\n"
        "from postrl.control import bench\n"
        "bench.train_command = lambda spec, out, seed: [sys.executable, '-c', "
        '\'import os, sys, time; open(sys.argv[1], "a").write(str(os.getpid()) + "\\\\n"); time.sleep(60)\', '
        f"{str(pids)!r}]\n"
        "spec = bench.BenchSpec('fake', Path('f.yaml'), 'ppo', 'CartPole-v1', (), (1, 2), 1.0)\n"
        f"bench.run_seeds(spec, Path({str(tmp_path / 'b')!r}), workers=2, echo=lambda line: None)\n"
    )
    (tmp_path / "b").mkdir()
    proc = subprocess.Popen([sys.executable, str(script)])
    deadline = time.time() + 60
    while time.time() < deadline and (not pids.is_file() or len(pids.read_text().split()) < 2):
        time.sleep(0.1)
    children = [int(x) for x in pids.read_text().split()]
    assert len(children) == 2
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    for pid in children:  # reaped by the bench, so no such process is left
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
