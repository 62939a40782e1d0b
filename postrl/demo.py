"""`postrl demo`: the notes' whole pipeline on the built-in world, then a report.

pretrain → SFT → reward model → PPO-RLHF → DPO (on the reward model's pairs) → GRPO → continued SFT for each
RL stage's time → evaluation of every checkpoint → report. The pretrained LM is the built-in base model that postrl ships (`postrl.lm.base_model`,
made by `postrl pretrain` with the recipe in `DemoConfig.pretrain`); ``from_scratch`` (``--from-scratch``)
runs that pretraining here instead. Each stage is an ordinary postrl run folder under RUN_DIR; a stage whose
summary.json exists is skipped, one that was interrupted resumes from its last checkpoint, so rerunning the
same command continues a killed demo. Stages that do not need each other run at the same time on lanes
with one thread each, one in this process and the others worker processes (`postrl.demo_runner`;
``workers``).

The stages are `Stage` rows of `stages()`: a name (the run folder), the trainer, a function that makes the
stage's config from the demo's (and from the summaries of the stages before it), and the stages it needs
(``after``); a new stage is one more row.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from postrl import demo_vlm
from postrl.demo_runner import (
    Job,
    MemorySampler,
    Progress,
    Stage,
    Summaries,
    auto_workers,
    cpu_seconds,
    critical_path,
    finished_stages,
    run_jobs,
    stage_jobs,
)
from postrl.demo_vlm import VLMDemo
from postrl.lm import base_model
from postrl.lm.dpo import DPOConfig, DPOLossConfig, run_dpo
from postrl.lm.grpo import GRPOConfig, GRPOLossConfig, run_grpo
from postrl.lm.ppo import KLConfig, PPOConfig, PPOLossConfig, RewardConfig, run_ppo
from postrl.lm.pretrain import PretrainConfig, run_pretrain
from postrl.lm.reward_model import RMConfig, run_rm
from postrl.lm.rollout import SamplingConfig
from postrl.lm.sft import SFTConfig, run_sft
from postrl.lm.spine import RunConfig
from postrl.lm.tasks import get_task
from postrl.lm.trainer import OptimConfig, TrainConfig
from postrl.report import (
    PER_ITEM,
    PLOTTED,
    evaluate_checkpoints,
    frontier,
    plot_stage,
    verdicts,
    write_report,
)
from postrl.runtime.checkpoint import atomic_write_text
from postrl.runtime.config import save_config, validate
from postrl.runtime.config_values import changed_keys, to_dict
from postrl.runtime.errors import UserError
from postrl.runtime.logging import peak_rss_mb
from postrl.runtime.rundir import check_resume_config, check_run_dir, remove_run, run_state

# The arithmetic the demo measures: 2-digit sums, asked as "What is 47+38?". The base model's corpus holds
# the train problems that do not carry as bare equations: it adds, but knows neither this format nor carrying.
ARITHMETIC = {"digits": 2, "ops": "+"}
# SFT sees this many demonstrations of it; GRPO's verifier scores any of the task's 5,000 train prompts.
# Checking an answer is cheaper than writing one: the situation RL with a verifier is for.
SFT_DEMOS = 200


@dataclass(frozen=True)
class DemoConfig:
    """`postrl demo --out RUN_DIR [--quick] [--from-scratch]`: every stage's config, nested (override e.g.
    grpo.run.steps=40)."""

    from_scratch: bool = False
    """Pretrain the tiny LM here with `pretrain` (minutes) instead of starting from the built-in base model
    that postrl ships, made by the same config (postrl/lm/base_model/provenance.json)."""
    pretrain: PretrainConfig = field(default_factory=base_model.recipe)
    """Stage 1 (with from_scratch): the tiny LM and its tokenizer, from scratch."""
    sft: SFTConfig = field(
        default_factory=lambda: SFTConfig(
            data="task:arithmetic,task:reviews",
            task={"arithmetic": {**ARITHMETIC, "n_train": SFT_DEMOS}, "reviews": {"n_sft_train": 100}},
            train=TrainConfig(batch_size=64, max_length=48),
            optim=OptimConfig(lr=1e-3, warmup_steps=20, min_lr_ratio=1.0),
            run=RunConfig(steps=200, eval_every=25, save_every=100),
        )
    )
    """Stage 2: supervised fine-tuning on a few hundred demonstrations of both tasks, until they are used up
    (held-out accuracy peaks near step 125, then the held-out loss turns up): what is left is RL's."""
    rm: RMConfig = field(
        default_factory=lambda: RMConfig(
            data="task:reviews",
            task={"perturb_fraction": 0.3},
            train=TrainConfig(batch_size=32, max_length=48),
            optim=OptimConfig(lr=5e-4, warmup_steps=20),
            run=RunConfig(steps=200, eval_every=50, save_every=200),
            plots=False,
        )
    )
    """Stage 3: the Bradley–Terry reward model on the labeller's preferences (tuned: benchmarks/demo.py)."""
    ppo: PPOConfig = field(
        default_factory=lambda: PPOConfig(
            data="task:reviews",
            max_prompt_length=32,
            sampling=SamplingConfig(max_new_tokens=24, temperature=1.0),
            ppo=PPOLossConfig(minibatches=4),
            kl=KLConfig(beta=0.1),
            reward=RewardConfig(clip=5.0),
            optim=OptimConfig(lr=8e-5, warmup_steps=0, min_lr_ratio=1.0),
            critic_optim=OptimConfig(lr=3e-4, warmup_steps=0, min_lr_ratio=1.0),
            run=RunConfig(steps=30, eval_every=10, save_every=30, log_every=1),
            eval_size=128,
        )
    )
    """Stage 4: PPO-RLHF against the reward model with a frozen reference (tuned: benchmarks/demo.py)."""
    dpo: DPOConfig = field(
        default_factory=lambda: DPOConfig(
            data="task:reviews",
            task={"perturb_fraction": 0.3},
            dpo=DPOLossConfig(beta=0.1),
            train=TrainConfig(batch_size=32, max_length=48),
            optim=OptimConfig(lr=1e-4, warmup_steps=0, min_lr_ratio=1.0, betas=(0.9, 0.95)),
            run=RunConfig(steps=100, eval_every=50, save_every=50, keep_last=0),
            eval_samples=128,
            sampling=SamplingConfig(max_new_tokens=24, temperature=1.0),
        )
    )
    """Stage 4b: DPO on the reward model's own preference pairs, no reward model in the loop (its score of
    the samples is logged beside the gold reward); configs/dpo-reviews.yaml has 200 steps, the demo stops at
    100 (held-out gold reward 0.439 at 100 vs 0.440 at 200 on seed 0)."""
    grpo: GRPOConfig = field(
        default_factory=lambda: GRPOConfig(
            data="task:arithmetic",
            task=ARITHMETIC,
            max_prompt_length=256,
            sampling=SamplingConfig(max_new_tokens=8),
            grpo=GRPOLossConfig(group_size=8, beta=0.04, loss_type="grpo", minibatches=2),  # 32 prompts
            optim=OptimConfig(lr=2e-4, warmup_steps=0, min_lr_ratio=1.0),
            run=RunConfig(steps=120, eval_every=30, save_every=120, log_every=1),
            eval_size=200,
        )
    )
    """Stage 5: GRPO on the arithmetic verifier, 2 updates per sampled batch (tuned: benchmarks/demo.py)."""
    vlm: VLMDemo = field(default_factory=VLMDemo)
    """The vision branch beside the text stages: the tiny VLM on task:shapes (`postrl.demo_vlm`)."""
    compare_sft: bool = True
    """Also run continued SFT for each RL stage's training time (what RL adds beyond more supervision)."""
    eval_prompts: int = 500
    """Held-out arithmetic prompts for exact match (greedy)."""
    eval_samples: int = 256
    """Held-out review responses for gold reward, RM score and KL (sampled at temperature 1)."""
    frontier_max_n: int = 16
    """Best-of-n on the report's gold-reward frontier: n = 1, 2, 4 … this, from the SFT policy ranked by the
    reward model (0: no best-of-n points)."""
    frontier_prompts: int = 64
    """Held-out review prompts for best-of-n (each gets frontier_max_n samples)."""
    seed: int = 0
    """Seed of every stage."""
    threads: int | None = 1
    """torch intra-op threads for every stage (null: torch's default). One thread: the tiny model gains
    little from a second, and a second CPU-bound process on the machine then slows the demo in proportion
    instead of several times over (oversubscribed threads wait on each other)."""
    workers: int | None = None
    """Stages run at the same time, on lanes with `threads` threads each: one in this process, the others
    worker processes (null: 2, or 1 when other processes, niced ones aside, keep every core busy right now;
    1: one after another in this process)."""

    CHECKS = {
        "eval_prompts": ">= 1",
        "eval_samples": ">= 1",
        "frontier_max_n": ">= 0",
        "frontier_prompts": ">= 1",
        "seed": ">= 0",
        "threads": ">= 1",
        "workers": ">= 1",
    }


