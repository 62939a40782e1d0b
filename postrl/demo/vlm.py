"""The demo's vision branch: the tiny VLM on task:shapes, SFT → GRPO with the verifier → continued SFT.

    vlm-align        the built-in aligned VLM that postrl ships (`postrl.lm.vlm.base_model`), or with
                     ``--from-scratch`` its alignment on captions run here (`postrl vlm-pretrain`, its recipe)
    vlm-sft          SFT on `VLMDemo.demos` demonstrations of task:shapes, stopped at a held-out accuracy band
                     (preset sft-shapes, at the demo's budget)
    vlm-grpo         GRPO from the SFT checkpoint on the task's train pictures, the verifier as the only
                     signal (preset grpo-shapes, at the demo's budget)
    vlm-sft-vs-grpo  continued SFT on the same demonstrations for GRPO's training seconds (the full demo)
    vlm-eval         every checkpoint above, greedy, on the same held-out scenes: accuracy per question kind,
                     the image-free baselines, a few pictures with the SFT and GRPO answers

The branch needs none of the text stages, so the demo runs it beside them. `vlm_demo_stages` gives its `DemoStage`
rows; `postrl.demo.vlm_eval` holds vlm-eval, the branch's numbers in summary.json and its section of the
report.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from postrl.demo.runner import DemoStage, Summaries
from postrl.demo.vlm_eval import CHECKPOINTS, EvalConfig, evaluate_vlm_checkpoints
from postrl.lm import base_model as text_base_model
from postrl.lm.grpo import GRPOConfig, GRPOLossConfig
from postrl.lm.grpo.config import GRPOSamplingConfig
from postrl.lm.sft import SFTConfig
from postrl.lm.spine import RunConfig
from postrl.lm.stages import STAGES
from postrl.lm.trainer import OptimConfig, TrainConfig
from postrl.lm.vlm import base_model as vlm_base
from postrl.lm.vlm.train import VLMPretrainConfig
from postrl.runtime.checkpoint import atomic_write_text
from postrl.runtime.errors import UserError

SHAPES = {"difficulty": 1}
"""task:shapes as the presets have it (five kinds of question, difficulty 1)."""
DEMOS = 100
"""Demonstrations SFT sees (the first train scenes); GRPO's verifier checks answers to ten times as many
pictures. Writing answers is the expensive part, checking them is cheap: the situation RL is for."""


@dataclass(frozen=True)
class VLMDemo:
    """The vision branch of `postrl demo` (override e.g. vlm.grpo.run.steps=60, vlm.enabled=false)."""

    enabled: bool = True
    """Run the branch (the tiny VLM on task:shapes) beside the text stages."""
    align: VLMPretrainConfig = field(default_factory=vlm_base.recipe)
    """With from_scratch: the alignment of the tiny VLM on captions (the shipped model's recipe)."""
    sft: SFTConfig = field(
        default_factory=lambda: SFTConfig(
            data="task:shapes",
            task={**SHAPES, "n_train": DEMOS, "n_test": 100},
            train=TrainConfig(batch_size=32, max_length=128, eval_examples=64),
            optim=OptimConfig(lr=3e-4, warmup_steps=0, min_lr_ratio=1.0),
            run=RunConfig(steps=300, eval_every=10, save_every=0, log_every=5),
            eval_size=100,
            eval_max_new_tokens=4,
            stop_accuracy=0.45,
        )
    )
    """SFT on `DEMOS` demonstrations (the first train scenes), stopped once greedy accuracy on 100 held-out
    scenes (checked every 10 steps) reaches the band: preset sft-shapes with fewer demonstrations and a
    cheaper check."""
    grpo: GRPOConfig = field(
        default_factory=lambda: GRPOConfig(
            data="task:shapes",
            task={**SHAPES, "n_train": 1000, "n_test": 100},
            max_prompt_length=64,
            sampling=GRPOSamplingConfig(max_new_tokens=4, temperature=1.0, top_k=5),
            grpo=GRPOLossConfig(group_size=8, prompts_per_step=16, beta=0.0, loss_type="grpo"),
            optim=OptimConfig(lr=1e-4, warmup_steps=5, min_lr_ratio=1.0, betas=(0.9, 0.999)),
            run=RunConfig(steps=240, eval_every=0, save_every=0, log_every=5),
            eval_size=100,
            eval_at_start=False,
        )
    )
    """GRPO on 1,000 train pictures (ten times the demonstrations; no answers shown), 16 prompts x G = 8
    answers per step, the verifier as the only signal: preset grpo-shapes for 240 steps, warmup 5."""
    eval_scenes: int = 600
    """Held-out scenes every checkpoint answers (greedy; the same for all)."""
    samples: int = 6
    """Held-out pictures shown in the report with the question and the SFT and GRPO answers."""
    compare_sft: bool = True
    """Run vlm-sft-vs-grpo (with the demo's compare_sft; --quick leaves it out)."""

    CHECKS = {"eval_scenes": ">= 1", "samples": ">= 0"}


def quick_vlm(v: VLMDemo) -> VLMDemo:
    """The branch at `postrl demo --quick`'s budget."""
    r = dataclasses.replace
    return r(v, grpo=r(v.grpo, run=r(v.grpo.run, steps=40)), eval_scenes=400, compare_sft=False)


def check(cfg: Any) -> None:
    """Before any run folder: the shipped aligned VLM must be there (unless from_scratch) and be its recipe's."""
    if not cfg.vlm.enabled or cfg.from_scratch:
        return
    if not vlm_base.is_available():
        raise UserError(
            f"the built-in aligned VLM is missing from this install ({vlm_base.path()}); run `postrl demo "
            "--from-scratch` or `python -m postrl.lm.vlm.base_model` (makes it), or set vlm.enabled=false"
        )
    if vlm_base.provenance().get("command") != vlm_base.command(cfg.vlm.align):
        raise UserError(
            "vlm.align.*: the built-in aligned VLM was made with another alignment config "
            f"({vlm_base.path() / vlm_base.PROVENANCE}); add --from-scratch to align with yours"
        )


# ---- the stages ---------------------------------------------------------------------------------------------
def vlm_demo_stages(cfg: Any) -> list[DemoStage]:
    """The branch's `DemoStage` rows (none when ``vlm.enabled`` is false); ``cfg`` is the demo's config."""
    run_sft, run_grpo = STAGES["sft"].run_function(), STAGES["grpo"].run_function()
    if not cfg.vlm.enabled:
        return []
    v = cfg.vlm
    align = DemoStage("vlm-align", copy_aligned_vlm, lambda c, out, done: None, lambda c: 1.0)
    if cfg.from_scratch:
        steps = v.align.run.steps
        align = DemoStage("vlm-align", _run_align, lambda c, out, done: _align(c), lambda c: 3 + 0.17 * steps)
    rows = [
        align,
        DemoStage("vlm-sft", run_sft, _sft, lambda c: 9.0, ("vlm-align",)),
        DemoStage("vlm-grpo", run_grpo, _grpo, lambda c: 2 + 0.135 * c.vlm.grpo.run.steps, ("vlm-sft",)),
    ]
    if cfg.compare_sft and v.compare_sft:
        rows.append(
            DemoStage(
                "vlm-sft-vs-grpo",
                run_sft,
                lambda c, out, done: continued_vlm_sft(c, out, done["vlm-grpo"]),
                lambda c: 1 + 0.135 * c.vlm.grpo.run.steps,
                ("vlm-grpo",),
            )
        )
    names = tuple(s.name for s in rows)
    rows.append(
        DemoStage(
            "vlm-eval",
            evaluate_vlm_checkpoints,
            _eval,
            lambda c: 1 + 0.0017 * c.vlm.eval_scenes * len(names),
            names,
        )
    )
    return rows


def _run(c: Any, stage_run: RunConfig) -> RunConfig:
    return dataclasses.replace(stage_run, seed=c.seed, threads=c.threads)


def _align(c: Any) -> VLMPretrainConfig:
    return dataclasses.replace(c.vlm.align, run=_run(c, c.vlm.align.run))


def _run_align(cfg: VLMPretrainConfig, run_dir: Path, resume: bool = False) -> dict[str, Any]:
    return STAGES["vlm-pretrain"].run_function()(cfg, run_dir, resume=resume)


def _sft(c: Any, out: Path, done: Summaries) -> SFTConfig:
    s = c.vlm.sft
    return dataclasses.replace(s, model=str(out / "vlm-align" / "model"), run=_run(c, s.run))


def _grpo(c: Any, out: Path, done: Summaries) -> GRPOConfig:
    g = c.vlm.grpo
    return dataclasses.replace(g, model=str(out / "vlm-sft" / "model"), run=_run(c, g.run))


def continued_vlm_sft(c: Any, out: Path, grpo: dict[str, Any]) -> SFTConfig:
    """SFT from the SFT checkpoint on the same demonstrations for GRPO's training seconds (no band)."""
    s = _sft(c, out, {})
    seconds = float(grpo.get("train_seconds") or grpo["wall_seconds"])
    run = dataclasses.replace(s.run, steps=100_000, max_seconds=seconds, eval_every=0, save_every=0)
    return dataclasses.replace(s, model=str(out / "vlm-sft" / "model"), stop_accuracy=None, run=run)


def copy_aligned_vlm(cfg: None, run_dir: Path, resume: bool = False) -> dict[str, Any]:
    """vlm-align without aligning: the shipped aligned VLM copied to ``run_dir/model``, and a summary.json
    with its provenance (the `postrl vlm-pretrain` command, its held-out caption loss)."""
    started = time.perf_counter()
    record = vlm_base.provenance()
    text_base_model.install(vlm_base.path(), run_dir)
    keys = ("command", "heldout_loss", "steps", "sha256")
    summary = {"source": str(vlm_base.path()), **{k: record.get(k) for k in keys}}
    summary |= {
        "align_seconds": record.get("seconds"),
        "wall_seconds": round(time.perf_counter() - started, 3),
    }
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def _eval(c: Any, out: Path, done: Summaries) -> EvalConfig:
    names = tuple(n for n in CHECKPOINTS if n in done)
    return EvalConfig(str(out), names, dict(SHAPES), c.vlm.eval_scenes, c.vlm.samples, c.threads)
