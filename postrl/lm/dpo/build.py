"""What a `postrl dpo` run loads, computes once and evaluates (`postrl.lm.dpo`): the preference pairs, the
summed response log-probs of a pair under a model, the reference's log-probs (computed once before training,
stored with the run), and the held-out evaluation: the implicit reward's accuracy and margin on held-out pairs,
and the gold reward, reward-model score and KL to the reference of sampled held-out responses."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from postrl.core import dpo_loss, masked_sum
from postrl.lm.data import collate_preferences
from postrl.lm.dpo.config import DPOConfig, DPOLossConfig
from postrl.lm.ppo.advantages import Roles
from postrl.lm.ppo.build import PromptSet, evaluate_heldout
from postrl.lm.reference import REF_FILE as REF_FILE
from postrl.lm.reward_model.pairs import load_pair_rows, tokenize_pairs
from postrl.lm.rollout import Rollout, token_log_probs
from postrl.lm.rollout.evaluation import evaluate_task
from postrl.lm.rollout.shared_prefix import response_logits
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


def collate(examples: Sequence[dict[str, Any]], pad_id: int, device: torch.device) -> dict[str, Tensor]:
    """2b rows in the rollout layout (chosen 0..b−1, rejected b..2b−1: a pair shares its prompt, which
    `response_logits` runs once) and ``target`` [b], on ``device``."""
    return to_device(collate_preferences(examples, pad_id), device)


def sequence_log_probs(
    model: torch.nn.Module, batch: dict[str, Tensor], use_fast: bool | None = None
) -> tuple[Tensor, Tensor]:
    """(log π(y_w|x) [b], log π(y_l|x) [b]): the response tokens' log-probs summed (EOS included), under the
    caller's grad mode. One teacher-forced forward of the 2b rows, each pair's prompt once."""
    ids, mask, response_mask = batch["input_ids"], batch["attention_mask"], batch["response_mask"]
    P = ids.shape[1] - response_mask.shape[1]
    logits = response_logits(model, ids, mask, P, use_fast)  # (2b, T, V)
    sums = masked_sum(token_log_probs(logits, ids[:, P:]), response_mask.to(torch.float32), dim=-1)  # (2b,)
    b = sums.shape[0] // 2
    return sums[:b], sums[b:]


# ---- the reference, once -------------------------------------------------------------------------------
@torch.no_grad()
def reference_log_probs(
    reference: torch.nn.Module,
    examples: Sequence[dict[str, Any]],
    pad_id: int,
    device: torch.device,
    batch_size: int,
    use_fast: bool | None = None,
) -> Tensor:
    """``[N, 2]`` float32 (chosen, rejected) summed log-probs of every pair under the frozen ``reference``.

    Batches are the consecutive runs of ``batch_size`` pairs whatever the world size; rank r computes batches
    r, r + W, ... and every rank gathers all of them, so N ranks give the tensor 1 process gives, bit for bit."""
    starts = list(range(0, len(examples), batch_size))
    mine = {}
    for k in range(dist.rank(), len(starts), dist.world_size()):
        batch = collate(examples[starts[k] : starts[k] + batch_size], pad_id, device)
        chosen, rejected = sequence_log_probs(reference, batch, use_fast)
        mine[k] = torch.stack((chosen, rejected), dim=1).float().cpu()  # (b, 2)
    parts = {k: v for ranks in dist.all_gather_object(mine) for k, v in ranks.items()}
    return torch.cat([parts[k] for k in range(len(starts))]) if starts else torch.zeros(0, 2)


# ---- the loss of a batch -------------------------------------------------------------------------------
def dpo_batch_loss(
    model: torch.nn.Module,
    batch: dict[str, Tensor],
    ref: Tensor,
    cfg: DPOLossConfig,
    use_fast: bool | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The mean DPO/IPO loss over the batch's pairs (`postrl.core.dpo_loss`) and its stats; ``ref`` [b, 2]
    holds the reference's (chosen, rejected) log-probs of these pairs."""
    chosen, rejected = sequence_log_probs(model, batch, use_fast)
    ref = ref.to(chosen.device)
    return dpo_loss(chosen, rejected, ref[:, 0], ref[:, 1], cfg.beta, cfg.loss_type, batch["target"])


