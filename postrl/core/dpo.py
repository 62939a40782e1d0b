"""Direct preference optimisation: the DPO and IPO losses on summed response log-probabilities.

DPO (Rafailov et al. 2023, arXiv:2305.18290) fits the policy's implicit reward β log(π/π_ref) to preference
pairs with the Bradley–Terry loss of a reward model; IPO (Azar et al. 2023, arXiv:2310.12036) regresses the
log-ratio margin to a fixed target instead, so that deterministic preferences cannot push it to infinity.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

__all__ = ["DPO_LOSS_TYPES", "dpo_loss"]


def _sigmoid(h: torch.Tensor, p: torch.Tensor, beta: float) -> torch.Tensor:
    """Rafailov et al. 2023, eq. 7, with a soft label p: −[p log σ(βh) + (1 − p) log σ(−βh)] per pair."""
    return -(p * F.logsigmoid(beta * h) + (1.0 - p) * F.logsigmoid(-beta * h))


def _ipo(h: torch.Tensor, p: torch.Tensor, beta: float) -> torch.Tensor:
    """Azar et al. 2023, IPO with τ = β: (h − (2p − 1)/(2β))² per pair; p = 1 gives (h − 1/(2β))²."""
    return (h - (2.0 * p - 1.0) / (2.0 * beta)) ** 2


# Each maps the log-ratio margins h [B], the targets p [B] and β to per-pair losses [B].
DPO_LOSS_TYPES: dict[str, Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = {
    "sigmoid": _sigmoid,
    "ipo": _ipo,
}


def dpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
    loss_type: str = "sigmoid",
    target: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPO / IPO loss on preference pairs (y_w chosen, y_l rejected).

        h = (log π(y_w) − log π_ref(y_w)) − (log π(y_l) − log π_ref(y_l))
        "sigmoid": L = mean[ −p log σ(βh) − (1 − p) log σ(−βh) ]     (Rafailov et al. 2023, eq. 7 at p = 1)
        "ipo":     L = mean[ (h − (2p − 1)/(2β))² ]                    (Azar et al. 2023, τ = β)

    p is the probability that y_w is preferred: 1 (the default) for a hard label, 0.5 for a tie, 1 − ε for
    conservative DPO's label smoothing ε (TRL's ``label_smoothing``). The sigmoid form is computed with
    ``F.logsigmoid`` (stable for large |βh|); it is minimised where σ(βh) = p. IPO's target margin
    (2p − 1)/(2β) is the symmetrised form of Azar et al.'s regression to I(y_w, y_l)/β; with p = 1 it is
    TRL's (h − 1/(2β))². TRL's IPO averages log-probs over each response's tokens: pass such means to get it.

    Args:
        chosen_logps: ``[B]`` log π(y_w | x), summed over the response tokens, differentiable.
        rejected_logps: ``[B]`` log π(y_l | x), summed likewise, differentiable.
        ref_chosen_logps: ``[B]`` log π_ref(y_w | x) (treated as constants: detached).
        ref_rejected_logps: ``[B]`` log π_ref(y_l | x) (detached).
        beta: β > 0, the KL coefficient (DPO), or IPO's regularisation τ.
        loss_type: ``"sigmoid"`` (DPO) or ``"ipo"``; see ``DPO_LOSS_TYPES``.
        target: ``[B]`` or scalar p ∈ [0, 1], or None for p = 1.

    Returns:
        ``(loss, stats)``: 0-dim loss and detached 0-dim stats (as :func:`ppo_clip_loss`):
        ``reward_accuracy`` = mean(h > 0), ``reward_margin`` = mean(βh), ``chosen_rewards`` =
        mean β(log π(y_w) − log π_ref(y_w)), ``rejected_rewards`` = mean β(log π(y_l) − log π_ref(y_l)).

    Raises:
        ValueError: unknown ``loss_type``, or β ≤ 0.
    """
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"dpo_loss: unknown loss_type {loss_type!r}; valid: {sorted(DPO_LOSS_TYPES)}")
    if beta <= 0:
        raise ValueError(f"dpo_loss: beta must be > 0, got {beta}")
    chosen_logratios = chosen_logps - ref_chosen_logps.detach()  # [B]
    rejected_logratios = rejected_logps - ref_rejected_logps.detach()  # [B]
    h = chosen_logratios - rejected_logratios  # [B]
    p = torch.ones_like(h) if target is None else torch.as_tensor(target, dtype=h.dtype, device=h.device)
    loss = DPO_LOSS_TYPES[loss_type](h, p.detach(), beta).mean()
    with torch.no_grad():
        stats = {
            "reward_accuracy": (h > 0).to(h.dtype).mean(),
            "reward_margin": (beta * h).mean(),
            "chosen_rewards": (beta * chosen_logratios).mean(),
            "rejected_rewards": (beta * rejected_logratios).mean(),
        }
    return loss, stats
