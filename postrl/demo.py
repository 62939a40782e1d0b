"""`postrl demo`: the notes' whole pipeline on the built-in world, then a report.

pretrain → SFT → reward model → PPO-RLHF → GRPO → evaluation of every checkpoint → report. Each stage
is an ordinary postrl run folder under RUN_DIR; a stage whose summary.json exists is skipped, one that
was interrupted resumes from its last checkpoint, so rerunning the same command continues a killed demo.
Each RL stage is compared with continued SFT for the same wall time from the same SFT checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from postrl.lm.grpo import GRPOConfig, GRPOLossConfig, run_grpo
from postrl.lm.ppo import KLConfig, PPOConfig, PPOLossConfig, RewardConfig, run_ppo
from postrl.lm.pretrain import PretrainConfig, run_pretrain
from postrl.lm.reward_model import RMConfig, run_rm
from postrl.lm.rollout import SamplingConfig
from postrl.lm.sft import SFTConfig, run_sft
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig, TrainConfig
from postrl.report import evaluate_checkpoints, write_report
from postrl.runtime.checkpoint import atomic_write_text
from postrl.runtime.config import save_config, validate
from postrl.runtime.logging import peak_rss_mb
from postrl.runtime.rundir import check_run_dir, remove_run, run_state

ARITHMETIC = {"digits": 2, "ops": "+"}


@dataclass(frozen=True)
class DemoConfig:
    """`postrl demo --out RUN_DIR [--quick]`: every stage's config, nested (override e.g. grpo.run.steps=40)."""

    pretrain: PretrainConfig = field(
        default_factory=lambda: PretrainConfig(
            arithmetic=ARITHMETIC,
            train=TrainConfig(batch_size=32, max_length=128, packing=True),
            optim=OptimConfig(lr=3e-3, warmup_steps=50, weight_decay=0.1),
            run=RunConfig(steps=800, eval_every=200, save_every=200),
        )
    )
    """Stage 1: the tiny LM and its tokenizer, from scratch."""
    sft: SFTConfig = field(
        default_factory=lambda: SFTConfig(
            data="task:arithmetic,task:reviews",
            task={"arithmetic": ARITHMETIC},
            stop_accuracy=0.3,
            train=TrainConfig(batch_size=64, max_length=48),
            optim=OptimConfig(lr=1e-3, warmup_steps=20),
            run=RunConfig(steps=600, eval_every=25, save_every=50),
        )
    )
    """Stage 2: supervised fine-tuning on both tasks' demonstrations, stopped at a held-out accuracy band."""
    rm: RMConfig = field(
        default_factory=lambda: RMConfig(
            data="task:reviews",
            task={"perturb_fraction": 0.3},
            train=TrainConfig(batch_size=32, max_length=48),
            optim=OptimConfig(lr=3e-4, warmup_steps=20),
            run=RunConfig(steps=250, eval_every=50, save_every=125),
        )
    )
    """Stage 3: the Bradley–Terry reward model on the synthetic labeller's preferences."""
    ppo: PPOConfig = field(
        default_factory=lambda: PPOConfig(
            data="task:reviews",
            max_prompt_length=32,
            sampling=SamplingConfig(max_new_tokens=24, temperature=1.0),
            ppo=PPOLossConfig(minibatches=4),
            kl=KLConfig(beta=0.1),
            reward=RewardConfig(clip=5.0),
            optim=OptimConfig(lr=3e-5, warmup_steps=0, min_lr_ratio=1.0),
            critic_optim=OptimConfig(lr=3e-4, warmup_steps=0, min_lr_ratio=1.0),
            run=RunConfig(steps=40, eval_every=10, save_every=50, log_every=1),
            eval_size=128,
        )
    )
    """Stage 4: PPO-RLHF against the reward model with a frozen reference."""
    grpo: GRPOConfig = field(
        default_factory=lambda: GRPOConfig(
            data="task:arithmetic",
            task=ARITHMETIC,
            max_prompt_length=256,
            sampling=SamplingConfig(max_new_tokens=8),
            grpo=GRPOLossConfig(group_size=8, prompts_per_step=32, beta=0.04, loss_type="grpo"),
            optim=OptimConfig(lr=2e-4, warmup_steps=0, min_lr_ratio=1.0),
            run=RunConfig(steps=40, eval_every=10, save_every=50, log_every=1),
            eval_size=200,
        )
    )
    """Stage 5: GRPO on the arithmetic verifier."""
    compare_sft: bool = True
    """Also run continued SFT for each RL stage's wall time (what RL adds beyond more supervision)."""
    eval_prompts: int = 500
    """Held-out arithmetic prompts for exact match (greedy)."""
    eval_samples: int = 256
    """Held-out review responses for gold reward, RM score and KL (sampled at temperature 1)."""
    seed: int = 0
    """Seed of every stage."""
    threads: int | None = None
    """torch intra-op threads for every stage (null: torch's default)."""

    CHECKS = {"eval_prompts": ">= 1", "eval_samples": ">= 1", "seed": ">= 0", "threads": ">= 1"}


