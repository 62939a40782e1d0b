"""``postrl control bench``: one preset on many seeds, aggregated the way rl-zoo and rliable publish results.

Each seed is a ``postrl control train`` run in its own process (``OUT/seed-S/``, one torch thread each), up to
``--workers`` at a time: process-level parallelism over independent runs, never over one run's gradients.
What a bench folder holds:

- ``seed-S/``: the seed's run folder (config.yaml, metrics.jsonl, summary.json, checkpoints, curve);
  ``seed-S.log`` its stderr, ``seed-S.usage.json`` its process's wall and CPU seconds and exit status;
- ``seeds.jsonl`` and ``seeds.csv``: one row per finished seed (final deterministic evaluation mean ± std over
  ``run.eval_episodes`` episodes, env steps, steps to the env's threshold, wall and CPU seconds, target met);
- ``summary.json``: the aggregate over seeds (below), the preset, its overrides and the command;
- ``curves.png``: every seed's learning curve (the 20-episode moving average of training returns against env
  steps), their median, the interquartile band and the min–max band, and the target.

The aggregate, over the seeds' final evaluation means: mean and std (population, ddof 0), median, the
interquartile mean (IQM: the mean of the middle half after cutting ⌊n/4⌋ runs from each end, rliable's
``scipy.stats.trim_mean(x, 0.25)``) with a 95% percentile interval from a stratified bootstrap (rliable's
``StratifiedBootstrap``: runs resampled with replacement within each task; here one task, so over the
seeds; 10,000 resamples from a seeded generator, so the interval is reproducible), and the fraction of seeds
whose evaluation mean reaches the preset's target (`TARGETS`).

Resumable: a seed whose folder holds ``summary.json`` is skipped; an interrupted one is rerun with the same
command, which resumes it from its last checkpoint (``postrl control train``'s own behaviour). The bench's
``bench.json`` records the preset and overrides; rerunning into the folder with others is an error, so
seeds of two configs are never aggregated together.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from postrl.control.bench_stats import aggregate, interquartile_mean, stratified_bootstrap_ci
from postrl.runtime.config import ConfigError, read_yaml
from postrl.runtime.interrupts import sigterm_as_interrupt
from postrl.runtime.presets import config_file

__all__ = [
    "TARGETS",
    "BenchSpec",
    "aggregate",
    "interquartile_mean",
    "parse_seeds",
    "plot_seed_curves",
    "run_bench",
    "stratified_bootstrap_ci",
]

TARGETS: dict[str, float] = {
    "ppo-cartpole": 475.0,
    "ppo-acrobot": -100.0,
    "ppo-pendulum": -200.0,
    "a2c-cartpole": 475.0,
    "reinforce-cartpole": 400.0,
    "trpo-cartpole": 475.0,
    "trpo-pendulum": -300.0,
}
"""The README's Part 1 target of each preset (issue 3's goals, also benchmarks/control.py's): the final
deterministic evaluation mean a seed must reach. CartPole's 475 is the env's reward threshold, Acrobot's −100
and Pendulum's −200 the peer benchmark's; REINFORCE (400) and TRPO on Pendulum (−300) have looser ones."""

MAX_SEEDS = 1000
CURVE_KEY = "train_return_ma20"


# ---------------------------------------------------------------- seeds


def parse_seeds(text: str) -> list[int]:
    """``"0-9"``, ``"10-19"``, ``"0,3,7"``, ``"0-4,10"`` → sorted distinct seeds; a bad range is a ConfigError."""
    seeds: set[int] = set()
    for part in text.replace(" ", "").split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if m is None:
            raise ConfigError(
                f"--seeds {text!r}: {part!r} is not a seed or a range; write e.g. 0-9, 10-19 or 0,3,7"
            )
        lo, hi = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
        if hi < lo:
            raise ConfigError(f"--seeds {text!r}: the range {part} runs backwards; write {hi}-{lo}")
        if hi - lo + 1 + len(seeds) > MAX_SEEDS:
            raise ConfigError(f"--seeds {text!r}: more than {MAX_SEEDS} seeds")
        seeds.update(range(lo, hi + 1))
    return sorted(seeds)


# ---------------------------------------------------------------- the spec of a bench


@dataclass(frozen=True)
class BenchSpec:
    """What a bench runs: the config file, its algorithm, the overrides, the seeds and the target."""

    name: str  # the preset's name, or the config file's stem
    config: Path
    algo: str
    env_id: str
    overrides: tuple[str, ...]
    seeds: tuple[int, ...]
    target: float | None

    def record(self) -> dict[str, Any]:
        """What bench.json keeps: the fields that must match for a rerun to add to the same folder."""
        return {
            "name": self.name,
            "config": str(self.config),
            "algo": self.algo,
            "overrides": list(self.overrides),
        }


def resolve_spec(config: str, seeds: str, overrides: Sequence[str], target: float | None = None) -> BenchSpec:
    """Check everything a bench needs before any folder is touched: the config (file or preset), its
    algorithm, the overrides (each key against the algorithm's config, ranges included), the env and the agent
    (built once: e.g. ppo.backend=fused with a policy it cannot run) and the seed range. Errors are
    ConfigErrors naming what is wrong."""
    from postrl.control.envs import VecEnv  # deferred: gymnasium, torch
    from postrl.control.loop import algorithm
    from postrl.runtime.config import load_config, validate

    path = config_file(config)
    algo = str(read_yaml(path).get("algo", "ppo"))
    entry = algorithm(algo)
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key in ("run.seed", "seed"):
            raise ConfigError(f"override {item!r}: the bench sets run.seed from --seeds")
        if key == "algo":
            raise ConfigError(f"override {item!r}: the algorithm is the config's ({algo})")
    cfg = load_config(entry.config, path, list(overrides))
    validate(cfg)
    seed_list = parse_seeds(seeds)
    env = VecEnv(cfg.env, cfg.run.seed)  # the env and the agent, built once as each seed will build them
    try:
        entry.build(cfg, env)
    finally:
        env.close()
    name = path.stem
    if target is None:
        target = TARGETS.get(name) if path.parent.resolve() == _presets_root() else None
    return BenchSpec(name, path, algo, cfg.env.id, tuple(overrides), tuple(seed_list), target)


def _presets_root() -> Path:
    from postrl.runtime.presets import presets_dir

    return presets_dir().resolve()


def check_out(out: Path, spec: BenchSpec) -> None:
    """``out`` must be new (and creatable), empty, or a bench folder of the same config and overrides."""
    if not out.exists():
        from postrl.runtime.rundir import check_can_create  # deferred: torch

        check_can_create(out)  # under a file it was a NotADirectoryError traceback at the first mkdir
        return
    if not out.is_dir():
        raise ConfigError(f"--out {out}: a file, not a folder")
    record = out / "bench.json"
    if record.is_file():
        try:
            old = json.loads(record.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ConfigError(f"{record}: unreadable ({err}); use another --out") from None
        mine = spec.record()
        diff = [k for k in mine if old.get(k) != mine[k]]
        if diff:
            raise ConfigError(
                f"--out {out} holds a bench of {old.get('name')} with overrides {old.get('overrides')}, not "
                f"{mine['name']} with {mine['overrides']} (differs in {', '.join(diff)}); use another --out"
            )
        return
    if any(out.iterdir()):
        raise ConfigError(f"--out {out}: a non-empty folder that is not a postrl bench; use another --out")


# ---------------------------------------------------------------- running the seeds


def _say(line: str) -> None:
    print(line, flush=True)  # seed by seed, also when stdout is a pipe or a log file


def seed_dir(out: Path, seed: int) -> Path:
    return out / f"seed-{seed}"


def finished(out: Path, seed: int) -> bool:
    return (seed_dir(out, seed) / "summary.json").is_file()


def train_command(spec: BenchSpec, out: Path, seed: int) -> list[str]:
    """The ``postrl control train`` command line of one seed (rerunning it resumes an interrupted run)."""
    return [
        sys.executable,
        "-m",
        "postrl.cli",
        "control",
        "train",
        "--algo",
        spec.algo,
        "--config",
        str(spec.config),
        "--seed",
        str(seed),
        "--out",
        str(seed_dir(out, seed)),
        *spec.overrides,
    ]


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = "1"  # one thread per seed: the parallelism is over processes
    return env


def run_seeds(spec: BenchSpec, out: Path, workers: int, echo: Callable[[str], None] = _say) -> list[int]:
    """Run every unfinished seed, at most ``workers`` at a time; returns the seeds whose process failed.
    Each child's wall and CPU seconds (its own rusage, from ``os.wait4``) go to ``seed-S.usage.json``."""
    todo = [s for s in spec.seeds if not finished(out, s)]
    skipped = len(spec.seeds) - len(todo)
    if skipped:
        echo(f"bench: {skipped} of {len(spec.seeds)} seeds already finished, skipped")
    running: dict[int, tuple[int, subprocess.Popen, float, Any]] = {}
    failed: list[int] = []
    env = _child_env()
    with sigterm_as_interrupt():
        try:
            while todo or running:
                while todo and len(running) < workers:
                    seed = todo.pop(0)
                    resumed = seed_dir(out, seed).exists()
                    log = open(out / f"seed-{seed}.log", "a")  # noqa: SIM115 (closed when the child ends)
                    proc = subprocess.Popen(
                        train_command(spec, out, seed), stdout=subprocess.DEVNULL, stderr=log, env=env
                    )
                    running[proc.pid] = (seed, proc, time.perf_counter(), log)
                    echo(f"bench: seed {seed} {'resumed' if resumed else 'started'} (pid {proc.pid})")
                time.sleep(0.05)
                for pid in list(running):
                    got, status, usage = os.wait4(pid, os.WNOHANG)
                    if got == 0:
                        continue
                    seed, proc, start, log = running.pop(pid)
                    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen.wait
                    log.close()
                    _record_usage(out, seed, proc.returncode, time.perf_counter() - start, usage)
                    if proc.returncode != 0:
                        failed.append(seed)
                        echo(f"bench: seed {seed} failed (exit {proc.returncode}): {_last_line(out, seed)}")
                    else:
                        echo(f"bench: seed {seed} finished: {_row_text(seed_row(out, seed, spec.target))}")
        finally:  # Ctrl-C or SIGTERM: stop the children; their folders resume on the next run
            for _seed, proc, _, log in running.values():
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                log.close()
        return sorted(failed)


def _record_usage(out: Path, seed: int, code: int, wall: float, usage) -> None:
    path = out / f"seed-{seed}.usage.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    # a resumed seed adds the time of this attempt to what the interrupted ones spent
    record = {
        "seed": seed,
        "returncode": code,
        "wall_seconds": round(old.get("wall_seconds", 0.0) + wall, 1),
        "cpu_seconds": round(old.get("cpu_seconds", 0.0) + usage.ru_utime + usage.ru_stime, 1),
        "attempts": old.get("attempts", 0) + 1,
    }
    path.write_text(json.dumps(record) + "\n")


def _last_line(out: Path, seed: int) -> str:
    try:
        lines = [ln for ln in (out / f"seed-{seed}.log").read_text().splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(empty log)"


def seed_row(out: Path, seed: int, target: float | None) -> dict[str, Any]:
    """One finished seed: its summary.json's evaluation and counters, and its process's usage."""
    summary = json.loads((seed_dir(out, seed) / "summary.json").read_text())
    usage_path = out / f"seed-{seed}.usage.json"
    usage = json.loads(usage_path.read_text()) if usage_path.is_file() else {}
    config = read_yaml(seed_dir(out, seed) / "config.yaml")
    mean = float(summary["eval_return_mean"])
    return {
        "seed": seed,
        "eval_return_mean": mean,
        "eval_return_std": float(summary["eval_return_std"]),
        "eval_episodes": int(config.get("run", {}).get("eval_episodes", 20)),
        "env_steps": int(summary["env_steps"]),
        "steps_to_threshold": summary.get("steps_to_threshold"),
        "train_seconds": summary.get("train_seconds"),
        "wall_seconds": usage.get("wall_seconds"),
        "cpu_seconds": usage.get("cpu_seconds"),
        "meets_target": None if target is None else mean >= target,
    }


def _row_text(row: dict[str, Any]) -> str:
    ok = (
        "" if row["meets_target"] is None else ("  meets target" if row["meets_target"] else "  BELOW target")
    )
    cpu = "?" if row["cpu_seconds"] is None else f"{row['cpu_seconds']:.0f}"
    return (
        f"eval {row['eval_return_mean']:.1f} ± {row['eval_return_std']:.1f} ({row['eval_episodes']} episodes), "
        f"{row['env_steps']} steps, {cpu} CPU-s{ok}"
    )


# ---------------------------------------------------------------- curves


def seed_curve(out: Path, seed: int) -> tuple[list[float], list[float]]:
    """(env steps, 20-episode moving average of training returns) of one seed's metrics.jsonl."""
    from postrl.runtime.logging import read_jsonl

    rows = read_jsonl(seed_dir(out, seed) / "metrics.jsonl")
    pts = [(r["step"], r[CURVE_KEY]) for r in rows if r.get(CURVE_KEY) is not None and "step" in r]
    return [float(p[0]) for p in pts], [float(p[1]) for p in pts]


def plot_seed_curves(
    curves: dict[int, tuple[Sequence[float], Sequence[float]]],
    path: Path,
    title: str,
    target: float | None = None,
    points: int = 200,
) -> Path | None:
    """Every seed's curve (thin), their median, the interquartile band and the min–max band, on a common grid
    of env steps (each curve linearly interpolated; the grid stops at the shortest curve's end)."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {s: c for s, c in curves.items() if len(c[0]) >= 2}
    if not curves:
        return None
    start = max(c[0][0] for c in curves.values())
    stop = min(c[0][-1] for c in curves.values())
    grid = np.linspace(start, stop, points) if stop > start else np.array([start])
    ys = np.stack([np.interp(grid, np.asarray(x), np.asarray(y)) for x, y in curves.values()])
    q0, q25, q50, q75, q100 = np.quantile(ys, [0.0, 0.25, 0.5, 0.75, 1.0], axis=0)
    fig, ax = plt.subplots(figsize=(7, 4))
    for x, y in curves.values():
        ax.plot(x, y, color="tab:blue", lw=0.5, alpha=0.35)
    ax.fill_between(grid, q0, q100, color="tab:blue", alpha=0.12, lw=0, label="min–max")
    ax.fill_between(grid, q25, q75, color="tab:blue", alpha=0.3, lw=0, label="interquartile range")
    ax.plot(grid, q50, color="tab:blue", lw=2, label=f"median of {len(curves)} seeds")
    if target is not None:
        ax.axhline(target, color="tab:red", ls="--", lw=1, label=f"target {target:g}")
    ax.set_xlabel("env steps")
    ax.set_ylabel("training return (20-episode moving average)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- the whole bench


def write_results(spec: BenchSpec, out: Path, failed: Sequence[int], command: str) -> dict[str, Any]:
    """seeds.jsonl, seeds.csv, summary.json and curves.png from the finished seeds' folders."""
    rows = [seed_row(out, s, spec.target) for s in spec.seeds if finished(out, s)]
    with open(out / "seeds.jsonl", "w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    if rows:
        with open(out / "seeds.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    cpu = [r["cpu_seconds"] for r in rows if r["cpu_seconds"] is not None]
    summary = {
        "preset": spec.name,
        "config": str(spec.config),
        "algo": spec.algo,
        "env_id": spec.env_id,
        "overrides": list(spec.overrides),
        "seeds": list(spec.seeds),
        "seeds_finished": [r["seed"] for r in rows],
        "seeds_failed": list(failed),
        "eval_return": aggregate([r["eval_return_mean"] for r in rows], spec.target),
        "env_steps": rows[0]["env_steps"] if rows else None,
        "cpu_seconds_total": round(sum(cpu), 1) if cpu else None,
        "cpu_seconds_per_seed": round(sum(cpu) / len(cpu), 1) if cpu else None,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "command": command,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    curves = {r["seed"]: seed_curve(out, r["seed"]) for r in rows}
    seeds_text = _seeds_text(spec.seeds)
    plot_seed_curves(curves, out / "curves.png", f"{spec.name}, seeds {seeds_text}", spec.target)
    return summary


def _seeds_text(seeds: Sequence[int]) -> str:
    seeds = list(seeds)
    if seeds and seeds == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 1:
        return f"{seeds[0]}–{seeds[-1]}"
    return ", ".join(map(str, seeds))


def aggregate_text(summary: dict[str, Any]) -> str:
    """One line: mean ± std, median, IQM [95% CI], seeds meeting the target."""
    a = summary["eval_return"]
    if not a.get("n_seeds"):
        return f"{summary['preset']}: no finished seed"
    lo, hi = a["iqm_ci95"]
    text = (
        f"{summary['preset']}: {a['n_seeds']} seeds, eval {a['mean']:.1f} ± {a['std']:.1f}, "
        f"median {a['median']:.1f}, IQM {a['iqm']:.1f} [{lo:.1f}, {hi:.1f}]"
    )
    if a["target"] is not None:
        text += f", {a['seeds_meeting_target']}/{a['n_seeds']} meet {a['target']:g}"
    return text


def run_bench(
    spec: BenchSpec, out: Path, workers: int, command: str = "", echo: Callable[[str], None] = _say
) -> dict[str, Any]:
    """Run the seeds of ``spec`` into ``out`` (validated by :func:`check_out` first) and write the results."""
    check_out(out, spec)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(spec.record(), indent=2) + "\n")
    failed = run_seeds(spec, out, workers, echo)
    summary = write_results(spec, out, failed, command or shlex.join(sys.argv))
    echo(aggregate_text(summary))
    return summary
