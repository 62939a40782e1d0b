"""PPO-RLHF, phase 2 and 3 of a step: score a rollout with the frozen roles, shape rewards, compute advantages.

    rollout ──reward model (or reward functions)──▶ scores [B] ──normalise, clip, no-EOS penalty──▶
            ──reference: log π_ref (temperature τ)──▶ kl_shaped_rewards [B, T] (β from the KL controller)
            ──critic: V [B, T]──▶ gae(γ, λ) ──▶ advantages (whitened over the batch), returns [B, T]

Every tensor keeps the rollout layout (DESIGN.md): prompts left-padded to P, responses right-padded to T, a
response mask that is 1 up to and including EOS. The score goes on each row's last response token (found
from the mask, never from pad ids), and the episode ends there: later positions carry no reward, value or
advantage. Defaults follow "The N+ implementation details of RLHF with PPO" (Huang et al. 2024).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from postrl.core import gae, kl_estimate, kl_shaped_rewards, masked_mean, masked_sum, masked_whiten
from postrl.lm.roles import Roles
from postrl.lm.rollout import (
    ResponseForward,
    Rollout,
    response_forward,
    response_log_probs,
    score,
    score_values,
)
from postrl.lm.rollout.batch import RolloutBatch
from postrl.runtime import distributed as dist

REWARD_NORMS = ("none", "rm_stats", "batch")


@dataclass(frozen=True)
class RewardConfig:
    """How sequence scores become the reward at the last token (the notes' "Practical Training
    Considerations": reward normalisation, reward clipping)."""

    normalize: str = "rm_stats"
    """none; rm_stats: (r − μ)/σ with the reward model's statistics on SFT samples (its reward_norm.json);
    batch: whiten the scores over each step's batch (all ranks)."""
    clip: float | None = None
    """Clip the (normalised) score to [−clip, clip]; null: no clipping."""
    missing_eos_penalty: float | None = -1.0
    """Score that REPLACES the score of a response cut at max_new_tokens without EOS (N+ details); null: keep."""

    CHECKS = {"clip": "> 0"}  # valid ranges


@dataclass(frozen=True)
class KLConfig:
    """The KL penalty to the frozen reference, −β·(log π − log π_ref) on every response token."""

    beta: float = 0.1
    """β (the initial β when `target` is set)."""
    target: float | None = None
    """Target KL per response (nats, k1 sum); set: adaptive β (Ziegler et al. 2019); null: β fixed."""
    horizon: int = 10000
    """Adaptive controller horizon, in responses."""

    CHECKS = {"beta": ">= 0", "target": "> 0", "horizon": ">= 1"}  # valid ranges


@dataclass(frozen=True)
class GAEConfig:
    """Advantages and returns."""

    gamma: float = 1.0
    """γ, discount per token (1: the N+ details' default)."""
    lam: float = 0.95
    """λ of GAE."""
    whiten_advantages: bool = True
    """Normalise advantages to mean 0, std 1 over the batch (all ranks)."""

    CHECKS = {"gamma": "[0, 1]", "lam": "[0, 1]"}  # valid ranges


# ---- scores ----------------------------------------------------------------------------------------------
@torch.no_grad()
def reward_model_scores(reward_model: torch.nn.Module, rollout: Rollout, chunk_size: int = 64) -> Tensor:
    """The RM's score of each prompt + response at its last real token (the EOS when there is one) → [B]."""
    out = []
    for rows in torch.split(torch.arange(rollout.input_ids.shape[0]), chunk_size):
        out.append(reward_model.score(rollout.input_ids[rows], rollout.attention_mask[rows]).float())
    return torch.cat(out)


def normalize_scores(
    scores: Tensor, finished: Tensor, cfg: RewardConfig, stats: dict[str, float] | None
) -> Tensor:
    """Raw scores [B] → the scores that enter the rewards: normalised, clipped, then (for a response
    without EOS) replaced by ``missing_eos_penalty``."""
    if cfg.normalize not in REWARD_NORMS:
        raise ValueError(f"reward.normalize must be one of {REWARD_NORMS}; got {cfg.normalize!r}")
    if cfg.normalize == "rm_stats":
        if stats is None:
            raise ValueError("reward.normalize=rm_stats needs the reward model's reward_norm.json")
        scores = (scores - stats["mean"]) / max(stats["std"], 1e-8)
    elif cfg.normalize == "batch":
        scores = global_whiten(scores, torch.ones_like(scores))
    if cfg.clip is not None:
        scores = scores.clamp(-cfg.clip, cfg.clip)
    if cfg.missing_eos_penalty is not None:
        scores = torch.where(finished, scores, torch.full_like(scores, cfg.missing_eos_penalty))
    return scores


def global_whiten(x: Tensor, mask: Tensor) -> Tensor:
    """`masked_whiten` with the mean and variance over every rank's positions (one process: the same)."""
    if dist.world_size() == 1:
        return masked_whiten(x, mask)
    m = mask.to(x.dtype)
    sums = dist.all_reduce_sum(torch.stack([masked_sum(x, m), (x * x * m).sum(), m.sum()]).double())
    mean = sums[0] / sums[2]
    var = (sums[1] - sums[2] * mean**2) / (sums[2] - 1).clamp(min=1.0)
    return ((x - mean) * torch.rsqrt(var + 1e-8) * m).to(x.dtype)


# ---- advantages ------------------------------------------------------------------------------------------
def last_token_mask(response_mask: Tensor) -> Tensor:
    """[B, T] bool: True at each row's last response token (the end of the episode)."""
    real = response_mask != 0
    following = torch.cat([real[:, 1:], torch.zeros_like(real[:, :1])], dim=1)
    return real & ~following


def advantages_and_returns(
    rewards: Tensor, values: Tensor, response_mask: Tensor, cfg: GAEConfig
) -> tuple[Tensor, Tensor]:
    """GAE over response tokens → (advantages, returns) [B, T], 0 on padding.

    The state after the last response token is terminal (the score was paid there), so nothing bootstraps
    past it; padded positions have reward 0 and value 0, so they add nothing.
    """
    mask = response_mask.to(rewards.dtype)
    values = values * mask
    next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)  # V(s_{t+1})
    end = last_token_mask(response_mask)
    advantages, returns = gae(rewards * mask, values, next_values, end, end, cfg.gamma, cfg.lam)
    advantages, returns = advantages * mask, returns * mask
    if cfg.whiten_advantages:
        advantages = global_whiten(advantages, mask)
    return advantages, returns


