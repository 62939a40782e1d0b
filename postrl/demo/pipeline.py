"""`postrl demo`: the notes' whole pipeline on the built-in world, then a report.

Each stage is an ordinary postrl run folder under RUN_DIR; a stage whose summary.json exists is skipped, one
that was interrupted resumes from its last checkpoint, so rerunning the same command continues a killed demo.
Stages that do not need each other run at the same time on lanes with one thread each (`postrl.demo.runner`;
``workers``), and each checkpoint is evaluated on the common held-out prompts as soon as it is trained
(`postrl.demo.evaluation`); the report (`postrl.demo.report`) and summary.json hold the same numbers.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import postrl.demo.vlm_eval as vlm_eval
from postrl.demo.config import DemoConfig
from postrl.demo.evaluation import evaluate_checkpoints, frontier
from postrl.demo.machine import MemorySampler, auto_workers, cpu_seconds
from postrl.demo.report import PLOTTED, plot_stage, write_report
from postrl.demo.runner import Summaries, finished_stages, run_jobs, stage_jobs
from postrl.demo.schedule import DemoProgress, Job, critical_path
from postrl.demo.stages import check_base_model, demo_stages, wire
from postrl.demo.verdicts import PER_ITEM, verdicts
from postrl.lm.tasks import get_task
from postrl.runtime.checkpoint import atomic_write_text
from postrl.runtime.config import save_config, validate
from postrl.runtime.config_values import changed_keys, to_dict
from postrl.runtime.logging import peak_rss_mb
from postrl.runtime.rundir import check_resume_config, check_run_dir, remove_run, run_state


def run_demo(
    cfg: DemoConfig, out: str | Path, resume: bool = False, overwrite: bool = False
) -> dict[str, Any]:
    """Run every stage (skipping finished ones), evaluate every checkpoint, write the report.

    An interrupted demo is resumed by running it again; a finished one (``summary.json``) is only redone
    with ``resume`` (finished stages skipped, evaluation and report written again) or ``overwrite``."""
    out = Path(out)
    wall_started, cpu_started, load_before = time.perf_counter(), cpu_seconds(), os.getloadavg()
    cfg = open_demo(cfg, out, resume, overwrite)
    rows = demo_stages(cfg)
    finished_before = finished_stages(out, [s.name for s in rows])  # skipped here: not in this time
    workers = cfg.workers or auto_workers()
    names = [s.name for s in rows]
    jobs = stage_jobs(rows, cfg, out, lambda name: progress.line(name)) + evaluation_jobs(cfg, out, names)
    progress = DemoProgress(jobs, workers, names)
    print(
        f"[demo] {len(rows)} stages in {workers} worker{'s' * (workers > 1)}, each checkpoint evaluated on "
        "the same held-out prompts once it is trained",
        file=sys.stderr,
    )
    with MemorySampler() as memory:
        results, usage = run_jobs(jobs, workers, progress)
    done = _with_rm_pairs(cfg, {s.name: results[s.name] for s in rows})
    evaluation = {n: row for j in jobs if j.name.startswith("eval ") for n, row in results[j.name].items()}
    summary = _job_summary(done, evaluation, usage, jobs)
    vlm_eval.add_to_summary(summary, done)
    summary["frontier"] = results.get("frontier", [])
    summary["workers"] = workers
    summary["finished_before"] = finished_before
    summary["wall_seconds"] = round(time.perf_counter() - wall_started, 2)
    summary["cpu_seconds"] = round(cpu_seconds() - cpu_started, 1)
    summary["peak_rss_mb"] = round(max(summary["peak_rss_mb"], memory.peak_mb), 1)
    summary["load_average"] = [round(x, 2) for x in load_before] + [round(x, 2) for x in os.getloadavg()]
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_report(out, cfg, done, evaluation, summary, vlm_eval.report_md(out, summary))
    for line in summary["verdicts"]:
        print(f"[demo] {line['text']}", file=sys.stderr)
    report = (out / "report.md").resolve()
    print(f"[demo] report: {report} (and report.html; the numbers in summary.json)", file=sys.stderr)
    return summary


def open_demo(cfg: DemoConfig, out: Path, resume: bool, overwrite: bool) -> DemoConfig:
    """Check the config and the folder before anything is written (an interrupted demo resumes, a resumed one
    keeps its config, the shipped models are the recipe's), then make the folder and save the wired config."""
    validate(cfg)
    if run_state(out) == "interrupted" and not overwrite:
        resume = True  # rerunning the demo resumes it, as `make demo` promises
    mode = check_run_dir(out, resume=resume, overwrite=overwrite)
    if mode == "resume":
        check_same_config(cfg, out)
    check_base_model(cfg)
    if mode == "overwrite":
        remove_run(out)
        print(f"[demo] --overwrite: removed the previous demo in {out}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    cfg = wire(cfg, out)
    save_config(cfg, out / "config.yaml")
    return cfg


def _with_rm_pairs(cfg: DemoConfig, done: Summaries) -> Summaries:
    """A reward model's summary from before its stage recorded ``heldout_pairs`` gets the count behind its
    accuracy."""
    if "rm" in done and "heldout_pairs" not in done["rm"]:
        pairs = get_task("reviews", **cfg.rm.task).config.n_pairs_test
        done["rm"] = {**done["rm"], "heldout_pairs": min(cfg.rm.eval_size or pairs, pairs)}
    return done


def _job_summary(
    done: Summaries, evaluation: dict[str, dict], usage: dict[str, dict[str, float]], jobs: list[Job]
) -> dict[str, Any]:
    """`build_summary` with the evaluation's CPU seconds, each job's seconds and the critical path."""
    evals = [u for n, u in usage.items() if n.startswith("eval ") or n == "frontier"]
    summary = build_summary(done, evaluation, sum(u["wall_seconds"] for u in evals))
    summary["eval_cpu_seconds"] = round(sum(u["cpu_seconds"] for u in evals), 1)
    summary["job_seconds"] = usage
    chain, cpu = critical_path(
        {n: u["cpu_seconds"] for n, u in usage.items()}, {j.name: j.after for j in jobs}
    )
    summary["critical_path"] = {"jobs": chain, "cpu_seconds": round(cpu, 1)}
    return summary


def check_same_config(cfg: DemoConfig, out: Path) -> None:
    """A demo resumes with the config it started with: its finished stages are skipped, so a changed key
    (``--quick`` on a full demo, or the other way round; a stage's steps) would leave a folder whose stages and
    report disagree. ``workers`` may change, and the paths `wire` derives from the folder (a moved one)."""
    derived = changed_keys(to_dict(wire(cfg, Path("/a"))), to_dict(wire(cfg, Path("/b"))))
    check_resume_config(out, to_dict(wire(cfg, out)), {*derived, "workers"}, hint=" (e.g. --quick)")


def evaluate_and_plot(cfg: DemoConfig, out: Path, name: str) -> dict[str, dict[str, Any]]:
    """`evaluate_checkpoints` of checkpoint ``name``, then its stage's learning curves (with SFT's, the reward
    model's too), drawn here beside the training instead of all after the last stage (the report keeps them)."""
    found = evaluate_checkpoints(cfg, out, [name])
    for stage in (name, "rm") if name == "sft" else (name,):
        if stage in PLOTTED:
            plot_stage(out, stage)
    return found


# The checkpoints the common evaluation compares (the reward model has its own pair accuracy).
EVALUATED = ("pretrain", "sft", "ppo", "dpo", "grpo", "sft-vs-ppo", "sft-vs-grpo")


def evaluation_jobs(cfg: DemoConfig, out: Path, names: list[str]) -> list[Job]:
    """The common evaluation as jobs: each checkpoint of `EVALUATED` among ``names`` once it is trained
    (against the SFT policy and the reward model), and the gold-reward frontier once SFT's row, PPO and DPO
    are there. Each job's numbers are those of one `evaluate_checkpoints` over all of them."""
    todo = [n for n in EVALUATED if n in names]
    seconds = (
        0.4 + 0.001 * cfg.eval_prompts + 0.002 * cfg.eval_samples
    )  # idle-machine seconds (benchmarks/demo.py)
    jobs = [
        Job(
            f"eval {n}",
            tuple(dict.fromkeys((n, "sft", "rm"))),
            seconds,
            lambda done, n=n: (evaluate_and_plot, (cfg, out, n)),
        )
        for n in todo
        if {"sft", "rm"} <= set(names)
    ]
    if jobs and "eval sft" in {j.name for j in jobs}:
        needs = ("eval sft", *(n for n in ("ppo", "dpo") if n in names))
        jobs.append(
            Job(
                "frontier",
                needs,
                0.025 * cfg.frontier_prompts * cfg.frontier_max_n / 16,  # idle-machine seconds, as above
                lambda done: (frontier, (cfg, out, done["eval sft"])),
            )
        )
    return jobs


def build_summary(stages: Summaries, evaluation: dict[str, dict], eval_seconds: float) -> dict[str, Any]:
    """The demo's summary.json. Every checkpoint's numbers are the common evaluation's (the report's table,
    number for number); the reward model's accuracy is its own held-out pair accuracy (the one number not in
    the table); ``verdicts`` says which stage beat its baseline.

    ``stage_seconds`` adds up the stages' own wall times and ``eval_seconds`` the evaluation's (the work:
    stages run at the same time, and a resumed demo counts those of earlier invocations)."""
    per_stage: dict[str, dict[str, Any]] = {}
    for name, stage in stages.items():
        row = {k: v for k, v in evaluation.get(name, {}).items() if k not in ("samples", *PER_ITEM.values())}
        if name == "rm":
            row = {"heldout_accuracy": stages["rm"].get("heldout_accuracy")}
        per_stage[name] = {**row, "wall_seconds": stage.get("wall_seconds")}
    return {
        "stage_seconds": round(sum(s.get("wall_seconds", 0) for s in stages.values()), 2),
        "eval_seconds": round(eval_seconds, 2),
        "peak_rss_mb": round(max([peak_rss_mb()] + [s.get("peak_rss_mb", 0) for s in stages.values()]), 1),
        "stages": per_stage,
        "verdicts": verdicts(evaluation, stages),
        "evaluation": evaluation,
    }
