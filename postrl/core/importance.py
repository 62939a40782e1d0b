"""Truncated importance sampling: correcting for samples drawn by a behaviour policy μ ≠ π.

An inference engine samples with its own numerics (another kernel, another precision) and an asynchronous
trainer updates on samples from a policy a step or more old, so the samples come from μ while the loss is
taken for π. Importance weights π/μ correct the expectation; truncating them at a cap bounds their variance
(Espeholt et al. 2018, IMPALA's ρ̄; Yao et al. 2025, "Your efficient RL framework secretly brings you
off-policy RL training", the TIS that TRL and veRL apply to vLLM samples); masking them instead (MIS: a token or
response whose weight exceeds the cap leaves the loss) drops the samples the two policies disagree on most
(Liu et al. 2025, "When speed kills stability"; TRL's ``*_mask`` modes; AReaL's ``behav_imp_weight_cap``).

With either, the clipped PPO/GRPO ratio is taken against a proximal policy π_prox (the trainer's own
teacher-forced log-probs before the update) and the weight π_prox/μ corrects for the behaviour policy:
decoupled PPO (Hilton et al. 2021, "Batch size-invariance for policy optimization"; AReaL, Fu et al. 2025),
    ℓ_t = −w_t · min(ρ_t A_t, clip(ρ_t, 1 − ε, 1 + ε) A_t),   ρ_t = π_t / π_prox,t,   w_t = f(π_prox,t / μ_t).
"""

from __future__ import annotations

import torch

__all__ = ["IS_LEVELS", "behaviour_mismatch", "masked_is_weights", "truncated_is_weights"]

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
    on, ratio = _ratios("truncated_is_weights", logps, behaviour_logps, mask, cap, level)
    return torch.where(on, ratio.clamp(max=cap), torch.zeros_like(ratio))


def masked_is_weights(
    logps: torch.Tensor,
    behaviour_logps: torch.Tensor,
    mask: torch.Tensor,
    cap: float,
    level: str = "token",
) -> torch.Tensor:
    """Masked importance weights (MIS) for samples of μ used to train π; detached, ``[B, T]``.

        "token":    w_t = r_t if r_t ≤ cap else 0,  r_t = exp(log π_t − log μ_t)          on masked tokens
        "sequence": w_t = r   if r ≤ cap else 0,    r = exp(Σ_s m_s (log π_s − log μ_s))  on every masked token
        w_t = 0 where mask is 0.

    Unlike `truncated_is_weights`, a sample whose weight is over the cap contributes nothing (its gradient is
    not kept at the cap's size). Arguments and errors as `truncated_is_weights`.
    """
    on, ratio = _ratios("masked_is_weights", logps, behaviour_logps, mask, cap, level)
    return torch.where(on & (ratio <= cap), ratio, torch.zeros_like(ratio))


def behaviour_mismatch(
    logps: torch.Tensor, behaviour_logps: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """How far the behaviour policy μ that sampled the tokens is from π, on μ's own samples; detached 0-dim.

        kl          = masked_mean(r_t − 1 − log r_t),  r_t = π_t / μ_t   (k3: an unbiased, ≥ 0 estimate of KL(μ‖π))
        log_ratio   = masked_mean(|log π_t − log μ_t|)                   (mean absolute log-prob gap per token)

    Args:
        logps: ``[B, T]`` log π of the sampled tokens. behaviour_logps: ``[B, T]`` log μ. mask: ``[B, T]`` 0/1.
    """
    on = mask.to(torch.bool)
    log_ratio = torch.where(on, logps.detach() - behaviour_logps.detach(), torch.zeros_like(logps))  # [B, T]
    count = on.sum().clamp(min=1)
    # expm1 and the floor: exp(x) − 1 − x rounds below 0 in float32 when π and μ agree to ~1e-5 (a CI run logged
    # −3.5e-10 from vLLM's log-probs), under the k3 ≥ 0 this estimate must keep
    k3 = (torch.expm1(log_ratio) - log_ratio).clamp(min=0)  # [B, T], 0 where masked
    return {"kl": k3.sum() / count, "log_ratio": log_ratio.abs().sum() / count}


def _ratios(
    name: str, logps: torch.Tensor, behaviour_logps: torch.Tensor, mask: torch.Tensor, cap: float, level: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The bool mask and the unbounded ratios π/μ ``[B, T]`` (per token, or the response's on each token) of
    the two weightings, after their argument checks."""
    if not cap > 0:
        raise ValueError(f"{name}: cap must be > 0, got {cap}")
    if level not in IS_LEVELS:
        raise ValueError(f"{name}: unknown level {level!r}; valid: {list(IS_LEVELS)}")
    if logps.shape != behaviour_logps.shape or logps.shape != mask.shape:
        raise ValueError(
            f"{name}: logps {tuple(logps.shape)}, behaviour_logps "
            f"{tuple(behaviour_logps.shape)} and mask {tuple(mask.shape)} must have one shape [B, T]"
        )
    on = mask.to(torch.bool)  # [B, T]
    # masked positions are zeroed before exp, so padding's values (even inf or nan) never reach a weight
    log_ratio = torch.where(on, logps.detach() - behaviour_logps.detach(), torch.zeros_like(logps))  # [B, T]
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=-1, keepdim=True).expand_as(log_ratio)  # [B, T]
    return on, torch.exp(log_ratio)
