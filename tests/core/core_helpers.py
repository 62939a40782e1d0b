"""Helpers for the core tests: float64 literals, seeded random tensors, garbage for padding."""

from __future__ import annotations

import torch
from hypothesis import settings

PROP = settings(max_examples=50, deadline=None)  # modest and deterministic-time property tests
F64 = torch.float64
GARBAGE = (float("nan"), float("inf"), -float("inf"), 1e30)


def t(values, dtype=F64) -> torch.Tensor:
    """Float64 tensor from nested lists."""
    return torch.tensor(values, dtype=dtype)


def rand(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=F64) * scale


def ragged_mask(gen: torch.Generator, batch: int, width: int) -> torch.Tensor:
    """Right-padded bool mask [batch, width], every row with at least one real position."""
    lengths = torch.randint(1, width + 1, (batch,), generator=gen)
    return torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)


def with_garbage(x: torch.Tensor, mask: torch.Tensor, value: float) -> torch.Tensor:
    """Copy of x with `value` (NaN, inf, huge) wherever mask is 0."""
    return torch.where(mask.bool(), x, torch.full_like(x, value))