def quick(cfg: DemoConfig) -> DemoConfig:
    """The same stages with small budgets: under a minute on an idle 2-core machine with two workers (the
    test suite runs this end to end). Each stage checks itself once, at its end, and still moves its number
    clearly past its baseline: PPO learns faster (lr 1.5e-4, gain over SFT 0.30 / 0.58 / 0.48 on seeds 0-2
    where 1e-4 gained 0.16 / -0.05 / 0.49; KL β 0.2 against the younger reward model, 80 steps at lr 1e-3);
    GRPO takes 40 smaller steps, one update per batch (lr 1e-4: at 2e-4 its reward peaks by step 13). DPO gets 20
    steps (at 30 and 40 its gold reward stayed within the noise of SFT's on 3 seeds): its curve and frontier
    points. The continued-SFT baselines are left out (``compare_sft``: the full demo's question). Pretraining
    keeps its recipe (a smaller one would not learn the sums)."""
    r = dataclasses.replace
    return r(
        cfg,
        compare_sft=False,
        frontier_max_n=8,
        frontier_prompts=32,
        sft=r(cfg.sft, eval_size=64, run=r(cfg.sft.run, steps=100, eval_every=100, save_every=100)),
        rm=r(
            cfg.rm,
            eval_size=128,
            norm=r(cfg.rm.norm, samples=32),
            optim=r(cfg.rm.optim, lr=1e-3),
            run=r(cfg.rm.run, steps=80, eval_every=80, save_every=80),
        ),
        ppo=r(
            cfg.ppo,
            eval_size=32,
            kl=r(cfg.ppo.kl, beta=0.2),
            optim=r(cfg.ppo.optim, lr=1.5e-4),
            run=r(cfg.ppo.run, steps=10, eval_every=10, save_every=10),
        ),
        dpo=r(
            cfg.dpo,
            eval_size=128,
            eval_samples=32,
            train=r(cfg.dpo.train, batch_size=16),
            run=r(cfg.dpo.run, steps=20, eval_every=20, save_every=20),
        ),
        grpo=r(
            cfg.grpo,
            eval_size=64,
            grpo=r(cfg.grpo.grpo, minibatches=1),
            optim=r(cfg.grpo.optim, lr=1e-4),
            run=r(cfg.grpo.run, steps=40, eval_every=40, save_every=40),
        ),
        vlm=demo_vlm.quick(cfg.vlm),
    )


