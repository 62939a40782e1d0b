"""KL estimators, KL-shaped rewards and KL coefficient controllers (RLHF).

Sample-based estimators of KL(π‖π_ref) from log-probs of tokens sampled from π (Schulman, "Approximating KL
Divergence", 2020, http://joschu.net/blog/kl-approx.html). With r = π_ref/π and log r = log π_ref − log π:

    k1 = −log r = log π − log π_ref          unbiased, high variance, can be negative
    k2 = ½ (log r)²                           biased, low variance, ≥ 0
    k3 = (r − 1) − log r                      unbiased, low variance, ≥ 0
"""

from __future__ import annotations

import torch

from postrl.core.stats import fill_outside_mask

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "KL_KINDS",
    "kl_estimate",
    "kl_shaped_rewards",
]


def _k1(log_ratio: torch.Tensor) -> torch.Tensor:
    return -log_ratio


def _k2(log_ratio: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_ratio**2


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    # (e^x − 1) − x with expm1: exp(x) − x − 1 cancels to −1e-16 for |x| ~ 1e-8, below the k3 ≥ 0 it must keep
    return torch.expm1(log_ratio) - log_ratio


KL_KINDS = {"k1": _k1, "k2": _k2, "k3": _k3}


def kl_estimate(
    log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: str, *, clamp: float = 20.0
) -> torch.Tensor:
    """Per-token estimate of KL(π‖π_ref) from log-probs of samples drawn from π.

        log r = log π_ref − log π
        k1 = log π − log π_ref,   k2 = ½ (log π − log π_ref)²,   k3 = exp(log r) − log r − 1

    For k3 the log-ratio is clamped to [−clamp, clamp] (default ±20) before use so ``exp`` cannot overflow;
    within that range the value is exact, outside it is the k3 of the clamped ratio (still ≥ 0) and its
    gradient is 0. k1 and k2 are not clamped.

    Args:
        log_probs: ``[..., T]`` log π of the sampled tokens.
        ref_log_probs: ``[..., T]`` log π_ref of the same tokens.
        kind: one of ``"k1"``, ``"k2"``, ``"k3"``.
        clamp: bound on |log r| for k3.

    Returns:
        ``[..., T]`` per-token estimates (differentiable).

    Raises:
        ValueError: unknown ``kind``.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"kl_estimate: unknown kind {kind!r}; valid kinds are {sorted(KL_KINDS)}")
    log_ratio = ref_log_probs - log_probs
    if kind == "k3":
        log_ratio = torch.clamp(log_ratio, -clamp, clamp)
    return KL_KINDS[kind](log_ratio)


def kl_shaped_rewards(
    scores: torch.Tensor,
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    *,
    kind: str = "k1",
) -> torch.Tensor:
    """Per-token RLHF rewards: a KL penalty on every response token plus the sequence score at the end.

        r_t = −β · kl_t  +  [t = last response token] · score,   kl_t = log π(y_t) − log π_ref(y_t)  (k1)

    Source: Ziegler et al. 2019 (arXiv:1909.08593), eq. 2; Ouyang et al. 2022 (InstructGPT), eq. 2.

    Args:
        scores: ``[B]`` reward-model / verifier scores, one per response.
        log_probs: ``[B, T]`` log π of the response tokens (rollout policy).
        ref_log_probs: ``[B, T]`` log π_ref of the same tokens.
        mask: ``[B, T]`` bool/float, 1 on response tokens (right- or left-padded; the score goes to the LAST
            position where the mask is 1).
        beta: KL coefficient β.
        kind: KL estimator for the per-token penalty (``"k1"`` as in the papers; see :func:`kl_estimate`).

    Returns:
        ``[B, T]`` rewards, detached (they are targets for GAE); 0 wherever ``mask`` is 0. A row whose mask
        is all 0 gets no score (all zeros).
    """
    with torch.no_grad():
        real = mask != 0
        kl = kl_estimate(fill_outside_mask(log_probs, real), fill_outside_mask(ref_log_probs, real), kind)
        rewards = fill_outside_mask(-beta * kl, real)
        width = real.shape[-1]
        # index of the last 1 in each row: flip, take the first 1, map back
        last = width - 1 - torch.argmax(torch.flip(real, dims=[-1]).to(torch.int8), dim=-1)  # [B]
        at_last = torch.nn.functional.one_hot(last, width).bool() & real.any(dim=-1, keepdim=True)  # [B, T]
        score_grid = scores.to(rewards.dtype).unsqueeze(-1).expand_as(rewards)
        rewards = rewards + torch.where(at_last, score_grid, torch.zeros_like(rewards))
    return rewards


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, arXiv:1909.08593, §2.2).

        e = clip(KL / target − 1, −0.2, 0.2),     β ← β (1 + e · n_steps / horizon)

    ``value`` is the current β. ``state_dict`` / ``load_state_dict`` let trainers checkpoint it.

    Args:
        init_beta: initial β.
        target: target KL per sequence (same units as the KL passed to ``update``).
        horizon: K_β⁻¹-like horizon in steps (the paper uses K_β = 0.1 per batch).
    """

    def __init__(self, init_beta: float, target: float, horizon: float) -> None:
        if target <= 0 or horizon <= 0:
            raise ValueError(f"AdaptiveKLController: target and horizon must be > 0, got {target}, {horizon}")
        self.value = float(init_beta)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> float:
        """Move β toward the target KL; ``current_kl`` may be a float or a 0-dim tensor. Returns new β."""
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
        return self.value

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])
        self.target = float(state.get("target", self.target))
        self.horizon = float(state.get("horizon", self.horizon))


class FixedKLController:
    """Constant β with the same interface as [`AdaptiveKLController`][postrl.core.AdaptiveKLController]
    (`update` is a no-op)."""

    def __init__(self, beta: float) -> None:
        self.value = float(beta)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> float:
        return self.value

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])
