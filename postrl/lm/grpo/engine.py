"""The policy's side of a GRPO step, injected into the one GRPO trainer (`postrl.lm.grpo.rollouts`): how its
prompts are sampled, how the samples are scored teacher-forced, and the forward the loss differentiates.

A `GRPOEngine` is chosen once when a run is built: `TextEngine` for a causal LM (postrl's rollout engine and
the forwards of `postrl.lm.rollout.forwards`), `postrl.lm.vlm.grpo.VLMEngine` for a vision-language model (its
pictures travel with each row as `Sampled.inputs`). Everything else of a step (rewards, dynamic sampling,
advantages, the update, evaluation, checkpoints) is the trainer's, the same for both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from postrl.lm.grpo.objective import PolicyForward, text_policy
from postrl.lm.rollout import (
    Rollout,
    RolloutEngine,
    SamplingConfig,
    left_pad,
    response_forward,
    response_log_probs,
)
from postrl.lm.rollout.decoders import fast_decoder_class
from postrl.lm.rollout.packed_forward import PackedForward
from postrl.lm.rollout.vllm_engine import VLLMSampler
from postrl.lm.rollout.vllm_server import VLLMServerSampler
from postrl.lm.tasks.base import stable_hash
from postrl.runtime import distributed as dist

log = logging.getLogger(__name__)


@dataclass
class Prompts:
    """Prompt rows (with all their columns) and their token ids."""

    rows: list[dict[str, Any]]
    ids: list[list[int]]


@dataclass
class Sampled:
    """Responses sampled for some prompts, each prompt's ``repeat`` responses in a row."""

    rollout: Rollout
    rows: list[dict[str, Any]]
    """each response's data row: the reward functions' prompts and columns"""
    texts: list[str]
    """each response decoded (a chat model's: as the reward functions read it)"""
    inputs: Any = None
    """per-row model inputs besides the tokens (a VLM's pictures) that scoring and the loss need; None: none"""
    terms: dict[str, torch.Tensor] | None = None
    """each reward function's terms, when the sampler computed them (the generation lane: lanes.rewards); None:
    the trainer calls the functions"""


def sampling_seed(seed: int, key: tuple) -> int:
    """The seed of a sampling generator: a function of the run's seed and what is sampled (`GRPOEngine`'s key)."""
    return stable_hash(":".join(str(p) for p in (seed, *key))) % 2**63


def sample_prompts(
    model: torch.nn.Module,
    tokenizer: Any,
    sampling: SamplingConfig,
    prompt_ids: list[list[int]],
    indices: list[int],
    repeat: int,
    seed: int,
    device: torch.device,
) -> tuple[Rollout, list[str]]:
    """``repeat`` responses to each prompt ``prompt_ids[i]``, i in ``indices`` (in a row), sampled by ``model``
    (in eval mode, put back as it was) with a generator seeded by ``seed``; the rollout and its decoded texts.
    The one sampling path of the trainer's process and of the generation lane (`postrl.lm.grpo.lanes`)."""
    ids, mask = left_pad([prompt_ids[i] for i in indices for _ in range(repeat)], tokenizer.pad_token_id)
    generator = torch.Generator(device=device).manual_seed(seed)
    # a fast decoder computes the eval-mode forward whatever the modules' flags (it refuses a model whose
    # dropout is active), so the train()/eval() walk over every module is needed only for the HF forward
    switch = model.training and (sampling.use_fast is False or fast_decoder_class(model) is None)
    if switch:
        model.eval()
    engine = RolloutEngine(model, tokenizer, sampling)
    rollout = engine.sample(ids.to(device), mask.to(device), generator)
    if switch:
        model.train()
    return rollout, engine.decode(rollout)


