"""Will a run fit? An estimate of an LM stage's peak memory from its config, before any weight is loaded.

The model is built on torch's ``meta`` device from its ``config.json`` (exact parameter counts, tied weights
counted once, no memory), and the peak is summed from the parts a training step holds at once:

    weights          parameters × bytes of run.dtype (a second copy for a reference model, unless LoRA's
                     reference is the policy with adapters off, the stage has none, or DPO/KTO only store
                     its log-probs: eval_samples 0)
    gradients        trained parameters × their bytes (LoRA adapters: float32); with ``optim.step_in_backward``
                     (`postrl.lm.step_in_backward`) the largest that waits for its last part, a tied
                     output layer's [vocab, hidden]
    optimizer        AdamW: 2 moments float32 per trained parameter, plus a float32 master weight for
                     bfloat16 ones (`postrl.lm.master_adamw`); ``optim.master_weights=false``: 2 moments in
                     the weights' dtype, no master
    activations      one forward's rows × tokens × layers × the per-token, per-layer tensors a block saves
                     for its backward (Korthikanti et al. 2022, "Reducing Activation Recomputation", §4.1:
                     ≈ 8h + 3·kv + 4·ffn elements, plus 2·heads·tokens for eager attention's probabilities); rows
                     padded to the config's longest (a worst case: prompt and response at their limits);
                     with activation checkpointing, the blocks' inputs (h) plus one block's full set
    logits           the response tokens' [tokens, vocab] float32 logits, their log-softmax and gradient
                     (3 copies), or one chunk's (`run.memory.log_probs`: chunked)
    kv cache         GRPO's and PPO's sampling: rows × tokens × layers × 2·kv
    reward model     PPO: the frozen reward model's weights (its folder's shape)
    critic           PPO: its weights, gradients, optimizer state and activations (a copy of the reward model
                     or of the policy's trunk; nothing for a value head on the actor, critic=shared)

It is an estimate (allocator slack, the framework's own buffers, tokenizer and data are not counted):
`benchmarks/real_size.py` measures the peaks it predicts. `check_fits` refuses a config whose estimate
exceeds the memory available now, before the run folder is touched; ``--dry-run`` prints it and exits.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from postrl.lm.memory import LARGE_VOCAB
from postrl.runtime.errors import UserError

GiB = 1024**3
STAGES_WITH_REFERENCE = ("dpo", "kto", "grpo", "ppo")


@dataclass(frozen=True)
class Shape:
    """What the estimate needs of a model: its parameter count, its trained count and its dimensions."""

    params: int
    trained: int
    layers: int
    hidden: int
    kv: int
    ffn: int
    heads: int
    vocab: int
    eager: bool
    """Eager attention: the [heads, tokens, tokens] probabilities are saved (SDPA and flash kernels keep none)."""


@dataclass(frozen=True)
class Estimate:
    """Bytes of each part of a step's peak, and the total."""

    parts: dict[str, float]
    rows: int
    tokens: int

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    def describe(self) -> str:
        items = ", ".join(f"{k} {v / GiB:.2f}" for k, v in self.parts.items() if v)
        return f"{self.total / GiB:.2f} GiB ({items}; {self.rows} rows × at most {self.tokens} tokens per forward)"


