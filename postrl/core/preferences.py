"""Bradley–Terry preference losses for reward models (Christiano et al. 2017; Ouyang et al. 2022)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["pairwise_loss", "preference_loss"]


def pairwise_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | float | None = None
) -> torch.Tensor:
    """Bradley–Terry loss on (chosen, rejected) reward pairs.

        L = −mean log σ(r_w − r_l − m)

    Source: Ouyang et al. 2022 (InstructGPT), eq. 1; the margin m is Llama 2's (Touvron et al. 2023, eq. 2).
    Computed with ``F.logsigmoid`` (stable for large |r_w − r_l|).

    Args:
        chosen: ``[B]`` rewards r_w of the preferred responses.
        rejected: ``[B]`` rewards r_l of the other responses.
        margin: optional ``[B]`` or scalar m ≥ 0.

    Returns:
        0-dim loss.
    """
    diff = chosen - rejected
    if margin is not None:
        diff = diff - margin
    return -F.logsigmoid(diff).mean()


def preference_loss(
    score_1: torch.Tensor,
    score_2: torch.Tensor,
    target: torch.Tensor | float,
    *,
    random_response: float = 0.0,
) -> torch.Tensor:
    """Cross-entropy of the Bradley–Terry probability P(1 ≻ 2) = σ(s1 − s2) against a soft label p.

        L = −mean[ p log P(1 ≻ 2) + (1 − p) log P(2 ≻ 1) ],   P(1 ≻ 2) = ε/2 + (1 − ε) σ(s1 − s2)

    Source: Christiano et al. 2017 (arXiv:1706.03741), §2.2.3 (p = 0.5 for "equally preferable"; ε = 0.1:
    "a 10% chance that the human responds uniformly at random", which bounds the loss of a wrong label).

    Args:
        score_1: ``[B]`` scores of the first item (e.g. summed predicted rewards of segment 1).
        score_2: ``[B]`` scores of the second item.
        target: ``[B]`` or scalar p ∈ [0, 1]: 1 if the first is preferred, 0 the second, 0.5 a tie.
        random_response: ε ∈ [0, 1), the modelled chance of a uniformly random answer (0: plain σ).

    Returns:
        0-dim loss. With p = 1 and ε = 0 this equals ``pairwise_loss(score_1, score_2)``.
    """
    diff = score_1 - score_2
    p = torch.as_tensor(target, dtype=diff.dtype, device=diff.device)
    log_p1, log_p2 = F.logsigmoid(diff), F.logsigmoid(-diff)
    if random_response > 0:  # log(ε/2 + (1 − ε) σ), stable for large |s1 − s2|
        floor = torch.tensor(random_response / 2, dtype=diff.dtype, device=diff.device).log()
        keep = torch.tensor(1.0 - random_response, dtype=diff.dtype, device=diff.device).log()
        log_p1, log_p2 = torch.logaddexp(floor, keep + log_p1), torch.logaddexp(floor, keep + log_p2)
    return -(p * log_p1 + (1.0 - p) * log_p2).mean()
