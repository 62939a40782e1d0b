"""Group Relative Policy Optimization: group-normalised advantages and the GRPO loss family.

GRPO (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300) samples G responses per prompt and uses the
group-normalised reward as every token's advantage; Dr. GRPO (Liu et al. 2025, arXiv:2503.20783) removes the
std scaling and the per-response length normalisation; DAPO (Yu et al. 2025, arXiv:2503.14476) adds
clip-higher (ε_high > ε) and token-level averaging; GSPO (Zheng et al. 2025, arXiv:2507.18071) replaces the
per-token importance ratio by one length-normalised ratio per response.

The loss (`grpo_loss`), for response i and its token t:

    ρ_{i,t} = exp(log π − log π_old),  k3_{i,t} = kl_estimate(log π, log π_ref, "k3")
    ℓ_{i,t} = −[ min(ρ A_i, clip(ρ, 1−ε, 1+ε_high) A_i) − β k3_{i,t} ]       (ρ k3 with ``unbiased_kl``)

GSPO. ``importance_level="sequence"`` (Zheng et al. 2025, arXiv:2507.18071) replaces ρ_{i,t} on every
response token by the response's length-normalised ratio

    s_i = exp( Σ_t m_{i,t} (log π_{i,t} − log π_old,{i,t}) / Σ_t m_{i,t} )
    ℓ_{i,t} = −[ min(s_i A_i, clip(s_i, 1−ε, 1+ε_high) A_i) − β k3_{i,t} ]

s_i is not detached, so the gradient reaches every token of the response through it; with
``loss_type="grpo"`` the loss is GSPO's −(1/B) Σ_i min(s_i A_i, clip(s_i) A_i) (+ the KL term). GSPO's
ε are those of its paper (e.g. 3e-4 and 4e-4), far below token-level ones, since s_i is a geometric mean.
``unbiased_kl`` still weights k3 by the token ratio ρ_{i,t}, which is what makes each token's KL
gradient unbiased.

``importance_level="sequence_sum"`` takes the response's whole likelihood ratio s_i = exp(Σ_t m_{i,t}(log π −
log π_old)) instead (not length-normalised): with ``loss_type="grpo"`` and β = 0 the loss is
−(1/B) Σ_i min(s_i A_i, clip(s_i) A_i), RLOO's REINFORCE on whole responses (Ahmadian et al. 2024) as TRL's
``RLOOTrainer`` computes it; at s_i = 1 its gradient is −(1/B) Σ_i A_i Σ_t ∇log π_{i,t}.

KL gradient. The tokens are samples of π_old, so (at ρ = 1) E[∇k3] = −Σ_y π_ref(y) ∇log π(y) =
∇KL(π_ref‖π), the forward KL, although k3's value estimates the reverse KL(π‖π_ref). ``unbiased_kl``
weights k3 by the differentiable ratio ρ (value 1 on-policy): E[∇(ρ k3)] = ∇KL(π‖π_ref) (DeepSeek-V3.2,
arXiv:2512.02556; TRL's ``use_bias_correction_kl``, on by default in TRL 1.16). The loss value at ρ = 1
is the same either way.

Aggregation. ``loss_type`` (see ``GRPO_LOSS_TYPES``):
    ``"grpo"``:    mean over each response's tokens, then over responses (Shao et al. 2024, eq. 3);
    ``"token"``:   sum over all tokens / number of tokens (DAPO, Yu et al. 2025);
    ``"dr_grpo"``: sum over all tokens / (B · max_len) (Liu et al. 2025).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from postrl.core.kl import kl_estimate
from postrl.core.policy_gradient import clipped_surrogate
from postrl.core.stats import fill_outside_mask, masked_mean

__all__ = ["GRPO_LOSS_TYPES", "IMPORTANCE_LEVELS", "group_advantages", "grpo_loss"]


def group_advantages(
    rewards: torch.Tensor, group_size: int, eps: float = 1e-4, scale: bool = True
) -> torch.Tensor:
    """Group-relative advantages (Shao et al. 2024, §4.1.2 "outcome supervision").

        A_i = (r_i − mean_g(r)) / (std_g(r) + eps)      (scale=True, GRPO)
        A_i = r_i − mean_g(r)                           (scale=False, Dr. GRPO, Liu et al. 2025)

    std_g is ``torch.std`` (Bessel-corrected). A group whose rewards are all equal (including G = 1) gives
    exactly 0 for each of its members, whatever rounding the mean has.

    Args:
        rewards: ``[n·G]`` rewards, the G responses of each prompt contiguous (other shapes are flattened in
            row-major order and the result is reshaped back).
        group_size: G.
        eps: added to the std.
        scale: divide by the group std (GRPO) or not (Dr. GRPO).

    Returns:
        Advantages of the shape of ``rewards``, detached.

    Raises:
        ValueError: if the number of rewards is not a multiple of ``group_size``.
    """
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"group_advantages: {rewards.numel()} rewards cannot be split into groups of {group_size}"
        )
    with torch.no_grad():
        groups = rewards.reshape(-1, group_size)  # (n, G)
        centered = groups - groups.mean(dim=-1, keepdim=True)
        if scale and group_size > 1:
            centered = centered / (groups.std(dim=-1, keepdim=True) + eps)
        constant = (groups == groups[:, :1]).all(dim=-1, keepdim=True)  # (n, 1)
        advantages = torch.where(constant, torch.zeros_like(centered), centered)
    return advantages.reshape(rewards.shape)


# Each aggregation maps masked per-token losses [B, T] (0 on padding) to a scalar.
# `normalizer` overrides the denominator with a global count so that micro-batch / shard losses sum to the
# full-batch loss: the global number of responses (grpo), of tokens (token), of responses × max_len (dr_grpo).
Aggregation = Callable[..., torch.Tensor]  # (per_token, mask, max_len, normalizer) -> loss


def _grpo_mean(per_token: torch.Tensor, mask: torch.Tensor, max_len, normalizer) -> torch.Tensor:
    """Shao et al. 2024, eq. 3: (1/G) Σ_i (1/|o_i|) Σ_t ℓ_{i,t}."""
    lengths = mask.sum(dim=-1).clamp(min=1.0)
    per_response = per_token.sum(dim=-1) / lengths  # [B]
    denom = per_token.shape[0] if normalizer is None else normalizer
    return per_response.sum() / denom


def _token_mean(per_token: torch.Tensor, mask: torch.Tensor, max_len, normalizer) -> torch.Tensor:
    """DAPO (Yu et al. 2025), eq. 12: Σ_{i,t} ℓ_{i,t} / Σ_i |o_i|."""
    denom = mask.sum().clamp(min=1.0) if normalizer is None else normalizer
    return per_token.sum() / denom


def _dr_grpo(per_token: torch.Tensor, mask: torch.Tensor, max_len, normalizer) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025): Σ_{i,t} ℓ_{i,t} / (B · max_len), a constant denominator."""
    if normalizer is None:
        normalizer = per_token.shape[0] * (mask.shape[-1] if max_len is None else max_len)
    return per_token.sum() / normalizer


