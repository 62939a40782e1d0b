"""Masked statistics over padded tensors.

Every function here treats ``mask`` as a {0, 1} (bool or float) weight of the same shape as ``x`` (or
broadcastable to it). Positions where ``mask`` is 0 never influence the result, even when ``x`` holds NaN or
inf there: they are removed with ``torch.where`` before any arithmetic, so neither the value nor the gradient
of a masked position can leak through ``0 * nan = nan``.
"""

from __future__ import annotations

import torch

__all__ = ["masked_mean", "masked_sum", "masked_whiten"]


def fill_outside_mask(x: torch.Tensor, mask: torch.Tensor, value: float = 0.0) -> torch.Tensor:
    """``x`` with ``value`` at positions where ``mask`` is 0: ``where(mask ≠ 0, x, value)``.

    x: ``[...]``, mask: ``[...]`` broadcastable to ``x`` (bool or float) → ``[...]`` like ``x``. Unlike
    ``x * mask`` it is NaN-safe (a NaN or inf in padding does not become NaN, as inf · 0 does) and
    gradient-safe (no NaN gradient flows back from padded positions), so padding may hold anything.
    """
    return torch.where(mask != 0, x, torch.full_like(x, value))


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Σ x·mask over ``dim`` (all positions when ``None``), ignoring whatever ``x`` holds where mask is 0.

    Args:
        x: ``[...]`` values.
        mask: ``[...]`` weights broadcastable to ``x``; bool or float.
        dim: dimension(s) to reduce; ``None`` reduces everything to a 0-dim tensor.
    """
    x, mask = torch.broadcast_tensors(x, mask)
    weighted = fill_outside_mask(x, mask) * mask.to(x.dtype)
    return weighted.sum() if dim is None else weighted.sum(dim=dim)


def masked_mean(
    x: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None
) -> torch.Tensor:
    """Mean of ``x`` over the positions where ``mask`` is 1.

        masked_mean(x, m) = Σ x·m / Σ m

    Args:
        x: ``[...]`` values (any float dtype; the result keeps it).
        mask: ``[...]`` broadcastable to ``x``; bool or float (0/1, or weights).
        dim: dimension(s) to reduce; ``None`` reduces everything to a 0-dim tensor.

    Returns:
        The masked mean; where Σ m = 0 (nothing selected) the result is 0, not NaN, so an all-padding
        micro-batch adds nothing to a loss.
    """
    x, mask = torch.broadcast_tensors(x, mask)
    total = masked_sum(x, mask, dim)
    count = mask.to(x.dtype).sum() if dim is None else mask.to(x.dtype).sum(dim=dim)
    safe = torch.where(count != 0, count, torch.ones_like(count))
    return torch.where(count != 0, total / safe, torch.zeros_like(total))


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise ``x`` to zero mean and unit variance over the masked positions (one global mean and variance).

        μ = masked_mean(x, m),  σ² = Σ m·(x − μ)² / (Σ m − 1)   (Bessel-corrected, as ``torch.var``)
        y = (x − μ)·rsqrt(σ² + 1e-8)              (+ μ when ``shift_mean=False``)

    Used for advantage normalisation (PPO; Schulman et al. 2017, and the CleanRL / TRL implementations).

    Args:
        x: ``[...]`` values, e.g. advantages ``[B, T]``.
        mask: ``[...]`` same shape as ``x`` (or broadcastable); bool or float 0/1.
        shift_mean: if False the mean is added back, so only the scale changes.

    Returns:
        ``[...]`` whitened values, **0 at every position where mask is 0**. With a single selected position
        the variance denominator is clamped to 1 (σ² = 0), giving 0 there (or μ when ``shift_mean=False``).
    """
    x, mask = torch.broadcast_tensors(x, mask)
    mean = masked_mean(x, mask)
    centered = fill_outside_mask(x - mean, mask)
    count = mask.to(x.dtype).sum()
    var = masked_sum(centered**2, mask) / torch.clamp(count - 1, min=1.0)
    whitened = centered * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return fill_outside_mask(whitened, mask)
