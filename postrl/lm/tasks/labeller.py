"""A synthetic preference labeller: turns pairs of responses into chosen/rejected using a gold reward.

Two modes. ``threshold``: the higher gold reward wins, and the label is flipped with probability
``noise``. ``bradley_terry``: a wins with P(a ≻ b) = σ((g_a − g_b)/temperature) (Bradley & Terry, 1952),
then flipped with probability ``noise``. In both, |g_a − g_b| ≤ ``tie_tolerance`` is a tie: target 0.5.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class LabellerConfig:
    """How the synthetic labeller decides."""

    mode: str = "threshold"
    """"threshold" (higher gold wins) or "bradley_terry" (sampled from σ((g_a − g_b)/temperature))"""
    noise: float = 0.1
    """probability that a non-tie label is flipped"""
    tie_tolerance: float = 0.05
    """|g_a − g_b| at or below this is a tie (target 0.5)"""
    temperature: float = 0.5
    """Bradley–Terry temperature (only for mode="bradley_terry")"""

    CHECKS = {"noise": "[0, 1]", "tie_tolerance": ">= 0", "temperature": "> 0"}  # valid ranges


class SyntheticLabeller:
    """Labels pairs from their gold rewards; deterministic given ``seed`` and the call order."""

    def __init__(self, config: LabellerConfig | None = None, seed: int = 0) -> None:
        self.config = config or LabellerConfig()
        if self.config.mode not in ("threshold", "bradley_terry"):
            raise ValueError(
                f"labeller mode must be 'threshold' or 'bradley_terry'; got {self.config.mode!r}"
            )
        if not 0.0 <= self.config.noise <= 1.0:
            raise ValueError(f"labeller noise must be in [0, 1]; got {self.config.noise}")
        self.rng = random.Random(seed)

    def target(self, gold_a: float, gold_b: float) -> float:
        """1.0 when a is preferred, 0.0 when b is, 0.5 for a tie."""
        diff = gold_a - gold_b
        if abs(diff) <= self.config.tie_tolerance:
            return 0.5
        if self.config.mode == "threshold":
            a_wins = diff > 0
        else:
            a_wins = self.rng.random() < 1.0 / (1.0 + math.exp(-diff / self.config.temperature))
        if self.rng.random() < self.config.noise:
            a_wins = not a_wins
        return 1.0 if a_wins else 0.0

    def label(self, prompt: str, a: str, b: str, gold_a: float, gold_b: float) -> dict[str, object]:
        """One TRL preference row ``{"prompt", "chosen", "rejected", "target"}``.

        The preferred response is put in ``chosen`` (target 1.0); a tie keeps the given order, target 0.5.
        """
        t = self.target(gold_a, gold_b)
        chosen, rejected = (b, a) if t == 0.0 else (a, b)
        return {"prompt": prompt, "chosen": chosen, "rejected": rejected, "target": 0.5 if t == 0.5 else 1.0}
