"""What every built-in task shares: the `Task` interface, splits, stable hashing and config building.

A task is a small, fully generated world: prompts, demonstrations, (where it fits) preference pairs, a
reward function that takes TRL's call ``fn(prompts=..., completions=..., completion_ids=..., **columns) ->
list[float]`` (completions as text or as TRL's conversational ``[{"role": "assistant", "content": ...}]``;
positional ``fn(prompts, completions)`` works too) and a hidden gold reward. Everything is a pure function
of the task's config (which holds the seed).
"""

from __future__ import annotations

import abc
import dataclasses
import difflib
import hashlib
import random
from collections.abc import Sequence
from typing import Any, Literal

from postrl.runtime.errors import ConfigError, UserError

Split = Literal["train", "test"]
SPLITS: tuple[str, ...] = ("train", "test")
KINDS: tuple[str, ...] = ("sft", "prefs", "prompts")


class TaskError(UserError, ValueError):
    """A task was asked for something it does not have (unknown split, kind, option)."""


def check_split(split: str) -> str:
    """Return ``split`` if it is "train" or "test", else raise `TaskError`."""
    if split not in SPLITS:
        raise TaskError(f"unknown split {split!r}; expected one of {SPLITS}")
    return split


def stable_hash(text: str) -> int:
    """A 64-bit hash of ``text`` that is the same in every process (unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def in_test_split(key: str, seed: int, test_fraction: float) -> bool:
    """Whether the item named ``key`` belongs to the held-out split (a fixed partition per seed)."""
    return (stable_hash(f"{seed}:{key}") % 1_000_000) < test_fraction * 1_000_000


def split_rng(seed: int, split: str, purpose: str) -> random.Random:
    """A private RNG per (seed, split, purpose), so adding rows of one kind never shifts another."""
    return random.Random(stable_hash(f"{seed}:{split}:{purpose}"))


def completion_text(completion: Any) -> str:
    """Plain text of a completion: a string, or TRL's conversational form (a list of messages)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def prompt_text(prompt: Any) -> str:
    """Plain text of a prompt: a string, or the last user message of a conversational prompt."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence):
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        if users:
            return str(users[-1].get("content", ""))
    return str(prompt)


def build_config(cls: type, kwargs: dict[str, Any], prefix: str = "") -> Any:
    """``cls(**kwargs)`` for a config dataclass, with an error that names an unknown key and suggests one, a
    value of the wrong type or outside the class's ``CHECKS`` (``prefix``, e.g. "arithmetic.", before the
    key in the message)."""
    from postrl.runtime.config_values import from_mapping, validate  # deferred: the config machinery

    names = [f.name for f in dataclasses.fields(cls)]
    for key in kwargs:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid options: {', '.join(names)}"
            raise TaskError(f"unknown option {key!r} for {cls.__name__}{hint}")
    try:
        return validate(from_mapping(cls, kwargs, prefix))
    except ConfigError as err:
        raise TaskError(str(err)) from None


class Task(abc.ABC):
    """Interface of a built-in task. Subclasses set ``name`` and ``config`` and implement the methods.

    Rows are plain dicts in TRL's column names: ``prompt``/``completion`` (SFT), ``prompt``/``chosen``/
    ``rejected`` (+ ``target``: 1.0, or 0.5 for a tie) for preferences, ``prompt`` (+ ``answer`` where a
    verifier exists) for RL prompts.
    """

    name: str = "task"
    config: Any = None

    @abc.abstractmethod
    def prompts(self, split: Split = "train") -> list[str]:
        """The prompt strings of ``split``."""

    def prompt_rows(self, split: Split = "train") -> list[dict[str, Any]]:
        """Rows for RL: ``{"prompt": str, ...}`` plus columns the reward function reads."""
        return [{"prompt": p} for p in self.prompts(split)]

    @abc.abstractmethod
    def sft_rows(self, split: Split = "train") -> list[dict[str, Any]]:
        """Demonstrations ``{"prompt": str, "completion": str}`` (no EOS: tokenisation appends it)."""

    def preference_rows(
        self, split: Split = "train", policy_samples: dict[str, list[str]] | None = None
    ) -> list[dict[str, Any]]:
        """Labelled pairs ``{"prompt", "chosen", "rejected", "target"}``; see the subclass."""
        raise TaskError(f"task {self.name!r} has no preference data")

    @abc.abstractmethod
    def reward_fn(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        """The RL reward, one float per completion. ``kwargs``: the data's columns (e.g. ``answer``) and what
        else TRL's call carries (``completion_ids``, ``trainer_state``), unused unless a task says so."""

    def gold_reward(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        """The hidden "true" reward used to measure (not train) a policy; defaults to ``reward_fn``."""
        return self.reward_fn(prompts=prompts, completions=completions, **kwargs)

    @abc.abstractmethod
    def corpus_lines(self, n: int, seed: int = 0) -> list[str]:
        """``n`` lines of pretraining text drawn from the train split only (held-out never leaks)."""

    def rows(self, kind: str, split: Split = "train") -> list[dict[str, Any]]:
        """Rows of one kind ("sft", "prefs" or "prompts") of ``split``."""
        check_split(split)
        if kind == "sft":
            return self.sft_rows(split)
        if kind == "prefs":
            return self.preference_rows(split)
        if kind == "prompts":
            return self.prompt_rows(split)
        raise TaskError(f"unknown kind {kind!r}; expected one of {KINDS}")
