"""Policy-gradient and critic losses: REINFORCE, PPO clipped surrogate, value loss, categorical entropy.

Shapes follow the rest of ``postrl.core``: per-step tensors are ``[..., T]`` (``[B, T]`` tokens or
``[envs, steps]``); an optional ``mask`` of the same shape (bool or float 0/1) selects real positions.
Padding may hold anything (NaN included): it is replaced before any arithmetic, so it changes neither the
loss nor its gradient.
"""

from __future__ import annotations

import torch

from postrl.core.stats import fill_outside_mask, masked_mean

__all__ = [
    "clipped_surrogate",
    "entropy_from_logits",
    "ppo_clip_loss",
    "reinforce_loss",
    "value_loss",
]


def _mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return x.mean() if mask is None else masked_mean(x, mask)


def _align_advantages(advantages: torch.Tensor, log_probs: torch.Tensor) -> torch.Tensor:
    """Per-sequence advantages ``[B]`` against per-token log-probs ``[B, T]`` become ``[B, 1]``."""
    if advantages.dim() == log_probs.dim() - 1 and log_probs.dim() >= 2:
        return advantages.unsqueeze(-1)
    return advantages


def reinforce_loss(
    log_probs: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """REINFORCE surrogate (Williams 1992): its gradient is the policy-gradient estimate.

        L = −mean_t[ log π(a_t|s_t) · w_t ],   w detached (G_t, G_t − b(s_t), or an advantage; any γ^t
        factor is folded into w by the caller)

    Args:
        log_probs: ``[..., T]`` log π(a_t|s_t), differentiable.
        weights: broadcastable to ``log_probs`` (e.g. ``[..., T]`` or ``[B, 1]``); detached here.
        mask: optional ``[..., T]`` bool/float; mean over positions where it is 1.

    Returns:
        0-dim loss.
    """
    weights = weights.detach()
    if mask is None:
        return -(log_probs * weights).mean()
    return -masked_mean(fill_outside_mask(log_probs, mask) * fill_outside_mask(weights, mask), mask)


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_eps: float, clip_eps_high: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's pessimistic surrogate min(ρA, clip(ρ, 1−ε, 1+ε_high)A) and where clipping is active.

    ``clipped`` is True where the clipped term is the active minimum and differs from ρA, i.e. where the
    gradient is zeroed: (A > 0 and ρ > 1+ε_high) or (A < 0 and ρ < 1−ε). This is the ``clip_fraction``
    definition used throughout postrl (CleanRL/TRL count |ρ−1| > ε instead, which also counts positions
    outside the band on the side that does not bind).

    Args:
        ratio: ``[..., T]`` ρ = π/π_old.
        advantages: broadcastable to ``ratio``.
        clip_eps: ε (lower side, and upper side when ``clip_eps_high`` is None).
        clip_eps_high: ε_high for the upper side (DAPO "clip-higher", Yu et al. 2025).

    Returns:
        ``(surrogate, clipped)`` of the broadcast shape; ``clipped`` is bool.
    """
    high = clip_eps if clip_eps_high is None else clip_eps_high
    surrogate = torch.minimum(ratio * advantages, torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high) * advantages)
    clipped = ((advantages > 0) & (ratio > 1.0 + high)) | ((advantages < 0) & (ratio < 1.0 - clip_eps))
    return surrogate, clipped


def ppo_clip_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float,
    mask: torch.Tensor | None = None,
    clip_eps_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate loss (Schulman et al. 2017, arXiv:1707.06347, eq. 7).

        ρ_t = exp(log π(a_t|s_t) − log π_old(a_t|s_t))
        L = −masked_mean( min(ρ_t A_t, clip(ρ_t, 1−ε, 1+ε_high) A_t) )

    ``clip_eps_high`` defaults to ``clip_eps`` (symmetric PPO); a larger value is DAPO's clip-higher
    (Yu et al. 2025). ``old_log_probs`` and ``advantages`` are treated as constants (detached).

    Args:
        log_probs: ``[..., T]`` log-probs under the current policy, differentiable.
        old_log_probs: ``[..., T]`` log-probs under the behaviour policy.
        advantages: broadcastable to ``log_probs`` (``[..., T]``, ``[B, 1]``); ``[B]`` against
            ``[B, T]`` log-probs is unsqueezed to ``[B, 1]`` (one advantage per sequence).
        clip_eps: ε.
        mask: optional ``[..., T]`` bool/float 0/1.
        clip_eps_high: optional ε_high for the upper clip.

    Returns:
        ``(loss, stats)``: 0-dim loss and detached 0-dim stats over masked positions:
        ``clip_fraction`` (fraction where clipping is active, see :func:`clipped_surrogate`),
        ``approx_kl`` (k3 estimate of KL(π_old‖π): mean of (ρ−1) − log ρ, as CleanRL), ``ratio_mean``.
    """
    advantages = _align_advantages(advantages.detach(), log_probs)
    old_log_probs = old_log_probs.detach()
    if mask is not None:
        log_probs, old_log_probs = fill_outside_mask(log_probs, mask), fill_outside_mask(old_log_probs, mask)
        advantages = fill_outside_mask(advantages, mask)
    log_ratio = log_probs - old_log_probs
    ratio = torch.exp(log_ratio)
    surrogate, clipped = clipped_surrogate(ratio, advantages, clip_eps, clip_eps_high)
    loss = -_mean(surrogate, mask)
    with torch.no_grad():
        stats = {
            "clip_fraction": _mean(clipped.to(ratio.dtype), mask),
            "approx_kl": _mean((ratio - 1.0) - log_ratio, mask),
            "ratio_mean": _mean(ratio, mask),
        }
    return loss, stats


def value_loss(
    values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor | None = None,
    old_values: torch.Tensor | None = None,
    clip_eps: float | None = None,
) -> torch.Tensor:
    """Critic regression loss, optionally PPO's clipped form.

        unclipped: L = ½ masked_mean( (V − R̂)² )
        clipped:   L = ½ masked_mean( max( (V − R̂)², (V_old + clip(V − V_old, −ε, ε) − R̂)² ) )

    The clipped form is from the PPO reference implementation (OpenAI baselines ppo2; see Engstrom et al.
    2020, "Implementation Matters"); it needs both ``old_values`` and ``clip_eps``.

    Args:
        values: ``[..., T]`` V(s_t), differentiable.
        returns: ``[..., T]`` targets R̂ (detached here).
        mask: optional ``[..., T]`` bool/float 0/1.
        old_values: optional ``[..., T]`` V_old(s_t) from the rollout (detached).
        clip_eps: optional ε for the clipped form.

    Returns:
        0-dim loss.

    Raises:
        ValueError: if only one of ``old_values`` / ``clip_eps`` is given.
    """
    if (old_values is None) != (clip_eps is None):
        raise ValueError("value_loss: the clipped form needs both old_values and clip_eps (or neither)")
    returns = returns.detach()
    if mask is not None:
        values, returns = fill_outside_mask(values, mask), fill_outside_mask(returns, mask)
    sq_err = (values - returns) ** 2
    if old_values is not None:
        old_values = old_values.detach() if mask is None else fill_outside_mask(old_values.detach(), mask)
        clipped_values = old_values + torch.clamp(values - old_values, -clip_eps, clip_eps)
        sq_err = torch.maximum(sq_err, (clipped_values - returns) ** 2)
    return 0.5 * _mean(sq_err, mask)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of a categorical distribution given unnormalised logits.

        H = −Σ_k p_k log p_k,   log p = log_softmax(z)   (stable: logsumexp inside)

    Logits of −inf (masked actions/tokens) contribute 0 to both the value and the gradient (0·log 0 := 0).
    A row where every logit is −inf has no distribution and gives NaN.

    Args:
        logits: ``[..., K]`` logits over K classes (last dimension).

    Returns:
        ``[...]`` entropies (the last dimension is reduced).
    """
    log_p = torch.log_softmax(logits, dim=-1)
    p = torch.exp(log_p)
    safe_log_p = torch.where(p > 0, log_p, torch.zeros_like(log_p))
    return -(p * safe_log_p).sum(dim=-1)
