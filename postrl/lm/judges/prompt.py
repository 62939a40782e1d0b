"""The generative judge's pairwise prompt: a constitution (a list of principles, as in Constitutional AI, Bai
et al. 2022), the prompt, the two responses shown as A and B, and the answer cue; the judge answers with the
next tokens " A" or " B".

    Principles: be positive about the subject; be fluent and grammatical.
    Prompt: Review of the pasta:
    A: was fresh and tasty .
    B: was cold .
    Better: A

`judge_sft_rows` writes labelled comparisons in this format (each pair in both orders, so that a judge trained
on them has no position to prefer): SFT on them makes a generative reward model (Zhang et al. 2024).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from postrl.lm.tasks.base import completion_text, prompt_text

DEFAULT_CONSTITUTION = (
    "answer the prompt",
    "be helpful, honest and harmless",
    "be fluent and grammatical",
)
"""The principles a generative judge is asked to apply when none are given."""

ANSWERS = (" A", " B")
"""The two answers, as the text that follows the prompt's cue."""


@dataclass(frozen=True)
class JudgePrompt:
    """The pairwise prompt of a generative judge."""

    constitution: tuple[str, ...] = DEFAULT_CONSTITUTION
    """The principles, shown in order ("Principles: p1; p2.")."""

    def principles(self) -> str:
        """The constitution as one line."""
        return "Principles: " + "; ".join(p.strip().rstrip(".;") for p in self.constitution) + "."

    def question(self, prompt: Any, a: Any, b: Any) -> str:
        """The pair as the judge reads it (the prompt's plain text, A then B), without the principles."""
        return (
            f"Prompt: {prompt_text(prompt).strip()}\nA: {completion_text(a).strip()}\n"
            f"B: {completion_text(b).strip()}"
        )

    def render(self, prompt: Any, a: Any, b: Any) -> str:
        """The whole judge prompt, ending with the cue whose next tokens are " A" or " B"."""
        return f"{self.principles()}\n{self.question(prompt, a, b)}\nBetter:"


def judge_sft_rows(rows: Sequence[dict[str, Any]], prompt: JudgePrompt | None = None) -> list[dict[str, str]]:
    """SFT rows ``{"prompt", "completion"}`` teaching a generative judge the labelled preference rows
    ``{"prompt", "chosen", "rejected", "target"}``: each pair in both orders (chosen as A → " A", chosen as B →
    " B"); ties (target 0.5) say neither and are left out."""
    prompt = prompt or JudgePrompt()
    out = []
    for row in rows:
        target = float(row.get("target", 1.0))
        if target == 0.5:
            continue
        good, bad = (row["chosen"], row["rejected"]) if target > 0.5 else (row["rejected"], row["chosen"])
        out.append({"prompt": prompt.render(row["prompt"], good, bad), "completion": ANSWERS[0]})
        out.append({"prompt": prompt.render(row["prompt"], bad, good), "completion": ANSWERS[1]})
    return out
