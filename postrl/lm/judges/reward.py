"""`RewardJudge`: a reward function in TRL's contract (a trained reward model, a task's gold reward, any
``module:function``) as a pairwise judge: both responses scored, the first preferred with σ(s₁ − s₂)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from postrl.lm.judges.base import hard_label, pairwise_probability
from postrl.lm.rewards import RewardCallable
from postrl.runtime.errors import UserError


class RewardJudge:
    """Scores ``first`` and ``second`` with one call of ``fn`` (2n completions) and compares them pairwise:
    p = σ(s₁ − s₂) (the Bradley–Terry probability a reward model was trained to give), or with ``hard``
    1, 0, or 0.5 when the two scores are equal."""

    def __init__(self, fn: RewardCallable, name: str = "reward", hard: bool = False) -> None:
        self.fn, self.name, self.hard = fn, name, hard

    def scores(self, prompts: Sequence[Any], completions: Sequence[str]) -> list[float]:
        """The reward function's scores, checked: one finite number per completion."""
        scores = list(self.fn(prompts=list(prompts), completions=list(completions)))
        bad = [s for s in scores if not isinstance(s, (int, float)) or not math.isfinite(s)]
        if len(scores) != len(completions) or bad:
            raise UserError(
                f"judge {self.name}: the reward function returned {len(scores)} values for "
                f"{len(completions)} completions"
                + (f" (e.g. {bad[0]!r}, not a finite number)" if bad else "")
            )
        return [float(s) for s in scores]

    def __call__(self, prompts: Sequence[Any], first: Sequence[str], second: Sequence[str]) -> list[float]:
        n = len(prompts)
        scores = self.scores([*prompts, *prompts], [*first, *second])
        probs = [pairwise_probability(scores[i], scores[n + i]) for i in range(n)]
        return [hard_label(p) if self.hard else p for p in probs]