# ---- the stages ---------------------------------------------------------------------------------------------
def stages(cfg: DemoConfig) -> list[Stage]:
    """The demo's pipeline in dependency order: each row after the stages it needs (``after``: the reward
    model starts from SFT, PPO and DPO use the reward model, continued SFT needs its RL stage's time)."""
    pretrain = Stage("pretrain", run_pretrain, lambda c, out, done: c.pretrain, _steps(0.14, "pretrain"))
    if not cfg.from_scratch:
        pretrain = Stage("pretrain", copy_base_model, lambda c, out, done: None, lambda c: 1.0)
    rows = [
        pretrain,
        Stage("sft", run_sft, lambda c, out, done: c.sft, _steps(0.08, "sft", 8.0), ("pretrain",)),
        Stage("rm", run_rm, lambda c, out, done: c.rm, _steps(0.12, "rm", 5.0), ("sft",)),
        Stage("ppo", run_ppo, lambda c, out, done: c.ppo, _steps(0.75, "ppo", 5.0), ("sft", "rm")),
        Stage("dpo", run_dpo, lambda c, out, done: c.dpo, _steps(0.12, "dpo", 5.0), ("sft", "rm")),
        Stage("grpo", run_grpo, lambda c, out, done: c.grpo, _steps(0.24, "grpo", 5.0), ("sft",)),
    ]
    rows += demo_vlm.stages(cfg)
    if cfg.compare_sft:
        for rl in ("ppo", "grpo"):
            rows.append(
                Stage(
                    f"sft-vs-{rl}",
                    run_sft,
                    lambda c, out, done, rl=rl: continued_sft(c, out, rl_seconds(done[rl])),
                    lambda c, rl=rl: next(s for s in rows if s.name == rl).idle_seconds(c) * 0.95,
                    (rl,),
                )
            )
    return rows


