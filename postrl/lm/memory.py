"""Memory switches of an LM run (``run.memory``): how response log-probs are computed, activation checkpointing.

`configure_memory` puts a loaded model under the run's settings: it records them on the model, where
`postrl.lm.rollout.forwards.response_forward` reads them when a trainer picks its forwards, and turns on the
model's activation checkpointing when asked. A model never configured runs with the defaults (``auto``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import torch

from postrl.lm.tiled_mlp import tile_mlps

log = logging.getLogger(__name__)

MEMORY_ATTRIBUTE = "postrl_memory"
"""The attribute of a configured model that holds its `MemoryConfig`."""

LARGE_VOCAB = 32768
"""``log_probs: auto`` chunks the output layer from this vocabulary size up (Llama 3, Qwen, SmolLM, Gemma);
below it the whole logits are small and the fused or shared-prefix forward is faster."""


@dataclass(frozen=True)
class MemoryConfig:
    """What an LM run keeps in memory: the logits of the response tokens, the activations of the blocks."""

    log_probs: Literal["auto", "chunked", "full"] = "auto"
    """How log π of the response tokens is computed: chunked (the output layer applied chunk_tokens positions
    at a time to the final hidden states, its backward recomputing them: never the [batch, tokens, vocab]
    logits; postrl.lm.rollout.chunked), full (the model's whole logits, then a log-softmax: the reference) or
    auto (chunked for a vocabulary of 32768 or more where the model allows it, the log says which ran)."""
    chunk_tokens: int = 64
    """Positions whose logits exist at once in the chunked path (memory ≈ 2 × chunk_tokens × vocab × 4 B: 78 MB
    at Qwen2.5's vocabulary; a chunk of 64 rows keeps the output layer's products large enough to run at full
    speed on a CPU)."""
    gradient_checkpointing: bool = False
    """Activation checkpointing: the transformer blocks keep only their inputs and recompute the rest in the
    backward (about a third more compute for a fraction of the activation memory; Chen et al. 2016)."""

    check: bool = True
    """Refuse, before the run folder is touched, a run whose estimated peak memory exceeds the memory available
    (postrl.lm.estimate; one process: under torchrun only --dry-run estimates)."""

    mlp_tile_tokens: int = 0
    """Token-tiled MLP blocks (`postrl.lm.tiled_mlp`): a Llama-family model's gated MLPs keep only their input
    for the backward and run it again this many tokens at a time, so one tile's [tokens, intermediate]
    tensors exist at once instead of the whole batch's (one more MLP forward per backward); a forward without
    gradients of more rows than a tile (a checkpointed block's first pass) runs tiled too. 0: off. Applies to
    the trained model's Hugging Face blocks (with it, postrl's own fast training forward gives way to them)."""

    release_freed_mb: int = 0
    """Give freed memory back to the operating system from blocks of this many MB up (glibc's malloc: its mmap
    and trim thresholds, `release_freed`), so the resident set follows what is alive instead of keeping the
    heap's high-water mark: a step's activations freed in a pattern that leaves holes stay resident otherwise
    (at 0.5B, GRPO's peak 0.2-0.3 GB lower at 2 MB). The price is page faults: such blocks are fresh pages at
    every allocation. 2 is the size from which torch's own allocations are huge pages (few faults: GRPO's step
    within noise of the step without the switch), 1 MB blocks fault a 4 KB page at a time (13% slower). 0: the
    allocator's own thresholds. Linux with glibc only (a warning elsewhere); the whole process."""

    CHECKS = {"chunk_tokens": ">= 1", "mlp_tile_tokens": ">= 0", "release_freed_mb": "[0, 32]"}


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
"""glibc's ``mallopt`` parameters (malloc.h)."""


def release_freed(mb: int) -> bool:
    """Set glibc malloc's mmap threshold (blocks of ``mb`` MB and up are mapped alone, and unmapped when freed)
    and trim threshold (free memory at the heap's top beyond ``mb`` MB is given back) for this process; the
    same as starting it with ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` set. False where the C
    library has no ``mallopt`` (macOS, musl) or refuses the value (glibc's mmap threshold is at most 32 MB)."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    size = int(mb) << 20
    return bool(mallopt(M_MMAP_THRESHOLD, size)) and bool(mallopt(M_TRIM_THRESHOLD, size))


def memory_settings(model: torch.nn.Module) -> MemoryConfig:
    """The `MemoryConfig` `configure_memory` recorded on ``model`` (or on the model it wraps), else the defaults."""
    for candidate in (model, getattr(model, "module", None), getattr(model, "policy", None)):
        settings = getattr(candidate, MEMORY_ATTRIBUTE, None) if candidate is not None else None
        if isinstance(settings, MemoryConfig):
            return settings
    return MemoryConfig()


def checkpointing_on(model: torch.nn.Module) -> bool:
    """Whether ``model``'s activation checkpointing is on (transformers 5's flag, else the older name)."""
    flag = getattr(model, "is_activation_checkpointing", None)
    return bool(getattr(model, "is_gradient_checkpointing", False) if flag is None else flag)


def configure_memory(
    model: torch.nn.Module, memory: MemoryConfig, *, trained: bool = True
) -> torch.nn.Module:
    """Record ``memory`` on ``model`` and, for a ``trained`` model when ``memory.gradient_checkpointing``, turn
    on its activation checkpointing (non-reentrant: frozen inputs, e.g. a LoRA base, still get gradients)."""
    object.__setattr__(model, MEMORY_ATTRIBUTE, memory)
    if trained and memory.release_freed_mb > 0:
        if release_freed(memory.release_freed_mb):
            log.info(
                "run.memory.release_freed_mb: freed blocks of %d MB and up go back to the system",
                memory.release_freed_mb,
            )
        else:
            log.warning("run.memory.release_freed_mb: this C library has no mallopt (not glibc); ignored")
    if trained and memory.mlp_tile_tokens > 0:
        blocks = tile_mlps(model, memory.mlp_tile_tokens)
        if blocks:
            log.info(
                "run.memory.mlp_tile_tokens: %d MLP blocks run %d tokens at a time",
                blocks,
                memory.mlp_tile_tokens,
            )
        else:
            log.warning(
                "run.memory.mlp_tile_tokens: %s has no gated MLP block; ignored", type(model).__name__
            )
    if trained and memory.gradient_checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        elif hasattr(model, "gradient_checkpointing_enable"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        else:
            log.warning(
                "run.memory.gradient_checkpointing: %s has no checkpointing; ignored", type(model).__name__
            )
            return model
        # transformers checkpoints a layer only in training mode, and from_pretrained returns eval mode: a
        # trainer that never calls train() (GRPO, PPO) kept every activation. Dropout stays as loaded (off
        # unless the run keeps it), so the mode changes nothing else.
        model.train()
        log.info("activation checkpointing on for %s", type(model).__name__)
    return model
