"""The generated pretraining corpus: arithmetic and review text from the train splits plus generic lines.

It is also the text the default tokenizer is trained on. Held-out prompts never appear in it.
"""

from __future__ import annotations

from postrl.lm.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from postrl.lm.tasks.base import split_rng
from postrl.lm.tasks.review_language import generic_sentence
from postrl.lm.tasks.reviews import ReviewsConfig, ReviewsTask


def build_corpus(
    n_lines: int = 20000,
    seed: int = 0,
    mix: tuple[float, float, float] = (0.4, 0.4, 0.2),
    arithmetic: ArithmeticConfig | None = None,
    reviews: ReviewsConfig | None = None,
) -> list[str]:
    """``n_lines`` lines of text, shares ``mix`` = (arithmetic, reviews, generic), shuffled.

    Each task contributes only its train split, so held-out prompts never leak into pretraining.
    """
    if len(mix) != 3 or min(mix) < 0 or sum(mix) <= 0:
        raise ValueError(f"mix must be three non-negative shares (arithmetic, reviews, generic); got {mix}")
    n_arith = round(n_lines * mix[0] / sum(mix))
    n_reviews = round(n_lines * mix[1] / sum(mix))
    rng = split_rng(seed, "train", "corpus-generic")
    lines = ArithmeticTask(arithmetic).corpus_lines(n_arith, seed)
    lines += ReviewsTask(reviews).corpus_lines(n_reviews, seed)
    lines += [generic_sentence(rng) for _ in range(n_lines - n_arith - n_reviews)]
    rng.shuffle(lines)
    return lines
