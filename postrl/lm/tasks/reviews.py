"""`reviews`: a preference task with a hidden gold reward and a synthetic, noisy labeller.

Prompts are "Review of the pasta:" or "Review of the soup at the diner:"; responses are short reviews in the
grammar of `review_language`. SFT demonstrations are grammatical with mixed sentiment, so an SFT policy is
mediocre on the gold reward and RL has room. Preference pairs are labelled by `SyntheticLabeller` from the
gold reward (label noise, ties at 0.5, optional Bradley–Terry sampling); by default they contain only
grammatical responses, so a reward model trained on them can be hacked by ungrammatical positive spam.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import postrl.lm.tasks.review_language as lang
from postrl.lm.tasks.base import (
    Split,
    Task,
    check_split,
    completion_text,
    in_test_split,
    prompt_text,
    split_rng,
)
from postrl.lm.tasks.labeller import LabellerConfig, SyntheticLabeller


@dataclass(frozen=True)
class ReviewsConfig:
    """Options of the reviews task."""

    n_sft_train: int = 4000
    """train demonstrations"""
    n_sft_test: int = 400
    """held-out demonstrations"""
    n_pairs_train: int = 4000
    """train preference pairs"""
    n_pairs_test: int = 500
    """held-out preference pairs"""
    test_fraction: float = 0.2
    """share of the (about 180) distinct prompts held out"""
    intensifier_prob: float = 0.3
    """probability of "very"/"really"/... before each generated adjective"""
    perturb_fraction: float = 0.0
    """share of generated preference responses that are broken (repeats, dropped words); >0 teaches the RM fluency"""
    labeller_mode: str = "threshold"
    """"threshold" or "bradley_terry" (see `SyntheticLabeller`)"""
    label_noise: float = 0.1
    """probability that the labeller flips a non-tie label"""
    tie_tolerance: float = 0.05
    """gold rewards this close are a tie (target 0.5)"""
    bt_temperature: float = 0.5
    """Bradley–Terry temperature"""
    seed: int = 0
    """seed of the split partition, the generators and the labeller"""

    CHECKS = {  # valid ranges (postrl.runtime.config.validate)
        "n_sft_train": ">= 1",
        "n_sft_test": ">= 1",
        "n_pairs_train": ">= 1",
        "n_pairs_test": ">= 1",
        "test_fraction": "(0, 1)",
        "intensifier_prob": "[0, 1]",
        "perturb_fraction": "[0, 1]",
        "label_noise": "[0, 1]",
        "tie_tolerance": ">= 0",
        "bt_temperature": "> 0",
    }


def all_prompts() -> list[str]:
    """Every prompt of the review language, in a fixed order (180 of them).

    Each prompt ends with ":", so none is a prefix of another and the text itself marks where the response
    starts. Without the mark ("Review: the view" beside "Review: the view at the harbor") a model cannot
    tell a complete plain prompt from the start of a longer one: it only memorises which plain prompts of
    the train split are complete, and on a held-out plain prompt goes on writing the prompt
    (" at the harbor was bright .") or a word piece ("Review: the music" → "k and great ."), which the
    gold reward scores about −3 (about 10% of the SFT samples on held-out prompts).
    """
    plain = [f"Review of the {noun}:" for noun in lang.NOUNS]
    located = [f"Review of the {noun} at {venue}:" for noun in lang.NOUNS for venue in lang.VENUES]
    return plain + located


class ReviewsTask(Task):
    """Synthetic product reviews; ``gold_reward`` is the hidden preference, ``reward_fn`` equals it."""

    name = "reviews"

    def __init__(self, config: ReviewsConfig | None = None) -> None:
        self.config = config or ReviewsConfig()
        labeller = LabellerConfig(
            mode=self.config.labeller_mode,
            noise=self.config.label_noise,
            tie_tolerance=self.config.tie_tolerance,
            temperature=self.config.bt_temperature,
        )
        SyntheticLabeller(labeller)  # validate the options now, not at first use
        self.labeller_config = labeller

    def prompts(self, split: Split = "train") -> list[str]:
        """The distinct prompts of ``split`` (a fixed, seed-dependent partition of `all_prompts`)."""
        check_split(split)
        held_out = [p for p in all_prompts() if in_test_split(p, self.config.seed, self.config.test_fraction)]
        if split == "test":
            return held_out
        excluded = set(held_out)
        return [p for p in all_prompts() if p not in excluded]

    def sft_rows(self, split: Split = "train") -> list[dict[str, Any]]:
        """Grammatical demonstrations of mixed sentiment ``{"prompt", "completion"}``."""
        rng = split_rng(self.config.seed, split, "sft")
        prompts = self.prompts(split)
        n = self.config.n_sft_train if split == "train" else self.config.n_sft_test
        rows = []
        for _ in range(n):
            prompt = rng.choice(prompts)
            rows.append(
                {
                    "prompt": prompt,
                    "completion": lang.sample_response(prompt, rng, self.config.intensifier_prob),
                }
            )
        return rows

    def _generated_pairs(self, split: str, rng: random.Random) -> list[tuple[str, str, str]]:
        prompts = self.prompts(split)
        n = self.config.n_pairs_train if split == "train" else self.config.n_pairs_test
        pairs = []
        for _ in range(n):
            prompt = rng.choice(prompts)
            a, b = (self._preference_response(prompt, rng) for _ in range(2))
            pairs.append((prompt, a, b))
        return pairs

    def _preference_response(self, prompt: str, rng: random.Random) -> str:
        response = lang.sample_response(prompt, rng, self.config.intensifier_prob)
        if rng.random() < self.config.perturb_fraction:
            response = lang.perturb_response(response, rng)
        return response

    def preference_rows(
        self, split: Split = "train", policy_samples: dict[str, list[str]] | None = None
    ) -> list[dict[str, Any]]:
        """Pairs labelled by the synthetic labeller: ``{"prompt", "chosen", "rejected", "target"}``.

        ``policy_samples`` maps a prompt to responses sampled from a policy (e.g. the SFT model, as in
        Ouyang et al., 2022); consecutive responses (0, 1), (2, 3), ... are paired. Without it, pairs come
        from the task's own generator. ``target`` is 1.0 (chosen preferred) or 0.5 (a tie).
        """
        check_split(split)
        rng = split_rng(self.config.seed, split, "prefs")
        if policy_samples is None:
            pairs = self._generated_pairs(split, rng)
        else:
            pairs = [
                (p, rs[k], rs[k + 1]) for p, rs in policy_samples.items() for k in range(0, len(rs) - 1, 2)
            ]
        labeller = SyntheticLabeller(self.labeller_config, seed=rng.randrange(2**32))
        rows = []
        for prompt, a, b in pairs:
            rows.append(
                labeller.label(prompt, a, b, lang.gold_reward_one(prompt, a), lang.gold_reward_one(prompt, b))
            )
        return rows

    def gold_reward(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        """The hidden true preference, one float per completion (see `review_language`)."""
        return [
            lang.gold_reward_one(prompt_text(p), completion_text(c))
            for p, c in zip(prompts, completions, strict=True)
        ]

    def reward_fn(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        """RL directly on the gold reward (an oracle baseline for RLHF with a learned reward model)."""
        return self.gold_reward(prompts=prompts, completions=completions, **kwargs)

    def corpus_lines(self, n: int, seed: int = 0) -> list[str]:
        """``n`` lines "Review of the pasta: was fresh ." from train prompts."""
        rng = split_rng(seed, "train", "corpus-reviews")
        prompts = self.prompts("train")
        lines = []
        for _ in range(n):
            prompt = rng.choice(prompts)
            lines.append(prompt + lang.sample_response(prompt, rng, self.config.intensifier_prob))
        return lines