def _steps(seconds_per_step: float, name: str, overhead: float = 3.0) -> Callable[[DemoConfig], float]:
    """An idle-machine estimate: ``overhead`` (loading, evaluation) + steps x seconds per step, the step time
    scaled by the stage's batch relative to the demo's default (measured with the defaults, 1 thread)."""

    def estimate(cfg: DemoConfig) -> float:
        stage, default = getattr(cfg, name), getattr(DemoConfig(), name)
        scale = _batch(stage) / max(1, _batch(default))
        return overhead + stage.run.steps * seconds_per_step * scale

    return estimate


def _batch(stage_cfg: Any) -> int:
    if isinstance(stage_cfg, GRPOConfig):
        return stage_cfg.grpo.prompts_per_step * stage_cfg.grpo.group_size
    if isinstance(stage_cfg, PPOConfig):
        return stage_cfg.batch_size
    return stage_cfg.train.batch_size


def rl_seconds(summary: dict[str, Any]) -> float:
    """The training time of an RL stage (its steps, evaluation excluded): continued SFT gets the same."""
    return float(summary.get("train_seconds") or summary["wall_seconds"])


def continued_sft(cfg: DemoConfig, out: Path, seconds: float) -> SFTConfig:
    """SFT from the SFT checkpoint on the same demonstrations for ``seconds`` of training (no accuracy stop,
    constant learning rate: SFT's last one)."""
    r = dataclasses.replace
    return r(
        cfg.sft,
        model=str(out / "sft" / "model"),
        stop_accuracy=None,
        optim=r(cfg.sft.optim, warmup_steps=0, min_lr_ratio=1.0),
        run=r(cfg.sft.run, steps=100_000, max_seconds=seconds, eval_every=0, save_every=50),
    )


def copy_base_model(cfg: None, run_dir: Path, resume: bool = False) -> dict[str, Any]:
    """The pretrain stage without pretraining: the built-in base model copied to ``run_dir/model``, and a
    summary.json that records where it came from (the `postrl pretrain` command, its held-out loss)."""
    started = time.perf_counter()
    source = base_model.path()
    record = base_model.provenance()
    base_model.install(source, run_dir)
    summary = {
        "source": str(source),
        "command": record.get("command"),
        "heldout_loss": record.get("heldout_loss"),
        "steps": record.get("steps"),
        "pretrain_seconds": record.get("seconds"),
        "sha256": record.get("sha256"),
        "wall_seconds": round(time.perf_counter() - started, 3),
    }
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def check_base_model(cfg: DemoConfig) -> None:
    """Without ``from_scratch`` the built-in base model must be installed and made by the demo's recipe."""
    demo_vlm.check(cfg)
    if cfg.from_scratch:
        return
    if not base_model.is_available():
        raise UserError(
            f"the built-in base model is missing from this install ({base_model.path()}); run `postrl demo "
            "--from-scratch` (pretrains it here) or `python -m postrl.lm.base_model` (makes it)"
        )
    made_with = base_model.provenance().get("command", "")
    if made_with != base_model.command(cfg.pretrain):
        raise UserError(
            "pretrain.*: the built-in base model was made with another pretraining config "
            f"({base_model.path() / base_model.PROVENANCE}); add --from-scratch to pretrain with yours"
        )


