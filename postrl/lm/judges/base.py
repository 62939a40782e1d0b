"""The judge interface, its pairwise math, and judges loaded from a spec.

Pairwise math. A judge that gives each answer a log-probability (a generative judge's log p(" A") and
log p(" B") as the next tokens) or a score (a reward model) prefers the first with

    p = σ(a − b) = exp(a) / (exp(a) + exp(b))                   (`pairwise_probability`)

which for log-probabilities is the answer distribution renormalised over the two allowed answers. A judge
that sees the pair in one order is biased towards a position (LLM-as-judge, Zheng et al. 2023; the tiny
models here too); asking again with the two swapped and averaging removes a constant bias:

    p = ½ · (p(first shown as A) + 1 − p(second shown as A))      (`debiased_probability`)

(if the judge adds δ to "A" whatever it reads, p(first as A) = p* + δ and p(second as A) = 1 − p* + δ, and the
average is p*).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

from postrl.runtime.errors import UserError

SPEC_KINDS = ("rm:PATH", "lm:PATH", "openai:URL", "task:NAME", "module:function")


class Judge(Protocol):
    """Labels pairs: for each (prompt, first, second), the probability that ``first`` is preferred."""

    def __call__(self, prompts: Sequence[Any], first: Sequence[str], second: Sequence[str]) -> list[float]:
        """P(first ≻ second | prompt) per pair, each in [0, 1] (0.5: a tie)."""
        ...


def pairwise_probability(first: float, second: float) -> float:
    """σ(first − second): the Bradley–Terry probability of the first of two scores (or log-probabilities:
    the two-way renormalised answer distribution), computed without overflow."""
    d = first - second
    if d >= 0:
        return 1.0 / (1.0 + math.exp(-d))
    e = math.exp(d)
    return e / (1.0 + e)


def debiased_probability(p_first_as_a: float, p_second_as_a: float) -> float:
    """½(p(first shown as A) + 1 − p(second shown as A)): both orders of a pair averaged, so a judge's
    constant preference for a position cancels (see the module's docstring)."""
    return 0.5 * (p_first_as_a + 1.0 - p_second_as_a)


def hard_label(p: float, tie_tolerance: float = 0.0) -> float:
    """1.0, 0.0 or 0.5 (|p − ½| ≤ ``tie_tolerance``): a soft verdict made a hard one."""
    if abs(p - 0.5) <= tie_tolerance:
        return 0.5
    return 1.0 if p > 0.5 else 0.0


def preference_rows(
    rows: Sequence[dict[str, Any]], probabilities: Sequence[float], hard: bool = False
) -> list[dict[str, Any]]:
    """TRL preference rows from judged pairs ``{"prompt", "first", "second", ...}``: the preferred response as
    ``chosen``, ``target`` = P(chosen ≻ rejected) ≥ 0.5 (``hard``: 1.0, or 0.5 for an exact tie), as postrl's
    reward model and DPO read it; other columns are kept."""
    out = []
    for row, p in zip(rows, probabilities, strict=True):
        p = hard_label(p) if hard else float(p)
        first_wins = p >= 0.5
        rest = {k: v for k, v in row.items() if k not in ("prompt", "first", "second")}
        out.append(
            {
                "prompt": row["prompt"],
                "chosen": row["first"] if first_wins else row["second"],
                "rejected": row["second"] if first_wins else row["first"],
                "target": p if first_wins else 1.0 - p,
                **rest,
            }
        )
    return out


def check_probabilities(values: Sequence[Any], n: int, name: str) -> list[float]:
    """A judge's output checked: ``n`` finite numbers in [0, 1]; else a `UserError` naming the judge."""
    values = list(values)
    if len(values) != n:
        raise UserError(f"judge {name} returned {len(values)} probabilities for {n} pairs")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= float(v) <= 1.0:
            raise UserError(f"judge {name}: pair {i}: expected a probability in [0, 1], got {v!r}")
    return [float(v) for v in values]
