"""Diagonal Gaussian policies for continuous actions (the classic-control half of the notes)."""

from __future__ import annotations

import math

import torch

__all__ = ["diag_gaussian_entropy", "diag_gaussian_log_prob"]

_LOG_2PI = math.log(2.0 * math.pi)


def diag_gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Log-density of a diagonal Gaussian, summed over the action dimension.

        log N(x; μ, diag σ²) = Σ_k −½ [ ((x_k − μ_k)/σ_k)² + 2 log σ_k + log 2π ]

    Source: the standard Gaussian policy of Schulman et al. 2015 (TRPO) / Spinning Up.

    Args:
        x: ``[..., A]`` actions.
        mean: ``[..., A]`` μ (broadcastable to ``x``).
        log_std: ``[..., A]`` or ``[A]`` log σ (broadcastable; a state-independent parameter is common).

    Returns:
        ``[...]`` log-densities (the last, action, dimension is summed).
    """
    z = (x - mean) * torch.exp(-log_std)
    return (-0.5 * (z**2 + 2.0 * log_std + _LOG_2PI)).sum(dim=-1)


def diag_gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """Entropy of a diagonal Gaussian: H = Σ_k ( log σ_k + ½ (1 + log 2π) ).

    Args:
        log_std: ``[..., A]`` log σ.

    Returns:
        ``[...]`` entropies (action dimension summed); broadcast to the batch by the caller if ``log_std``
        is a single ``[A]`` parameter.
    """
    return (log_std + 0.5 * (1.0 + _LOG_2PI)).sum(dim=-1)
