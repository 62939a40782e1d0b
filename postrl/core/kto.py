"""Kahneman–Tversky optimisation: the KTO loss on unpaired desirable and undesirable responses.

KTO (Ethayarajh et al. 2024, arXiv:2402.01306) needs only a binary label per (prompt, response): it pushes
the implicit reward r = log π(y|x) − log π_ref(y|x) of a desirable response above a reference point z0 and
that of an undesirable one below it, through a value function that saturates (the prospect-theory shape).
z0 is the KL divergence KL(π‖π_ref) of the policy from the reference, estimated on mismatched pairs
(a prompt with another example's response), clamped at 0 and not differentiated through.
"""

from __future__ import annotations

import torch

__all__ = ["kto_loss"]


def kto_loss(
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    desirable: torch.Tensor,
    kl: torch.Tensor | float,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KTO loss (Ethayarajh et al. 2024, eq. 8) on a batch of labelled responses.

        r_i = log π(y_i | x_i) − log π_ref(y_i | x_i),      z0 = max(kl, 0) (detached)
        ℓ_i = λ_D (1 − σ(β (r_i − z0)))   if y_i is desirable
        ℓ_i = λ_U (1 − σ(β (z0 − r_i)))   if y_i is undesirable
        L = mean_i ℓ_i

    This is TRL's ``KTOTrainer`` loss (``loss_type="kto"``): the weighted per-example losses of both kinds
    averaged over the whole batch. The paper's λ_D n_D / (λ_U n_U) ∈ [1, 4/3] guidance is the caller's
    choice of weights.

    Args:
        logps: ``[B]`` log π(y | x) summed over each response's tokens, differentiable.
        ref_logps: ``[B]`` log π_ref(y | x) summed likewise (detached).
        desirable: ``[B]`` bool, True where the response is desirable.
        kl: the reference point z0: a scalar (0-dim tensor or float), e.g. the mean over mismatched pairs of
            log π(y_j | x_i) − log π_ref(y_j | x_i); detached and clamped at 0 here.
        beta: β > 0, the KL coefficient.
        desirable_weight: λ_D ≥ 0.
        undesirable_weight: λ_U ≥ 0.

    Returns:
        ``(loss, stats)``: 0-dim loss and detached 0-dim stats: ``rewards_desirable`` /
        ``rewards_undesirable`` = mean β r over each kind (NaN when the batch has none of that kind), ``kl`` = z0.

    Raises:
        ValueError: β ≤ 0, a negative weight, or shapes that differ.
    """
    if beta <= 0:
        raise ValueError(f"kto_loss: beta must be > 0, got {beta}")
    if desirable_weight < 0 or undesirable_weight < 0:
        raise ValueError(
            f"kto_loss: weights must be >= 0, got desirable_weight={desirable_weight}, "
            f"undesirable_weight={undesirable_weight}"
        )
    if logps.shape != ref_logps.shape or logps.shape != desirable.shape:
        raise ValueError(
            f"kto_loss: logps {tuple(logps.shape)}, ref_logps {tuple(ref_logps.shape)} and desirable "
            f"{tuple(desirable.shape)} must have one shape [B]"
        )
    z0 = torch.as_tensor(kl, dtype=logps.dtype, device=logps.device).detach().clamp(min=0)  # []
    rewards = logps - ref_logps.detach()  # [B]
    good = desirable.to(torch.bool)  # [B]
    desirable_losses = desirable_weight * (1.0 - torch.sigmoid(beta * (rewards - z0)))  # [B]
    undesirable_losses = undesirable_weight * (1.0 - torch.sigmoid(beta * (z0 - rewards)))  # [B]
    loss = torch.where(good, desirable_losses, undesirable_losses).mean()
    scaled = (beta * rewards).detach()  # [B]
    nan = torch.full((), float("nan"), dtype=scaled.dtype, device=scaled.device)
    stats = {
        "rewards_desirable": scaled[good].mean() if bool(good.any()) else nan,
        "rewards_undesirable": scaled[~good].mean() if bool((~good).any()) else nan,
        "kl": z0,
    }
    return loss, stats
