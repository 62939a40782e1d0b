"""GRPO's loss on a batch and its part of the on-policy update (`postrl.lm.onpolicy`) that PPO shares:
`GRPOObjective`, with the policy's teacher-forced forward injected (`PolicyForward`: a causal LM's,
`text_policy`, or a VLM's, `postrl.lm.vlm.grpo`). Kept apart from `algorithm.py` (the step and the trainer)
so that the VLM's GRPO imports it without importing the trainer that dispatches to it."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from postrl.core import behaviour_mismatch, grpo_loss, masked_is_weights, masked_mean, truncated_is_weights
from postrl.lm import onpolicy
from postrl.lm.grpo.config import GRPOLossConfig
from postrl.lm.onpolicy import Term
from postrl.lm.rollout import ResponseForward, forward_log_probs, response_forward
from postrl.lm.rollout.batch import RolloutBatch
from postrl.lm.trainer import clip_grad_norm
from postrl.runtime import distributed as dist

# ---- the batch's loss -----------------------------------------------------------------------------------
PolicyForward = Callable[[RolloutBatch], tuple[Tensor, Tensor]]
"""A teacher-forced forward of the policy on a batch's rows → (log π_τ of the response tokens [b, T], entropy
per token [b, T] detached), both 0 past each response: a causal LM's (`text_policy`) or a VLM's, whose rows
carry pictures (`postrl.lm.vlm.grpo`)."""


def policy_log_probs(
    forward: ResponseForward, input_ids: Tensor, attention_mask: Tensor, prompt_len: int, temperature: float
) -> tuple[Tensor, Tensor]:
    """One teacher-forced ``forward`` of the policy (`postrl.lm.rollout.forwards`: a group's shared prompt runs
    once) → (log π_τ of the response tokens [b, T], entropy per token [b, T] detached)."""
    log_probs, entropy = forward_log_probs(
        forward, input_ids, attention_mask, prompt_len, temperature, entropy=True
    )
    mask = attention_mask[:, prompt_len:].to(torch.float32)
    return log_probs * mask, entropy * mask


def text_policy(forward: ResponseForward, temperature: float) -> PolicyForward:
    """The `PolicyForward` of a causal LM run through ``forward`` (`policy_log_probs`)."""

    def policy(batch: RolloutBatch) -> tuple[Tensor, Tensor]:
        return policy_log_probs(forward, batch.input_ids, batch.attention_mask, batch.prompt_len, temperature)

    return policy


def loss_of(
    log_probs: Tensor,
    entropy: Tensor,
    batch: RolloutBatch,
    cfg: GRPOLossConfig,
    max_len: int,
    normalizer: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """`core.grpo_loss` of ``batch`` given the policy's log-probs and entropy [b, T] of its rows, and its stats
    (clip fraction, k3 KL, ratio, entropy).

    A batch that carries ``behaviour_log_probs`` (one update per batch under grpo.is_correction) takes the
    proximal policy from this very forward: before the only update π_old is the current policy, so its
    detached log-probs are π_old and no second forward is needed; the weights π_old/μ and the mismatch stats
    are made here. ``cfg.is_correction`` must be resolved (not auto) then."""
    old_log_probs, is_weights, behaviour = batch.old_log_probs, batch.is_weights, {}
    if batch.behaviour_log_probs is not None:
        old_log_probs = log_probs.detach()
        is_weights, behaviour = behaviour_correction(
            cfg, old_log_probs, batch.behaviour_log_probs, batch.response_mask
        )
    loss, stats = grpo_loss(
        log_probs,
        old_log_probs,
        batch.ref_log_probs,
        batch.advantages,
        batch.response_mask,
        cfg.clip_eps,
        cfg.beta,
        cfg.loss_type,
        clip_eps_high=cfg.clip_eps_high,
        max_len=max_len,
        normalizer=normalizer,
        unbiased_kl=cfg.unbiased_kl,
        importance_level=cfg.importance_level,
        is_weights=is_weights,
    )
    return loss, {**stats, **behaviour, "entropy": masked_mean(entropy, batch.response_mask)}


IS_WEIGHTS = {"tis": truncated_is_weights, "mis": masked_is_weights}
"""grpo.is_correction → the weighting of the behaviour policy's samples (`postrl.core.importance`)."""


def behaviour_correction(
    g: GRPOLossConfig, old_log_probs: Tensor, behaviour_log_probs: Tensor, mask: Tensor
) -> tuple[Tensor | None, dict[str, Tensor]]:
    """The weights π_old/μ of ``g.is_correction`` ([N, T], None for none) and the mismatch between the trainer's
    teacher-forced log-probs and the sampler's: behaviour_kl (k3 of KL(μ‖π_old)), behaviour_log_ratio (mean
    |log π_old − log μ|) and, when corrected, the fraction of response tokens whose weight met the cap."""
    stats = behaviour_mismatch(old_log_probs, behaviour_log_probs, mask)
    metrics = {"behaviour_kl": stats["kl"], "behaviour_log_ratio": stats["log_ratio"]}
    if g.is_correction == "none":
        return None, metrics
    weights = IS_WEIGHTS[g.is_correction](old_log_probs, behaviour_log_probs, mask, g.is_cap, g.is_level)
    ratios = truncated_is_weights(old_log_probs, behaviour_log_probs, mask, math.inf, g.is_level)  # unbounded
    on = mask.bool()
    metrics["is_capped_fraction"] = (
        (ratios[on] > g.is_cap).float().mean() if on.any() else ratios.new_zeros(())
    )
    metrics["is_weight_mean"] = weights[on].mean() if on.any() else weights.new_ones(())
    return weights, metrics