# ---- the phase -------------------------------------------------------------------------------------------
def seq_mean(x: Tensor) -> float:
    """Mean over all ranks' rows of a per-row tensor [B]."""
    total = dist.all_reduce_sum(torch.stack([x.double().sum(), torch.tensor(float(x.numel()))]))
    return float(total[0] / total[1].clamp(min=1))


@torch.no_grad()
def reference_and_values(
    roles: Roles,
    rollout: Rollout,
    temperature: float,
    chunk_size: int = 64,
    reference: ResponseForward | None = None,
) -> tuple[Tensor, Tensor]:
    """(log π_ref [B, T] at ``temperature``, through ``reference``, the forward the trainer chose for the
    reference (None: `response_forward`'s); the critic's values [B, T], V of the state before each response
    token) of the rollout's responses."""
    ids, mask, P = rollout.input_ids, rollout.attention_mask, rollout.prompt_len
    reference = reference or response_forward(roles.reference, gradients=False)
    ref_log_probs = response_log_probs(
        reference, ids, mask, P, temperature=temperature, chunk_size=chunk_size
    )
    if roles.critic is None:  # shared trunk: the actor returns (logits, values)
        _, values = score(roles.actor, ids, mask, P, temperature=temperature, chunk_size=chunk_size)
    else:
        values = score_values(roles.critic, ids, mask, P, chunk_size=chunk_size)
    return ref_log_probs, values


@torch.no_grad()
def make_batch(
    roles: Roles,
    rollout: Rollout,
    raw_scores: Tensor,
    *,
    temperature: float,
    beta: float,
    reward: RewardConfig,
    advantage: GAEConfig,
    norm_stats: dict[str, float] | None,
    chunk_size: int = 64,
    reference: ResponseForward | None = None,
) -> tuple[RolloutBatch, dict[str, float]]:
    """Reference log-probs, values, shaped rewards and GAE for ``rollout`` with sequence scores
    ``raw_scores`` [B] → (batch, metrics). Log-probs of actor and reference both use ``temperature``; the
    reference's through ``reference``, the forward the trainer chose for it (None: `response_forward`'s)."""
    ids, response_mask = rollout.input_ids, rollout.response_mask
    ref_log_probs, values = reference_and_values(roles, rollout, temperature, chunk_size, reference)
    scores = normalize_scores(raw_scores.to(ids.device).float(), rollout.finished, reward, norm_stats)
    rewards = kl_shaped_rewards(scores, rollout.log_probs, ref_log_probs, response_mask, beta)
    advantages, returns = advantages_and_returns(rewards, values, response_mask, advantage)
    batch = RolloutBatch(
        ids, rollout.attention_mask, rollout.prompt_len, response_mask, rollout.log_probs, advantages,
        values=values, returns=returns,
    )  # fmt: skip
    m = response_mask.float()
    k1 = masked_sum(kl_estimate(rollout.log_probs, ref_log_probs, "k1"), m, dim=-1)  # (B,) per response
    k3 = masked_sum(kl_estimate(rollout.log_probs, ref_log_probs, "k3"), m, dim=-1)
    metrics = {
        "rm_score": seq_mean(raw_scores.float().cpu()),
        "score": seq_mean(scores.cpu()),
        "kl_to_ref": seq_mean(k1.cpu()),
        "kl_k3": seq_mean(k3.cpu()),
        "beta": beta,
        "non_score_reward": seq_mean(masked_sum(rewards, m, dim=-1).cpu() - scores.cpu()),
        "response_length": seq_mean(rollout.response_lengths.float().cpu()),
        "no_eos_fraction": seq_mean((~rollout.finished).float().cpu()),
        "value_mean": float(masked_mean(values, m)),
        "explained_variance": explained_variance(values, returns, m),
    }
    return batch, metrics


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 − Var[R̂ − V] / Var[R̂] over masked positions (1: perfect critic, ≤ 0: no better than a constant)."""
    var_returns = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    error = returns - values
    var_error = masked_mean((error - masked_mean(error, mask)) ** 2, mask)
    return float(1 - var_error / var_returns) if float(var_returns) > 0 else float("nan")
