"""What a `postrl dpo` run loads, computes once and evaluates (`postrl.lm.dpo`): the preference pairs, the
summed response log-probs of a pair under a model, the reference's log-probs (computed once before training,
stored with the run), and the implicit reward's accuracy and margin on held-out pairs. The gold reward,
reward-model score and KL to the reference of sampled held-out responses are the LM stages' shared
evaluation (`postrl.lm.evaluation.sample_metrics`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from postrl.core import dpo_loss, masked_sum
from postrl.lm.data import collate_preferences
from postrl.lm.dpo.config import DPOConfig, DPOLossConfig
from postrl.lm.reference import REF_FILE as REF_FILE
from postrl.lm.reward_model.pairs import load_pair_rows, tokenize_pairs
from postrl.lm.rollout import ResponseForward, forward_log_probs
from postrl.lm.trainer import to_device
from postrl.runtime import distributed as dist
from postrl.runtime.errors import UserError

log = logging.getLogger(__name__)


# ---- data ----------------------------------------------------------------------------------------------
def load_pairs(cfg: DPOConfig, tokenizer: Any) -> tuple[list[dict], list[dict], Any]:
    """(train pairs, held-out pairs, the built-in task or None), tokenised: prompt ids as generation encodes
    them, each response's ids + EOS; pairs longer than ``train.max_length`` handled by ``train.overlong``."""
    rows, heldout, task = load_pair_rows(cfg.data, cfg.eval_data, cfg.task, cfg.empty_rows, tokenizer)
    train = tokenize_pairs(rows, tokenizer, cfg.train.max_length, cfg.train.overlong)
    evals = tokenize_pairs(heldout, tokenizer, cfg.train.max_length, "drop")[: cfg.eval_size]
    if not train:
        raise UserError(f"{cfg.data}: no preference pair fits train.max_length={cfg.train.max_length}")
    if any(e["margin"] is not None for e in train):
        log.warning("dpo: the data's 'margin' column is not used (DPO has no margin term)")
    return train, evals, task


def collate_dpo_batch(
    examples: Sequence[dict[str, Any]], pad_id: int, device: torch.device
) -> dict[str, Tensor]:
    """2b rows in the rollout layout (chosen 0..b−1, rejected b..2b−1: a pair shares its prompt, which a
    `postrl.lm.rollout.forwards.SharedPrefixForward` or `FusedForward` runs once) and ``target`` [b], on
    ``device``."""
    return to_device(collate_preferences(examples, pad_id), device)


def sequence_log_probs(forward: ResponseForward, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """(log π(y_w|x) [b], log π(y_l|x) [b]): the response tokens' log-probs summed (EOS included), under the
    caller's grad mode. One teacher-forced ``forward`` of the 2b rows."""
    ids, mask, response_mask = batch["input_ids"], batch["attention_mask"], batch["response_mask"]
    P = ids.shape[1] - response_mask.shape[1]
    log_probs, _ = forward_log_probs(forward, ids, mask, P)  # (2b, T)
    sums = masked_sum(log_probs, response_mask.to(torch.float32), dim=-1)  # (2b,)
    b = sums.shape[0] // 2
    return sums[:b], sums[b:]


# ---- the reference, once -------------------------------------------------------------------------------
@torch.no_grad()
def reference_pair_log_probs(
    reference: ResponseForward,
    examples: Sequence[dict[str, Any]],
    pad_id: int,
    device: torch.device,
    batch_size: int,
) -> Tensor:
    """``[N, 2]`` float32 (chosen, rejected) summed log-probs of every pair under the frozen ``reference``
    (its forward without gradients).

    Batches are the consecutive runs of ``batch_size`` pairs whatever the world size; rank r computes batches
    r, r + W, ... and every rank gathers all of them, so N ranks give the tensor 1 process gives, bit for bit."""
    starts = list(range(0, len(examples), batch_size))
    mine = {}
    for k in range(dist.rank(), len(starts), dist.world_size()):
        batch = collate_dpo_batch(examples[starts[k] : starts[k] + batch_size], pad_id, device)
        chosen, rejected = sequence_log_probs(reference, batch)
        mine[k] = torch.stack((chosen, rejected), dim=1).float().cpu()  # (b, 2)
    parts = {k: v for ranks in dist.all_gather_object(mine) for k, v in ranks.items()}
    return torch.cat([parts[k] for k in range(len(starts))]) if starts else torch.zeros(0, 2)


# ---- the loss of a batch -------------------------------------------------------------------------------
def dpo_batch_loss(
    forward: ResponseForward, batch: dict[str, Tensor], ref: Tensor, cfg: DPOLossConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """The mean DPO/IPO loss over the batch's pairs (`postrl.core.dpo_loss`) and its stats, the policy's
    log-probs through ``forward``; ``ref`` [b, 2] holds the reference's (chosen, rejected) log-probs."""
    chosen, rejected = sequence_log_probs(forward, batch)
    ref = ref.to(chosen.device)
    return dpo_loss(chosen, rejected, ref[:, 0], ref[:, 1], cfg.beta, cfg.loss_type, batch["target"])


# ---- held-out evaluation -------------------------------------------------------------------------------
@torch.no_grad()
def pair_metrics(
    forward: ResponseForward,
    examples: Sequence[dict[str, Any]],
    ref: Tensor,
    cfg: DPOLossConfig,
    pad_id: int,
    device: torch.device,
    batch_size: int = 64,
) -> dict[str, float]:
    """Held-out loss, implicit-reward accuracy (share with h > 0), margin (mean βh) and the chosen and
    rejected implicit rewards, over every held-out pair (this rank's share, summed over ranks), the policy
    through ``forward`` (without gradients)."""
    if not examples:
        return {}
    rows = list(dist.shard_range(len(examples)))
    keys = ("loss", "reward_accuracy", "reward_margin", "chosen_rewards", "rejected_rewards")
    sums = torch.zeros(len(keys) + 1, dtype=torch.float64)
    for i in range(0, len(rows), batch_size):
        part = rows[i : i + batch_size]
        batch = collate_dpo_batch([examples[j] for j in part], pad_id, device)
        loss, stats = dpo_batch_loss(forward, batch, ref[part], cfg)
        values = [loss, *(stats[k] for k in keys[1:])]
        sums += torch.tensor([float(v) * len(part) for v in values] + [len(part)], dtype=torch.float64)
    totals = dist.all_reduce_sum(sums)
    return {f"heldout_{k}": float(totals[j] / totals[-1]) for j, k in enumerate(keys)}