def grpo_batch_loss(
    forward: ResponseForward,
    batch: RolloutBatch,
    cfg: GRPOLossConfig,
    temperature: float,
    max_len: int,
    normalizer: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The GRPO loss of ``batch`` under the policy's ``forward`` and its stats (clip fraction, k3 KL, ratio,
    entropy).

    ``normalizer``: the global count of the whole minibatch (`loss_normalizer`), so that micro-batch losses sum
    to the minibatch loss; None normalises by this batch alone.
    """
    log_probs, entropy = text_policy(forward, temperature)(batch)
    return loss_of(log_probs, entropy, batch, cfg, max_len, normalizer)


def loss_normalizer(response_mask: Tensor, loss_type: str, max_len: int) -> float:
    """The global denominator of `grpo_loss` for a minibatch: responses, tokens, or responses · max_len."""
    local = {
        "grpo": response_mask.shape[0],
        "token": int(response_mask.sum()),
        "dr_grpo": response_mask.shape[0] * max_len,
    }[loss_type]
    return float(dist.all_reduce_sum(torch.tensor(float(local))).item())


# ---- the update ---------------------------------------------------------------------------------------------
class GRPOObjective:
    """GRPO's part of the on-policy update (`postrl.lm.onpolicy.Objective`): each micro-batch's `core.grpo_loss`
    over the minibatch's global count (`loss_normalizer`), token-weighted mean stats of this rank's rows, the
    policy's gradient norm clipped to ``max_grad_norm``."""

    def __init__(
        self,
        model: torch.nn.Module,
        forward: PolicyForward,
        cfg: GRPOLossConfig,
        max_len: int,
        max_grad_norm: float | None = None,
    ) -> None:
        self.model, self.forward, self.cfg = model, forward, cfg
        self.max_len, self.max_grad_norm = max_len, max_grad_norm
        self.models = [model]
        self.totals: dict[
            str, Tensor
        ] = {}  # token-weighted sums, kept on the device in float64: no host sync
        self.tokens: list[Tensor] = []  # per micro-batch (the float64 sums equal the Python-float ones)

    def terms(self, minibatch: RolloutBatch, micro_batches: Sequence[RolloutBatch]) -> list[Term]:
        normalizer = loss_normalizer(minibatch.response_mask, self.cfg.loss_type, self.max_len)
        self.totals, self.tokens = {}, []
        return [functools.partial(self.micro_loss, micro, normalizer) for micro in micro_batches]

    def micro_loss(self, micro: RolloutBatch, normalizer: float) -> Tensor:
        log_probs, entropy = self.forward(micro)
        value, stats = loss_of(log_probs, entropy, micro, self.cfg, self.max_len, normalizer)
        count = micro.response_mask.sum()
        self.tokens.append(count)
        for key, v in stats.items():
            weighted = torch.as_tensor(v, device=count.device).detach().double() * count
            self.totals[key] = self.totals[key] + weighted if key in self.totals else weighted
        # DDP / FSDP average gradients over ranks and the normaliser is already global: × world makes the rank
        # average of the sum (reduce_metrics) the global loss
        return value * dist.world_size()

    def stats(self, total: float) -> dict[str, float]:
        n_tokens = max(1, int(torch.stack(self.tokens).sum())) if self.tokens else 1
        return {"loss": total, **{k: float(v) / n_tokens for k, v in self.totals.items()}}

    def clip(self) -> dict[str, float]:
        return {"grad_norm": clip_grad_norm(self.model, self.max_grad_norm)}


def backward_grpo_minibatch(
    model: torch.nn.Module,
    batch: RolloutBatch,
    cfg: GRPOLossConfig,
    temperature: float,
    max_len: int,
    forward: ResponseForward | None = None,
) -> dict[str, float]:
    """Accumulate the minibatch's gradient over ``grpo.grad_accum`` micro-batches (`onpolicy`: exactly the
    full-batch gradient); token-weighted mean stats. ``forward``: the one the trainer chose for ``model``
    (None: `response_forward`'s)."""
    forward = forward or response_forward(model)
    objective = GRPOObjective(model, text_policy(forward, temperature), cfg, max_len)
    return onpolicy.backward_minibatch(objective, batch, cfg.grad_accum)


def update_grpo(
    objective: GRPOObjective, optimizer: torch.optim.Optimizer, batch: RolloutBatch, cfg: GRPOLossConfig
) -> dict[str, float]:
    """μ epochs over ``batch``, ``minibatches`` optimiser steps each, every m-th row per minibatch
    (`onpolicy.strided_minibatches`); returns the stats averaged over steps."""
    split = functools.partial(onpolicy.strided_minibatches, n=cfg.minibatches)
    return onpolicy.update(objective, [optimizer], batch, cfg.epochs, split, cfg.grad_accum)


def optimise_grpo(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    cfg: GRPOLossConfig,
    temperature: float,
    max_len: int,
    max_grad_norm: float | None,
    forward: ResponseForward | None = None,
) -> dict[str, float]:
    """`update_grpo` of a causal LM policy ``model`` run through ``forward``, the one the trainer chose for it
    (None: `response_forward`'s)."""
    forward = forward or response_forward(model)
    objective = GRPOObjective(model, text_policy(forward, temperature), cfg, max_len, max_grad_norm)
    return update_grpo(objective, optimizer, batch, cfg)
