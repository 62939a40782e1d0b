"""Teacher-forced scoring of responses in the `Rollout` layout: log π_τ of each response token, and values.

`score` with the sampling temperature reproduces the log-probs `generate` recorded; a plain causal LM runs each
distinct prompt once (`postrl.lm.rollout.forwards`). `score_values` reads a critic's values at the states
before each response token.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel

from postrl.lm.models import position_ids_from_mask
from postrl.lm.rollout.forwards import ResponseForward, forward_log_probs, response_forward
from postrl.lm.rollout.sampling import token_log_probs

ValueFn = Callable[[Tensor], Tensor]


def _forward_full(
    model: torch.nn.Module, ids: Tensor, mask: Tensor, keep: int, value_fn: ValueFn | None
) -> tuple[Tensor, Tensor | None]:
    """Teacher-forced forward of one chunk → (logits of the last ``keep`` positions [b, keep, V],
    values [b, L] or None). A model returning ``(logits, values)`` (e.g. `postrl.lm.models.
    PolicyWithValueHead`) gives its own values; otherwise ``value_fn`` maps final hidden states to values."""
    params = inspect.signature(model.forward).parameters
    kwargs: dict[str, Any] = {"position_ids": position_ids_from_mask(mask)}
    if "logits_to_keep" in params:
        kwargs["logits_to_keep"] = keep
    if "use_cache" in params:
        kwargs["use_cache"] = False
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if value_fn is not None and ("output_hidden_states" in params or takes_kwargs):
        kwargs["output_hidden_states"] = True
    out = model(input_ids=ids, attention_mask=mask, **kwargs)
    if isinstance(out, tuple):
        return out[0][:, -keep:], out[1]
    if isinstance(out, Tensor) or not hasattr(out, "logits"):
        raise TypeError(
            f"score needs a model with logits; {type(model).__name__} returned {type(out).__name__}"
        )
    values = None if value_fn is None else value_fn(out.hidden_states[-1])  # (b, L) or (b, L, 1)
    return out.logits[:, -keep:], values


def response_log_probs(
    forward: ResponseForward,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_start: int,
    *,
    temperature: float = 1.0,
    chunk_size: int = 64,
) -> Tensor:
    """Teacher-forced log π_τ [B, T] float32 of the response tokens ``input_ids[:, response_start:]`` through a
    chosen ``forward`` (`postrl.lm.rollout.forwards`), ``chunk_size`` rows at a time; masked positions 0.
    Runs under the caller's grad mode."""
    P = response_start
    chunks = [
        forward_log_probs(forward, input_ids[rows], attention_mask[rows], P, temperature)[0]
        for rows in torch.split(torch.arange(input_ids.shape[0], device=input_ids.device), chunk_size)
    ]  # each (b, T)
    return torch.cat(chunks) * attention_mask[:, P:].to(torch.float32)


def score(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_start: int,
    *,
    temperature: float = 1.0,
    chunk_size: int = 64,
    value_fn: ValueFn | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Teacher-forced log π_τ of the response tokens ``input_ids[:, response_start:]`` → [B, T] float32.

    input_ids, attention_mask: [B, P + T] in the `Rollout` layout; rows run ``chunk_size`` at a time. Masked
    response positions get 0. Runs under the caller's grad mode (wrap in ``torch.no_grad()`` for reference or
    old log-probs). A plain causal LM runs through the forward `response_forward` picks for it (a trainer that
    scores every step chooses its forward once and calls `response_log_probs`). With ``value_fn`` (final
    hidden states [b, L, d] → values [b, L] or [b, L, 1]), or for a model that returns ``(logits, values)``,
    returns ``(log_probs, values)``, values [B, T] float32 being V of the state before each response token:
    positions ``P − 1 … P + T − 2``.
    """
    P = response_start
    if value_fn is None and isinstance(model, PreTrainedModel):  # a plain causal LM
        forward = response_forward(model, gradients=torch.is_grad_enabled())
        return response_log_probs(
            forward, input_ids, attention_mask, P, temperature=temperature, chunk_size=chunk_size
        )
    T = input_ids.shape[1] - P
    chunks_lp, chunks_v = [], []
    for rows in torch.split(torch.arange(input_ids.shape[0], device=input_ids.device), chunk_size):
        ids, mask = input_ids[rows], attention_mask[rows]
        logits, values = _forward_full(model, ids, mask, T + 1, value_fn)  # (b, T + 1, V)
        chunks_lp.append(token_log_probs(logits[:, :-1], ids[:, P:], temperature))  # (b, T)
        if values is not None:
            chunks_v.append(values.reshape(*values.shape[:2]).float()[:, P - 1 : -1])  # (b, T)
    response_mask = attention_mask[:, P:].to(torch.float32)
    log_probs = torch.cat(chunks_lp) * response_mask
    if not chunks_v:
        return log_probs
    return log_probs, torch.cat(chunks_v) * response_mask


def score_values(
    critic: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_start: int,
    chunk_size: int = 64,
) -> Tensor:
    """Values [B, T] from a critic whose forward maps (input_ids, attention_mask) to values [b, L]
    (e.g. `postrl.lm.models.ScalarHeadModel`): V of the state before each response token, 0 where masked."""
    P = response_start
    chunks = []
    for rows in torch.split(torch.arange(input_ids.shape[0], device=input_ids.device), chunk_size):
        mask = attention_mask[rows]
        values = critic(input_ids[rows], mask, position_ids_from_mask(mask))  # (b, L)
        chunks.append(values.float()[:, P - 1 : -1])  # (b, T)
    return torch.cat(chunks) * attention_mask[:, P:].to(torch.float32)
