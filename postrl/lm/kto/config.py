"""The configs of `postrl kto` (`postrl.lm.kto`): the loss, and the whole run.

The defaults are TRL's (`trl.KTOConfig`, the anchor for a real model): β 0.1, desirable and undesirable weights
1, lr 1e-6 decaying to 0 with no warmup, AdamW betas (0.9, 0.999), gradients clipped to 1, 8 examples per step,
sequences of at most 1024 tokens. The values for the built-in tiny world are the preset
``configs/kto-reviews.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from postrl.lm.rollout import SamplingConfig
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import TRAIN_RENAMED, OptimConfig, TrainConfig


@dataclass(frozen=True)
class KTOLossConfig:
    """The KTO loss on the policy's implicit reward r = log π(y|x) − log π_ref(y|x) (`postrl.core.kto_loss`)."""

    beta: float = 0.1
    """β: the KL coefficient of the implicit reward; larger β keeps the policy closer to the reference."""
    desirable_weight: float = 1.0
    """λ_D, the weight of a desirable example's loss (the paper: λ_D n_D / (λ_U n_U) in [1, 4/3])."""
    undesirable_weight: float = 1.0
    """λ_U, the weight of an undesirable example's loss."""
    ref_batch_size: int = 64
    """Examples per forward when the reference log-probs are computed (once, before training, no gradients)."""

    CHECKS = {
        "beta": "> 0",
        "desirable_weight": ">= 0",
        "undesirable_weight": ">= 0",
        "ref_batch_size": ">= 1",
    }  # valid ranges (postrl.runtime.config.validate)


def _optim() -> OptimConfig:
    """TRL's KTO optimiser: AdamW (betas 0.9, 0.999), lr 1e-6, no warmup, decayed to 0, gradients clipped to 1."""
    return OptimConfig(lr=1e-6, warmup_steps=0, min_lr_ratio=0.0, betas=(0.9, 0.999), max_grad_norm=1.0)


@dataclass(frozen=True)
class KTOConfig:
    """`postrl kto --model SFT_DIR --data FILE_OR_TASK --out RUN_DIR`."""

    model: str = "runs/sft/model"
    """The SFT policy to start from (and the reference unless `ref_model` is set): a Hugging Face causal LM."""
    ref_model: str | None = None
    """Frozen reference π_ref (default: `model`)."""
    tokenizer: str | None = None
    """Tokenizer folder or name (default: the model's)."""
    data: str = "task:reviews"
    """Unpaired rows prompt/completion/label (label true: desirable, false: undesirable), TRL's unpaired
    preference format; preference rows prompt/chosen/rejected are unpaired (chosen desirable, rejected not, ties
    dropped) as TRL's `unpair_preference_dataset`. A JSONL/JSON/Parquet file, task:NAME (built-in), or a
    `datasets` name; plain text or conversational."""
    task: dict[str, Any] = field(default_factory=dict)
    """Options of a built-in task (e.g. {label_noise: 0.2})."""
    eval_data: str | None = None
    """Held-out rows (default: the test split of a built-in task, else the last 5% of the data)."""
    empty_rows: Literal["error", "skip"] = "error"
    """Rows whose prompt or completion is empty or whitespace-only: error (names the first one's
    file:line:field and the count) or skip (dropped, the count logged)."""
    kto: KTOLossConfig = field(default_factory=KTOLossConfig)
    """β, the weights of each kind, and the reference pass."""
    train: TrainConfig = field(default_factory=lambda: TrainConfig(batch_size=8, max_length=1024))
    """Batches: examples per step (over micro-batches and ranks; the KL reference point is estimated on the
    step's mismatched pairs, so at least 2), micro-batches, and the limit of prompt + completion tokens."""
    optim: OptimConfig = field(default_factory=_optim)
    """AdamW and its schedule (TRL's KTO defaults; the built-in tiny models use configs/kto-reviews.yaml)."""
    run: RunConfig = field(default_factory=lambda: RunConfig(steps=1000, eval_every=500, save_every=500))
    """Steps, seed (the example order), logging, evaluation and checkpoint cadence, device, dtype, threads,
    parallelism (ddp or fsdp under torchrun)."""
    eval_size: int = 500
    """Held-out examples for the held-out loss and the implicit rewards of each kind."""
    eval_samples: int = 256
    """Held-out responses sampled at each evaluation for their KL to the reference, length, gold reward
    (built-in task) and reward-model score (`reward_model`); 0: none, and the reference is not kept after its
    log-probs are computed."""
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(max_new_tokens=64))
    """How the held-out responses are sampled; its backend also runs the teacher-forced forwards."""
    reward_model: str | None = None
    """A reward model (`postrl rm`) that scores the held-out samples, as a metric; KTO never trains on it."""
    eval_at_start: bool = True
    """Evaluate the starting policy before the first step."""
    trust_remote_code: bool = False
    """Run the model repository's own code (only for models you trust)."""
    plots: bool = True
    """Write curves.png at the end."""

    CHECKS = {"eval_size": ">= 0", "eval_samples": ">= 0"}  # valid ranges
    RENAMED = TRAIN_RENAMED | {
        "beta": "kto.beta",
        "desirable_weight": "kto.desirable_weight",
        "undesirable_weight": "kto.undesirable_weight",
    }  # TRL's key → ours
