"""Teacher-forced forwards that run each distinct prompt once: a GRPO group's G responses share their prompt.

A batch in the rollout layout, ``[B, P + T]``, whose B rows hold only U < B distinct prompts (GRPO: U = B / G)
spends P / (P + T) of a plain forward on prompt tokens that are identical across a group. `response_logits`
runs the U distinct prompts once with a KV cache, gives every row its prompt's cache (a gather: autograd flows
through it, so the backward sums a group's gradients into the shared prompt), and runs only the T − 1 response
tokens that are inputs on top. The logits equal the full forward's to float32 rounding (tests/lm). vLLM's
prefix caching does the same for generation; `postrl.lm.rollout.generate` prefills distinct prompts once too.

Where a fast decoder runs the model (`decoders.fast_decoder`: GPT-2 and Llama in float32) the same
two passes go through it instead of the Hugging Face forward, with or without gradients: on short sequences the
HF forward is mostly per-call overhead (mask building, cache objects, module wrappers), and a GRPO training
step on the TRL benchmark task spends a third less time in its forward and backward. Its parameters must be
whole tensors (not FSDP shards outside `postrl.runtime.distributed.gathered`), and gradient checkpointing
keeps the HF forward.

Only for a plain Hugging Face causal LM: under DDP (one forward per backward), FSDP (every rank must run the same
forwards, and one rank's batch may need only the first), gradient checkpointing (the blocks drop the cache) or a
model without a cache, the full forward runs instead.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor

from postrl.lm.models import position_ids_from_mask
from postrl.lm.rollout.decoders import cache_argument, fast_decoder
from postrl.runtime import distributed as dist


def distinct_prompts(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Left-padded prompts ids, mask [B, P] → (distinct ids [U, P], their mask [U, P], row → distinct [B])."""
    P = ids.shape[1]
    unique, inverse = torch.unique(torch.cat((ids, mask.to(ids.dtype)), dim=1), dim=0, return_inverse=True)
    return unique[:, :P], unique[:, P:].to(mask.dtype), inverse


def _checkpointing(model: torch.nn.Module) -> bool:
    if not model.training:  # first: HF's flags are properties that walk every module
        return False
    flag = getattr(model, "is_activation_checkpointing", None)
    return bool(getattr(model, "is_gradient_checkpointing", False) if flag is None else flag)


def _shares(model: torch.nn.Module) -> bool:
    ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel) or dist.is_sharded(model)
    return not ddp and not _checkpointing(model) and cache_argument(model) is not None


def _fast(model: torch.nn.Module) -> Any | None:
    """A fast decoder for ``model`` when one supports it, its parameters are whole and, with gradients on,
    no checkpointing is asked for; else None."""
    if torch.is_grad_enabled() and _checkpointing(model):
        return None
    if not dist.whole_tensors(model.parameters()):  # FSDP shards: the decoders read whole weights
        return None
    return fast_decoder(model)


def _fast_response_logits(
    decoder: Any, input_ids: Tensor, attention_mask: Tensor, prompts: tuple[Tensor, Tensor, Tensor]
) -> Tensor:
    """`response_logits` through a fast decoder: the distinct ``prompts`` (`distinct_prompts`) prefilled, every
    row given its prompt's cache, then the T − 1 response tokens that are inputs in one `extend`."""
    ids, mask, inverse = prompts
    P = ids.shape[1]
    shared = ids.shape[0] < input_ids.shape[0]
    if not shared:  # every prompt distinct: no gather
        ids, mask = input_ids[:, :P], attention_mask[:, :P]
    first = decoder.prefill(ids, mask, position_ids_from_mask(mask), input_ids.shape[1])  # (U, V)
    if shared:
        first = first[inverse]
        decoder.select_rows(inverse)
    if input_ids.shape[1] == P + 1:
        return first[:, None]
    return torch.cat((first[:, None], decoder.extend(input_ids[:, P:-1])), dim=1)  # (B, T, V)


def response_logits(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    prompt_len: int,
    use_fast: bool | None = None,
) -> Tensor:
    """Logits [B, T, V] at positions P − 1 … P + T − 2: row b's t-th predicts its response token
    ``input_ids[b, P + t]``. input_ids, attention_mask: [B, P + T] in the `postrl.lm.rollout.Rollout` layout.
    Runs under the caller's grad mode. ``use_fast=False`` keeps the Hugging Face forward (None: a fast decoder
    where one runs the model)."""
    P, T = prompt_len, input_ids.shape[1] - prompt_len
    ids, mask, inverse = distinct_prompts(input_ids[:, :P], attention_mask[:, :P])
    decoder = None if use_fast is False else _fast(model)
    if decoder is not None:
        return _fast_response_logits(decoder, input_ids, attention_mask, (ids, mask, inverse))
    positions = position_ids_from_mask(attention_mask)
    takes_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
    keep = (lambda n: {"logits_to_keep": n}) if takes_keep else (lambda n: {})
    if ids.shape[0] == input_ids.shape[0] or not _shares(model):
        out = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False,
            **keep(T + 1),
        )  # fmt: skip
        return out.logits[:, -(T + 1) : -1]
    key = cache_argument(model)
    head = model(
        input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=True, **keep(1)
    )  # fmt: skip
    first = head.logits[inverse, -1:]  # (B, 1, V): position P − 1 predicts response token 0
    if T == 1:
        return first
    cache = getattr(head, "cache", None) or head.past_key_values
    cache.batch_select_indices(inverse)  # every row gets its prompt's keys and values (differentiable)
    tail = model(
        input_ids=input_ids[:, P:-1], attention_mask=attention_mask[:, :-1], position_ids=positions[:, P:-1],
        use_cache=True, **{key: cache},
    )  # fmt: skip
    return torch.cat((first, tail.logits), dim=1)  # (B, T, V)
