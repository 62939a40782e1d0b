"""The configs of `postrl grpo` (`postrl.lm.grpo`): groups, advantages and the loss, and the whole run.

The defaults are TRL's (`trl.GRPOConfig`, the anchor for a real model): lr 1e-6, G = 8 responses of at most 256
tokens per prompt, prompts of at most 512 tokens, β = 0 (no reference model), ε = 0.2, one pass per batch,
rewards scaled by the group's std, and the token-level loss (TRL's default ``dapo``: our ``token``, the mean over
every response token of the step). The values tuned for the built-in tiny world are the preset
``configs/grpo-arithmetic.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from postrl.lm.agents.config import EnvConfig
from postrl.lm.rollout import SamplingConfig
from postrl.lm.spine import RUN_KEYS, RunConfig
from postrl.lm.trainer import OptimConfig


@dataclass(frozen=True)
class GRPOLossConfig:
    """Groups, advantages, the clipped objective and its aggregation."""

    group_size: int = 8
    """G: responses sampled per prompt (TRL's num_generations)."""
    prompts_per_step: int = 32
    """B: prompts per step (over all ranks); a step trains on B·G responses."""
    epochs: int = 1
    """μ: optimisation passes over each batch (TRL's num_iterations)."""
    minibatches: int = 1
    """Optimiser steps per pass, each on an equal share of the batch."""
    grad_accum: int = 1
    """Micro-batches per minibatch (TRL's gradient_accumulation_steps; PPO's ppo.grad_accum): each rank's
    minibatch is cut into this many forward/backward passes of ⌈rows / grad_accum⌉ responses. Never changes the
    gradient: every micro-batch's loss is divided by the minibatch's global count (`postrl.lm.onpolicy`)."""
    clip_eps: float = 0.2
    """ε: the ratio is clipped to [1 − ε, 1 + ε_high]."""
    clip_eps_high: float | None = None
    """ε_high (DAPO clip-higher, e.g. 0.28); null: ε."""
    beta: float = 0.0
    """β: coefficient of the k3 KL to the frozen reference (DeepSeekMath: 0.04); 0 loads no reference model."""
    unbiased_kl: bool = False
    """Weight k3 by the ratio ρ so that its gradient is that of KL(π‖π_ref) (DeepSeek-V3.2; TRL's
    use_bias_correction_kl, off there too); false: plain k3, whose gradient is that of KL(π_ref‖π) (DeepSeekMath)."""
    loss_type: Literal["grpo", "token", "dr_grpo"] = "token"
    """grpo: mean over each response's tokens, then over responses (DeepSeekMath); token: mean over all
    tokens of the step (DAPO, TRL's default "dapo"); dr_grpo: sum / (responses · max_new_tokens) (Dr. GRPO)."""
    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp"] = "grpo"
    """The advantage estimator (`postrl.lm.grpo.rollouts.ADVANTAGES`), each from the rewards of a group:
    grpo: A_i = (r_i − mean_g r) / (std_g r + adv_eps), the std only with scale_rewards (DeepSeekMath, Shao et
    al. 2024); dr_grpo: A_i = r_i − mean_g r, no std (Dr. GRPO, Liu et al. 2025; as grpo with
    scale_rewards false); rloo: A_i = r_i − Σ_{j≠i} r_j / (G − 1), the leave-one-out baseline (RLOO, Ahmadian
    et al. 2024); reinforce_pp: a_i = r_i − mean_g r, whitened over the step's whole batch, all ranks
    (REINFORCE++-baseline, Hu 2025)."""
    importance_level: Literal["token", "sequence", "sequence_sum"] = "token"
    """The importance ratio: token: ρ_it = π_it / π_old,it per token (GRPO, PPO); sequence: s_i =
    exp(mean_t(log π_it − log π_old,it)), one length-normalised ratio per response, clipped and applied to
    every token (GSPO, Zheng et al. 2025); sequence_sum: s_i = π(o_i) / π_old(o_i), the whole response's
    ratio (RLOO as REINFORCE on responses, Ahmadian et al. 2024, and TRL's RLOOTrainer, with loss_type
    grpo)."""
    scale_rewards: bool = True
    """Divide advantages by the group's reward std (advantage grpo only; false: Dr. GRPO)."""
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
    is_correction: Literal["auto", "none", "tis", "mis"] = "auto"
    """Correction for samples drawn by a behaviour policy μ that is not the trained π (another engine's numerics,
    a stale copy); auto: tis when sampling.engine is vllm, else none. tis or mis take the clipped ratio against π's own teacher-forced log-probs before the update
    (the proximal policy: decoupled PPO, Hilton et al. 2021) and weight each token's surrogate by π_prox/μ,
    truncated at is_cap (tis: TRL's vllm_importance_sampling_mode *_truncate) or zeroed above it (mis: *_mask);
    the engine–trainer mismatch (behaviour_kl, is_capped_fraction) is logged every step. none: the sampler's
    log-probs are π_old, exact for postrl's own engine."""
    is_level: Literal["token", "sequence"] = "sequence"
    """The weight per token (π_prox,t/μ_t) or per response (the product over its tokens; TRL's default)."""
    is_cap: float = 3.0
    """C: the bound on the weight (TRL's vllm_importance_sampling_clip_max)."""

    CHECKS = {  # valid ranges (postrl.runtime.config.validate)
        "group_size": ">= 2",
        "prompts_per_step": ">= 1",
        "epochs": ">= 1",
        "minibatches": ">= 1",
        "grad_accum": ">= 1",
        "clip_eps": "> 0",
        "clip_eps_high": "> 0",
        "beta": ">= 0",
        "adv_eps": ">= 0",
        "max_refills": ">= 0",
        "overlong_buffer": ">= 0",
        "overlong_penalty": ">= 0",
        "is_cap": "> 0",
    }
    # old key → new key (postrl.runtime.config); micro_batch_size was a micro-batch's rows (0: the whole
    # minibatch), grad_accum is their count, PPO's and TRL's word
    RENAMED = {"mu": "epochs", "micro_batch_size": "grad_accum"}


@dataclass(frozen=True)
class GRPOSamplingConfig(SamplingConfig):
    """How responses are sampled, and which engine samples them."""

    engine: Literal["postrl", "vllm"] = "postrl"
    """Who samples the responses: postrl (its own engine, run by sampling.backend) or vllm (a vLLM engine in
    this process, colocated; with lanes.enabled, in the generation lane, held-out prompts then by postrl; pip
    install '.[vllm]', on CPU `make vllm-venv`): the policy's weights are pushed to it after every optimiser
    step, and grpo.is_correction auto corrects its numerics with tis. Scoring and the loss always run
    postrl's forward (sampling.backend)."""
    vllm_mode: Literal["colocate", "server"] = "colocate"
    """engine vllm: colocate (a vllm.LLM in the trainer's process, weights pushed as tensors) or server (vLLM's
    OpenAI-compatible server in another process, sampled over HTTP: the one at sampling.vllm_url, else one
    postrl launches on the model's folder). Server weight sync: after each optimiser step the policy is
    written to model.safetensors in a temporary folder and the server reloads it (POST /collective_rpc
    reload_weights with weights_path; the server must run with VLLM_SERVER_DEV_MODE=1 and see that folder)."""
    vllm_url: str | None = None
    """vllm_mode server: the base URL of a vLLM server you started (e.g. http://127.0.0.1:8000; `python -m
    vllm.entrypoints.openai.api_server --model MODEL --skip-tokenizer-init --logprobs-mode processed_logprobs`
    with VLLM_SERVER_DEV_MODE=1, on this machine's file system); unset: postrl launches one and stops it."""
    vllm_timeout: float = 300.0
    """vllm_mode server: seconds the server may take to start, and to answer one request; past it (or when the
    server dies) the run stops with one error."""
    vllm_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """engine vllm: the dtype vLLM holds the weights and computes in; auto: the policy's (run.dtype). A lower
    precision than the trainer's samples from a μ further from π_old: grpo.is_correction corrects it."""
    vllm_kv_cache_gib: float = 1.0
    """engine vllm on CPU: GiB of memory for vLLM's KV cache (VLLM_CPU_KVCACHE_SPACE, whole GiB)."""
    vllm_gpu_memory_utilization: float = 0.3
    """engine vllm on a GPU: the fraction of the device's memory vLLM may take (the rest is training's)."""

    CHECKS = SamplingConfig.CHECKS | {
        "vllm_kv_cache_gib": "> 0",
        "vllm_gpu_memory_utilization": "(0, 1]",
        "vllm_timeout": "> 0",
    }


def sampling_engine(cfg: GRPOConfig) -> str:
    """sampling.engine (postrl for a plain `SamplingConfig`, which has no engine key)."""
    return getattr(cfg.sampling, "engine", "postrl")


def is_correction(cfg: GRPOConfig) -> str:
    """grpo.is_correction with auto resolved: tis for vLLM's samples (its numerics are not the trainer's)."""
    if cfg.grpo.is_correction != "auto":
        return cfg.grpo.is_correction
    return "tis" if sampling_engine(cfg) == "vllm" else "none"


LANE_UNSENDABLE = ("rm:", "callable:")
"""Reward specs the generation lane does not load: a reward model (a second copy), a Python API function."""


def reward_specs(cfg: GRPOConfig) -> list[str]:
    """The run's reward specs: ``rewards``, or a built-in task's own (``data`` task:NAME)."""
    return list(cfg.rewards) or ([cfg.data] if cfg.data.startswith("task:") else [])


def lane_rewards(cfg: GRPOConfig) -> bool:
    """Whether the generation lane scores the training responses (lanes.rewards with auto resolved)."""
    if not cfg.lanes.enabled or cfg.lanes.rewards == "training":
        return False
    sendable = all(not s.startswith(LANE_UNSENDABLE) for s in reward_specs(cfg))
    return cfg.lanes.rewards == "generation" or sendable


@dataclass(frozen=True)
class LanesConfig:
    """Asynchronous rollouts (`postrl.lm.grpo.lanes`): a generation lane, another process with its own torch
    threads, samples the next steps' responses while this process (the training lane) trains on the last."""

    enabled: bool = False
    """Sample in the generation lane; false: sample and train in turn, in this process."""
    max_staleness: int = 1
    """k: step s trains on responses sampled by the policy after step s − k (the lane works up to k steps
    ahead). 0: by the current policy, nothing overlaps, and the run is the synchronous one. With k > 0 and
    postrl's engine, grpo.is_correction auto (none) takes the sampler's log-probs as π_old: PPO's clipped ratio
    against the stale policy, as accurate as the synchronous run within noise (benchmarks/async_grpo.py);
    tis or mis at one update per batch clip against the current policy, so never (per-token tis was lower).
    Weights reach the lane through k + 1 shared-memory copies of the policy's state dict (made at the start)."""
    threads: int = 1
    """torch intra-op threads of the generation lane (run.threads are the training lane's)."""
    rewards: Literal["auto", "generation", "training"] = "auto"
    """Where the reward functions score the training responses. generation: in the generation lane, as soon as
    it has sampled them (their time overlaps training, as in AReaL's and veRL's rollout workers); the lane
    loads them itself from their specs (a file's module runs again there). training: in this process, after it
    takes them. auto: generation unless a reward is a reward model (rm:, a second copy would load) or a Python
    function given to the Python API (it cannot be sent to another process). Held-out evaluation is scored
    here either way."""
    timeout: float = 600.0
    """Seconds to wait for a step's responses once the lane is up (its start, importing torch and loading the
    model, may take up to 5 minutes): a lane that died, or sent nothing for this long, stops the run with one
    error."""

    CHECKS = {"max_staleness": ">= 0", "threads": ">= 1", "timeout": "> 0"}


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
    env: EnvConfig = field(default_factory=EnvConfig)
    """Episodes in a text environment instead of prompts from data (env.id; the reward is the environment's)."""
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
    max_prompt_length: int = 512
    """Longest prompt in tokens; see overlong_prompts."""
    overlong_prompts: Literal["drop", "truncate", "error"] = "drop"
    """Longer prompts are dropped, truncated (from the left) or refused (error); always reported."""
    sampling: GRPOSamplingConfig = field(default_factory=lambda: GRPOSamplingConfig(max_new_tokens=256))
    """How responses are sampled (the temperature also defines the optimised policy π_τ)."""
    grpo: GRPOLossConfig = field(default_factory=GRPOLossConfig)
    """Groups, advantages and the loss."""
    lanes: LanesConfig = field(default_factory=LanesConfig)
    """Asynchronous rollouts: generation in another process while this one trains."""
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=1e-6, warmup_steps=0, min_lr_ratio=0.0, betas=(0.9, 0.999))
    )
    """AdamW and its schedule. TRL's GRPO defaults: lr 1e-6, no warmup, decay to 0 (TRL's is linear, ours the
    cosine), β₂ 0.999, no weight decay, gradient norm clipped to 1. The built-in tiny models use
    configs/grpo-arithmetic.yaml."""
    run: RunConfig = field(default_factory=lambda: RunConfig(steps=1000, eval_every=100, save_every=500))
    """Steps (each: generate, reward, μ passes), seed, logging, evaluation and checkpoint cadence, device,
    dtype, threads, parallelism. Under parallel=fsdp the policy, its gradients and optimiser state and the
    reference are sharded, and every rank gathers the whole policy for sampling and scoring, so it must fit
    one device then (README, Scaling out)."""
    eval_size: int = 200
    """Held-out prompts per evaluation (greedy and one sample each: pass@1)."""
    eval_at_start: bool = True
    """Evaluate the starting policy before the first step."""
    trust_remote_code: bool = False
    """Run the model repository's own code (only for models you trust)."""

    CHECKS = {"max_prompt_length": ">= 1", "eval_size": ">= 0"}  # valid ranges (postrl.runtime.config)
    RENAMED = {"max_steps": "run.steps", "eval_prompts": "eval_size"} | {k: f"run.{k}" for k in RUN_KEYS}
