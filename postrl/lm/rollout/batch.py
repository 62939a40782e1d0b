"""The one batch type of the on-policy trainers, from the rollout to the loss (DESIGN.md, "How a batch flows").

PPO-RLHF and the GRPO family fill the same :class:`RolloutBatch`; they differ in which optional fields they
set (PPO: ``values`` and ``returns`` from the critic and GAE, advantages per token [N, T]; GRPO: advantages per
response [N] and, when β > 0, ``ref_log_probs``) and in the loss they take from `postrl.core`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from postrl.lm.models import last_token_index
from postrl.runtime import distributed as dist


@dataclass
class RolloutBatch:
    """One step's rollout data on this rank, in the `postrl.lm.rollout.Rollout` layout."""

    input_ids: Tensor
    """[N, P + T] prompt (left-padded) then response (right-padded)"""
    attention_mask: Tensor
    """[N, P + T]"""
    prompt_len: int
    """P"""
    response_mask: Tensor
    """[N, T] 1 on response tokens up to and including EOS"""
    old_log_probs: Tensor
    """[N, T] log π_old of the sampling policy (temperature applied)"""
    advantages: Tensor
    """[N, T] per token (PPO: GAE) or [N] per response (GRPO family: one value for every token)"""
    ref_log_probs: Tensor | None = None
    """[N, T] log π_ref, or None (no KL term in the loss)"""
    values: Tensor | None = None
    """[N, T] V_old of the state before each response token (PPO's critic), or None"""
    returns: Tensor | None = None
    """[N, T] the critic's targets, or None"""
    row_ids: Tensor | None = None
    """[N] each row's index in the step's batch, kept through `rows` (a VLM's rows find their pictures by it),
    or None"""
    is_weights: Tensor | None = None
    """[N, T] behaviour-policy weights π_old/μ of each token's surrogate (`core.truncated_is_weights`,
    `core.masked_is_weights`), or None (samples drawn by π_old itself)"""
    behaviour_log_probs: Tensor | None = None
    """[N, T] log μ of the policy that sampled, when the loss makes the weights from its own forward (one
    update per batch: `postrl.lm.grpo.objective.loss_of`), or None"""
    value_mask: Tensor | None = None
    """[N, T] 1 where the value loss is taken (PPO over episodes: the first action token of each turn, where
    the critic is evaluated), or None (every response token)"""

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, index: Tensor | slice) -> RolloutBatch:
        """The rows ``index`` (at least one), right padding trimmed to their last response token (padding adds
        nothing to any loss; a multi-turn response keeps the observations between its turns)."""
        mask = self.response_mask[index]
        if mask.shape[0] == 0:
            raise ValueError("RolloutBatch.rows: no rows selected (split a short batch with minibatches())")
        width = max(1, int(last_token_index(mask).max()) + 1)

        def cut(t: Tensor | None) -> Tensor | None:  # [N, T] → [n, width]; [N] → [n]
            if t is None:
                return None
            return t[index, :width] if t.dim() == 2 else t[index]

        end = self.prompt_len + width
        return RolloutBatch(
            self.input_ids[index, :end],
            self.attention_mask[index, :end],
            self.prompt_len,
            mask[:, :width],
            cut(self.old_log_probs),
            cut(self.advantages),
            cut(self.ref_log_probs),
            cut(self.values),
            cut(self.returns),
            cut(self.row_ids),
            cut(self.is_weights),
            cut(self.behaviour_log_probs),
            cut(self.value_mask),
        )

    def minibatches(self, order: Tensor, n: int) -> list[RolloutBatch]:
        """The rows in ``order`` [N] cut into min(n, N) non-empty minibatches, sizes within one of each other.

        An epoch's short last batch (one process keeps it) can have fewer rows than ``n``: it makes fewer
        optimiser steps instead of empty ones. Under torchrun every rank must make the same number of steps
        (DDP syncs each), so there N < n is refused.
        """
        if len(order) < n and dist.world_size() > 1:
            raise ValueError(f"{len(order)} rows on this rank for {n} minibatches: ranks would disagree")
        if len(order) == 0:
            return []
        parts = torch.tensor_split(order.to(self.input_ids.device), min(n, len(order)))
        return [self.rows(rows) for rows in parts]
