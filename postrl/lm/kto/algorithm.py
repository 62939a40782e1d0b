"""`postrl kto`: Kahneman–Tversky optimisation (Ethayarajh et al. 2024, arXiv:2402.01306) on unpaired
desirable and undesirable responses.

KTO needs no pairs: each (prompt, response) carries one label. The policy's implicit reward
r = log π(y|x) − log π_ref(y|x) of a desirable response is pushed above a reference point z0, that of an
undesirable one below it, through a saturating value function. z0 is the policy's KL from the reference,
estimated on the step's mismatched pairs (each prompt with a neighbouring row's response), without gradient:

    B rows ──policy, no grad: Σ log π(y'|x) on the mismatched pairs──▶ − log π_ref(y'|x) ──mean, ≥ 0──▶ z0
    B rows ──teacher-forced forward of π──▶ log π(y|x) [B]  + log π_ref(y|x) [B] (computed once, stored)
      ──core.kto_loss(β, λ_D, λ_U, z0)──▶ AdamW step

Reference. π_ref never changes, so its log-probs of every row's own and mismatched completion are computed once
before the first step and written to the run folder (``reference_logps.safetensors``), as for DPO.

Distributed (torchrun): the step's rows are split over ranks (`trainer.micro_batches`); z0 is the mean over all
of the step's rows (every rank and micro-batch); each micro-batch's loss is its summed row loss over the step's
row count, so N ranks take the step one process takes.

This file: the step, :class:`KTO` (the spine's algorithm) and `run_kto`. The config is in `config.py`, the rows
in `data.py`, the log-probs, reference and held-out metrics in `build.py`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from postrl.lm.kto.build import (
    REF_FILE,
    batch_loss,
    kl_reference_point,
    reference_completion_log_probs,
)
from postrl.lm.kto.build import (
    heldout_metrics as kto_heldout_metrics,
)
from postrl.lm.kto.config import KTOConfig
from postrl.lm.kto.data import check_labels, collate_kto_rows, load_train_heldout_kto, tokenize
from postrl.lm.recipe import Setup, run_recipe
from postrl.lm.reference import ReferenceAlgorithm, ReferenceRecipe
from postrl.lm.rollout import ResponseForward
from postrl.lm.spine import LoopState, accumulate
from postrl.lm.trainer import (
    clip_grad_norm,
    micro_batches,
    to_device,
)
from postrl.runtime import distributed as dist
from postrl.runtime.errors import UserError
from postrl.runtime.logging import read_jsonl
from postrl.runtime.plots import plot_curves

log = logging.getLogger(__name__)
STAT_KEYS = ("rewards_desirable", "rewards_undesirable")


def kto_train_step(
    model: torch.nn.Module,
    forward: ResponseForward,
    scoring_forward: ResponseForward,
    optimizer: torch.optim.Optimizer,
    examples: list[dict[str, Any]],
    ref: Tensor,
    indices: list[int],
    cfg: KTOConfig,
    pad_id: int,
    device: torch.device,
) -> dict[str, float]:
    """One optimiser step over the rows ``indices`` (all ranks'): z0 on the step's mismatched pairs (through
    ``scoring_forward``, no gradients), then the loss (through ``forward``) Σ_i ℓ_i / N over its N rows on every micro-batch and rank. Returns the loss, z0 (``kl``), the mean
    implicit reward of each kind in the step, and the gradient norm."""
    micro = micro_batches(indices, cfg.train.grad_accum)
    z0 = kl_reference_point(scoring_forward, examples, ref, micro, pad_id, device)
    scale = dist.world_size()  # DDP and FSDP average gradients over ranks; the loss is a global row sum
    sums = torch.zeros(5, dtype=torch.float64)  # loss share, Σ βr desirable, n desirable, Σ βr undesirable, n

    def micro_loss(mb: tuple[list[int], float]) -> Tensor:
        rows, weight = mb
        share = weight * len(rows) / len(indices)  # b/N; 0 for a rank whose share ran out
        batch = to_device(collate_kto_rows([examples[i] for i in rows], pad_id), device)
        value, stats = batch_loss(forward, batch, ref[rows, 0], z0, cfg.kto)
        good = batch["desirable"].cpu()
        n_good, n_bad = float(good.sum()) * weight, float((~good).sum()) * weight
        totals = (float(value.detach()) * share, 0.0, n_good, 0.0, n_bad)
        sums.add_(torch.tensor(totals, dtype=torch.float64))
        for k, (key, n) in enumerate(((STAT_KEYS[0], n_good), (STAT_KEYS[1], n_bad))):
            if n:
                sums[1 + 2 * k] += float(stats[key]) * n
        return value * share * scale

    accumulate([model], micro, micro_loss)
    norm = clip_grad_norm(model, cfg.optim.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    t = dist.all_reduce_sum(sums)
    nan = float("nan")
    return {
        "loss": float(t[0]),
        "kl": float(z0),
        "rewards_desirable": float(t[1] / t[2]) if t[2] else nan,
        "rewards_undesirable": float(t[3] / t[4]) if t[4] else nan,
        "grad_norm": norm,
    }


class KTO(ReferenceAlgorithm):
    """KTO as a `postrl.lm.spine` algorithm (`postrl.lm.reference.ReferenceAlgorithm`): a step is one AdamW
    step on a batch of labelled rows."""

    name = "kto"

    def train_step(self, indices: list[int]) -> dict[str, float]:
        return kto_train_step(
            self.model, self.forward, self.scoring_forward, self.optimizer, self.examples, self.ref, indices, self.cfg,
            self.tokenizer.pad_token_id, self.device,
        )  # fmt: skip

    def bar(self, metrics: dict[str, float]) -> dict[str, float]:
        return {"loss": metrics["loss"], "kl": metrics["kl"]}

    def heldout_metrics(self) -> dict[str, float]:
        return kto_heldout_metrics(
            self.eval_forward, self.evals, self.eval_ref, self.cfg.kto, self.tokenizer.pad_token_id, self.device,
            self.cfg.kto.ref_batch_size,
        )  # fmt: skip


class KTORecipe(ReferenceRecipe):
    """KTO on `postrl.lm.reference.ReferenceRecipe`: its labelled rows, their reference pass (own and
    mismatched completions), `KTO`, its summary."""

    def one_backward(self, cfg: KTOConfig) -> list[str]:
        """What stops ``optim.step_in_backward``: several backwards per optimiser step."""
        return (
            [f"it needs train.grad_accum=1, not {cfg.train.grad_accum}"] if cfg.train.grad_accum != 1 else []
        )

    section = "kto"
    algorithm_class = KTO

    def check(self, cfg: KTOConfig) -> None:
        super().check(cfg)
        if cfg.train.batch_size < 2:
            raise UserError(
                "train.batch_size must be >= 2 for KTO: the KL reference point is estimated on the step's "
                f"mismatched pairs, and one row has none (got {cfg.train.batch_size})"
            )

    def load_examples(self, cfg: KTOConfig, tokenizer: Any) -> tuple[list[dict], list[dict], Any]:
        return load_examples(cfg, tokenizer)

    def reference_log_probs(
        self, reference: ResponseForward, examples: list[dict], setup: Setup, batch_size: int
    ) -> Tensor:
        pad = setup.tokenizer.pad_token_id
        return reference_completion_log_probs(reference, examples, pad, setup.info.device, batch_size)

    def summarize(self, setup: Setup, algo: KTO, state: LoopState) -> dict[str, Any]:
        return _summarize(algo, state, len(setup.extra["train"]))

    def plot(self, run_dir: Path) -> None:
        plot_kto(run_dir)


def load_examples(cfg: KTOConfig, tokenizer: Any) -> tuple[list[dict], list[dict], Any]:
    """(train rows, held-out rows, the built-in task or None), tokenised, with their mismatched completions."""
    rows, heldout, task = load_train_heldout_kto(cfg.data, cfg.eval_data, cfg.task, cfg.empty_rows)
    chunk = cfg.train.batch_size
    train = tokenize(rows, tokenizer, cfg.train.max_length, cfg.train.overlong, chunk)
    evals = tokenize(heldout, tokenizer, cfg.train.max_length, "drop", chunk)[: cfg.eval_size]
    if not train:
        raise UserError(f"{cfg.data}: no row fits train.max_length={cfg.train.max_length}")
    check_labels(train, cfg.data)
    return train, evals, task


def run_kto(
    cfg: KTOConfig, run_dir: str | Path, resume: bool = False, overwrite: bool = False
) -> dict[str, Any]:
    """Train with KTO, export ``RUN_DIR/model`` (HF format), write the run folder, return the summary.
    The models, tokenizer and rows are loaded and checked before the run folder is touched."""
    return run_recipe(KTORecipe(), cfg, run_dir, resume=resume, overwrite=overwrite)


def _summarize(algo: KTO, state: LoopState, n_rows: int) -> dict[str, Any]:
    """The last evaluation (and the first, as ``*_start``), the last step's training metrics, throughput."""
    start = {f"{k}_start": v for k, v in state.start_eval.items()}
    last = state.last_metrics
    return {
        **state.last_eval,
        **start,
        "loss": last.get("loss"),
        "kl": last.get("kl"),
        "steps": state.step,
        "train_rows": n_rows,
        "desirable_rows": sum(e["label"] for e in algo.examples),
        "beta": algo.cfg.kto.beta,
        "train_seconds": round(state.train_seconds, 3),
        "seconds_per_step": state.train_seconds / max(1, state.step),
        "reference_file": REF_FILE,
    }


def plot_kto(run_dir: Path) -> Path | None:
    """``RUN_DIR/curves.png``: training loss, z0 and implicit rewards, the held-out ones, and the sampled
    responses' gold reward, reward-model score and KL to the reference."""
    keys = ["loss", "kl", "rewards_desirable", "rewards_undesirable", "heldout_loss", "heldout_reward_margin"]
    keys += ["heldout_gold_reward", "heldout_rm_score", "heldout_kl"]
    return plot_curves(read_jsonl(run_dir / "metrics.jsonl"), keys, run_dir / "curves.png", title="KTO")