class GRPOEngine(Protocol):
    """What the GRPO trainer asks of its policy. ``split``: "train" or "heldout"; ``key``: what seeds the
    sampling generator, ("train", step, rank, round) or ("eval", first prompt index)."""

    hidden_columns: Sequence[str]
    """data columns the reward functions do not get as keyword arguments"""

    def prompt_count(self, split: str) -> int: ...

    def sample(
        self, split: str, indices: list[int], repeat: int, sampling: SamplingConfig, key: tuple
    ) -> Sampled: ...

    def log_probs(self, which: str, rollout: Rollout, inputs: Any) -> Tensor:
        """Teacher-forced log π_τ [B, T] of the rollout's responses without gradients: ``which`` "old" (the
        policy) or "ref" (the frozen reference)."""
        ...

    def policy(self, inputs: Any, n: int) -> PolicyForward:
        """The loss's forward on rows of a step's batch of ``n`` rows (with ``inputs``, found by row_ids)."""
        ...

    def write_files(self) -> Callable[[Path], None] | None:
        """What a checkpoint folder gets besides the weights (None: nothing)."""
        ...

    def accuracy_breakdown(self, accuracy: Tensor) -> dict[str, float]:
        """Held-out greedy accuracy [N] (in prompt order) split by the prompts' kind, where they have one."""
        ...


class TextEngine:
    """A causal LM: postrl's rollout engine samples, and the teacher-forced forwards are chosen here, once
    (`postrl.lm.rollout.forwards.response_forward`): ``forward`` the loss's, ``old_forward`` and
    ``ref_forward`` the scoring's (no gradients, inside `dist.gathered`)."""

    hidden_columns: Sequence[str] = ("prompt",)

    def __init__(
        self,
        cfg: Any,
        policy: torch.nn.Module,
        ref: torch.nn.Module | None,
        tokenizer: Any,
        train: Prompts,
        heldout: Prompts,
        device: torch.device,
    ) -> None:
        self.cfg, self.policy_module, self.ref, self.tokenizer = cfg, policy, ref, tokenizer
        self.prompts = {"train": train, "heldout": heldout}
        self.device = device
        use_fast = cfg.sampling.use_fast
        # sampled responses are right-padded: the padding-free forward where it runs
        self.forward = response_forward(policy, use_fast, padding_free=True)
        self.old_forward = response_forward(
            dist.unwrap(policy), use_fast, gradients=False, gathered=True, padding_free=True
        )
        self.ref_forward = None
        if ref is not None:
            self.ref_forward = response_forward(
                ref, use_fast, gradients=False, gathered=True, padding_free=True
            )
        packed = isinstance(self.forward, PackedForward)
        log.info(  # as SFT and DPO say which forward they took (postrl --verbose)
            "grpo: the loss runs %s%s", type(self.forward).__name__,
            " (padding-free: the sampled tokens only, each prompt once)" if packed else "",
        )  # fmt: skip

    @property
    def heldout(self) -> Prompts:
        return self.prompts["heldout"]

    def prompt_count(self, split: str) -> int:
        return len(self.prompts[split].rows)

    def sample(
        self, split: str, indices: list[int], repeat: int, sampling: SamplingConfig, key: tuple
    ) -> Sampled:
        prompts = self.prompts[split]
        rows = [prompts.rows[i] for i in indices for _ in range(repeat)]
        # the decoders read whole weights; ranks decode different counts
        with dist.gathered(self.policy_module):
            rollout, texts = sample_prompts(
                dist.unwrap(self.policy_module), self.tokenizer, sampling, prompts.ids, indices, repeat,
                sampling_seed(self.cfg.run.seed, key), self.device,
            )  # fmt: skip
        return Sampled(rollout, rows, texts)

    def log_probs(self, which: str, rollout: Rollout, inputs: Any) -> Tensor:
        model, forward = (
            (self.policy_module, self.old_forward) if which == "old" else (self.ref, self.ref_forward)
        )
        with dist.gathered(model):  # (FSDP: each rank scores its own rows, whole weights)
            return response_log_probs(
                forward, rollout.input_ids, rollout.attention_mask, rollout.prompt_len,
                temperature=self.cfg.sampling.temperature,
            )  # fmt: skip

    def policy(self, inputs: Any, n: int) -> PolicyForward:
        return text_policy(self.forward, self.cfg.sampling.temperature)

    def write_files(self) -> Callable[[Path], None] | None:
        return None

    def accuracy_breakdown(self, accuracy: Tensor) -> dict[str, float]:
        return {}