def model_shape(path: str, lora: Any, trust_remote_code: bool = False) -> Shape:
    """`Shape` of the causal LM at ``path`` (its config only, built on the meta device)."""
    from transformers import AutoConfig, AutoModelForCausalLM  # deferred: transformers (seconds)

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    params = sum(p.numel() for p in model.parameters())
    text = getattr(config, "text_config", None) or config
    hidden, heads = text.hidden_size, text.num_attention_heads
    kv = (getattr(text, "num_key_value_heads", None) or heads) * getattr(text, "head_dim", hidden // heads)
    trained = params
    if lora.enabled:  # rank·(in + out) per Linear of the blocks (all-linear: the output layer excluded)
        blocks = model.get_decoder() if hasattr(model, "get_decoder") else model
        linears = [m for n, m in blocks.named_modules() if isinstance(m, torch.nn.Linear) and "layers" in n]
        trained = sum(lora.rank * (m.in_features + m.out_features) for m in linears)
    ffn = getattr(text, "intermediate_size", None) or 4 * hidden
    eager = getattr(model.config, "_attn_implementation", "eager") == "eager"
    return Shape(params, trained, text.num_hidden_layers, hidden, kv, ffn, heads, text.vocab_size, eager)


def _batch(stage: str, cfg: Any) -> tuple[int, int, int]:
    """(rows of one forward, tokens per row, response tokens per row) of a stage's config."""
    if stage in ("grpo", "ppo"):
        g = cfg.grpo if stage == "grpo" else cfg.ppo
        responses = g.prompts_per_step * g.group_size if stage == "grpo" else cfg.batch_size
        rows = -(-responses // (g.minibatches * g.grad_accum))
        T = cfg.sampling.max_new_tokens
        return rows, cfg.max_prompt_length + T, T
    train = cfg.train
    rows = -(-train.batch_size // train.grad_accum) * (2 if stage == "dpo" else 1)
    return rows, train.max_length, train.max_length


def _optimizer_bytes(wbytes: int, lora: bool, master: bool) -> int:
    """AdamW state per trained parameter: moments float32 and a float32 master for low-precision weights
    (`postrl.lm.master_adamw`); with ``optim.master_weights=false`` moments in the weights' dtype, no master;
    LoRA adapters are float32."""
    if lora or wbytes >= 4:
        return 8
    return 12 if master else 2 * wbytes


STEP_IN_BACKWARD_STAGES = ("sft", "dpo", "kto", "rm", "grpo")
"""The stages that run ``optim.step_in_backward`` (their recipes' ``one_backward``)."""


def _steps_in_backward(cfg: Any) -> bool:
    """``optim.step_in_backward`` of ``cfg`` (False where it has no ``optim``)."""
    return getattr(getattr(cfg, "optim", None), "step_in_backward", False)


def _gradient_elements(stage: str, cfg: Any, shape: Shape) -> int:
    """Gradient elements held at the peak: every trained parameter's, or with ``optim.step_in_backward`` (in
    a stage that runs it) the largest tensor's (an output layer's [vocab, hidden] gradient, whole at the start
    of the backward; a tied one then steps outside its embedded rows, `postrl.lm.step_in_backward`)."""
    if stage in STEP_IN_BACKWARD_STAGES and _steps_in_backward(cfg):
        return min(shape.trained, shape.vocab * shape.hidden)
    return shape.trained


def _master(cfg: Any) -> bool:
    """``optim.master_weights`` of ``cfg`` (True, the default, where it has no ``optim``)."""
    return getattr(getattr(cfg, "optim", None), "master_weights", True)


def _trained_bytes(shape: Shape, wbytes: int, lora: bool, master: bool) -> float:
    """Gradients and AdamW state of ``shape``'s trained parameters (`_optimizer_bytes`)."""
    return shape.trained * ((4 if lora else wbytes) + _optimizer_bytes(wbytes, lora, master))


def _ppo_roles(cfg: Any, policy: Shape, reward: Shape, wbytes: int, activations: float) -> dict[str, float]:
    """PPO-RLHF's roles beyond the actor and its reference (`postrl.lm.ppo.build.build_roles`): the frozen
    reward model's weights, and the critic's weights, gradients, AdamW state and activations (its forward and
    backward run beside the actor's, one loss); critic=reward_model copies the reward model, sft the policy's
    trunk, shared is a value head on the actor (nothing more)."""
    lora = cfg.run.lora.enabled
    scored = cfg.reward_model is not None and not cfg.rewards and cfg.env.id is None
    parts = {"reward model": float(reward.params * wbytes if scored else 0), "critic": 0.0}
    if cfg.critic != "shared":
        trunk = reward if cfg.critic == "reward_model" else policy
        master = cfg.critic_optim.master_weights
        parts["critic"] = trunk.params * wbytes + _trained_bytes(trunk, wbytes, lora, master) + activations
    return parts


def estimate(stage: str, cfg: Any, shape: Shape, reward_shape: Shape | None = None) -> Estimate:
    """The peak memory of one training step of ``stage`` under ``cfg`` for a model of ``shape`` (PPO: its
    reward model and critic of ``reward_shape``, by default the policy's)."""
    run, memory = cfg.run, cfg.run.memory
    wbytes = {"float32": 4, "bfloat16": 2, "float16": 2}.get(run.dtype, 4)
    lora = run.lora.enabled
    rows, L, T = _batch(stage, cfg)
    s = shape
    reference = stage in STAGES_WITH_REFERENCE and not lora and getattr(getattr(cfg, "grpo", None), "beta", 1)
    if stage == "ppo":  # LoRA's reference is the actor with its adapters off, unless ref_model names another
        reference = not lora or cfg.ref_model is not None
    if stage in ("dpo", "kto"):  # the reference's log-probs are stored before training; the model stays only
        reference = reference and cfg.eval_samples > 0  # for the held-out samples' KL (postrl.lm.reference)
    per_token = 8 * s.hidden + 3 * s.kv + 4 * s.ffn + (2 * s.heads * L if s.eager else 0)  # per token, layer
    if memory.gradient_checkpointing:
        activations = rows * L * (s.layers * s.hidden + per_token) * wbytes
    else:
        activations = rows * L * s.layers * per_token * wbytes
    chunked = memory.log_probs == "chunked" or (memory.log_probs == "auto" and s.vocab >= LARGE_VOCAB)
    logit_rows = min(memory.chunk_tokens, rows * T) if chunked else rows * T
    parts = {
        "weights": s.params * wbytes * (2 if reference else 1),
        "gradients": _gradient_elements(stage, cfg, s) * (4 if lora else wbytes),
        "optimizer": s.trained * _optimizer_bytes(wbytes, lora, _master(cfg)),
        "activations": activations,
        "logits": (2 if chunked else 3) * logit_rows * s.vocab * 4,  # chunked: logits, exp (chunked.py)
        "kv cache": rows * L * s.layers * 2 * s.kv * wbytes if stage in ("grpo", "ppo") else 0,
    }
    if stage == "ppo":
        parts |= _ppo_roles(cfg, s, reward_shape or s, wbytes, activations)
    return Estimate({k: float(v) for k, v in parts.items()}, rows, L)


def _levers(stage: str, cfg: Any, shape: Shape) -> list[str]:
    """The memory switches ``cfg`` has not set yet, as key=value overrides."""
    run, memory = cfg.run, cfg.run.memory
    chunked = memory.log_probs == "chunked" or (memory.log_probs == "auto" and shape.vocab >= LARGE_VOCAB)
    levers = {
        "run.memory.log_probs=chunked": not chunked,
        "run.memory.gradient_checkpointing=true": not memory.gradient_checkpointing,
        "run.lora.enabled=true": not run.lora.enabled,
        "run.dtype=bfloat16": run.dtype == "float32",
        "optim.master_weights=false": run.dtype != "float32"
        and not run.lora.enabled
        and _master(cfg)
        and hasattr(cfg, "optim"),
        "optim.step_in_backward=true optim.max_grad_norm=null": stage in STEP_IN_BACKWARD_STAGES
        and not run.lora.enabled
        and hasattr(cfg, "optim")
        and not _steps_in_backward(cfg),
    }
    return [lever for lever, open_ in levers.items() if open_] or ["a smaller model"]


def available_memory(device: str) -> tuple[float, str]:
    """(bytes free now, what) on ``device``: a GPU's free memory, else the host's MemAvailable."""
    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        free, _ = torch.cuda.mem_get_info(torch.device("cuda" if device == "auto" else device))
        return float(free), "free GPU memory"
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return float(info["MemAvailable"]), "available RAM"
    except (OSError, KeyError):
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), "RAM"


def check_fits(stage: str, cfg: Any, *, dry_run: bool = False) -> str | None:
    """The estimate's line for ``stage`` (None: a stage it does not cover). Raises `UserError` with the
    estimate when it exceeds the available memory and ``run.memory.check`` is on (or under ``dry_run``)."""
    if stage not in ("sft", "dpo", "kto", "grpo", "ppo") or not hasattr(cfg, "model"):
        return None
    remote = getattr(cfg, "trust_remote_code", False)
    try:
        shape = model_shape(str(cfg.model), cfg.run.lora, remote)
    except (OSError, ValueError) as err:
        if dry_run:
            raise UserError(f"model={cfg.model}: no config.json to estimate from ({err})") from None
        return None  # the loader says what is wrong with the model, as before
    reward_shape = None
    if stage == "ppo" and cfg.reward_model is not None:
        try:  # a *ForSequenceClassification folder: its trunk's shape (a tied LM head counted once)
            reward_shape = model_shape(str(cfg.reward_model), cfg.run.lora, remote)
        except (OSError, ValueError):
            reward_shape = None  # estimated as the policy's; the loader names a missing reward model
    est = estimate(stage, cfg, shape, reward_shape)
    free, what = available_memory(cfg.run.device)
    line = (
        f"estimated peak {est.describe()}; {what} {free / GiB:.2f} GiB ({shape.params / 1e6:.0f}M parameters)"
    )
    one_process = int(os.environ.get("WORLD_SIZE", "1")) == 1
    if est.total > free and (dry_run or (cfg.run.memory.check and one_process)):
        levers = ", ".join(_levers(stage, cfg, shape))
        raise UserError(
            f"this config would not fit: {line}. Lower the batch or lengths, or set {levers} "
            "(run.memory.check=false runs it anyway)"
        )
    return line
