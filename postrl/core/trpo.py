"""The numerical pieces of TRPO (Schulman et al. 2015, arXiv:1502.05477, Appendix C): conjugate gradient,
backtracking line search, and flat-parameter helpers."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

__all__ = [
    "backtracking_line_search",
    "conjugate_gradient",
    "flat_grad",
    "flat_params",
    "set_flat_params",
]


def _params(module: torch.nn.Module | Iterable[torch.Tensor]) -> list[torch.Tensor]:
    return list(module.parameters()) if isinstance(module, torch.nn.Module) else list(module)


def flat_params(module: torch.nn.Module | Iterable[torch.Tensor]) -> torch.Tensor:
    """All parameters concatenated into one detached 1-D tensor ``[P]`` (in ``parameters()`` order)."""
    return torch.cat([p.detach().reshape(-1) for p in _params(module)])


def set_flat_params(module: torch.nn.Module | Iterable[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy a flat ``[P]`` vector into the module's parameters (in place on the module, by design).

    Raises:
        ValueError: if ``flat`` does not have exactly as many elements as the parameters.
    """
    params = _params(module)
    total = sum(p.numel() for p in params)
    if flat.numel() != total:
        raise ValueError(f"set_flat_params: got {flat.numel()} values for {total} parameters")
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def flat_grad(
    y: torch.Tensor,
    params: torch.nn.Module | Iterable[torch.Tensor],
    *,
    retain_graph: bool | None = None,
    create_graph: bool = False,
) -> torch.Tensor:
    """∂y/∂θ flattened to ``[P]``; parameters that ``y`` does not depend on get zeros.

    Args:
        y: 0-dim tensor.
        params: a module or an iterable of parameters.
        retain_graph: as in ``torch.autograd.grad``.
        create_graph: as in ``torch.autograd.grad`` (``True`` for Hessian-/Fisher-vector products).
    """
    params = _params(params)
    grads = torch.autograd.grad(
        y, params, retain_graph=retain_graph, create_graph=create_graph, allow_unused=True
    )
    return torch.cat(
        [(torch.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(grads, params, strict=True)]
    )


def conjugate_gradient(
    Avp: Callable[[torch.Tensor], torch.Tensor],
    b: torch.Tensor,
    iters: int = 10,
    residual_tol: float = 1e-10,
) -> torch.Tensor:
    """Solve A x = b for symmetric positive-definite A using only products A·v (Hestenes & Stiefel 1952).

    TRPO uses it with A = Fisher matrix (Fisher-vector products) to get the natural-gradient direction
    x ≈ F⁻¹ g without forming F (Schulman et al. 2015, Appendix C).

        r₀ = p₀ = b, x₀ = 0;  α = rᵀr / pᵀAp;  x += αp;  r −= αAp;  p = r + (r'ᵀr'/rᵀr) p

    Args:
        Avp: function v ``[P]`` → A v ``[P]``.
        b: ``[P]`` right-hand side.
        iters: maximum number of iterations (n iterations solve an n×n system exactly in exact arithmetic).
        residual_tol: stop when the squared residual norm rᵀr falls below this.

    Returns:
        ``[P]`` approximate solution x (dtype of ``b``).
    """
    x = torch.zeros_like(b)
    r = b.clone()
    p = b.clone()
    r_dot_r = torch.dot(r, r)
    for _ in range(iters):
        if r_dot_r < residual_tol:
            break
        Ap = Avp(p)
        alpha = r_dot_r / torch.dot(p, Ap)
        x = x + alpha * p
        r = r - alpha * Ap
        new_r_dot_r = torch.dot(r, r)
        p = r + (new_r_dot_r / r_dot_r) * p
        r_dot_r = new_r_dot_r
    return x


def backtracking_line_search(
    f: Callable[[torch.Tensor], torch.Tensor | float],
    x: torch.Tensor,
    full_step: torch.Tensor,
    expected_improve: torch.Tensor | float,
    max_backtracks: int = 10,
    accept_ratio: float = 0.1,
    *,
    constraint: Callable[[torch.Tensor], bool] | None = None,
) -> tuple[bool, torch.Tensor]:
    """TRPO's step acceptance: shrink the step by halves until it really improves the objective.

    Convention: ``f`` is a LOSS to minimise (e.g. the negated surrogate), ``expected_improve`` is the
    first-order predicted *decrease* of f for the full step (−∇fᵀ·full_step, positive for a descent step).
    For k = 0, 1, …, max_backtracks − 1 with frac = 0.5^k it tries x_new = x + frac·full_step and accepts
    the first one with

        actual = f(x) − f(x_new) > 0   and   actual / (frac · expected_improve) > accept_ratio
        and ``constraint(x_new)`` (if given; TRPO passes "mean KL ≤ δ").

    If ``expected_improve`` ≤ 0 the ratio test is skipped (any real decrease is accepted).

    Source: Schulman et al. 2015 (TRPO), Appendix C; modular_rl's ``linesearch``.
    ``f`` is evaluated under ``torch.no_grad``.

    Args:
        f: x ``[P]`` → scalar loss (tensor or float).
        x: ``[P]`` current parameters (not modified).
        full_step: ``[P]`` proposed step.
        expected_improve: predicted decrease of f for the full step.
        max_backtracks: number of step sizes tried.
        accept_ratio: minimum ratio of actual to expected improvement.
        constraint: optional x_new → bool that must also hold.

    Returns:
        ``(accepted, x_new)``: ``(True, accepted point)`` or, if no step was accepted, ``(False, x)`` with the
        original ``x`` (the caller keeps its old parameters).
    """
    with torch.no_grad():
        f_x = float(f(x))
        for k in range(max_backtracks):
            frac = 0.5**k
            x_new = x + frac * full_step
            actual = f_x - float(f(x_new))
            expected = float(expected_improve) * frac
            ratio = actual / expected if expected > 0 else float("inf")
            if actual > 0 and ratio > accept_ratio:
                if constraint is None or constraint(x_new):
                    return True, x_new
    return False, x
