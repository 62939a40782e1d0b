"""Truncated importance sampling: correcting for samples drawn by a behaviour policy μ ≠ π.

An inference engine samples with its own numerics (another kernel, another precision) and an asynchronous
trainer updates on samples from a policy a step or more old, so the samples come from μ while the loss is
taken for π. Importance weights π/μ correct the expectation; truncating them at a cap bounds their variance
(Espeholt et al. 2018, IMPALA's ρ̄; Yao et al. 2025, "Your efficient RL framework secretly brings you
off-policy RL training", the TIS that TRL and veRL apply to vLLM samples).
"""

from __future__ import annotations

import torch

__all__ = ["IS_LEVELS", "truncated_is_weights"]

IS_LEVELS = ("token", "sequence")


def truncated_is_weights(
    logps: torch.Tensor,
    behaviour_logps: torch.Tensor,
    mask: torch.Tensor,
    cap: float,
    level: str = "token",
) -> torch.Tensor:
    """Truncated importance weights for samples of μ used to train π; detached, ``[B, T]``.

        "token":    w_t = min(exp(log π_t − log μ_t), cap)                      on masked tokens
        "sequence": w_t = min(exp(Σ_s m_s (log π_s − log μ_s)), cap)            on every masked token
        w_t = 0 where mask is 0.

    Args:
        logps: ``[B, T]`` log π of the sampled tokens (the policy being trained; detached here).
        behaviour_logps: ``[B, T]`` log μ of the same tokens (the policy that sampled them).
        mask: ``[B, T]`` 1 on response tokens, 0 on padding.
        cap: the truncation C > 0.
        level: ``"token"`` or ``"sequence"``.

    Raises:
        ValueError: cap ≤ 0, an unknown level, or shapes that differ.
    """
    if not cap > 0:
        raise ValueError(f"truncated_is_weights: cap must be > 0, got {cap}")
    if level not in IS_LEVELS:
        raise ValueError(f"truncated_is_weights: unknown level {level!r}; valid: {list(IS_LEVELS)}")
    if logps.shape != behaviour_logps.shape or logps.shape != mask.shape:
        raise ValueError(
            f"truncated_is_weights: logps {tuple(logps.shape)}, behaviour_logps "
            f"{tuple(behaviour_logps.shape)} and mask {tuple(mask.shape)} must have one shape [B, T]"
        )
    on = mask.to(torch.bool)  # [B, T]
    # masked positions are zeroed before exp, so padding's values (even inf or nan) never reach a weight
    log_ratio = torch.where(on, logps.detach() - behaviour_logps.detach(), torch.zeros_like(logps))  # [B, T]
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=-1, keepdim=True).expand_as(log_ratio)  # [B, T]
    weights = torch.exp(log_ratio).clamp(max=cap)  # [B, T]
    return torch.where(on, weights, torch.zeros_like(weights))
