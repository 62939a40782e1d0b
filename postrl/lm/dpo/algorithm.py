"""`postrl dpo`: Direct Preference Optimization (Rafailov et al. 2023, arXiv:2305.18290) and IPO (Azar et al.
2023, arXiv:2310.12036) on the preference pairs a reward model would learn from.

DPO skips the reward model and the sampling of RLHF: the policy's log-ratio to a frozen reference,
β·log(π(y|x)/π_ref(y|x)), is an implicit reward, and fitting it to the pairs with the Bradley–Terry loss is
maximum likelihood for the policy that the KL-regularised RL objective would reach. One step:

    B pairs ──collate_dpo_batch: 2B rows (chosen, rejected) in the rollout layout──▶ teacher-forced forward of π
      ──Σ log π over each response's tokens──▶ log π(y_w), log π(y_l) [B]
      + log π_ref(y_w), log π_ref(y_l) [B] (computed once before training, `build.reference_log_probs`)
      ──core.dpo_loss (sigmoid or ipo; target p per pair, 0.5 a tie)──▶ AdamW step

Reference. π_ref never changes, so its log-probs of every train and held-out pair are computed once, batched
and without gradients, before the first step (TRL's ``precompute_ref_log_probs``), and written to the run
folder (``reference_logps.safetensors``): a resumed run reads them back, so it trains on the same numbers.
The reference model itself is kept only for the held-out KL of sampled responses (``eval_samples`` > 0).

Distributed (torchrun): the step's pairs are split over ranks (`trainer.micro_batches`), each micro-batch's
loss is its summed pair loss over the step's global pair count, DDP/FSDP average gradients, so N ranks take
the step one process takes on the whole batch.

This file: the step and :class:`DPO`, the algorithm of the shared loop (`postrl.lm.spine`), and `run_dpo`. The
config is in `config.py`; the pairs, log-probs, reference and evaluation in `build.py`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from postrl.lm.dpo.build import (
    REF_FILE,
    collate_dpo_batch,
    dpo_batch_loss,
    load_pairs,
    pair_metrics,
    reference_pair_log_probs,
)
from postrl.lm.dpo.config import DPOConfig
from postrl.lm.recipe import Setup, run_recipe
from postrl.lm.reference import ReferenceAlgorithm, ReferenceRecipe
from postrl.lm.rollout import ResponseForward
from postrl.lm.rollout.forwards import ChunkedForward
from postrl.lm.rollout.packed_forward import PackedForward, packed_refusal
from postrl.lm.spine import LoopState, accumulate
from postrl.lm.trainer import (
    clip_grad_norm,
    micro_batches,
)
from postrl.runtime import distributed as dist
from postrl.runtime.logging import read_jsonl
from postrl.runtime.plots import plot_curves

log = logging.getLogger(__name__)
STAT_KEYS = ("reward_accuracy", "reward_margin", "chosen_rewards", "rejected_rewards")


# ---- one optimiser step --------------------------------------------------------------------------------
def length_groups(
    rows: list[int], weight: float, pairs: list[dict[str, Any]], groups: int
) -> list[tuple[list[int], float]]:
    """A micro-batch's pairs sorted by length (longer response, then prompt) and cut into ``groups`` parts of
    near-equal counts, each with the micro-batch's loss weight: in the rollout layout a batch is as wide as its
    longest prompt plus its longest response, so one long response would pad every row to its length. Always
    ``groups`` parts (an empty one is a pair with weight 0), so that every rank runs the same forwards."""

    def length(i: int) -> tuple[int, int]:
        e = pairs[i]
        return max(len(e["chosen_ids"]), len(e["rejected_ids"])), len(e["prompt_ids"])

    order = sorted(rows, key=length)
    size, extra = divmod(len(order), groups)
    out, start = [], 0
    for k in range(groups):
        end = start + size + (1 if k < extra else 0)
        out.append((order[start:end], weight) if end > start else ([rows[0]], 0.0))
        start = end
    return out


def dpo_train_step(
    model: torch.nn.Module,
    forward: ResponseForward,
    optimizer: torch.optim.Optimizer,
    pairs: list[dict[str, Any]],
    ref: Tensor,
    indices: list[int],
    cfg: DPOConfig,
    pad_id: int,
    device: torch.device,
) -> dict[str, float]:
    """One optimiser step over the pairs ``indices`` (all ranks'), the policy ``model`` run through its
    ``forward``; returns the loss, the implicit-reward stats and the gradient norm, each the mean over the
    step's pairs.

    The step's loss is Σ_i ℓ_i / N over its N pairs on every micro-batch and rank: a micro-batch of b pairs
    contributes its mean loss · b/N, so accumulation and sharding give the gradient of one big batch."""
    groups = 1 if isinstance(forward, PackedForward) else cfg.dpo.length_groups  # packed: no padding to cut
    micro = [
        part
        for rows, weight in micro_batches(indices, cfg.train.grad_accum)
        for part in length_groups(rows, weight, pairs, groups)
    ]
    scale = dist.world_size()  # DDP and FSDP average gradients over ranks; the loss is a global pair sum
    sums = dict.fromkeys(("loss", *STAT_KEYS), 0.0)

    def micro_loss(mb: tuple[list[int], float]) -> Tensor:
        rows, weight = mb
        share = weight * len(rows) / len(indices)  # b/N; 0 for a rank whose share ran out
        batch = collate_dpo_batch([pairs[i] for i in rows], pad_id, device)
        value, stats = dpo_batch_loss(forward, batch, ref[rows], cfg.dpo)
        sums["loss"] += float(value.detach()) * share
        for key in STAT_KEYS:
            sums[key] += float(stats[key]) * share
        return value * share * scale

    accumulate([model], micro, micro_loss)
    norm = clip_grad_norm(model, cfg.optim.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    out = dist.reduce_metrics(sums)  # the mean over ranks of each rank's share: × world size is the sum
    return {k: v * scale for k, v in out.items()} | {"grad_norm": norm}


def padding_free_forward(
    model: torch.nn.Module, padded: ResponseForward, cfg: DPOConfig, gradients: bool
) -> ResponseForward:
    """`PackedForward` of ``model`` where ``dpo.padding_free`` asks for it and `packed_refusal` allows it,
    else ``padded`` (the forward `postrl.lm.rollout.forwards.response_forward` chose); logged when training."""
    if cfg.dpo.padding_free == "off" or cfg.sampling.use_fast is False:
        return padded
    why = packed_refusal(model, gradients)
    if why is None and isinstance(padded, ChunkedForward):
        why = "run.memory.log_probs chose the chunked output layer (the whole logits of a batch do not fit)"
    if gradients:
        if why is None:
            log.info(
                "dpo: padding-free forward (dpo.padding_free=auto): real tokens only, one prompt per pair"
            )
        else:
            log.info("dpo: padded forward %s, the padding-free one refused: %s", type(padded).__name__, why)
    return padded if why is not None else PackedForward(model)


# ---- the algorithm on the spine ------------------------------------------------------------------------
class DPO(ReferenceAlgorithm):
    """DPO as a `postrl.lm.spine` algorithm (`postrl.lm.reference.ReferenceAlgorithm`): a step is one AdamW
    step on a batch of pairs."""

    name = "dpo"

    def __init__(self, model: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        super().__init__(model, *args, **kwargs)
        self.forward = padding_free_forward(model, self.forward, self.cfg, gradients=True)
        self.eval_forward = padding_free_forward(
            dist.unwrap(model), self.eval_forward, self.cfg, gradients=False
        )

    def train_step(self, indices: list[int]) -> dict[str, float]:
        return dpo_train_step(
            self.model, self.forward, self.optimizer, self.examples, self.ref, indices, self.cfg,
            self.tokenizer.pad_token_id, self.device,
        )  # fmt: skip

    def bar(self, metrics: dict[str, float]) -> dict[str, float]:
        return {"loss": metrics["loss"], "acc": metrics["reward_accuracy"]}

    def heldout_metrics(self) -> dict[str, float]:
        return pair_metrics(
            self.eval_forward, self.evals, self.eval_ref, self.cfg.dpo, self.tokenizer.pad_token_id, self.device,
            self.cfg.dpo.ref_batch_size,
        )  # fmt: skip


# ---- the command ---------------------------------------------------------------------------------------
class DPORecipe(ReferenceRecipe):
    """DPO on `postrl.lm.reference.ReferenceRecipe`: its pairs, their reference pass, `DPO`, its summary."""

    section = "dpo"
    algorithm_class = DPO

    def one_backward(self, cfg: DPOConfig) -> list[str]:
        """What stops ``optim.step_in_backward``: several backwards per optimiser step."""
        return [
            f"it needs {key}=1, not {value}"
            for key, value in (
                ("train.grad_accum", cfg.train.grad_accum),
                ("dpo.length_groups", cfg.dpo.length_groups),
            )
            if value != 1
        ]

    def load_examples(self, cfg: DPOConfig, tokenizer: Any) -> tuple[list[dict], list[dict], Any]:
        return load_pairs(cfg, tokenizer)

    def reference_log_probs(
        self, reference: ResponseForward, examples: list[dict], setup: Setup, batch_size: int
    ) -> Tensor:
        pad = setup.tokenizer.pad_token_id
        model = getattr(
            reference, "model", None
        )  # the held-out metrics' forward: π = π_ref gives h = 0 exactly
        if model is not None:
            reference = padding_free_forward(model, reference, setup.cfg, gradients=False)
        return reference_pair_log_probs(reference, examples, pad, setup.info.device, batch_size)

    def summarize(self, setup: Setup, algo: DPO, state: LoopState) -> dict[str, Any]:
        return _summarize(algo, state, len(setup.extra["train"]))

    def plot(self, run_dir: Path) -> None:
        plot_dpo(run_dir)


def run_dpo(
    cfg: DPOConfig, run_dir: str | Path, resume: bool = False, overwrite: bool = False
) -> dict[str, Any]:
    """Train with DPO, export ``RUN_DIR/model`` (HF format), write the run folder, return the summary.
    The models, tokenizer and pairs are loaded and checked before the run folder is touched."""
    return run_recipe(DPORecipe(), cfg, run_dir, resume=resume, overwrite=overwrite)


def _summarize(algo: DPO, state: LoopState, n_pairs: int) -> dict[str, Any]:
    """The last evaluation (and the first, as ``*_start``), the last step's training metrics, throughput."""
    start = {f"{k}_start": v for k, v in state.start_eval.items()}
    last = state.last_metrics
    return {
        **state.last_eval,
        **start,
        "loss": last.get("loss"),
        "reward_accuracy": last.get("reward_accuracy"),
        "steps": state.step,
        "train_pairs": n_pairs,
        "beta": algo.cfg.dpo.beta,
        "loss_type": algo.cfg.dpo.loss_type,
        "train_seconds": round(state.train_seconds, 3),
        "seconds_per_step": state.train_seconds / max(1, state.step),
        "reference_file": REF_FILE,
    }


def plot_dpo(run_dir: Path) -> Path | None:
    """``RUN_DIR/curves.png``: training loss and implicit-reward accuracy and margin, the held-out ones, and the
    sampled responses' gold reward, reward-model score and KL to the reference."""
    keys = ["loss", "reward_accuracy", "reward_margin", "heldout_loss", "heldout_reward_accuracy"]
    keys += ["heldout_gold_reward", "heldout_rm_score", "heldout_kl"]
    return plot_curves(read_jsonl(run_dir / "metrics.jsonl"), keys, run_dir / "curves.png", title="DPO")
