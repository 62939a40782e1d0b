"""What online DPO adds to DPO: pairs sampled from the current policy and labelled by a judge.

    B prompts ──repeat ×2──▶ generate(π_θ): 2B responses (a prompt's two adjacent, its prefix prefilled once)
      ──judge(prompts, first, second)──▶ p = P(first ≻ second) [B]  (`postrl.lm.judges`)
      ──▶ B pairs in DPO's layout: prompt ids, first as "chosen", second as "rejected", target p
          (hard labels: 1 or 0 by the side p favours)

With target p the sigmoid loss −[p log σ(βh) + (1 − p) log σ(−βh)] is the same whichever response is called
chosen, so the pair keeps its sampled order. The sampling generator is seeded by (run seed, step): a resumed
run draws the responses an uninterrupted one draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from postrl.lm.judges import Judge, hard_label
from postrl.lm.judges.base import check_probabilities
from postrl.lm.rollout import RolloutEngine


def step_generator(device: torch.device, seed: int, step: int) -> torch.Generator:
    """The sampling generator of the step after ``step`` done (the spine counts from 0; −1: the evaluation's): a
    function of (seed, step) only."""
    return torch.Generator(device=device).manual_seed(seed * 1_000_003 + step + 1)


def response_ids(rollout: Any) -> list[list[int]]:
    """Each sampled response's token ids, EOS included where it ended with one (the tokens DPO scores)."""
    lengths = rollout.response_lengths.tolist()
    return [ids[:n] for ids, n in zip(rollout.response_ids.tolist(), lengths, strict=True)]


@torch.no_grad()
def sample_judged_pairs(
    engine: RolloutEngine,
    judge: Judge,
    judge_name: str,
    prompts: Sequence[str],
    generator: torch.Generator,
    hard: bool,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Two responses per prompt from ``engine``'s policy, labelled by ``judge``: the pairs (``prompt_ids``,
    ``chosen_ids`` = first, ``rejected_ids`` = second, ``target`` = p) and what was sampled (texts, p)."""
    was_training = engine.model.training
    engine.model.eval()
    rollout = engine.generate([p for p in prompts for _ in range(2)], generator=generator)  # (2B,)
    engine.model.train(was_training)
    texts, ids = rollout.texts, response_ids(rollout)
    first, second = texts[0::2], texts[1::2]
    p = check_probabilities(judge(list(prompts), first, second), len(prompts), judge_name)
    targets = [hard_label(x) if hard else x for x in p]
    prompt_ids, prompt_mask = (t.cpu() for t in engine.encode(list(prompts)))  # (B, P), as sampled
    pairs = [
        {
            "prompt_ids": prompt_ids[i][prompt_mask[i].bool()].tolist(),
            "chosen_ids": ids[2 * i],
            "rejected_ids": ids[2 * i + 1],
            "target": targets[i],
        }
        for i in range(len(prompts))
    ]
    sampled = {"first": first, "second": second, "p": p, "lengths": rollout.response_lengths.float()}
    return pairs, sampled


@torch.no_grad()
def judge_win_rate(
    policy: torch.nn.Module,
    reference: torch.nn.Module,
    tokenizer: Any,
    judge: Judge,
    prompts: Sequence[str],
    sampling: Any,
    seed: int,
) -> float:
    """The judge's mean P(policy sample ≻ reference sample) over ``prompts``: one response from each, sampled
    with the same seed (so a policy equal to the reference scores exactly ½ with a judge that scores
    responses, and close to it with any other)."""
    texts = []
    for model in (policy, reference):
        was_training = model.training
        model.eval()
        engine = RolloutEngine(model, tokenizer, sampling)
        device = next(model.parameters()).device
        texts.append(engine.generate(list(prompts), generator=step_generator(device, seed, -1)).texts)
        model.train(was_training)
    p = judge(list(prompts), texts[0], texts[1])
    return float(sum(p) / len(p))