def quick(cfg: DemoConfig) -> DemoConfig:
    """The same stages with small budgets (the test suite runs this end to end)."""
    r = dataclasses.replace
    return r(
        cfg,
        pretrain=r(
            cfg.pretrain,
            corpus_lines=2000,
            train=r(cfg.pretrain.train, batch_size=8, max_length=64),
            run=r(cfg.pretrain.run, steps=30, eval_every=15, save_every=15),
        ),
        sft=r(
            cfg.sft,
            eval_size=50,
            train=r(cfg.sft.train, batch_size=32),
            run=r(cfg.sft.run, steps=30, eval_every=15, save_every=15),
        ),
        rm=r(
            cfg.rm,
            eval_size=64,
            norm=r(cfg.rm.norm, samples=32),
            train=r(cfg.rm.train, batch_size=16),
            run=r(cfg.rm.run, steps=20, eval_every=10, save_every=10),
        ),
        ppo=r(cfg.ppo, batch_size=16, eval_size=32, run=r(cfg.ppo.run, steps=4, eval_every=2)),
        grpo=r(
            cfg.grpo,
            eval_size=32,
            run=r(cfg.grpo.run, steps=4, eval_every=2),
            grpo=r(cfg.grpo.grpo, prompts_per_step=8, group_size=4),
        ),
        eval_prompts=32,
        eval_samples=32,
    )


def wire(cfg: DemoConfig, out: Path) -> DemoConfig:
    """Point every stage at its inputs under ``out`` and give them the demo's seed and threads."""
    r = dataclasses.replace
    sft_model, rm_model = str(out / "sft" / "model"), str(out / "rm" / "model")
    return r(
        cfg,
        pretrain=r(cfg.pretrain, run=r(cfg.pretrain.run, seed=cfg.seed, threads=cfg.threads)),
        sft=r(
            cfg.sft,
            model=str(out / "pretrain" / "model"),
            run=r(cfg.sft.run, seed=cfg.seed, threads=cfg.threads),
        ),
        rm=r(
            cfg.rm,
            model=sft_model,
            run=r(cfg.rm.run, seed=cfg.seed, threads=cfg.threads),
            norm=r(cfg.rm.norm, policy=sft_model),
        ),
        ppo=r(
            cfg.ppo,
            model=sft_model,
            reward_model=rm_model,
            run=r(cfg.ppo.run, seed=cfg.seed, threads=cfg.threads),
        ),
        grpo=r(cfg.grpo, model=sft_model, run=r(cfg.grpo.run, seed=cfg.seed, threads=cfg.threads)),
    )


def run_stage(name: str, out: Path, fn: Callable[..., dict[str, Any]], cfg: Any) -> dict[str, Any]:
    """Run one stage into ``out/name`` unless it already finished; resume it if it was interrupted."""
    run_dir = out / name
    done = run_dir / "summary.json"
    if done.is_file():
        summary = json.loads(done.read_text())
        print(f"[demo] {name}: already done ({run_dir}), skipped", file=sys.stderr)
        return summary
    resume = run_state(run_dir) == "interrupted"
    print(f"[demo] {name}: {'resuming' if resume else 'starting'} → {run_dir}", file=sys.stderr)
    summary = fn(cfg, run_dir, resume=resume)
    print(
        f"[demo] {name}: done in {summary.get('wall_seconds', 0):.0f}s — {_headline(name, summary)}",
        file=sys.stderr,
    )
    return summary


def _headline(name: str, s: dict[str, Any]) -> str:
    keys = {
        "pretrain": ["heldout_loss"],
        "sft": ["heldout_loss", "heldout_accuracy"],
        "rm": ["heldout_accuracy"],
        "ppo": ["gold_reward", "rm_score", "kl_to_ref"],
        "grpo": ["heldout_accuracy", "kl_to_ref"],
    }.get(name.split("-")[0], ["heldout_loss"])
    return ", ".join(f"{k} {s[k]:.3f}" for k in keys if isinstance(s.get(k), (int, float)))


