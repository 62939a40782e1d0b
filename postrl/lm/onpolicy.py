"""The on-policy update that PPO-RLHF and the GRPO family (text and vision-language policies) share.

    batch ──epochs × split──▶ minibatch ──grad_accum micro-batches──▶ objective's loss terms
          ──spine.accumulate (one gradient sync)──▶ objective.clip ──▶ every optimiser steps

One step's `RolloutBatch` is optimised for ``epochs`` passes; each pass cuts it into minibatches (``split``: a
fresh random order per pass for PPO, `shuffled_minibatches`; every m-th row for GRPO, `strided_minibatches`),
each minibatch is one optimiser step, its gradient accumulated over ``grad_accum`` micro-batches (TRL's
gradient_accumulation_steps). The algorithm brings an :class:`Objective`: the loss of a minibatch as terms
whose gradients add up to the minibatch's, its stats, and the gradient clipping. Returns the stats averaged over
the optimiser steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from postrl.lm.rollout.batch import RolloutBatch
from postrl.lm.spine import accumulate

Term = Callable[[], torch.Tensor]
"""One backward of a minibatch's gradient accumulation: a micro-batch's share of the loss (or PPO's ptx loss)."""


class Objective(Protocol):
    """What an on-policy algorithm brings to :func:`update`."""

    models: Sequence[torch.nn.Module]
    """The trained modules (their DDP/FSDP gradient sync waits for the minibatch's last backward)."""

    def terms(self, minibatch: RolloutBatch, micro_batches: Sequence[RolloutBatch]) -> list[Term]:
        """The minibatch's loss as terms whose summed gradients are exactly the minibatch's: each micro-batch's
        loss divided by the minibatch's count over every micro-batch and rank (`spine.accumulate`)."""
        ...

    def stats(self, total: float) -> dict[str, float]:
        """The minibatch's stats once its terms ran; ``total``: the sum of the terms' values."""
        ...

    def clip(self) -> dict[str, float]:
        """Clip (or only measure) the accumulated gradients; returns the norms to log."""
        ...


def split_micro_batches(minibatch: RolloutBatch, grad_accum: int) -> list[RolloutBatch]:
    """``minibatch`` cut into ``grad_accum`` contiguous micro-batches of ⌈n / grad_accum⌉ rows (fewer when
    the rows run out), each trimmed to its longest response (`RolloutBatch.rows`)."""
    n = len(minibatch)
    size = math.ceil(n / grad_accum)
    return [minibatch.rows(slice(s, s + size)) for s in range(0, n, size)]


def strided_minibatches(batch: RolloutBatch, n: int) -> list[RolloutBatch]:
    """min(n, N) minibatches, minibatch k every m-th row from row k, the same in every pass (GRPO). Rank r's row
    i is global row r·N + i, so when m divides N this is the same split of the global batch at any number of
    ranks (contiguous cuts are not)."""
    rows, m = len(batch), min(n, len(batch))
    if m == 1:  # the whole batch (views, no gather)
        return [batch.rows(slice(None))]
    return [batch.rows(torch.arange(k, rows, m, device=batch.input_ids.device)) for k in range(m)]


def shuffled_minibatches(batch: RolloutBatch, n: int, generator: torch.Generator) -> list[RolloutBatch]:
    """The rows in a fresh random order (drawn from ``generator``) cut into min(n, N) minibatches (PPO;
    `RolloutBatch.minibatches`)."""
    return batch.minibatches(torch.randperm(len(batch), generator=generator), n)


def backward_minibatch(objective: Objective, minibatch: RolloutBatch, grad_accum: int) -> dict[str, float]:
    """Accumulate ``minibatch``'s gradient over ``grad_accum`` micro-batches; returns its stats."""
    terms = objective.terms(minibatch, split_micro_batches(minibatch, grad_accum))
    total = accumulate(objective.models, terms, lambda term: term())
    return objective.stats(total)


def update(
    objective: Objective,
    optimizers: Sequence[torch.optim.Optimizer],
    batch: RolloutBatch,
    epochs: int,
    split: Callable[[RolloutBatch], list[RolloutBatch]],
    grad_accum: int,
) -> dict[str, float]:
    """``epochs`` passes over ``batch``, each cut into minibatches by ``split``, one optimiser step of every
    optimiser per minibatch; returns the stats (and gradient norms) averaged over the optimiser steps."""
    history: list[dict[str, float]] = []
    for _ in range(epochs):
        for minibatch in split(batch):
            stats = backward_minibatch(objective, minibatch, grad_accum)
            stats |= objective.clip()
            for optimizer in optimizers:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            history.append(stats)
    return {k: sum(h[k] for h in history) / len(history) for k in history[0]}
