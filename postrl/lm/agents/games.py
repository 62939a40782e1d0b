"""Built-in environments that need several turns: arithmetic with a calculator tool, and guess the number.

`CalculatorEnv` asks a sum whose digits carry (which the tiny built-in model gets wrong alone) and offers an
``add`` tool in TRL's ``tools=`` form; the final reply (one without a tool call) is scored by the last number
it writes. `GuessNumberEnv` answers every guess with "higher" or "lower", so feedback (and a per-turn reward)
arrives each turn: the game where per-turn credit can show what trajectory credit cannot.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from postrl.lm.agents.config import HELDOUT_SEED
from postrl.lm.agents.env import AgentError, Message, TextEnv
from postrl.lm.agents.tools import ToolEnv
from postrl.lm.tasks.arithmetic import is_correct, parse_last_number
from postrl.lm.tasks.base import completion_text


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.

    Returns:
        The sum a + b.
    """
    return a + b


def answer_reward(completions: Sequence[Any], answer: Sequence[int], **_: Any) -> list[float]:
    """1 when the last number of the final reply is the answer, else 0 (TRL's reward-function call)."""
    return [float(is_correct(completion_text(c), a)) for c, a in zip(completions, answer, strict=True)]


def carries(a: int, b: int) -> bool:
    """Whether adding ``a`` and ``b`` (non-negative) carries in some column."""
    while a or b:
        if a % 10 + b % 10 >= 10:
            return True
        a, b = a // 10, b // 10
    return False


def carrying_sum(rng: random.Random, digits: int) -> tuple[int, int]:
    """Two ``digits``-digit numbers whose sum carries."""
    low, high = 10 ** (digits - 1), 10**digits - 1
    while True:
        a, b = rng.randint(low, high), rng.randint(low, high)
        if carries(a, b):
            return a, b


class CalculatorEnv(ToolEnv):
    """The question "What is a+b?" for a sum that carries, with the ``add`` tool; reward 1 for the right answer.

    ``reset(seed)`` draws the sum from the seed; ``reset(options=row)`` plays a data row (``prompt`` and
    ``answer``) instead.
    """

    def __init__(self, digits: int = 2, tool_timeout_s: float = 10.0) -> None:
        if digits < 1:
            raise AgentError(f"calculator: digits must be >= 1, got {digits}")
        super().__init__(tools=[add], reward_funcs=[answer_reward], tool_timeout_s=tool_timeout_s)
        self.digits = digits

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        if options and "prompt" in options:
            return super().reset(seed=seed, options=options)
        a, b = carrying_sum(random.Random(seed), self.digits)
        return super().reset(options={"prompt": f"What is {a}+{b}?", "answer": a + b})


class GuessNumberEnv(TextEnv):
    """Guess a secret integer in [low, high]; each wrong guess is answered "higher" or "lower".

    Secrets: the multiples of ``heldout_every`` in the range are held out: only the held-out seeds (from
    `postrl.lm.agents.config.HELDOUT_SEED` on, a trainer's ``env.n_eval`` episodes) draw them, and the
    training seeds draw the other numbers, so a held-out success is a secret never seen in training
    (``heldout_every=0``: every seed draws from the whole range).

    Reward per turn (``reward``): ``"success"`` gives 1 for the secret (the episode ends) and 0 for any other
    guess; ``"interval"`` gives each guess the share of the information it wins, ln(size before) − ln(size
    after) over ln(high − low + 1), where size is how many numbers the hints leave possible (the secret's guess
    leaves 1), so a solved episode's rewards sum to 1 whatever its turns, and an unsolved one earns what its
    hints narrowed. Either way ``-penalty`` for a guess the hints had already ruled out, or a reply without a
    number.
    """

    REWARDS = ("success", "interval")

    def __init__(
        self,
        low: int = 1,
        high: int = 100,
        penalty: float = 0.1,
        heldout_every: int = 5,
        reward: str = "success",
    ) -> None:
        if low >= high:
            raise AgentError(f"guess_number: low must be < high, got low={low}, high={high}")
        if reward not in self.REWARDS:
            raise AgentError(f"guess_number: reward must be one of {', '.join(self.REWARDS)}, got {reward!r}")
        if heldout_every < 0:
            raise AgentError(f"guess_number: heldout_every must be >= 0, got {heldout_every}")
        self.low, self.high, self.penalty, self.reward = low, high, penalty, reward
        numbers = range(low, high + 1)
        held = [n for n in numbers if heldout_every and n % heldout_every == 0]
        self.secrets = {
            "train": [n for n in numbers if n not in held] if heldout_every else list(numbers),
            "heldout": held if heldout_every else list(numbers),
        }
        for split, pool in self.secrets.items():
            if not pool:
                raise AgentError(
                    f"guess_number: no {split} secret in [{low}, {high}] with heldout_every={heldout_every}"
                    " (its multiples are the held-out secrets, the other numbers the training ones; 0 for no split)"
                )

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        split = "heldout" if seed is not None and seed >= HELDOUT_SEED else "train"
        self.secret = random.Random(seed).choice(self.secrets[split])
        self.lo, self.hi = self.low, self.high  # what the hints so far leave possible
        prompt = (
            f"I am thinking of a whole number from {self.low} to {self.high}. Guess it: after each guess I say"
            " higher or lower. Reply with one number."
        )
        return [{"role": "user", "content": prompt}], {}

    def step(self, action: str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        value = parse_last_number(action)
        if value is None or value != int(value):
            message = f"Reply with one whole number from {self.low} to {self.high}."
            return [{"role": "user", "content": message}], -self.penalty, False, False, {"guess": None}
        guess = int(value)
        info = {"guess": guess, "secret": self.secret}
        before = self.hi - self.lo + 1
        if guess == self.secret:
            return [], self._reward(before, 1, solved=True), True, False, info
        ruled_out = not self.lo <= guess <= self.hi
        if guess < self.secret:
            self.lo = max(self.lo, guess + 1)
            hint = "higher"
        else:
            self.hi = min(self.hi, guess - 1)
            hint = "lower"
        reward = -self.penalty if ruled_out else self._reward(before, self.hi - self.lo + 1, solved=False)
        return [{"role": "user", "content": f"{guess} is wrong: {hint}."}], reward, False, False, info

    def _reward(self, before: int, after: int, solved: bool) -> float:
        """The reward of a guess the hints allowed, which leaves ``after`` of the ``before`` numbers possible."""
        if self.reward == "interval":
            return math.log(before / after) / math.log(self.high - self.low + 1)
        return 1.0 if solved else 0.0
