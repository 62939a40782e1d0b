"""Held-out evaluation of a policy, shared by the LM stages (no stage borrows another's).

complete, evaluate_task       greedy (or sampled) completions of a task's held-out prompts: the task
                              reward (exact-match accuracy for a verifier task) and the gold reward
evaluate_preference_policy    sampled responses of a policy: gold reward, reward-model score, KL to a reference
PromptSet, sequence_kl,       sampled held-out responses during training (PPO, DPO, KTO): the mean score,
evaluate_heldout              gold reward, KL k1/k3 to the reference and length, over every rank's share
heldout_prompts,              a stage trained on fixed data (DPO, KTO): the prompts to sample, the reward
reward_model_scorer,          model that scores the samples, and `evaluate_heldout` plus the greedy
sample_metrics                response's gold reward
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from postrl.core import kl_estimate, masked_sum
from postrl.lm.rewards import columns_of
from postrl.lm.roles import Roles
from postrl.lm.rollout import Rollout
from postrl.lm.rollout.engine import RolloutEngine, SamplingConfig
from postrl.lm.rollout.forwards import ResponseForward, response_forward
from postrl.lm.rollout.scoring import response_log_probs, score
from postrl.runtime import distributed as dist


@dataclass
class PromptSet:
    """Prompt rows (all columns kept for reward functions) and their texts."""

    rows: list[dict[str, Any]]

    @property
    def texts(self) -> list[str]:
        return [r["prompt"] for r in self.rows]


@torch.no_grad()
def complete(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    greedy: bool = True,
    temperature: float = 1.0,
    batch_size: int = 128,
    seed: int = 0,
) -> list[str]:
    """One completion per prompt (greedy by default), in batches; dropout off during generation."""
    was_training = model.training
    model.eval()
    sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, greedy=greedy)
    engine = RolloutEngine(model, tokenizer, sampling)
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    texts: list[str] = []
    for i in range(0, len(prompts), batch_size):
        texts += engine.generate(list(prompts[i : i + batch_size]), generator=generator).texts
    model.train(was_training)
    return texts


def evaluate_task(
    model: torch.nn.Module,
    tokenizer: Any,
    task: Any,
    *,
    split: str = "test",
    n: int = 500,
    max_new_tokens: int = 16,
    greedy: bool = True,
    batch_size: int = 128,
    seed: int = 0,
) -> dict[str, Any]:
    """Complete ``n`` held-out prompts of ``task``; ``reward`` is the mean task reward (for a verifier task
    with 0/1 rewards, the exact-match accuracy; ``rewards`` each prompt's) and ``gold_reward`` the mean hidden
    gold reward."""
    rows = task.prompt_rows(split)[:n]
    prompts = [r["prompt"] for r in rows]
    texts = complete(
        model,
        tokenizer,
        prompts,
        max_new_tokens=max_new_tokens,
        greedy=greedy,
        batch_size=batch_size,
        seed=seed,
    )
    columns = columns_of(rows)
    rewards = task.reward_fn(prompts, texts, **columns)
    gold = task.gold_reward(prompts, texts, **columns)
    return {
        "reward": sum(rewards) / max(1, len(rewards)),
        "gold_reward": sum(gold) / max(1, len(gold)),
        "n": len(rows),
        "rewards": list(rewards),  # per prompt, in order: two policies compare prompt by prompt (paired)
        "samples": list(zip(prompts[:5], texts[:5], strict=True)),
    }


@torch.no_grad()
def evaluate_preference_policy(
    model: torch.nn.Module,
    tokenizer: Any,
    task: Any,
    *,
    reference: torch.nn.Module | None = None,
    reward_model: Any = None,
    split: str = "test",
    n: int = 256,
    max_new_tokens: int = 24,
    temperature: float = 1.0,
    batch_size: int = 128,
    seed: int = 0,
) -> dict[str, Any]:
    """Sample responses to ``n`` held-out prompts (cycling through them) at ``temperature``; report the mean
    gold reward (and its per-response sd, ``gold_reward_sd``), the reward model's score
    (``reward_model(prompts, completions)``) and the KL to ``reference`` (k1 summed over each response's
    tokens, averaged: an unbiased estimate of KL(π‖π_ref))."""
    prompts_all = task.prompts(split)
    prompts = [prompts_all[i % len(prompts_all)] for i in range(n)]
    was_training = model.training
    model.eval()
    engine = RolloutEngine(
        model, tokenizer, SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature)
    )
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    gold: list[float] = []
    rm: list[float] = []
    kl: list[float] = []
    texts: list[str] = []
    for i in range(0, n, batch_size):
        rollout = engine.generate(prompts[i : i + batch_size], generator=generator)
        texts += rollout.texts
        gold += task.gold_reward(rollout.prompts, rollout.texts)
        if reward_model is not None:
            rm += reward_model(rollout.prompts, rollout.texts)
        if reference is not None:
            ref = score(
                reference,
                rollout.input_ids,
                rollout.attention_mask,
                rollout.prompt_len,
                temperature=temperature,
            )
            per_token = kl_estimate(rollout.log_probs, ref, "k1")
            kl += masked_sum(per_token, rollout.response_mask.float(), dim=-1).tolist()
    model.train(was_training)

    def mean(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    def sd(xs: list[float]) -> float | None:  # per-response spread, for the standard error of the mean
        return (sum((x - mean(xs)) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else None

    return {
        "gold_reward": mean(gold),
        "gold_reward_sd": sd(gold),
        "gold_rewards": gold,  # per response, prompt i's at i: paired with another policy's on the same prompts
        "rm_score": mean(rm),
        "kl_to_ref": mean(kl),
        "samples": list(zip(prompts[:5], texts[:5], strict=True)),
    }


# ---- sampled held-out responses during training ------------------------------------------------------------
@torch.no_grad()
def sequence_kl(rollout: Rollout, reference: ResponseForward, temperature: float) -> tuple[Tensor, Tensor]:
    """Per-response KL(π‖π_ref) estimates (k1 and k3 summed over tokens) → ([B], [B]), the reference's
    log-probs through its ``forward`` (without gradients)."""
    ref = response_log_probs(
        reference, rollout.input_ids, rollout.attention_mask, rollout.prompt_len, temperature=temperature
    )
    m = rollout.response_mask.float()
    k1 = masked_sum(kl_estimate(rollout.log_probs, ref, "k1"), m, dim=-1)
    k3 = masked_sum(kl_estimate(rollout.log_probs, ref, "k3"), m, dim=-1)
    return k1, k3


@torch.no_grad()
def evaluate_heldout(
    roles: Roles,
    tokenizer: Any,
    prompts: PromptSet,
    sampling: SamplingConfig,
    scorer: Callable[[Rollout, Sequence[dict[str, Any]]], Tensor],
    task: Any,
    *,
    n: int,
    seed: int,
    batch_size: int = 128,
) -> dict[str, float]:
    """Sample ``n`` held-out responses (the held-out prompts in turn, a fixed sampling seed, this rank's share)
    and report the mean raw score (``scorer(rollout, rows)``), gold reward (built-in task), KL to the reference
    and length. Every rank calls it with its sharded roles gathered (`postrl.runtime.distributed.gathered`)."""
    if not prompts.rows or n <= 0:
        return {}
    rows = [prompts.rows[i % len(prompts.rows)] for i in dist.shard_range(n)]
    engine = RolloutEngine(roles.policy, tokenizer, sampling)
    reference = response_forward(roles.reference, sampling.use_fast, gradients=False, gathered=True)
    device = next(roles.policy.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    sums: dict[str, float] = {}
    for i in range(0, len(rows), batch_size):
        part = rows[i : i + batch_size]
        rollout = engine.generate([r["prompt"] for r in part], generator=generator)
        k1, k3 = sequence_kl(rollout, reference, sampling.temperature or 1.0)
        values = {
            "heldout_rm_score": scorer(rollout, part).float().cpu(),
            "heldout_kl": k1.cpu(),
            "heldout_kl_k3": k3.cpu(),
            "heldout_length": rollout.response_lengths.float().cpu(),
        }
        if task is not None:
            values["heldout_gold_reward"] = torch.tensor(task.gold_reward(rollout.prompts, rollout.texts))
        for key, v in values.items():
            sums[key] = sums.get(key, 0.0) + float(v.double().sum())
    keys = sorted(sums)
    totals = dist.all_reduce_sum(
        torch.tensor([sums[k] for k in keys] + [float(len(rows))], dtype=torch.float64)
    )
    return {k: float(totals[j] / totals[-1]) for j, k in enumerate(keys)}


# ---- a stage trained on fixed data against a frozen reference (DPO, KTO) -----------------------------------
def heldout_prompts(task: Any, evals: Sequence[dict[str, Any]]) -> PromptSet:
    """Prompts to sample held-out responses for: a built-in task's test prompts, else the distinct prompts
    of the held-out examples (already rendered)."""
    if task is not None:
        return PromptSet(task.prompt_rows("test"))
    return PromptSet([{"prompt": p} for p in dict.fromkeys(e["row"]["prompt"] for e in evals)])


def reward_model_scorer(cfg: Any, device: torch.device) -> Callable[[Rollout, Any], Tensor] | None:
    """The reward model of ``cfg.reward_model`` (a DPO or KTO config) as the held-out scorer (on the decoded
    texts, through its own tokenizer), or None."""
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
    cfg: Any,
    task: Any,
    scorer: Callable[[Rollout, Any], Tensor] | None,
) -> dict[str, float]:
    """Held-out responses sampled from ``policy`` (`evaluate_heldout`, as PPO evaluates): their KL to the
    reference (k1 and k3 summed per response), length, gold reward (built-in task) and reward-model score,
    each a mean; every rank samples its share of ``cfg.eval_samples`` (``cfg`` a DPO or KTO config: its
    ``eval_samples``, ``sampling`` and ``run.seed``). On a built-in task also the gold reward of the greedy
    response to each held-out prompt."""
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
