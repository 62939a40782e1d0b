"""The configs of `postrl ppo` (`postrl.lm.ppo`): the PPO update, the ptx loss, and the whole run.

Defaults suit a real Hugging Face model and follow TRL's PPO trainer and "The N+ implementation details of RLHF
with PPO" (Huang et al. 2024): actor and critic lr 3e-6 decaying to 0, β 0.05, 4 epochs of one minibatch,
responses of up to 53 tokens at temperature 0.7. The values tuned for the built-in tiny world (the `reviews`
task) are in configs/ppo-reviews.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from postrl.lm.agents.config import EnvConfig
from postrl.lm.ppo.advantages import GAEConfig, KLConfig, RewardConfig
from postrl.lm.rollout import SamplingConfig
from postrl.lm.spine import RUN_KEYS, RunConfig
from postrl.lm.trainer import OptimConfig
from postrl.runtime import distributed as dist
from postrl.runtime.errors import UserError

CRITICS = ("reward_model", "sft", "shared")


@dataclass(frozen=True)
class PPOLossConfig:
    """The PPO update."""

    epochs: int = 4
    """Passes over each step's rollouts."""
    minibatches: int = 1
    """Optimiser steps per epoch (the batch is cut into this many minibatches)."""
    grad_accum: int = 1
    """Micro-batches per minibatch (token-weighted, so the gradient is the minibatch's)."""
    clip_eps: float = 0.2
    """ε of the clipped policy ratio."""
    vf_clip: float | None = 0.2
    """ε of the clipped value loss (PPO2); null: unclipped."""
    vf_coef: float = 0.1
    """Weight of the value loss."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""

    CHECKS = {  # valid ranges (postrl.runtime.config.validate)
        "epochs": ">= 1",
        "minibatches": ">= 1",
        "grad_accum": ">= 1",
        "clip_eps": "> 0",
        "vf_clip": "> 0",
        "vf_coef": ">= 0",
        "ent_coef": ">= 0",
    }


@dataclass(frozen=True)
class PtxConfig:
    """The pretraining-mix loss of InstructGPT (PPO-ptx): next-token NLL on SFT data, weighted."""

    coef: float = 0.0
    """γ_ptx; 0 turns it off."""
    data: str | None = None
    """SFT rows (prompt/completion); default: the SFT split of `data` when it is a built-in task."""
    batch_size: int = 16
    """Examples per minibatch."""
    max_length: int = 64
    """Longest example in tokens (longer ones are dropped)."""

    CHECKS = {"coef": ">= 0", "batch_size": ">= 1", "max_length": ">= 2"}  # valid ranges


def _optim() -> OptimConfig:
    """TRL's PPO optimiser: AdamW (betas 0.9, 0.999), lr 3e-6, no warmup, decayed to 0, gradients clipped to 1."""
    return OptimConfig(lr=3e-6, warmup_steps=0, min_lr_ratio=0.0, betas=(0.9, 0.999), max_grad_norm=1.0)


@dataclass(frozen=True)
class PPOLanesConfig:
    """Asynchronous rollouts (`postrl.lm.ppo.lanes`): a generation lane, another process with its own copy of
    the actor and its own torch threads, samples the next steps' responses while this process scores them and
    trains on the last (GRPO's lanes, `postrl.lm.grpo.lanes`, for PPO-RLHF)."""

    enabled: bool = False
    """Sample in the generation lane; false: sample and train in turn, in this process."""
    max_staleness: int = 1
    """k: step s trains on responses sampled by the actor after step s − k. 0: by the current actor, nothing
    overlaps and the run is the synchronous one. The sampler's log-probs are PPO's π_old, so the clipped ratio
    is taken against the actor that sampled (and the KL penalty's log π is the sampler's)."""
    threads: int = 1
    """torch intra-op threads of the generation lane (run.threads are the training lane's)."""
    timeout: float = 600.0
    """Seconds to wait for a step's responses once the lane is up: a lane that died, or sent nothing for this
    long, stops the run with one error."""

    CHECKS = {"max_staleness": ">= 0", "threads": ">= 1", "timeout": "> 0"}


