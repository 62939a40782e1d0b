"""Where the real tokens are in a padded batch: positions and each row's last token.

A batch is ``input_ids [B, T]`` with ``attention_mask [B, T]`` (1 = real token); prompts are LEFT-padded and
responses RIGHT-padded, so real tokens are not aligned to either edge. Positions therefore always come from
the mask (`position_ids_from_mask`) and a sequence's last real token from `last_token_index`, never from a
column.
"""

from __future__ import annotations

import torch


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens: ``cumsum(mask) − 1`` clamped at 0.

    attention_mask: [B, T] (0/1) → position_ids: [B, T] long. With left padding the first real token gets
    position 0; pads before it get 0, pads after the last real token repeat its position (never attended).
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real token of each row. attention_mask: [B, T] → [B] long (0 for an empty row)."""
    positions = torch.arange(attention_mask.shape[-1], device=attention_mask.device)
    return (attention_mask.long() * positions).amax(-1)


def gather_last(values: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``values[b, last_token_index(mask)[b]]``. values: [B, T], attention_mask: [B, T] → [B]."""
    index = last_token_index(attention_mask).unsqueeze(-1)  # (B, 1)
    return values.gather(-1, index).squeeze(-1)