def vllm_options(cfg: Any, dtype: torch.dtype) -> dict[str, Any]:
    """`postrl.lm.rollout.vllm_engine.VLLMSampler`'s arguments for a run (besides the tokenizer): vLLM loads the
    starting model's folder (the policy's weights are pushed before it first samples), in sampling.vllm_dtype
    (auto: the policy's ``dtype``)."""
    s = cfg.sampling
    dtype = dtype if s.vllm_dtype == "auto" else getattr(torch, s.vllm_dtype)
    return {
        "model_dir": cfg.model, "dtype": dtype, "max_model_len": cfg.max_prompt_length + s.max_new_tokens,
        "kv_cache_gib": s.vllm_kv_cache_gib, "gpu_memory_utilization": s.vllm_gpu_memory_utilization,
        "seed": cfg.run.seed, "mode": s.vllm_mode, "url": s.vllm_url, "timeout": s.vllm_timeout,
    }  # fmt: skip


def make_vllm_sampler(tokenizer: Any, options: dict[str, Any]) -> VLLMSampler | VLLMServerSampler:
    """The sampler of `vllm_options` ``options``: a colocated `VLLMSampler` (mode colocate) or a
    `VLLMServerSampler` (mode server: the server at ``url``, else one it launches)."""
    options = dict(options)
    mode, url, timeout = options.pop("mode"), options.pop("url"), options.pop("timeout")
    if mode == "server":
        return VLLMServerSampler(tokenizer, url=url, timeout=timeout, **options)
    return VLLMSampler(tokenizer=tokenizer, **options)


def vllm_sample(
    sampler: Any, model: torch.nn.Module, tokenizer: Any, sampling: SamplingConfig, prompt_ids: list[list[int]],
    indices: list[int], repeat: int, seed: int, device: torch.device,
) -> tuple[Rollout, list[str]]:  # fmt: skip
    """`sample_prompts` by a `VLLMSampler` (whose weights are ``model``'s): the rollout and its decoded texts."""
    rollout = sampler.sample([prompt_ids[i] for i in indices], repeat, sampling, seed, device)
    return rollout, RolloutEngine(model, tokenizer).decode(rollout)


class VLLMEngine(TextEngine):
    """A causal LM sampled by vLLM in this process (sampling.engine=vllm, `postrl.lm.rollout.vllm_engine`);
    scoring and the loss are the text engine's. vLLM holds its own copy of the weights: the trainer calls
    `weights_changed` after every optimiser step (an optimiser hook), and the next sampling pushes the policy's
    weights first (so a step with several optimiser steps pushes once, and a resumed run pushes the loaded
    weights before it samples)."""

    def __init__(self, cfg: Any, policy: torch.nn.Module, *args: Any, sampler: Any) -> None:
        super().__init__(cfg, policy, *args)
        self.sampler, self.stale = sampler, True
        self.push_seconds, self.pushes = 0.0, 0

    def weights_changed(self) -> None:
        self.stale = True

    def close(self) -> None:
        """Release the sampler (a launched vLLM server stops)."""
        self.sampler.close()

    def sample(
        self, split: str, indices: list[int], repeat: int, sampling: SamplingConfig, key: tuple
    ) -> Sampled:
        model = dist.unwrap(self.policy_module)
        if self.stale:
            self.push_seconds += self.sampler.push(model)
            self.pushes, self.stale = self.pushes + 1, False
        prompts = self.prompts[split]
        rollout, texts = vllm_sample(
            self.sampler, model, self.tokenizer, sampling, prompts.ids, indices, repeat,
            sampling_seed(self.cfg.run.seed, key), self.device,
        )  # fmt: skip
        return Sampled(rollout, [prompts.rows[i] for i in indices for _ in range(repeat)], texts)