@dataclass(frozen=True)
class PPOConfig:
    """`postrl ppo --model SFT_DIR --reward-model RM_DIR --out RUN_DIR`."""

    model: str = "runs/sft/model"
    """The SFT policy: the actor's initialisation (and the reference unless `ref_model` is set)."""
    reward_model: str | None = "runs/rm/model"
    """Reward-model folder written by `postrl rm` (frozen)."""
    rewards: list[str] = field(default_factory=list)
    """Rule-based rewards instead of the reward model (task:NAME, module:function, rm:PATH), summed."""
    reward_weights: list[float] | None = None
    """Weights of `rewards` (default 1 each)."""
    ref_model: str | None = None
    """Reference policy (default: `model`)."""
    critic: str = "reward_model"
    """reward_model (a trainable copy of the RM, N+ details), sft (a new head on the SFT trunk), or shared
    (a value head on the actor's trunk)."""
    tokenizer: str | None = None
    """Tokenizer (default: the model's)."""
    data: str = "task:reviews"
    """Prompts: a JSONL/JSON/Parquet file with a 'prompt' column, task:NAME, or a `datasets` name."""
    task: dict[str, Any] = field(default_factory=dict)
    """Options of a built-in task."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Episodes in a text environment instead of prompts from data (env.id): the environment's reward per
    turn (no reward model), the critic at each turn's start and GAE over turns (env.gamma, gae.lam); batch_size
    counts episodes. configs/ppo-guess-number.yaml."""
    eval_data: str | None = None
    """Held-out prompts (default: the test split of a built-in task, else the last 5% of the prompts)."""
    empty_rows: Literal["error", "skip"] = "error"
    """Rows whose prompt or completion (chosen, rejected) is empty or whitespace-only: error (the default:
    names the first one's file:line:field and the count) or skip (dropped, the count logged)."""
    max_prompt_length: int = 512
    """Longer prompts are dropped (and reported)."""
    sampling: SamplingConfig = field(
        default_factory=lambda: SamplingConfig(max_new_tokens=53, temperature=0.7)
    )
    """How responses are sampled (the temperature also divides the training logits; TRL's response_length
    and temperature)."""
    batch_size: int = 64
    """Prompts per step, over all ranks (one response each)."""
    ppo: PPOLossConfig = field(default_factory=PPOLossConfig)
    """The PPO update."""
    gae: GAEConfig = field(default_factory=GAEConfig)
    """Advantages and returns."""
    kl: KLConfig = field(default_factory=lambda: KLConfig(beta=0.05))
    """KL penalty to the reference."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Reward normalisation, clipping and the no-EOS penalty (of a reward model's or the reward functions'
    scores; with env.id the environment's rewards enter as they are)."""
    ptx: PtxConfig = field(default_factory=PtxConfig)
    """Optional pretraining loss."""
    optim: OptimConfig = field(default_factory=_optim)
    """The actor's AdamW and its schedule (which counts PPO steps)."""
    critic_optim: OptimConfig = field(default_factory=_optim)
    """The critic's AdamW and its schedule (the same shape as `optim`)."""
    run: RunConfig = field(default_factory=RunConfig)
    """Steps (each: generate, score, update), seed (prompt order, sampling, minibatch order), logging,
    held-out evaluation (RM score, gold reward, KL) and checkpoint cadence, device, dtype, threads. Under
    run.parallel=fsdp actor, critic, reference and reward model are sharded, and every rank gathers the whole
    models for sampling and scoring, so they must fit one device then; critic=shared is refused there (README,
    Scaling out)."""
    eval_size: int = 256
    """Held-out responses per evaluation (cycling through the held-out prompts)."""
    lanes: PPOLanesConfig = field(default_factory=PPOLanesConfig)
    """Generation of the next steps' responses in another process while this one trains (lanes.enabled)."""
    trust_remote_code: bool = False
    """Run the model repository's own code (only for models you trust)."""
    plots: bool = True
    """Write curves.png and heldout.png at the end."""

    CHECKS = {"max_prompt_length": ">= 1", "batch_size": ">= 1", "eval_size": ">= 1"}  # valid ranges
    RENAMED = {k: f"run.{k}" for k in (*RUN_KEYS, "steps")} | {  # old key → its new name
        "actor_optim": "optim",
        "eval_samples": "eval_size",
        "reward_fns": "rewards",
    }


SHARED_FSDP = (
    "the value head lives in the actor's FSDP root unit, but the actor's LM and the head are trained and "
    "checkpointed as separate parts, which FSDP cannot gather on their own; use critic=sft or "
    "critic=reward_model (a separate critic model) with fsdp"
)


def check_ppo_config(cfg: PPOConfig) -> None:
    """Refuse settings that cannot work, naming the key."""
    p, parallel = cfg.ppo, cfg.run.parallel
    problems = {
        f"critic must be one of {CRITICS}, got {cfg.critic!r}": cfg.critic not in CRITICS,
        "critic=reward_model needs reward_model (or choose critic=sft / shared)": (
            cfg.critic == "reward_model" and cfg.reward_model is None
        ),
        "give reward_model or rewards": cfg.reward_model is None and not cfg.rewards and cfg.env.id is None,
        "reward.normalize=rm_stats needs a reward model (use none or batch with rewards)": (
            cfg.reward.normalize == "rm_stats" and bool(cfg.rewards) and cfg.env.id is None
        ),
        f"batch_size={cfg.batch_size} must be >= ppo.minibatches·ppo.grad_accum per rank": (
            cfg.batch_size // dist.world_size() < p.minibatches * p.grad_accum
        ),
        "sampling.greedy must be false and sampling.temperature > 0 for training": (
            cfg.sampling.greedy or cfg.sampling.temperature <= 0
        ),
        f"run.parallel must be one of {dist.PARALLEL}, got {parallel!r}": parallel not in dist.PARALLEL,
        f"run.parallel=fsdp with critic=shared: {SHARED_FSDP}": parallel == "fsdp" and cfg.critic == "shared",
        "lanes.enabled samples prompts, not env episodes: unset env.id or lanes.enabled": (
            cfg.lanes.enabled and cfg.env.id is not None
        ),
        "lanes.enabled sends whole weights to the generation lane: use run.parallel=ddp or none, not fsdp": (
            cfg.lanes.enabled and parallel == "fsdp"
        ),
    }
    bad = [message for message, failed in problems.items() if failed]
    if bad:
        raise UserError("ppo config: " + "; ".join(bad))