# ---- held-out evaluation -------------------------------------------------------------------------------
@torch.no_grad()
def pair_metrics(
    model: torch.nn.Module,
    examples: Sequence[dict[str, Any]],
    ref: Tensor,
    cfg: DPOLossConfig,
    pad_id: int,
    device: torch.device,
    batch_size: int = 64,
) -> dict[str, float]:
    """Held-out loss, implicit-reward accuracy (share with h > 0), margin (mean βh) and the chosen and
    rejected implicit rewards, over every held-out pair (this rank's share, summed over ranks)."""
    if not examples:
        return {}
    rows = list(dist.shard_range(len(examples)))
    keys = ("loss", "reward_accuracy", "reward_margin", "chosen_rewards", "rejected_rewards")
    sums = torch.zeros(len(keys) + 1, dtype=torch.float64)
    for i in range(0, len(rows), batch_size):
        part = rows[i : i + batch_size]
        batch = collate([examples[j] for j in part], pad_id, device)
        loss, stats = dpo_batch_loss(model, batch, ref[part], cfg)
        values = [loss, *(stats[k] for k in keys[1:])]
        sums += torch.tensor([float(v) * len(part) for v in values] + [len(part)], dtype=torch.float64)
    totals = dist.all_reduce_sum(sums)
    return {f"heldout_{k}": float(totals[j] / totals[-1]) for j, k in enumerate(keys)}


def heldout_prompts(task: Any, evals: Sequence[dict[str, Any]]) -> PromptSet:
    """Prompts to sample held-out responses for: a built-in task's test prompts, else the distinct prompts
    of the held-out pairs (already rendered)."""
    if task is not None:
        return PromptSet(task.prompt_rows("test"))
    return PromptSet([{"prompt": p} for p in dict.fromkeys(e["row"]["prompt"] for e in evals)])


def reward_model_scorer(cfg: DPOConfig, device: torch.device) -> Callable[[Rollout, Any], Tensor] | None:
    """The reward model of ``cfg.reward_model`` as the held-out scorer (on the decoded texts, through its own
    tokenizer), or None."""
    if cfg.reward_model is None:
        return None
    from postrl.lm.models import ScalarHeadModel  # deferred: transformers (seconds), as in run_dpo
    from postrl.lm.rewards.scorer import RewardModelScorer
    from postrl.lm.tokenizer import load_tokenizer

    model = ScalarHeadModel.from_pretrained(cfg.reward_model, device=device, what="reward_model")
    scorer = RewardModelScorer(
        model.requires_grad_(False), load_tokenizer(cfg.reward_model, what="reward_model")
    )

    def score(rollout: Rollout, rows: Any) -> Tensor:
        return torch.tensor(scorer(rollout.prompts, rollout.texts), dtype=torch.float32)

    return score


def sample_metrics(
    policy: torch.nn.Module,
    reference: torch.nn.Module,
    tokenizer: Any,
    prompts: PromptSet,
    cfg: DPOConfig,
    task: Any,
    scorer: Callable[[Rollout, Any], Tensor] | None,
) -> dict[str, float]:
    """Held-out responses sampled from ``policy`` (PPO's evaluation, `postrl.lm.ppo.build.evaluate_heldout`):
    their KL to the reference (k1 and k3 summed per response), length, gold reward (built-in task) and
    reward-model score, each a mean; every rank samples its share of ``cfg.eval_samples``. On a built-in task
    also the gold reward of the greedy response to each held-out prompt."""
    if cfg.eval_samples == 0 or not prompts.rows:
        return {}
    roles = Roles(actor=policy, critic=None, reference=reference, reward_model=None)
    zeros = lambda rollout, rows: torch.zeros(rollout.input_ids.shape[0])  # noqa: E731
    was_training = policy.training
    policy.eval()
    out = evaluate_heldout(
        roles, tokenizer, prompts, cfg.sampling, scorer or zeros, task, n=cfg.eval_samples, seed=cfg.run.seed
    )
    if task is not None:  # the greedy response's gold reward too (one per held-out prompt, every rank alike)
        greedy = evaluate_task(
            policy, tokenizer, task, n=len(prompts.rows), max_new_tokens=cfg.sampling.max_new_tokens
        )
        out["heldout_gold_reward_greedy"] = float(greedy["gold_reward"])
    policy.train(was_training)
    if scorer is None:
        out.pop("heldout_rm_score", None)
    return out
