"""The contract between postrl and a reward function (TRL's `GRPOTrainer` call): the keywords every call
carries, the loaded function with its name and weight, the trainer state a curriculum reads, the error type,
and `check_signature`, which refuses before training a function that cannot take the call.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from postrl.runtime.errors import UserError

RewardCallable = Callable[..., Sequence[float | None] | Awaitable[Sequence[float | None]]]
CALL_KEYWORDS: tuple[str, ...] = ("prompts", "completions", "completion_ids", "trainer_state")
"""The keywords every reward call carries besides the data's columns (TRL's `GRPOTrainer` contract)."""


class RewardError(UserError, ValueError):
    """A reward spec cannot be loaded, or a reward function failed or returned unusable values."""


@dataclass(frozen=True)
class RewardFunction:
    """A loaded reward function with its name (for metrics and errors) and weight in the sum."""

    name: str
    fn: RewardCallable
    weight: float = 1.0
    is_verifier: bool = False
    """0/1 correctness (a built-in task with answers): its mean is an accuracy."""


@dataclass(frozen=True)
class TrainerState:
    """What a reward function reads as ``trainer_state`` (the fields of transformers' `TrainerState` that
    curriculum rewards use), e.g. to ramp a penalty up over training."""

    global_step: int = 0
    """optimizer steps taken so far"""
    max_steps: int = 0
    """the run's total optimizer steps"""


def check_signature(fn: Callable[..., Any], name: str, columns: Sequence[str] | None = None) -> None:
    """Refuse, before training, a reward function that cannot take postrl's call: the keywords of
    `CALL_KEYWORDS` and each column by name. With ``columns`` (the data's columns other than the prompt) the
    call is bound exactly; without, every argument the fixed keywords leave open must be one a column can fill
    by name."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature: their first call will tell
        return
    fixed: dict[str, Any] = dict.fromkeys(CALL_KEYWORDS, [])
    try:
        if columns is not None:
            signature.bind(**fixed, **dict.fromkeys(columns, []))
            return
        bound = signature.bind_partial(**fixed)
    except TypeError as err:
        given = f" with the data's columns ({', '.join(columns) or 'none'})" if columns is not None else ""
        raise RewardError(
            f"reward function {name} cannot be called as fn(prompts=, completions=, completion_ids=, "
            f"trainer_state=, **columns){given}: {err}; postrl passes every argument by name, as TRL does: "
            "define it as def fn(completions, **kwargs) and name the columns it reads"
        ) from None
    for param in signature.parameters.values():
        if param.name not in bound.arguments and param.kind is param.POSITIONAL_ONLY:
            raise RewardError(
                f"reward function {name}: its argument {param.name!r} is positional-only, but postrl passes "
                "every argument by name (TRL's convention)"
            )
