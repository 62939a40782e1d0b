"""`arithmetic`: "What is 47+38?" → " 85", with a verifier that reads the last number of a completion.

The problem space (operand pairs × operators) is partitioned once by a stable hash, so a held-out problem
never appears in the train split, whatever ``n_train`` is. Completions are short (" 85" is four tokens with
EOS) so a tiny model learns the format in minutes and RL (GRPO) works on correctness alone.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from postrl.lm.tasks.base import (
    Split,
    Task,
    TaskError,
    check_split,
    completion_text,
    in_test_split,
    prompt_text,
    split_rng,
)

OPS: dict[str, Any] = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_ENUMERATE_LIMIT = 300_000  # problem spaces up to this size are enumerated, larger ones sampled

# A number: optional sign (not when glued to a preceding word/digit, so "12-5" reads as 12 and 5),
# digits with optional thousands commas, optional decimals. Unicode minus is accepted.
_NUMBER = re.compile(r"(?:(?<![\w)])[-−])?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_PROBLEM = re.compile(r"(-?\d+)\s*([+\-*×x])\s*(-?\d+)")


def parse_last_number(text: str) -> float | None:
    """The last number written in ``text`` (regex, never ``eval``), or None.

    "The answer is 1,234." → 1234; "-12" → -12; "3 - 5 = -2" → -2; "12-5" → 5; "2.5" → 2.5.
    """
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    token = matches[-1].replace(",", "").replace("−", "-")
    try:
        return float(token)
    except ValueError:
        return None


def is_correct(completion: str, answer: float | int | str) -> bool:
    """Whether the last number of ``completion`` equals ``answer`` (to 1e-6)."""
    value = parse_last_number(completion)
    if value is None:
        return False
    return abs(value - float(str(answer).replace(",", ""))) < 1e-6


def answer_from_prompt(prompt: str) -> int | None:
    """The answer of a prompt like "What is 47+38?" (for reward calls without an ``answer`` column)."""
    match = _PROBLEM.search(prompt)
    if match is None:
        return None
    a, op, b = int(match.group(1)), match.group(2), int(match.group(3))
    op = "*" if op in ("×", "x") else op
    return OPS[op](a, b)


@dataclass(frozen=True)
class ArithmeticConfig:
    """Options of the arithmetic task."""

    digits: int = 2
    """operands have exactly this many digits (1 means 0–9)"""
    ops: str = "+"
    """operators drawn uniformly, any of "+", "-", "*" (e.g. "+-*")"""
    n_train: int = 5000
    """train problems (unique; capped by the size of the train part of the problem space)"""
    n_test: int = 500
    """held-out problems (unique; never in train)"""
    test_fraction: float = 0.1
    """share of the problem space reserved for the held-out split"""
    allow_negative: bool = True
    """for "-", allow a < b (negative answers); otherwise operands are ordered"""
    prompt_format: str = "What is {a}{op}{b}?"
    """prompt template with {a}, {op}, {b}"""
    answer_format: str = " {answer}"
    """demonstration template with {answer}; keep it short (e.g. " {answer}" or " The answer is {answer}.")"""
    seed: int = 0
    """seed of the split partition and of the sampling"""

    CHECKS = {"digits": ">= 1", "n_train": ">= 1", "n_test": ">= 1", "test_fraction": "(0, 1)"}


class ArithmeticTask(Task):
    """Integer arithmetic with a verifier; reward 1.0 when the last number of a completion is correct."""

    name = "arithmetic"

    def __init__(self, config: ArithmeticConfig | None = None) -> None:
        self.config = config or ArithmeticConfig()
        bad = set(self.config.ops) - set(OPS)
        if bad or not self.config.ops:
            raise TaskError(f"ops must be made of '+', '-', '*'; got {self.config.ops!r}")
        if self.config.digits < 1:
            raise TaskError(f"digits must be >= 1; got {self.config.digits}")
        self._cache: dict[str, list[tuple[int, str, int]]] = {}

    # ---- problems --------------------------------------------------------------------------------------
    def _operand_range(self) -> tuple[int, int]:
        d = self.config.digits
        return (0 if d == 1 else 10 ** (d - 1), 10**d - 1)

    def _normalise(self, a: int, op: str, b: int) -> tuple[int, str, int]:
        if op == "-" and not self.config.allow_negative and a < b:
            return b, op, a
        return a, op, b

    def _is_test(self, problem: tuple[int, str, int]) -> bool:
        a, op, b = problem
        return in_test_split(f"{a}{op}{b}", self.config.seed, self.config.test_fraction)

    def problems(self, split: Split = "train") -> list[tuple[int, str, int]]:
        """The unique ``(a, op, b)`` problems of ``split``, in a fixed order."""
        check_split(split)
        if split not in self._cache:
            lo, hi = self._operand_range()
            size = (hi - lo + 1) ** 2 * len(self.config.ops)
            sample = self._enumerate if size <= _ENUMERATE_LIMIT else self._sample
            self._cache[split] = sample(split, lo, hi)
        return self._cache[split]

    def _wanted(self, split: str) -> int:
        return self.config.n_train if split == "train" else self.config.n_test

    def _enumerate(self, split: str, lo: int, hi: int) -> list[tuple[int, str, int]]:
        space = itertools.product(range(lo, hi + 1), self.config.ops, range(lo, hi + 1))
        unique = dict.fromkeys(self._normalise(a, op, b) for a, op, b in space)
        chosen = [p for p in unique if self._is_test(p) == (split == "test")]
        split_rng(self.config.seed, split, "problems").shuffle(chosen)
        return chosen[: self._wanted(split)]

    def _sample(self, split: str, lo: int, hi: int) -> list[tuple[int, str, int]]:
        rng, wanted = split_rng(self.config.seed, split, "problems"), self._wanted(split)
        found: dict[tuple[int, str, int], None] = {}
        for _ in range(wanted * 50):
            if len(found) == wanted:
                break
            p = self._normalise(rng.randint(lo, hi), rng.choice(self.config.ops), rng.randint(lo, hi))
            if self._is_test(p) == (split == "test"):
                found[p] = None
        return list(found)

    def format_prompt(self, a: int, op: str, b: int) -> str:
        """The prompt text of one problem."""
        return self.config.prompt_format.format(a=a, op=op, b=b)

    def format_answer(self, answer: int) -> str:
        """The demonstration completion of one answer (without EOS)."""
        return self.config.answer_format.format(answer=answer)

    # ---- Task interface --------------------------------------------------------------------------------
    def prompts(self, split: Split = "train") -> list[str]:
        """Prompt strings of ``split``."""
        return [self.format_prompt(*p) for p in self.problems(split)]

    def prompt_rows(self, split: Split = "train") -> list[dict[str, Any]]:
        """``{"prompt", "answer"}`` rows (answer as a string, as in GSM8K-style data)."""
        return [
            {"prompt": self.format_prompt(*p), "answer": str(OPS[p[1]](p[0], p[2]))}
            for p in self.problems(split)
        ]

    def sft_rows(self, split: Split = "train") -> list[dict[str, Any]]:
        """``{"prompt", "completion", "answer"}`` demonstrations in the fixed answer format."""
        rows = self.prompt_rows(split)
        return [{**r, "completion": self.format_answer(int(r["answer"]))} for r in rows]

    def preference_rows(
        self, split: Split = "train", policy_samples: dict[str, list[str]] | None = None
    ) -> list[dict[str, Any]]:
        """Correct demonstration (chosen) vs the same format with a wrong answer (rejected); target 1.0.

        ``policy_samples`` (prompt → completions) are ignored: correctness alone decides here.
        """
        rng = split_rng(self.config.seed, split, "prefs")
        rows = []
        for r in self.prompt_rows(split):
            answer = int(r["answer"])
            wrong = answer + rng.choice([d for d in range(-10, 11) if d != 0])
            chosen, rejected = self.format_answer(answer), self.format_answer(wrong)
            rows.append(
                {
                    "prompt": r["prompt"],
                    "chosen": chosen,
                    "rejected": rejected,
                    "target": 1.0,
                    "answer": r["answer"],
                }
            )
        return rows

    def reward_fn(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        """1.0 where the last number of the completion equals the answer, else 0.0.

        The answer comes from the ``answer`` column when given, else it is recomputed from the prompt.
        """
        answers = kwargs.get("answer")
        rewards = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            answer = answers[i] if answers is not None else answer_from_prompt(prompt_text(prompt))
            ok = answer is not None and is_correct(completion_text(completion), answer)
            rewards.append(1.0 if ok else 0.0)
        return rewards

    def corpus_lines(self, n: int, seed: int = 0) -> list[str]:
        """``n`` lines "What is a+b? c" from the train split (with repeats when n is large)."""
        rows = self.sft_rows("train")
        rng = split_rng(seed, "train", "corpus-arithmetic")
        return [r["prompt"] + r["completion"] for r in (rng.choice(rows) for _ in range(n))]
