"""The demo's pipeline as `DemoStage` rows: pretrain (the shipped base model, copied, unless from_scratch) →
SFT → reward model → PPO-RLHF and DPO (against the reward model) and GRPO (the arithmetic verifier), the
vision branch beside them (`postrl.demo.vlm`), and continued SFT for each RL stage's training time. Each row
runs a stage of the registry (`postrl.lm.stages`) with its section of the demo's config, `wire`d to the run
folders of the stages before it; a new stage is one more row."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import postrl.demo.vlm as vision
from postrl.demo.config import DemoConfig
from postrl.demo.runner import DemoStage, Summaries
from postrl.lm import base_model
from postrl.lm.sft import SFTConfig
from postrl.lm.spine import RunConfig
from postrl.lm.stages import STAGES
from postrl.runtime.checkpoint import atomic_write_text
from postrl.runtime.errors import UserError

# The text stages after pretraining: (name in the registry and in the demo's config, idle-machine CPU seconds
# per step and fixed seconds of the progress estimate, the stages whose run folders it reads).
TEXT_STAGES = (
    ("sft", 0.08, 8.0, ("pretrain",)),
    ("rm", 0.12, 5.0, ("sft",)),
    ("ppo", 0.75, 5.0, ("sft", "rm")),
    ("dpo", 0.12, 5.0, ("sft", "rm")),
    ("grpo", 0.24, 5.0, ("sft",)),
)


def demo_stages(cfg: DemoConfig) -> list[DemoStage]:
    """The demo's pipeline in dependency order: each row after the stages it needs (``after``: the reward
    model starts from SFT, PPO and DPO use the reward model, continued SFT needs its RL stage's time)."""
    pretrain = DemoStage("pretrain", copy_base_model, lambda c, out, done: None, lambda c: 1.0)
    if cfg.from_scratch:
        run_pretrain = STAGES["pretrain"].run_function()
        pretrain = DemoStage("pretrain", run_pretrain, _section("pretrain"), _steps(0.14, "pretrain"))
    rows = [pretrain]
    for name, per_step, overhead, after in TEXT_STAGES:
        run = STAGES[name].run_function()
        rows.append(DemoStage(name, run, _section(name), _steps(per_step, name, overhead), after))
    rows += vision.vlm_demo_stages(cfg)
    if cfg.compare_sft:
        for rl in ("ppo", "grpo"):
            rows.append(
                DemoStage(
                    f"sft-vs-{rl}",
                    STAGES["sft"].run_function(),
                    lambda c, out, done, rl=rl: continued_sft(c, out, rl_seconds(done[rl])),
                    lambda c, rl=rl: next(s for s in rows if s.name == rl).idle_seconds(c) * 0.95,
                    (rl,),
                )
            )
    return rows


def _section(name: str) -> Callable[[DemoConfig, Path, Summaries], Any]:
    """A row's config: the stage's own section of the (wired) demo config."""
    return lambda c, out, done: getattr(c, name)


def _steps(seconds_per_step: float, name: str, overhead: float = 3.0) -> Callable[[DemoConfig], float]:
    """An idle-machine estimate: ``overhead`` (loading, evaluation) + steps x seconds per step, the step time
    scaled by the stage's batch relative to the demo's default (the defaults' CPU seconds per step with one
    thread, as benchmarks/demo.py prints them per job)."""

    def estimate(cfg: DemoConfig) -> float:
        stage, default = getattr(cfg, name), getattr(DemoConfig(), name)
        scale = _batch(stage) / max(1, _batch(default))
        return overhead + stage.run.steps * seconds_per_step * scale

    return estimate


def _batch(stage_cfg: Any) -> int:
    """Sequences per step: GRPO's prompts x group, PPO's batch, the supervised stages' batch."""
    if isinstance(stage_cfg, STAGES["grpo"].config_class()):
        return stage_cfg.grpo.prompts_per_step * stage_cfg.grpo.group_size
    if isinstance(stage_cfg, STAGES["ppo"].config_class()):
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
    vision.check(cfg)
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
