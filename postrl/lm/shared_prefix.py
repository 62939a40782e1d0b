"""Teacher-forced forwards that run each distinct prompt once: a GRPO group's G responses share their prompt.

A batch in the rollout layout, ``[B, P + T]``, whose B rows hold only U < B distinct prompts (GRPO: U = B / G)
spends P / (P + T) of a plain forward on prompt tokens that are identical across a group. `response_logits`
runs the U distinct prompts once with a KV cache, gives every row its prompt's cache (a gather: autograd flows
through it, so the backward sums a group's gradients into the shared prompt), and runs only the T − 1 response
tokens that are inputs on top. The logits equal the full forward's to float32 rounding (tests/lm). vLLM's
prefix caching does the same for generation; `postrl.lm.rollout.generate` prefills distinct prompts once too.

Only for a plain Hugging Face causal LM: under DDP (one forward per backward), FSDP (every rank must run the same
forwards, and one rank's batch may need only the first), gradient checkpointing (the blocks drop the cache) or a
model without a cache, the full forward runs instead.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor

from postrl.lm.models import position_ids_from_mask
from postrl.runtime import distributed as dist


def cache_argument(model: torch.nn.Module) -> str | None:
    """The forward's KV-cache keyword: transformers 5 renamed ``past_key_values`` to ``cache``; None: neither."""
    params = inspect.signature(model.forward).parameters
    return next((name for name in ("cache", "past_key_values") if name in params), None)


def distinct_prompts(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Left-padded prompts ids, mask [B, P] → (distinct ids [U, P], their mask [U, P], row → distinct [B])."""
    P = ids.shape[1]
    unique, inverse = torch.unique(torch.cat((ids, mask.to(ids.dtype)), dim=1), dim=0, return_inverse=True)
    return unique[:, :P], unique[:, P:].to(mask.dtype), inverse


def _shares(model: torch.nn.Module) -> bool:
    ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel) or dist.is_sharded(model)
    flag = (
        "is_activation_checkpointing"
        if hasattr(model, "is_activation_checkpointing")
        else "is_gradient_checkpointing"
    )
    checkpointing = getattr(model, flag, False) and model.training
    return not ddp and not checkpointing and cache_argument(model) is not None


def response_logits(
    model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, prompt_len: int
) -> Tensor:
    """Logits [B, T, V] at positions P − 1 … P + T − 2: row b's t-th predicts its response token
    ``input_ids[b, P + t]``. input_ids, attention_mask: [B, P + T] in the `postrl.lm.rollout.Rollout` layout.
    Runs under the caller's grad mode."""
    P, T = prompt_len, input_ids.shape[1] - prompt_len
    positions = position_ids_from_mask(attention_mask)
    ids, mask, inverse = distinct_prompts(input_ids[:, :P], attention_mask[:, :P])
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
