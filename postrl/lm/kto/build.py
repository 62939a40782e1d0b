"""What a `postrl kto` run computes besides its step (`postrl.lm.kto`): the summed completion log-probs of a
batch, the reference's (once, before training, stored with the run), the KL reference point z0 of a set of rows,
and the held-out loss and implicit rewards."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from postrl.core import kto_loss, masked_sum
from postrl.lm.kto.config import KTOLossConfig
from postrl.lm.kto.data import collate_kto_rows
from postrl.lm.reference import REF_FILE as REF_FILE
from postrl.lm.rollout import ResponseForward, forward_log_probs
from postrl.lm.trainer import to_device
from postrl.runtime import distributed as dist


def completion_log_probs(forward: ResponseForward, batch: dict[str, Tensor]) -> Tensor:
    """log π(y|x) [b]: each row's completion tokens' log-probs summed (EOS included) through the model's
    ``forward``, under the caller's grad mode; ``batch`` in the rollout layout."""
    ids, mask, response_mask = batch["input_ids"], batch["attention_mask"], batch["response_mask"]
    P = ids.shape[1] - response_mask.shape[1]
    log_probs, _ = forward_log_probs(forward, ids, mask, P)  # (b, T)
    return masked_sum(log_probs, response_mask.to(torch.float32), dim=-1)  # (b,)


def rows_log_probs(
    forward: ResponseForward,
    examples: Sequence[dict[str, Any]],
    rows: Sequence[int],
    pad_id: int,
    device: torch.device,
) -> Tensor:
    """``[len(rows), 2]``: (matched, mismatched) summed log-probs of the given rows, under the caller's grad mode."""
    part = [examples[i] for i in rows]
    matched = completion_log_probs(forward, to_device(collate_kto_rows(part, pad_id), device))
    mismatched = completion_log_probs(
        forward, to_device(collate_kto_rows(part, pad_id, mismatched=True), device)
    )
    return torch.stack((matched, mismatched), dim=1)


@torch.no_grad()
def reference_completion_log_probs(
    reference: ResponseForward,
    examples: Sequence[dict[str, Any]],
    pad_id: int,
    device: torch.device,
    batch_size: int,
) -> Tensor:
    """``[N, 2]`` float32 (matched, mismatched) log-probs of every row under the frozen ``reference`` (its
    forward without gradients); rank r
    computes batches r, r + W, ... and every rank gathers all of them (N ranks give what 1 process gives)."""
    starts = list(range(0, len(examples), batch_size))
    mine = {}
    for k in range(dist.rank(), len(starts), dist.world_size()):
        rows = range(starts[k], min(starts[k] + batch_size, len(examples)))
        mine[k] = rows_log_probs(reference, examples, rows, pad_id, device).float().cpu()
    parts = {k: v for ranks in dist.all_gather_object(mine) for k, v in ranks.items()}
    return torch.cat([parts[k] for k in range(len(starts))]) if starts else torch.zeros(0, 2)


@torch.no_grad()
def kl_reference_point(
    forward: ResponseForward,
    examples: Sequence[dict[str, Any]],
    ref: Tensor,
    parts: Sequence[tuple[list[int], float]],
    pad_id: int,
    device: torch.device,
) -> Tensor:
    """z0 = max(0, mean over the rows of every rank's ``parts`` of log π(y'|x) − log π_ref(y'|x)), y' the
    mismatched completion; parts of weight 0 (a rank whose share ran out) are left out of the mean but still
    run, so that every rank runs the same forwards (FSDP gathers parameters in each). Detached."""
    total = torch.zeros(2, dtype=torch.float64)
    for rows, weight in parts:
        batch = to_device(collate_kto_rows([examples[i] for i in rows], pad_id, mismatched=True), device)
        logps = completion_log_probs(forward, batch).double().cpu()  # (b,)
        if weight > 0:
            total += torch.stack(((logps - ref[rows, 1].double()).sum(), torch.tensor(float(len(rows)))))
    total = dist.all_reduce_sum(total)
    return (total[0] / total[1].clamp(min=1)).clamp(min=0).float()


def batch_loss(
    forward: ResponseForward, batch: dict[str, Tensor], ref: Tensor, z0: Tensor, cfg: KTOLossConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """The mean KTO loss over the batch's rows (`postrl.core.kto_loss`) at the reference point ``z0``, the
    policy through ``forward``; ``ref`` [b] holds the reference's log-probs of the rows' own completions."""
    logps = completion_log_probs(forward, batch)
    return kto_loss(
        logps, ref.to(logps.device), batch["desirable"], z0.to(logps.device), cfg.beta,
        cfg.desirable_weight, cfg.undesirable_weight,
    )  # fmt: skip


@torch.no_grad()
def heldout_metrics(
    forward: ResponseForward,
    examples: Sequence[dict[str, Any]],
    ref: Tensor,
    cfg: KTOLossConfig,
    pad_id: int,
    device: torch.device,
    batch_size: int = 64,
) -> dict[str, float]:
    """Held-out loss and the mean implicit reward β·r of each kind (and their margin), with z0 estimated on the
    whole held-out set's mismatched pairs; every rank computes its share."""
    if not examples:
        return {}
    mine = list(dist.shard_range(len(examples)))
    parts = [(mine[i : i + batch_size], 1.0) for i in range(0, len(mine), batch_size)]
    z0 = kl_reference_point(forward, examples, ref, parts, pad_id, device)
    sums = torch.zeros(5, dtype=torch.float64)  # loss·n, Σ βr desirable, n desirable, Σ βr undesirable, n
    for rows, _ in parts:
        batch = to_device(collate_kto_rows([examples[i] for i in rows], pad_id), device)
        logps = completion_log_probs(forward, batch).double().cpu()
        loss, _ = kto_loss(logps, ref[rows, 0].double(), batch["desirable"].cpu(), z0.double(), cfg.beta,
                           cfg.desirable_weight, cfg.undesirable_weight)  # fmt: skip
        good = batch["desirable"].cpu()
        scaled = cfg.beta * (logps - ref[rows, 0].double())
        counts = good.sum().double(), (~good).sum().double()
        sums += torch.stack((loss * len(rows), scaled[good].sum(), counts[0], scaled[~good].sum(), counts[1]))
    t = dist.all_reduce_sum(sums)
    n = float(t[2] + t[4])
    good, bad = float(t[1] / t[2]) if t[2] else float("nan"), float(t[3] / t[4]) if t[4] else float("nan")
    return {
        "heldout_loss": float(t[0]) / n,
        "heldout_rewards_desirable": good,
        "heldout_rewards_undesirable": bad,
        "heldout_reward_margin": good - bad,
        "heldout_z0": float(z0),
    }
