"""The generated pretraining corpus: arithmetic as bare equations, review text, and generic lines.

It is also the text the default tokenizer is trained on. Held-out problems and prompts never appear in it.

The arithmetic lines are equations of the task's train problems, "47+38=85", not the task's question and
answer ("What is 47+38? 85"): pretraining learns the sums, and the question format is left for SFT to
teach, so a pretrained model does not already solve the task that SFT and RL are measured on (it scores
about 0 on the questions until SFT shows it the format).

How the equations are written (``equations``): "draws", the built-in base model's until it left out the
carries (below), draws them from the train problems with repeats ("47+38=85"); whether the sums then carry
over to the questions is a lottery on the pretraining seed. "rounds" writes every train problem once per
round, in a fresh order each round, with the result after a space, as the task writes its answers, and after
"=", ":" or ";" at random ("47+38; 85"), so the sums do not hang on one sign and SFT only has to show that a
question's "?" is one more (benchmarks/pretrain_seeds.py has the demo's SFT accuracy per pretraining seed for
both, and for the recipe below).

``carries=False`` (the built-in base model's recipe, with "rounds") leaves out the sums whose units digits
carry (47+38: 7 + 8 ≥ 10; 44% of the 2-digit sums): pretraining learns to add without carrying, reliably on
every seed, and the questions that need a carry are left for SFT's 200 demonstrations and GRPO's verifier to
teach: what a pretraining seed decides is then no longer whether the sums were learnt at all.
"""

from __future__ import annotations

from postrl.lm.tasks.arithmetic import OPS, ArithmeticConfig, ArithmeticTask
from postrl.lm.tasks.base import split_rng
from postrl.lm.tasks.review_language import generic_sentence
from postrl.lm.tasks.reviews import ReviewsConfig, ReviewsTask

EQUATIONS = ("draws", "rounds")
"""How the corpus writes its equations (see the module's docstring)."""
RESULT_SIGNS = ("=", ":", ";")
"""What a "rounds" equation writes between a sum and its result, one drawn per line."""


def units_carry(a: int, op: str, b: int) -> bool:
    """Whether the sum ``a + b`` carries from its units digits (47+38: 7 + 8 ≥ 10); False for other ops."""
    return op == "+" and abs(a) % 10 + abs(b) % 10 >= 10


def equation_lines(
    task: ArithmeticTask, n: int, seed: int = 0, equations: str = "draws", carries: bool = True
) -> list[str]:
    """``n`` equations of ``task``'s train problems: "draws" = drawn with repeats, "47+38=85"; "rounds" =
    rounds of all of them, each round in a fresh random order (the last one cut short), "47+38= 85" with
    the "=" one of `RESULT_SIGNS` drawn per line. ``carries=False`` leaves out the sums that carry from their
    units digits (`units_carry`)."""
    if equations not in EQUATIONS:
        raise ValueError(f"equations must be one of {', '.join(EQUATIONS)}; got {equations!r}")
    problems = [p for p in task.problems("train") if carries or not units_carry(*p)]
    if n > 0 and not problems:
        raise ValueError("the arithmetic task has no train problems to write equations of")
    rng = split_rng(seed, "train", "corpus-arithmetic")
    if equations == "draws":
        return [f"{a}{op}{b}={OPS[op](a, b)}" for a, op, b in (rng.choice(problems) for _ in range(n))]
    chosen: list[tuple[int, str, int]] = []
    while len(chosen) < n:
        round_ = problems[:]
        rng.shuffle(round_)
        chosen += round_[: n - len(chosen)]
    signs = split_rng(seed, "train", "corpus-arithmetic-sep")
    return [f"{a}{op}{b}{signs.choice(RESULT_SIGNS)} {OPS[op](a, b)}" for a, op, b in chosen]


def build_corpus(
    n_lines: int = 20000,
    seed: int = 0,
    mix: tuple[float, float, float] = (0.4, 0.4, 0.2),
    arithmetic: ArithmeticConfig | None = None,
    reviews: ReviewsConfig | None = None,
    equations: str = "draws",
    carries: bool = True,
) -> list[str]:
    """``n_lines`` lines of text, shares ``mix`` = (arithmetic, reviews, generic), shuffled; ``equations``:
    how the arithmetic lines are written, ``carries``: whether they include the sums that carry (`equation_lines`).

    Each task contributes only its train split, so held-out problems and prompts never leak into pretraining.
    """
    if len(mix) != 3 or min(mix) < 0 or sum(mix) <= 0:
        raise ValueError(f"mix must be three non-negative shares (arithmetic, reviews, generic); got {mix}")
    n_arith = round(n_lines * mix[0] / sum(mix))
    n_reviews = round(n_lines * mix[1] / sum(mix))
    rng = split_rng(seed, "train", "corpus-generic")
    lines = equation_lines(ArithmeticTask(arithmetic), n_arith, seed, equations, carries)
    lines += ReviewsTask(reviews).corpus_lines(n_reviews, seed)
    lines += [generic_sentence(rng) for _ in range(n_lines - n_arith - n_reviews)]
    rng.shuffle(lines)
    return lines
