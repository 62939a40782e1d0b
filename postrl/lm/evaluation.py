"""Held-out evaluation of a policy: exact-match accuracy (tasks with a verifier) and mean gold reward."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from postrl.core import kl_estimate, masked_sum
from postrl.lm.rollout.engine import RolloutEngine, SamplingConfig
from postrl.lm.rollout.scoring import score


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


def _columns(rows: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    keys = [k for k in rows[0] if k != "prompt"] if rows else []
    return {k: [r.get(k) for r in rows] for k in keys}


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
    columns = _columns(rows)
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