def continued_sft(cfg: DemoConfig, out: Path, seconds: float) -> SFTConfig:
    """SFT from the SFT checkpoint for ``seconds`` of training (no accuracy stop)."""
    r = dataclasses.replace
    return r(
        cfg.sft,
        model=str(out / "sft" / "model"),
        stop_accuracy=None,
        optim=r(cfg.sft.optim, warmup_steps=0, min_lr_ratio=1.0),
        run=r(cfg.sft.run, steps=100_000, max_seconds=seconds, eval_every=0, save_every=50),
    )


def run_demo(
    cfg: DemoConfig, out: str | Path, resume: bool = False, overwrite: bool = False
) -> dict[str, Any]:
    """Run every stage (skipping finished ones), evaluate every checkpoint, write the report.

    An interrupted demo is resumed by running it again; a finished one (``summary.json``) is only redone
    with ``resume`` (finished stages skipped, evaluation and report written again) or ``overwrite``."""
    out = Path(out)
    validate(cfg)
    state = run_state(out)
    if state == "interrupted" and not overwrite:
        resume = True  # rerunning the demo resumes it, as `make demo` promises
    mode = check_run_dir(out, resume=resume, overwrite=overwrite)
    if mode == "overwrite":
        remove_run(out)
        print(f"[demo] --overwrite: removed the previous demo in {out}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    cfg = wire(cfg, out)
    save_config(cfg, out / "config.yaml")
    stages: dict[str, dict[str, Any]] = {}
    stages["pretrain"] = run_stage("pretrain", out, run_pretrain, cfg.pretrain)
    stages["sft"] = run_stage("sft", out, run_sft, cfg.sft)
    stages["rm"] = run_stage("rm", out, run_rm, cfg.rm)
    stages["ppo"] = run_stage("ppo", out, run_ppo, cfg.ppo)
    stages["grpo"] = run_stage("grpo", out, run_grpo, cfg.grpo)
    if cfg.compare_sft:
        for rl in ("ppo", "grpo"):
            seconds = float(stages[rl].get("train_seconds") or stages[rl]["wall_seconds"])
            stages[f"sft-vs-{rl}"] = run_stage(f"sft-vs-{rl}", out, run_sft, continued_sft(cfg, out, seconds))
    eval_started = time.perf_counter()
    evaluation = evaluate_checkpoints(cfg, out)
    eval_seconds = time.perf_counter() - eval_started
    summary = build_summary(stages, evaluation, eval_seconds)
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_report(out, cfg, stages, evaluation, summary)
    print(f"[demo] report: {out / 'report.md'} (and report.html)", file=sys.stderr)
    return summary


def build_summary(
    stages: dict[str, dict], evaluation: dict[str, dict], eval_seconds: float
) -> dict[str, Any]:
    """The demo's summary.json: the held-out numbers of each stage (from the common evaluation).

    ``wall_seconds`` adds up the stages' own wall times and the evaluation, so a resumed demo reports the
    time of the whole pipeline, not of its last invocation."""
    ev = evaluation
    out: dict[str, Any] = {
        "wall_seconds": round(eval_seconds + sum(s.get("wall_seconds", 0) for s in stages.values()), 2),
        "eval_seconds": round(eval_seconds, 2),
        "peak_rss_mb": round(max([peak_rss_mb()] + [s.get("peak_rss_mb", 0) for s in stages.values()]), 1),
        "stages": {
            "pretrain": {"heldout_loss": stages["pretrain"].get("heldout_loss")},
            "sft": {
                "heldout_accuracy": ev["sft"]["heldout_accuracy"],
                "gold_reward": ev["sft"]["gold_reward"],
                "heldout_loss": stages["sft"].get("heldout_loss"),
            },
            "rm": {"heldout_accuracy": stages["rm"].get("heldout_accuracy")},
            "ppo": {
                "gold_reward": ev["ppo"]["gold_reward"],
                "rm_score": ev["ppo"]["rm_score"],
                "kl_to_ref": ev["ppo"]["kl_to_ref"],
            },
            "grpo": {
                "heldout_accuracy": ev["grpo"]["heldout_accuracy"],
                "kl_to_ref": ev["grpo"]["kl_to_ref"],
            },
        },
        "evaluation": ev,
    }
    for name, stage in stages.items():
        out["stages"].setdefault(name, {})["wall_seconds"] = stage.get("wall_seconds")
    return out