GRPO_LOSS_TYPES: dict[str, Aggregation] = {"grpo": _grpo_mean, "token": _token_mean, "dr_grpo": _dr_grpo}


def _token_ratio(log_ratio: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """ρ_{i,t} = exp(log π_{i,t} − log π_old,{i,t}): ``[B, T]``."""
    return torch.exp(log_ratio)


def _sequence_ratio(log_ratio: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """GSPO (Zheng et al. 2025): s_i = exp(Σ_t m_{i,t} log ρ_{i,t} / Σ_t m_{i,t}): ``[B, 1]``.

    Not detached: ∂s_i/∂log π_{i,t} = s_i m_{i,t} / |o_i|. A row without response tokens gets s_i = 1.
    """
    lengths = real.sum(dim=-1, keepdim=True).clamp(min=1)  # [B, 1]
    return torch.exp(log_ratio.sum(dim=-1, keepdim=True) / lengths)


def _sequence_sum_ratio(log_ratio: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """The response's likelihood ratio π(o_i)/π_old(o_i) = exp(Σ_t m_{i,t} log ρ_{i,t}): ``[B, 1]`` (RLOO as
    REINFORCE on whole responses, Ahmadian et al. 2024; TRL's ``RLOOTrainer``). Not detached:
    ∂s_i/∂log π_{i,t} = s_i m_{i,t}, so at s_i = 1 the gradient is A_i Σ_t ∇log π_{i,t}."""
    return torch.exp(log_ratio.sum(dim=-1, keepdim=True))


# `log_ratio` is 0 on padding; each maps it and the bool mask to a ratio broadcastable to [B, T].
IMPORTANCE_LEVELS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token": _token_ratio,
    "sequence": _sequence_ratio,
    "sequence_sum": _sequence_sum_ratio,
}


def grpo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    beta: float,
    loss_type: str = "grpo",
    *,
    clip_eps_high: float | None = None,
    max_len: int | None = None,
    normalizer: float | torch.Tensor | None = None,
    unbiased_kl: bool = False,
    importance_level: str = "token",
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO clipped surrogate with a k3 KL penalty, aggregated per ``loss_type`` (the module docstring gives
    the per-token loss ℓ_{i,t}, GSPO's ratio, the KL gradient and the aggregations).

    Args:
        log_probs: ``[B, T]`` log π of the response tokens, differentiable.
        old_log_probs: ``[B, T]`` log π_old (sampling policy), detached.
        ref_log_probs: ``[B, T]`` log π_ref, or None when ``beta == 0``.
        advantages: ``[B]`` (one per response, e.g. from :func:`group_advantages`), or ``[B, 1]``/``[B, T]``.
        mask: ``[B, T]`` bool/float 0/1 response mask.
        clip_eps: ε.
        beta: KL coefficient β.
        loss_type: ``"grpo"``, ``"token"`` or ``"dr_grpo"``.
        clip_eps_high: ε_high (DAPO clip-higher); defaults to ``clip_eps``.
        max_len: the L of Dr. GRPO; defaults to the mask's width T.
        normalizer: global denominator for gradient accumulation / data parallelism: the global number of
            responses (grpo), of response tokens (token), or of responses × max_len (dr_grpo). Give every
            micro-batch the same value and the sum of their losses equals the full-batch loss.
        unbiased_kl: weight k3 by ρ ("KL gradient"); the logged ``kl`` stays the plain k3 mean.
        importance_level: ``"token"`` (GRPO, PPO's per-token ρ), ``"sequence"`` (GSPO's s_i) or
            ``"sequence_sum"`` (the response's likelihood ratio: RLOO as TRL); see ``IMPORTANCE_LEVELS``.
        is_weights: ``[B, T]`` detached behaviour-policy weights w_t (`truncated_is_weights`,
            `masked_is_weights`) multiplying the clipped surrogate: −w_t·min(ρA, clip(ρ)A) + β·k3, the KL term
            unweighted as in TRL; ``old_log_probs`` is then the proximal policy (decoupled PPO). None: w = 1.

    Returns:
        ``(loss, stats)``: 0-dim loss and detached 0-dim local stats: ``clip_fraction`` (as
        :func:`ppo_clip_loss`), ``kl`` (masked mean k3; 0 when ``ref_log_probs`` is None), ``ratio_mean``;
        over response tokens for ``"token"``, over responses for the sequence levels (see `_ratio_stats`).

    Raises:
        ValueError: unknown ``loss_type`` or ``importance_level``, or ``beta != 0`` without ``ref_log_probs``.
    """
    _check_options(loss_type, importance_level, ref_log_probs, beta)
    real = mask != 0
    per_token, ratio, clipped, kl = _per_token_losses(
        log_probs, old_log_probs, ref_log_probs, advantages, real, clip_eps, beta,
        clip_eps_high=clip_eps_high, unbiased_kl=unbiased_kl, importance_level=importance_level,
        is_weights=is_weights,
    )  # fmt: skip
    loss = GRPO_LOSS_TYPES[loss_type](per_token, real.to(per_token.dtype), max_len, normalizer)
    return loss, _stats(ratio, clipped, kl, real, importance_level)


def _check_options(
    loss_type: str, importance_level: str, ref_log_probs: torch.Tensor | None, beta: float
) -> None:
    """Raise the `ValueError`s of `grpo_loss` for its options."""
    if loss_type not in GRPO_LOSS_TYPES:
        raise ValueError(f"grpo_loss: unknown loss_type {loss_type!r}; valid: {sorted(GRPO_LOSS_TYPES)}")
    if importance_level not in IMPORTANCE_LEVELS:
        raise ValueError(
            f"grpo_loss: unknown importance_level {importance_level!r}; valid: {sorted(IMPORTANCE_LEVELS)}"
        )
    if ref_log_probs is None and beta != 0:
        raise ValueError("grpo_loss: ref_log_probs is required when beta != 0")


def _per_token_losses(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor | None,
    advantages: torch.Tensor,
    real: torch.Tensor,
    clip_eps: float,
    beta: float,
    *,
    clip_eps_high: float | None = None,
    unbiased_kl: bool = False,
    importance_level: str = "token",
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """ℓ_{i,t} of `grpo_loss` before aggregation, with what its statistics need.

    Inputs as in `grpo_loss`, ``real`` the bool mask ``[B, T]``. Returns (ℓ ``[B, T]``, 0 on padding; the
    ratio: ρ ``[B, T]``, or GSPO's s ``[B, 1]``; the clip indicator of `clipped_surrogate` ``[B, T]``; k3
    ``[B, T]``, or None without ``ref_log_probs``).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)  # [B, 1]
    log_probs = fill_outside_mask(log_probs, real)
    old_log_probs = fill_outside_mask(old_log_probs.detach(), real)
    advantages = fill_outside_mask(advantages.detach(), real)  # [B, T]
    log_ratio = log_probs - old_log_probs  # [B, T], 0 on padding
    ratio = IMPORTANCE_LEVELS[importance_level](log_ratio, real)  # [B, T] or [B, 1] (GSPO)
    surrogate, clipped = clipped_surrogate(ratio, advantages, clip_eps, clip_eps_high)  # [B, T]
    per_token = -surrogate  # 0 on padding: every input is 0 there, so ρ = 1, A = 0 and k3 = 0
    if is_weights is not None:
        per_token = per_token * fill_outside_mask(is_weights.detach(), real)
    kl = None
    if ref_log_probs is not None:
        kl = kl_estimate(log_probs, fill_outside_mask(ref_log_probs.detach(), real), "k3")
        per_token = per_token + beta * (kl * torch.exp(log_ratio) if unbiased_kl else kl)
    return per_token, ratio, clipped, kl


@torch.no_grad()
def _stats(
    ratio: torch.Tensor,
    clipped: torch.Tensor,
    kl: torch.Tensor | None,
    real: torch.Tensor,
    importance_level: str,
) -> dict[str, torch.Tensor]:
    """The detached statistics of `grpo_loss`."""
    clip_fraction, ratio_mean = _ratio_stats(ratio, clipped, real, importance_level)
    return {
        "clip_fraction": clip_fraction,
        "kl": torch.zeros((), dtype=ratio.dtype) if kl is None else masked_mean(kl, real),
        "ratio_mean": ratio_mean,
    }


def _ratio_stats(
    ratio: torch.Tensor, clipped: torch.Tensor, real: torch.Tensor, importance_level: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(clip fraction, mean ratio) over response tokens (token level) or over responses with at least one
    token (sequence level: the fraction of responses whose s_i is clipped and the mean s_i; with per-token
    advantages a response counts by the fraction of its tokens that are clipped)."""
    clipped = clipped.to(ratio.dtype)
    if importance_level == "token":
        return masked_mean(clipped, real), masked_mean(ratio, real)
    has_tokens = real.any(dim=-1)  # [B]
    per_response = masked_mean(clipped, real, dim=-1)  # [B] fraction of the response's tokens clipped
    return masked_mean(per_response, has_tokens), masked_mean(ratio.squeeze(-1), has_tokens)
