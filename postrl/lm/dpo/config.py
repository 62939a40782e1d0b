"""The configs of `postrl dpo` (`postrl.lm.dpo`): the loss, and the whole run.

The defaults are TRL's (`trl.DPOConfig`, the anchor for a real model): β 0.1, the sigmoid loss, lr 1e-6 decaying
to 0 with no warmup, AdamW betas (0.9, 0.999), gradients clipped to 1, 8 pairs per step, sequences of at most
1024 tokens, dropout off. The values tuned for the built-in tiny world are the preset
``configs/dpo-reviews.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from postrl.lm.rollout import SamplingConfig
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import TRAIN_RENAMED, OptimConfig, TrainConfig


@dataclass(frozen=True)
class DPOLossConfig:
    """The preference loss on the policy's implicit reward β·log(π/π_ref) (`postrl.core.dpo_loss`)."""

    beta: float = 0.1
    """β: the KL coefficient of DPO's implicit reward (IPO: its regularisation τ). Larger β keeps the policy
    closer to the reference."""
    loss_type: Literal["sigmoid", "ipo"] = "sigmoid"
    """sigmoid: −[p log σ(βh) + (1−p) log σ(−βh)] (DPO, Rafailov et al. 2023, with the label p of the data's
    target column, 0.5 for a tie); ipo: (h − (2p−1)/(2β))² (IPO, Azar et al. 2023, on summed log-probs);
    h = log-ratio of chosen minus that of rejected."""
    ref_batch_size: int = 64
    """Pairs per forward when the reference log-probs are computed (once, before training, without gradients)."""
    padding_free: Literal["auto", "off"] = "auto"
    """auto: the loss's forward runs its products on the real tokens only and each pair's prompt once
    (`postrl.lm.rollout.packed_forward.PackedForward`, as TRL's padding_free plus a shared prompt) where it
    can: a whole Llama-family or GPT-2 model in float32 without activation checkpointing, and sampling.use_fast
    not false; the choice, or why it was refused, is logged. off: the padded forward (the same loss and
    gradients to float32 rounding)."""
    length_groups: int = 2
    """Forwards per micro-batch of the padded forward: its pairs sorted by length and cut into this many
    groups, each padded only to its own longest response (the same gradient, less padding to compute; 1: one
    forward, as TRL). The padding-free forward takes one per micro-batch."""

    CHECKS = {
        "beta": "> 0",
        "ref_batch_size": ">= 1",
        "length_groups": ">= 1",
    }  # valid ranges (postrl.runtime.config.validate)


def _optim() -> OptimConfig:
    """TRL's DPO optimiser: AdamW (betas 0.9, 0.999), lr 1e-6, no warmup, decayed to 0, gradients clipped to 1."""
    return OptimConfig(lr=1e-6, warmup_steps=0, min_lr_ratio=0.0, betas=(0.9, 0.999), max_grad_norm=1.0)


@dataclass(frozen=True)
class DPOConfig:
    """`postrl dpo --model SFT_DIR --data FILE_OR_TASK --out RUN_DIR`."""

    model: str = "runs/sft/model"
    """The SFT policy to start from (and the reference unless `ref_model` is set): a Hugging Face causal LM."""
    ref_model: str | None = None
    """Frozen reference π_ref (default: `model`)."""
    tokenizer: str | None = None
    """Tokenizer folder or name (default: the model's)."""
    data: str = "task:reviews"
    """Preference rows prompt/chosen/rejected (+ target in [0, 1]: 1 chosen preferred, 0.5 a tie): a
    JSONL/JSON/Parquet file, task:NAME (built-in), or a `datasets` name; plain text or conversational."""
    task: dict[str, Any] = field(default_factory=dict)
    """Options of a built-in task (e.g. {label_noise: 0.2})."""
    eval_data: str | None = None
    """Held-out pairs (default: the test split of a built-in task, else the last 5% of the data)."""
    empty_rows: Literal["error", "skip"] = "error"
    """Rows whose prompt or completion (chosen, rejected) is empty or whitespace-only: error (the default:
    names the first one's file:line:field and the count) or skip (dropped, the count logged)."""
    dpo: DPOLossConfig = field(default_factory=DPOLossConfig)
    """β, the loss and the reference pass."""
    train: TrainConfig = field(default_factory=lambda: TrainConfig(batch_size=8, max_length=1024))
    """Batches: pairs per step (over micro-batches and ranks), micro-batches, and the length limit of prompt
    + the longer response (TRL's DPO defaults: 8 pairs, 1024 tokens)."""
    optim: OptimConfig = field(default_factory=_optim)
    """AdamW and its schedule (TRL's DPO defaults; the built-in tiny models use configs/dpo-reviews.yaml)."""
    run: RunConfig = field(default_factory=lambda: RunConfig(steps=1000, eval_every=500, save_every=500))
    """Steps, seed (the pair order), logging, evaluation and checkpoint cadence, device, dtype, threads,
    parallelism (ddp or fsdp under torchrun)."""
    eval_size: int = 500
    """Held-out pairs for the implicit reward's accuracy and margin, and the held-out loss."""
    eval_samples: int = 256
    """Held-out responses sampled at each evaluation (cycling through the held-out prompts) for their KL to
    the reference, length, gold reward (built-in task) and reward-model score (`reward_model`); 0: none, and
    the reference is not kept after its log-probs are computed."""
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(max_new_tokens=64))
    """How the held-out responses are sampled (temperature 1: the KL is that of the policy itself); its
    backend also runs the teacher-forced forwards of training and of the reference pass."""
    reward_model: str | None = None
    """A reward model (`postrl rm`) that scores the held-out samples, as a metric beside the gold reward (the
    proxy of the frontier: benchmarks/frontier.py); DPO never trains on it."""
    eval_at_start: bool = True
    """Evaluate the starting policy before the first step (the frontier's origin)."""
    trust_remote_code: bool = False
    """Run the model repository's own code (only for models you trust)."""
    plots: bool = True
    """Write curves.png at the end."""

    CHECKS = {"eval_size": ">= 0", "eval_samples": ">= 0"}  # valid ranges
    RENAMED = TRAIN_RENAMED | {"beta": "dpo.beta", "loss_type": "dpo.loss_type"}  # old/TRL key → ours
