"""The processor's outputs besides the token ids: everything a model's forward needs with its pictures.

Processors return more than ``pixel_values``: LLaVA-Next its ``image_sizes``, Mllama ``aspect_ratio_ids``,
``aspect_ratio_mask`` and a ``cross_attention_mask`` per token, Gemma 3 and PaliGemma ``token_type_ids`` per
token, Idefics3 a ``pixel_attention_mask``. postrl keeps them all (``labels`` aside) and passes them to every
forward, sampling and teacher-forced scoring alike, so the log-probs are the model's own.

Two kinds, told apart by shape:

- per token: ``[B, P, ...]``, one entry per prompt token (an integer tensor whose second dimension is the
  prompt's length). Left-padded with the prompt (0 at padding), and continued over the response tokens as
  transformers' ``generate`` continues them (`response_columns`).
- per row or per picture: ``[B · n, ...]`` (n = 1 per row, or the pictures of each row, in row order).
  Padded with zeros to a common shape (what the processors do in a batch: LLaVA-Next's and Idefics3's
  patches, Mllama's pictures and tiles), then concatenated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

NOT_INPUTS = ("input_ids", "attention_mask", "labels")
"""processor outputs that are not picture inputs: the ids and mask travel on their own, labels are SFT's"""

RESPONSE_VALUES = {("paligemma", "token_type_ids"): 1}
"""per-token inputs whose value on generated tokens is fixed by the model rather than the prompt's last
column: PaliGemma's generated tokens are its causal suffix, 1 (its ``_update_model_kwargs_for_generation``;
0 would put the response in the bidirectional prefix and let it see the tokens it predicts)"""


def picture_inputs(encoded: Any) -> dict[str, Tensor]:
    """The processor's tensors for one row, without ids, mask and labels."""
    return {k: v for k, v in encoded.items() if k not in NOT_INPUTS and isinstance(v, Tensor)}


def is_per_token(value: Tensor, prompt_len: int, rows: int) -> bool:
    """Whether ``value`` holds one entry per prompt token: [rows, prompt_len, ...], integer."""
    return (
        value.dim() >= 2
        and tuple(value.shape[:2]) == (rows, prompt_len)
        and not (value.is_floating_point() or value.is_complex())
    )


def _pad_to(value: Tensor, shape: Sequence[int], left_dim: int | None) -> Tensor:
    """``value`` zero-padded to ``shape`` (all dims but the first): on the left along ``left_dim``, else on
    the right."""
    pad: list[int] = []
    for dim in reversed(range(1, value.dim())):
        extra = shape[dim] - value.shape[dim]
        pad += [extra, 0] if dim == left_dim else [0, extra]
    return F.pad(value, pad) if any(pad) else value


def collate_inputs(
    per_row: Sequence[dict[str, Tensor]], prompt_lens: Sequence[int], P: int
) -> dict[str, Tensor]:
    """Each row's `picture_inputs` (as the processor gave them for that row alone) → one batch: per-token
    tensors left-padded to the prompt width P [B, P, ...], the others zero-padded to a common shape and
    concatenated [Σ n, ...] in row order."""
    out = {}
    for key in per_row[0]:
        values = [row[key] for row in per_row]
        per_token = all(is_per_token(v, n, 1) for v, n in zip(values, prompt_lens, strict=True))
        shape = [max(v.shape[d] for v in values) for d in range(values[0].dim())]
        if per_token:
            shape[1] = P
        out[key] = torch.cat([_pad_to(v, shape, 1 if per_token else None) for v in values])
    return out


def same_count_per_row(per_row: Sequence[dict[str, Tensor]]) -> bool:
    """Whether every row holds as many entries of each input as the first row (as many pictures): only then
    does a batch's [B · n, ...] tensor split into B equal parts, one per row (`select_rows`,
    `postrl.lm.vlm.rollout.shared_rows`). Rows of a multi-turn episode hold one picture per turn so far."""
    first = per_row[0] if per_row else {}
    return all(row[k].shape[0] == first[k].shape[0] for row in per_row for k in first)


def select_rows(inputs: dict[str, Tensor], rows: Tensor, B: int) -> dict[str, Tensor]:
    """The inputs of ``rows`` out of a batch of B rows (leading dim B · n, row order)."""
    return {k: v.reshape(B, -1, *v.shape[1:])[rows].flatten(0, 1) for k, v in inputs.items()}


def response_columns(model_type: str, key: str, prompt_value: Tensor, n: int) -> Tensor:
    """[B, n, ...]: a per-token input [B, P, ...] continued over n response tokens, as transformers'
    ``generate`` continues it: the prompt's last column repeated (the generic update; Mllama's
    ``cross_attention_mask``: a response token sees every picture its last prompt token saw), or the value
    `RESPONSE_VALUES` fixes."""
    last = prompt_value[:, -1:]
    columns = last.expand(-1, n, *last.shape[2:])
    fixed = RESPONSE_VALUES.get((model_type, key))
    return columns.clone() if fixed is None else torch.full_like(columns, fixed)


def split_inputs(inputs: dict[str, Tensor], prompt_len: int, rows: int) -> tuple[dict, dict]:
    """(per-token inputs, the others) of a batch of ``rows`` prompts of width ``prompt_len``."""
    token = {k: v for k, v in inputs.items() if is_per_token(v, prompt_len, rows)}
    return token, {k: v for k, v in inputs.items() if k not in token}


def model_type(model: torch.nn.Module) -> str:
    """The model's ``config.model_type`` (through a DDP wrapper); "" when it has none."""
    inner = getattr(model, "module", model)
    return str(getattr(getattr(inner, "config", None), "model_type", ""))


def with_response(model: torch.nn.Module, inputs: dict[str, Tensor], prompt_len: int, width: int, rows: int):
    """``inputs`` for a forward over [rows, width] tokens whose first ``prompt_len`` are the prompt: the
    per-token ones continued to ``width`` (`response_columns`), the others as they are."""
    token, other = split_inputs(inputs, prompt_len, rows)
    kind = model_type(model)
    for key, value in token.items():
        other[key] = torch.cat((value, response_columns(kind, key, value, width - prompt_len)), 1)
    return other
