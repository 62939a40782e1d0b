"""Held-out evaluation of a policy: exact-match accuracy (tasks with a verifier) and mean gold reward."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from postrl.lm.rollout import RolloutEngine, SamplingConfig


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
    with 0/1 rewards, the exact-match accuracy) and ``gold_reward`` the mean hidden gold reward."""
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
        "samples": list(zip(prompts[:5], texts[:5], strict=True)),
    }
