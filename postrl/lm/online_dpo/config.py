"""The config of `postrl online-dpo` (`postrl.lm.online_dpo`).

The defaults are TRL's (`trl.OnlineDPOConfig`, the anchor for a real model): β 0.1, the sigmoid loss, lr 5e-7,
64 new tokens sampled at temperature 0.9, 8 prompts per step. The values for the built-in tiny world are the
preset ``configs/online-dpo-reviews.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from postrl.lm.dpo.config import DPOLossConfig
from postrl.lm.rollout import SamplingConfig
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig


@dataclass(frozen=True)
class OnlineBatchConfig:
    """How many prompts a step samples for."""

    batch_size: int = 8
    """Prompts per step; each gets two sampled responses, one judged pair (TRL: per_device_train_batch_size)."""
    grad_accum: int = 1
    """Micro-batches the step's pairs are cut into (the same gradient, less memory)."""
    max_length: int = 512
    """Longest prompt + sampled response, in tokens (TRL's max_length; clipped to the model's context):
    prompts longer than max_length − sampling.max_new_tokens are dropped (counted in a warning)."""

    CHECKS = {"batch_size": ">= 1", "grad_accum": ">= 1", "max_length": ">= 2"}


@dataclass(frozen=True)
class OnlineDPOConfig:
    """`postrl online-dpo --model SFT_DIR --data PROMPTS --judge SPEC --out RUN_DIR`."""

    model: str = "runs/sft/model"
    """The SFT policy to start from (and the reference unless `ref_model` is set): a Hugging Face causal LM."""
    ref_model: str | None = None
    """Frozen reference π_ref (default: `model`)."""
    tokenizer: str | None = None
    """Tokenizer folder or name (default: the model's)."""
    data: str = "task:reviews"
    """Prompts: a JSONL/JSON/Parquet file with a prompt column (text or conversational), task:NAME (built-in),
    or a `datasets` name."""
    task: dict[str, Any] = field(default_factory=dict)
    """Options of a built-in task."""
    eval_data: str | None = None
    """Held-out prompts (default: the test split of a built-in task, else the last 5% of the data)."""
    empty_rows: Literal["error", "skip"] = "error"
    """Rows whose prompt is empty or whitespace-only: error (names the first one's file:line) or skip."""
    judge: str = "rm:runs/rm/model"
    """Who labels each sampled pair (`postrl.lm.judges`): rm:PATH (a reward model, σ(s₁ − s₂)), lm:PATH (a
    causal LM answering A or B, both orders averaged), openai:URL (a chat endpoint), or a reward function
    (task:NAME, module:function)."""
    judge_constitution: list[str] | None = None
    """Principles of a generative judge (lm:, openai:); null: `postrl.lm.judges.DEFAULT_CONSTITUTION`."""
    judge_model: str | None = None
    """openai: the model name the endpoint serves (null: the first it lists)."""
    labels: Literal["soft", "hard"] = "soft"
    """soft: the judge's probability p that the first sample is better is DPO's target (0.5 says neither);
    hard: 1 or 0 by the side p favours, as Guo et al. label (0.5 when p is exactly 0.5, e.g. two identical
    samples, where TRL's OnlineDPOTrainer calls the first chosen)."""
    dpo: DPOLossConfig = field(default_factory=DPOLossConfig)
    """β, the loss (sigmoid or ipo) and the reference forward's batch size."""
    train: OnlineBatchConfig = field(default_factory=OnlineBatchConfig)
    """Prompts per step, micro-batches, the length limit."""
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(
            lr=5e-7, warmup_steps=0, min_lr_ratio=0.0, betas=(0.9, 0.999), max_grad_norm=1.0
        )
    )
    """AdamW and its schedule (TRL's online DPO defaults; the built-in tiny models use the preset)."""
    run: RunConfig = field(default_factory=lambda: RunConfig(steps=1000, eval_every=100, save_every=100))
    """Steps, seed (prompt order and sampling), logging, evaluation and checkpoint cadence, device, dtype."""
    sampling: SamplingConfig = field(
        default_factory=lambda: SamplingConfig(max_new_tokens=64, temperature=0.9)
    )
    """How the two responses of a step (and the held-out ones) are sampled."""
    eval_samples: int = 256
    """Held-out responses sampled at each evaluation for their KL to the reference, length, gold reward
    (built-in task) and reward-model score (`reward_model`); 0: none."""
    eval_judge_prompts: int = 64
    """Held-out prompts on which the judge compares a policy sample with a reference sample (the win rate
    against the reference, heldout_judge_win_rate); 0: none."""
    reward_model: str | None = None
    """A reward model (`postrl rm`) that scores the held-out samples, as a metric."""
    eval_at_start: bool = True
    """Evaluate the starting policy before the first step."""
    trust_remote_code: bool = False
    """Run the model repository's own code (only for models you trust)."""
    plots: bool = True
    """Write curves.png at the end."""

    CHECKS = {"eval_samples": ">= 0", "eval_judge_prompts": ">= 0"}
    RENAMED = {"beta": "dpo.beta", "loss_type": "dpo.loss_type", "temperature": "sampling.temperature"}
    RENAMED |= {"max_new_tokens": "sampling.max_new_tokens", "learning_rate": "optim.lr"}
    RENAMED |= {"per_device_train_batch_size": "train.batch_size"}
