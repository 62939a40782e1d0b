"""The teacher-forced forward every LM loss passes through, chosen once when a trainer is built.

A `ResponseForward` has one method, ``logits(input_ids, attention_mask, prompt_len)`` → [B, T, V]: the logits
at positions P − 1 … P + T − 2 of a batch in the `postrl.lm.rollout.Rollout` layout ([B, P + T], prompts
left-padded), so that row b's t-th predicts its response token ``input_ids[b, P + t]``. It runs under the
caller's grad mode. Three implementations give the same logits and gradients to float32 rounding (tests/lm):

- `FullForward`: the model's own forward over every column (any causal LM; DDP, FSDP, checkpointing);
- `SharedPrefixForward`: the Hugging Face forward run on each distinct prompt once with a KV cache, every row
  given its prompt's cache by a gather (autograd flows through it, so the backward sums a group's gradients
  into the shared prompt), then only the T − 1 response tokens that are inputs. A GRPO group's G rows, or a
  DPO pair's chosen and rejected, spend one prompt forward instead of G or two;
- `FusedForward`: the same two passes through a fast decoder (`postrl.lm.rollout.decoders.FAST_DECODERS`:
  GPT-2 and Llama in float32), which skips the Hugging Face forward's per-call overhead (mask building, cache
  objects, module wrappers); a GRPO step spends a third less time in its forward and backward.

`response_forward` picks the fastest that is exact for a model and a use (with or without gradients) — the
trainer calls it when it builds, and its loss code then reads ``forward.logits(...)`` like the reference.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from postrl.lm.models import position_ids_from_mask
from postrl.lm.rollout.decoders import cache_argument, fast_decoder_class
from postrl.runtime import distributed as dist


class ResponseForward(Protocol):
    """Logits of the response positions; see the module docstring."""

    def logits(self, input_ids: Tensor, attention_mask: Tensor, prompt_len: int) -> Tensor: ...


def distinct_prompts(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Left-padded prompts ids, mask [B, P] → (distinct ids [U, P], their mask [U, P], row → distinct [B])."""
    P = ids.shape[1]
    unique, inverse = torch.unique(torch.cat((ids, mask.to(ids.dtype)), dim=1), dim=0, return_inverse=True)
    return unique[:, :P], unique[:, P:].to(mask.dtype), inverse


def _keep_kwarg(model: torch.nn.Module) -> str | None:
    return "logits_to_keep" if "logits_to_keep" in inspect.signature(model.forward).parameters else None


@dataclass
class FullForward:
    """One forward of the model over all P + T columns; logits kept for the last T + 1 positions only."""

    model: torch.nn.Module

    def __post_init__(self) -> None:
        self.keep = _keep_kwarg(self.model)

    def logits(self, input_ids: Tensor, attention_mask: Tensor, prompt_len: int) -> Tensor:
        T = input_ids.shape[1] - prompt_len
        keep = {self.keep: T + 1} if self.keep else {}
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask), use_cache=False, **keep,
        )  # fmt: skip
        return out.logits[:, -(T + 1) : -1]


@dataclass
class SharedPrefixForward:
    """Each distinct prompt through the Hugging Face forward once, its KV cache gathered to the rows that share
    it, then the response tokens on top (a batch whose prompts are all distinct takes one full forward)."""

    model: torch.nn.Module

    def __post_init__(self) -> None:
        self.full = FullForward(self.model)
        self.cache_kw = cache_argument(self.model)

    def logits(self, input_ids: Tensor, attention_mask: Tensor, prompt_len: int) -> Tensor:
        P, T = prompt_len, input_ids.shape[1] - prompt_len
        ids, mask, inverse = distinct_prompts(input_ids[:, :P], attention_mask[:, :P])
        if ids.shape[0] == input_ids.shape[0]:
            return self.full.logits(input_ids, attention_mask, P)
        keep = {self.full.keep: 1} if self.full.keep else {}
        head = self.model(
            input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=True, **keep
        )  # fmt: skip
        first = head.logits[inverse, -1:]  # (B, 1, V): position P − 1 predicts response token 0
        if T == 1:
            return first
        cache = getattr(head, "cache", None) or head.past_key_values
        cache.batch_select_indices(inverse)  # every row gets its prompt's keys and values (differentiable)
        positions = position_ids_from_mask(attention_mask)
        tail = self.model(
            input_ids=input_ids[:, P:-1], attention_mask=attention_mask[:, :-1], position_ids=positions[:, P:-1],
            use_cache=True, **{self.cache_kw: cache},
        )  # fmt: skip
        return torch.cat((first, tail.logits), dim=1)  # (B, T, V)


@dataclass
class FusedForward:
    """The shared-prefix passes through a fast decoder. A decoder folds the current weights into its own
    tensors under the caller's grad mode, so one is made per call; the model's parameters must be whole
    (an FSDP model: inside `postrl.runtime.distributed.gathered`)."""

    model: torch.nn.Module
    decoder_class: Any

    def logits(self, input_ids: Tensor, attention_mask: Tensor, prompt_len: int) -> Tensor:
        P = prompt_len
        ids, mask, inverse = distinct_prompts(input_ids[:, :P], attention_mask[:, :P])
        shared = ids.shape[0] < input_ids.shape[0]
        if not shared:  # every prompt distinct: no gather
            ids, mask = input_ids[:, :P], attention_mask[:, :P]
        decoder = self.decoder_class(self.model, checked=True)
        first = decoder.prefill(ids, mask, position_ids_from_mask(mask), input_ids.shape[1])  # (U, V)
        if shared:
            first = first[inverse]
            decoder.select_rows(inverse)
        if input_ids.shape[1] == P + 1:
            return first[:, None]
        return torch.cat((first[:, None], decoder.extend(input_ids[:, P:-1])), dim=1)  # (B, T, V)


def _checkpointing(model: torch.nn.Module) -> bool:
    flag = getattr(model, "is_activation_checkpointing", None)
    return bool(getattr(model, "is_gradient_checkpointing", False) if flag is None else flag)


def response_forward(
    model: torch.nn.Module, use_fast: bool | None = None, *, gradients: bool = True, gathered: bool = False
) -> ResponseForward:
    """The forward a trainer uses for ``model``. ``gradients``: whether a loss backpropagates through it (False:
    reference and old log-probs under ``torch.no_grad``). ``use_fast``: `postrl.lm.rollout.SamplingConfig.
    use_fast` (None: a fast decoder where one runs the model; False: never). ``gathered``: the caller runs it
    inside `postrl.runtime.distributed.gathered`, where an FSDP model's weights are whole.

    A fast decoder reads whole weights and does not checkpoint: it is taken without gradients on any model it
    supports whose weights are whole when it runs, and with gradients only on a plain module without
    activation checkpointing. The shared prefix needs the model's own KV cache and one forward per backward:
    not under DDP or FSDP (every rank must run the same forwards) nor with checkpointing (the blocks drop the
    cache). Otherwise the full forward.
    """
    sharded = dist.is_sharded(model)
    checkpointing = _checkpointing(model)
    decoder = None if use_fast is False else fast_decoder_class(model)
    whole = not sharded or (gathered and not gradients)
    if decoder is not None and whole and not (gradients and checkpointing):
        return FusedForward(model, decoder)
    ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
    if ddp or sharded or checkpointing or cache_argument(model) is None:
        return FullForward(model)
    return SharedPrefixForward(model)
