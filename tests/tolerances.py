"""Tolerances that follow from the arithmetic they check, for comparisons that cannot run in float64."""

from __future__ import annotations

import torch


def reordered_float32_sum_atol(reference: torch.Tensor, n_terms: int) -> float:
    """The absolute tolerance between two float32 computations of ``reference`` that add the same ``n_terms``
    terms in different orders (one batch against micro-batches; another CPU's SIMD width).

    A sum of n terms reordered is off by at most γ_n·Σ|x_i| ≈ n·u·Σ|x_i| (Higham, Accuracy and Stability of
    Numerical Algorithms, §4.2; u = eps/2). A gradient reorders twice, in the forward and in the backward
    (×2), and Σ|x_i| is taken as 4 × the largest |entry| of ``reference``: atol = 4·n·eps·max|reference|.
    The comparisons in float64 are not possible here: the HF Llama's RMSNorm and rotary embeddings compute in
    float32 whatever the model's dtype. Measured on an AVX-512 CPU: at most 70·eps·max|g| (n = 96)."""
    eps = torch.finfo(torch.float32).eps
    return 4.0 * n_terms * eps * float(reference.abs().max())
