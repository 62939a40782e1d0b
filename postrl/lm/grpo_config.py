"""The configs of `postrl grpo` (`postrl.lm.grpo`): groups, advantages and the loss, and the whole run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from postrl.lm.rollout import SamplingConfig
from postrl.lm.trainer import OptimConfig


@dataclass(frozen=True)
class GRPOLossConfig:
    """Groups, advantages, the clipped objective and its aggregation."""

    group_size: int = 8
    """G: responses sampled per prompt."""
    prompts_per_step: int = 32
    """B: prompts per step (over all ranks); a step trains on B·G responses."""
    mu: int = 1
    """μ: optimisation passes over each batch (TRL's num_iterations)."""
    minibatches: int = 1
    """Optimiser steps per pass, each on an equal share of the batch."""
    micro_batch_size: int = 0
    """Responses per forward/backward (gradient accumulation; 0: the whole minibatch). Never changes the
    gradient: every micro-batch's loss is divided by the minibatch's global count."""
    clip_eps: float = 0.2
    """ε: the ratio is clipped to [1 − ε, 1 + ε_high]."""
    clip_eps_high: float | None = None
    """ε_high (DAPO clip-higher, e.g. 0.28); null: ε."""
    beta: float = 0.04
    """β: coefficient of the k3 KL to the frozen reference; 0 loads no reference model."""
    unbiased_kl: bool = False
    """Weight k3 by the ratio ρ so that its gradient is that of KL(π‖π_ref) (DeepSeek-V3.2; TRL's
    use_bias_correction_kl, its default); false: plain k3, whose gradient is that of KL(π_ref‖π) (DeepSeekMath)."""
    loss_type: Literal["grpo", "token", "dr_grpo"] = "grpo"
    """grpo: mean over each response's tokens, then over responses (DeepSeekMath); token: mean over all
    tokens (DAPO); dr_grpo: sum / (responses · max_new_tokens) (Dr. GRPO)."""
    scale_rewards: bool = True
    """Divide advantages by the group's reward std (false: Dr. GRPO)."""
    adv_eps: float = 1e-4
    """ε added to the group std."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal and refill with new prompts."""
    max_refills: int = 4
    """Most refill rounds per step; a batch still short is topped up with dropped groups (zero gradient)."""
    overlong_buffer: int = 0
    """DAPO soft overlong penalty: the last this many tokens before max_new_tokens cost up to
    overlong_penalty, linearly (0: off)."""
    overlong_penalty: float = 1.0
    """Penalty at max_new_tokens when overlong_buffer > 0."""
    repeat_prompts: bool = False
    """Allow a prompt to appear twice in one step (needed when the data has fewer than B prompts)."""

    CHECKS = {  # valid ranges (postrl.runtime.config.validate)
        "group_size": ">= 2",
        "prompts_per_step": ">= 1",
        "mu": ">= 1",
        "minibatches": ">= 1",
        "micro_batch_size": ">= 0",
        "clip_eps": "> 0",
        "clip_eps_high": "> 0",
        "beta": ">= 0",
        "adv_eps": ">= 0",
        "max_refills": ">= 0",
        "overlong_buffer": ">= 0",
        "overlong_penalty": ">= 0",
    }


@dataclass(frozen=True)
class GRPOConfig:
    """`postrl grpo --model SFT_MODEL --data FILE_OR_TASK --out RUN_DIR`."""

    model: str = "runs/sft/model"
    """Policy to start from (and the reference): a Hugging Face causal LM folder, or a hub name when online."""
    tokenizer: str | None = None
    """Tokenizer folder or name (default: the model's)."""
    ref_model: str | None = None
    """Frozen reference for the KL (default: the starting model); not loaded when grpo.beta is 0."""
    data: str = "task:arithmetic"
    """Prompt rows: a JSONL/JSON/Parquet file, task:NAME (built-in), or a `datasets` name. Every column is
    passed to the reward functions."""
    task: dict[str, Any] = field(default_factory=dict)
    """Options of a built-in task, for the data and the task: rewards (e.g. {digits: 3})."""
    eval_data: str | None = None
    """Held-out prompt rows (default: the test split of a built-in task, else the last 5% of the data)."""
    empty_rows: Literal["error", "skip"] = "error"
    """Rows whose prompt or completion (chosen, rejected) is empty or whitespace-only: error (the default:
    names the first one's file:line:field and the count) or skip (dropped, the count logged)."""
    rewards: list[str] = field(default_factory=list)
    """Reward functions: task:NAME, module:function (or file.py:function), rm:PATH; empty: the built-in
    task's reward when data is task:NAME."""
    reward_weights: list[float] | None = None
    """Weight of each reward function (default: all 1; 0 keeps a function as a metric only)."""
    verifier: str | None = None
    """The reward spec (one of rewards) that checks correctness (0/1): its mean is logged as accuracy.
    Default: the task: reward of a built-in task with answers."""
    max_prompt_length: int = 256
    """Longest prompt in tokens; see overlong_prompts."""
    overlong_prompts: str = "drop"
    """Longer prompts are dropped, truncated (from the left) or refused (error); always reported."""
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(max_new_tokens=16))
    """How responses are sampled (the temperature also defines the optimised policy π_τ)."""
    grpo: GRPOLossConfig = field(default_factory=GRPOLossConfig)
    """Groups, advantages and the loss."""
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=2e-4, warmup_steps=0, min_lr_ratio=1.0, max_grad_norm=1.0)
    )
    """Optimiser and schedule (the default lr suits the built-in tiny models; ~1e-6 for billion-parameter ones)."""
    max_steps: int = 200
    """GRPO steps (each: generate, reward, μ passes)."""
    max_seconds: float | None = None
    """Also stop after this many seconds of training (evaluation excluded); null: no time limit."""
    eval_every: int = 20
    """Steps between held-out evaluations (0: only at the end)."""
    eval_prompts: int = 200
    """Held-out prompts per evaluation (greedy and one sample each: pass@1)."""
    eval_at_start: bool = True
    """Evaluate the starting policy before the first step."""
    save_every: int = 50
    """Steps between checkpoints (0: only at the end)."""
    keep_last: int = 2
    """Checkpoints kept."""
    log_every: int = 1
    """Steps between metrics.jsonl rows."""
    seed: int = 0
    """Seed of the prompt order, the sampling and everything random."""
    device: str = "auto"
    """cpu, cuda, cuda:1, mps, or auto."""
    dtype: str = "float32"
    """Weights dtype: float32, bfloat16 or float16."""
    threads: int | None = None
    """torch intra-op threads (null: torch's default; 1–2 is fastest for tiny models on a CPU)."""
    parallel: str = "ddp"
    """Under torchrun: ddp (replicate the policy) or fsdp (shard the policy, its gradients and optimiser state,
    and the reference: FSDP2). Under fsdp every rank gathers the whole policy for sampling and scoring, so it
    must fit one device then (README, Scaling out)."""
    trust_remote_code: bool = False
    """Run the model repository's own code (only for models you trust)."""
    tensorboard: bool = False
    """Also write TensorBoard event files."""

    CHECKS = {  # valid ranges (postrl.runtime.config.validate)
        "max_prompt_length": ">= 1",
        "max_steps": ">= 1",
        "max_seconds": "> 0",
        "eval_every": ">= 0",
        "eval_prompts": ">= 0",
        "save_every": ">= 0",
        "keep_last": ">= 0",
        "log_every": ">= 1",
        "seed": ">= 0",
        "threads": ">= 1",
    }