# ---- running them -------------------------------------------------------------------------------------------
def run_demo(
    cfg: DemoConfig, out: str | Path, resume: bool = False, overwrite: bool = False
) -> dict[str, Any]:
    """Run every stage (skipping finished ones), evaluate every checkpoint, write the report.

    An interrupted demo is resumed by running it again; a finished one (``summary.json``) is only redone
    with ``resume`` (finished stages skipped, evaluation and report written again) or ``overwrite``."""
    out = Path(out)
    wall_started, cpu_started, load_before = time.perf_counter(), cpu_seconds(), os.getloadavg()
    validate(cfg)
    state = run_state(out)
    if state == "interrupted" and not overwrite:
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
    rows = stages(cfg)
    finished_before = finished_stages(out, [s.name for s in rows])  # skipped here: not in this time
    workers = cfg.workers or auto_workers()
    names = [s.name for s in rows]
    jobs = stage_jobs(rows, cfg, out, lambda name: progress.line(name)) + evaluation_jobs(cfg, out, names)
    progress = Progress(jobs, workers, names)
    print(
        f"[demo] {len(rows)} stages in {workers} worker{'s' * (workers > 1)}, each checkpoint evaluated on "
        "the same held-out prompts once it is trained",
        file=sys.stderr,
    )
    with MemorySampler() as memory:
        results, usage = run_jobs(jobs, workers, progress)
    done: Summaries = {s.name: results[s.name] for s in rows}
    if "rm" in done and "heldout_pairs" not in done["rm"]:  # a reward model from before its stage said
        pairs = get_task("reviews", **cfg.rm.task).config.n_pairs_test  # the count behind its accuracy
        done["rm"] = {**done["rm"], "heldout_pairs": min(cfg.rm.eval_size or pairs, pairs)}
    evaluation = {n: row for j in jobs if j.name.startswith("eval ") for n, row in results[j.name].items()}
    evals = [u for n, u in usage.items() if n.startswith("eval ") or n == "frontier"]
    summary = build_summary(done, evaluation, sum(u["wall_seconds"] for u in evals))
    summary["eval_cpu_seconds"] = round(sum(u["cpu_seconds"] for u in evals), 1)
    summary["job_seconds"] = usage
    chain, cpu = critical_path(
        {n: u["cpu_seconds"] for n, u in usage.items()}, {j.name: j.after for j in jobs}
    )
    summary["critical_path"] = {"jobs": chain, "cpu_seconds": round(cpu, 1)}
    demo_vlm.add_to_summary(summary, done)
    summary["frontier"] = results.get("frontier", [])
    summary["workers"] = workers
    summary["finished_before"] = finished_before
    summary["wall_seconds"] = round(time.perf_counter() - wall_started, 2)
    summary["cpu_seconds"] = round(cpu_seconds() - cpu_started, 1)
    summary["peak_rss_mb"] = round(max(summary["peak_rss_mb"], memory.peak_mb), 1)
    summary["load_average"] = [round(x, 2) for x in load_before] + [round(x, 2) for x in os.getloadavg()]
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_report(out, cfg, done, evaluation, summary, demo_vlm.report_md(out, summary))
    for line in summary["verdicts"]:
        print(f"[demo] {line['text']}", file=sys.stderr)
    print(f"[demo] report: {(out / 'report.md').resolve()} (and report.html)", file=sys.stderr)
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
    seconds = 0.4 + 0.001 * cfg.eval_prompts + 0.002 * cfg.eval_samples  # measured: 1.2-1.8 s at 500 and 256
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
                0.025 * cfg.frontier_prompts * cfg.frontier_max_n / 16,  # measured: 1.2-1.5 s at 64 x 16
                lambda done: (frontier, (cfg, out, done["eval sft"])),
            )
        )
    return jobs


def wire(cfg: DemoConfig, out: Path) -> DemoConfig:
    """Point every stage at its inputs under ``out`` and give them the demo's seed and threads."""
    r = dataclasses.replace
    sft_model, rm_model = str(out / "sft" / "model"), str(out / "rm" / "model")

    def run(stage_run: RunConfig) -> RunConfig:
        return r(stage_run, seed=cfg.seed, threads=cfg.threads)

    return r(
        cfg,
        pretrain=r(cfg.pretrain, run=run(cfg.pretrain.run)),
        sft=r(cfg.sft, model=str(out / "pretrain" / "model"), run=run(cfg.sft.run)),
        rm=r(cfg.rm, model=sft_model, run=run(cfg.rm.run), norm=r(cfg.rm.norm, policy=sft_model)),
        ppo=r(cfg.ppo, model=sft_model, reward_model=rm_model, run=run(cfg.ppo.run)),
        dpo=r(cfg.dpo, model=sft_model, reward_model=rm_model, run=run(cfg.dpo.run)),
        grpo=r(cfg.grpo, model=sft_model, run=run(cfg.grpo.run)),
    )


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
