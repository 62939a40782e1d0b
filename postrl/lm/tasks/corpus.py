"""The generated pretraining corpus: arithmetic as bare equations, review text, and generic lines.

It is also the text the default tokenizer is trained on. Held-out problems and prompts never appear in it.

The arithmetic lines are equations of the task's train problems, "47+38=85", not the task's question and
answer ("What is 47+38? 85"): pretraining learns the sums, and the question format is left for SFT to
teach, so a pretrained model does not already solve the task that SFT and RL are measured on (it scores
about 0 on the questions until SFT shows it the format).
"""

from __future__ import annotations

from postrl.lm.tasks.arithmetic import OPS, ArithmeticConfig, ArithmeticTask
from postrl.lm.tasks.base import split_rng
from postrl.lm.tasks.review_language import generic_sentence
from postrl.lm.tasks.reviews import ReviewsConfig, ReviewsTask


def equation_lines(task: ArithmeticTask, n: int, seed: int = 0) -> list[str]:
    """``n`` equations "47+38=85" drawn from ``task``'s train problems (with repeats when n is large)."""
    problems = task.problems("train")
    rng = split_rng(seed, "train", "corpus-arithmetic")
    lines = []
    for a, op, b in (rng.choice(problems) for _ in range(n)):
        lines.append(f"{a}{op}{b}={OPS[op](a, b)}")
    return lines


def build_corpus(
    n_lines: int = 20000,
    seed: int = 0,
    mix: tuple[float, float, float] = (0.4, 0.4, 0.2),
    arithmetic: ArithmeticConfig | None = None,
    reviews: ReviewsConfig | None = None,
) -> list[str]:
    """``n_lines`` lines of text, shares ``mix`` = (arithmetic, reviews, generic), shuffled.

    Each task contributes only its train split, so held-out problems and prompts never leak into pretraining.
    """
    if len(mix) != 3 or min(mix) < 0 or sum(mix) <= 0:
        raise ValueError(f"mix must be three non-negative shares (arithmetic, reviews, generic); got {mix}")
    n_arith = round(n_lines * mix[0] / sum(mix))
    n_reviews = round(n_lines * mix[1] / sum(mix))
    rng = split_rng(seed, "train", "corpus-generic")
    lines = equation_lines(ArithmeticTask(arithmetic), n_arith, seed)
    lines += ReviewsTask(reviews).corpus_lines(n_reviews, seed)
    lines += [generic_sentence(rng) for _ in range(n_lines - n_arith - n_reviews)]
    rng.shuffle(lines)
    return lines
