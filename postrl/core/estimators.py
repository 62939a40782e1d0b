"""Outcome-reward estimators for groups of sampled responses: RLOO, REINFORCE++-baseline, DAPO overlong shaping.

Each prompt gets G responses, stored contiguously (rows ``[g·G, (g+1)·G)`` belong to prompt g), each with one
scalar reward. These functions turn the rewards into one detached advantage per response (the sibling of
:func:`postrl.core.group_advantages`), or shape the rewards before that (:func:`overlong_penalty`).
"""

from __future__ import annotations

import torch

from postrl.core.stats import masked_whiten

__all__ = ["overlong_penalty", "reinforce_pp_advantages", "rloo_advantages"]


def _groups(rewards: torch.Tensor, group_size: int, name: str, min_size: int) -> torch.Tensor:
    """``rewards`` as ``(n, G)`` groups, or a ValueError that names the sizes."""
    if group_size < min_size or rewards.numel() % group_size != 0:
        raise ValueError(
            f"{name}: {rewards.numel()} rewards cannot be split into groups of {group_size}"
            f" (group_size must be >= {min_size} and divide the number of rewards)"
        )
    return rewards.detach().reshape(-1, group_size)  # (n, G)


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE leave-one-out advantages (Ahmadian et al. 2024, "Back to Basics", arXiv:2402.14740).

        A_i = r_i − (1/(G − 1)) Σ_{j≠i} r_j  =  G/(G − 1) · (r_i − mean_g(r))

    Each response's baseline is the mean reward of the other G − 1 responses to the same prompt, so the
    baseline is independent of the response it is subtracted from (unbiased), unlike the group mean of
    :func:`group_advantages`. The advantages of a group sum to 0; a group whose rewards are all equal gives
    exactly 0 for each member (as :func:`group_advantages`), whatever rounding its sum has.

    Args:
        rewards: ``[n·G]`` rewards, the G responses of each prompt contiguous (other shapes are flattened in
            row-major order and the result is reshaped back).
        group_size: G ≥ 2 (a single response has no one to leave out).

    Returns:
        Advantages of the shape of ``rewards``, detached.

    Raises:
        ValueError: if G < 2 or the number of rewards is not a multiple of G.
    """
    groups = _groups(rewards, group_size, "rloo_advantages", min_size=2)
    others = (groups.sum(dim=-1, keepdim=True) - groups) / (group_size - 1)  # (n, G) leave-one-out means
    advantages = groups - others
    constant = (groups == groups[:, :1]).all(dim=-1, keepdim=True)  # (n, 1)
    advantages = torch.where(constant, torch.zeros_like(advantages), advantages)
    return advantages.reshape(rewards.shape)


def reinforce_pp_advantages(rewards: torch.Tensor, group_size: int | None = None) -> torch.Tensor:
    """REINFORCE++-baseline advantages (Hu 2025, "REINFORCE++", arXiv:2501.03262).

        a_i = r_i − mean_g(r)          (group_size given; a_i = r_i when it is None)
        A_i = (a_i − mean(a)) · rsqrt(var(a) + 1e-8),   mean and var over the whole batch

    The group mean removes each prompt's difficulty; the global whitening then sets one scale for the batch
    (not one per group, as GRPO's std does, which up-weights near-constant groups). The whitening is exactly
    :func:`masked_whiten` with an all-ones mask, whose variance is Bessel-corrected (Σ(a − mean a)²/(N − 1),
    as ``torch.var``, with N − 1 clamped to 1 so that N = 1 gives 0) and has 1e-8 added inside the rsqrt.

    Args:
        rewards: ``[N]`` rewards; with ``group_size`` the G responses of each prompt contiguous (other shapes
            are flattened in row-major order and the result is reshaped back).
        group_size: G, or None for no per-group baseline (plain REINFORCE++ with a global whitening).

    Returns:
        Advantages of the shape of ``rewards``, detached: mean 0 and (Bessel) std σ/√(σ² + 1e-8), σ the
        std of a.

    Raises:
        ValueError: if ``group_size`` is given and is < 1 or does not divide the number of rewards.
    """
    if group_size is None:
        centered = rewards.detach().reshape(-1)
    else:
        groups = _groups(rewards, group_size, "reinforce_pp_advantages", min_size=1)
        centered = (groups - groups.mean(dim=-1, keepdim=True)).reshape(-1)  # [N]
    whitened = masked_whiten(centered, torch.ones_like(centered, dtype=torch.bool))
    return whitened.reshape(rewards.shape)


def overlong_penalty(
    lengths: torch.Tensor, max_len: int, buffer_len: int, penalty: float = 1.0
) -> torch.Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13), a reward term per response.

                   ⎧ 0                                        L ≤ max_len − buffer_len
        R(L)  =    ⎨ penalty · (max_len − buffer_len − L) / buffer_len     max_len − buffer_len < L ≤ max_len
                   ⎩ −penalty                                 L > max_len

    (the paper's L_max is ``max_len``, L_cache is ``buffer_len``). R is continuous at both ends, falls linearly
    from 0 to −penalty across the buffer, and is non-increasing in L for ``penalty`` ≥ 0. With
    ``buffer_len = 0`` the ramp is empty: 0 up to ``max_len`` and −penalty beyond (a hard cut). Responses
    sampled with ``max_new_tokens = max_len`` never exceed it, so there ``buffer_len = 0`` turns the term off.

    Args:
        lengths: ``[N]`` (any shape) response lengths L in tokens, integer or float.
        max_len: L_max, the generation budget.
        buffer_len: L_cache ≥ 0, the width of the linear ramp before ``max_len``.
        penalty: the penalty at and beyond ``max_len`` (DAPO uses 1).

    Returns:
        Penalties of the shape of ``lengths``, in its dtype when floating, else the default float dtype.

    Raises:
        ValueError: if ``buffer_len`` < 0.
    """
    if buffer_len < 0:
        raise ValueError(f"overlong_penalty: buffer_len must be >= 0, got {buffer_len}")
    dtype = lengths.dtype if lengths.is_floating_point() else torch.get_default_dtype()
    length = lengths.to(dtype)
    start = max_len - buffer_len
    # (start − L)/buffer_len first: it is exactly −1 at L = max_len, so the ramp meets −penalty without a step
    ramp = penalty * ((start - length) / max(buffer_len, 1))  # used only where start < L ≤ max_len
    beyond = torch.full_like(length, -penalty)
    return torch.where(
        length <= start, torch.zeros_like(length), torch.where(length <= max_len, ramp, beyond)
    )
