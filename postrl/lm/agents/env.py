"""Environments for language policies in the Gymnasium shape, and the episode loop that runs one.

A `TextEnv` is what a policy that writes text acts in: ``reset()`` gives the first observation, a list of chat
messages (the prompt); ``step(action_text)`` takes the model's reply and gives ``(observation, reward,
terminated, truncated, info)`` with the observation the messages to append (a user message, tool results).
`run_episode` plays one episode with a policy (any function from messages to a reply) under a budget of turns
and tokens, and records per-turn rewards for the per-turn credit of `postrl.core.turns`.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from postrl.runtime.errors import UserError

Message = dict[str, Any]
"""A chat message: ``{"role": "user" | "assistant" | "tool" | "system", "content": ..., ...}``."""


class AgentError(UserError, ValueError):
    """An environment or tool that cannot be used (unknown id, a tool without type hints, a `step` that
    raised); the message names it and where it is defined."""


def where(obj: Any) -> str:
    """``file:line`` where a function, method or class is defined (or its repr when unknown)."""
    target = getattr(obj, "__func__", obj)
    try:
        file = inspect.getsourcefile(target) or "?"
        line = inspect.getsourcelines(target)[1]
    except (OSError, TypeError):
        return repr(obj)
    return f"{file}:{line}"


def as_messages(observation: Any, role: str = "user") -> list[Message]:
    """An observation as messages: a string is one message of ``role``; a message or a list of them passes."""
    if isinstance(observation, str):
        return [{"role": role, "content": observation}]
    if isinstance(observation, dict):
        return [observation]
    return list(observation)


class TextEnv(abc.ABC):
    """An environment whose actions are the model's replies (text) and whose observations are messages."""

    tools: list[dict[str, Any]] = []
    """JSON schemas of the tools the model may call (rendered by the chat template); empty: none"""

    @abc.abstractmethod
    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode: ``(messages, info)``, the messages being the prompt."""

    @abc.abstractmethod
    def step(self, action: str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Take the model's reply: ``(observation messages, reward, terminated, truncated, info)``."""

    def truncation_reward(self) -> float:
        """The reward added when the episode loop cuts the episode at its budget (default 0): an environment
        that scores only at the end (a final answer, `get_reward`) scores what there is."""
        return 0.0


@dataclass(frozen=True)
class EpisodeBudget:
    """The limits of one episode (the loop truncates it when one is reached)."""

    max_turns: int = 8
    """most replies the policy writes in one episode"""
    max_tokens: int = 512
    """most tokens the policy writes over the whole episode (each reply gets what is left)"""

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_tokens"):
            if getattr(self, name) < 1:
                raise AgentError(f"episode budget: {name} must be >= 1, got {getattr(self, name)}")


@dataclass
class Episode:
    """One played episode."""

    messages: list[Message]
    """the whole conversation: the prompt, then each reply and the observation that followed it"""
    prompt_len: int
    """how many of ``messages`` are the prompt"""
    actions: list[str] = field(default_factory=list)
    """the policy's reply of each turn"""
    rewards: list[float] = field(default_factory=list)
    """the reward of each turn (the truncation reward is added to the last)"""
    terminated: bool = False
    """the environment ended the episode"""
    truncated: bool = False
    """the environment or the budget cut it"""
    tokens: int = 0
    """tokens the policy wrote"""
    infos: list[dict[str, Any]] = field(default_factory=list)
    """the info of each step"""

    @property
    def total_reward(self) -> float:
        return float(sum(self.rewards))


Policy = Callable[[list[Message], int], str]
"""A policy for `run_episode`: (conversation so far, max new tokens) -> reply."""


def _raised(env: TextEnv, method: str, err: Exception, context: str) -> AgentError:
    """The one error of an environment method that raised: the environment, where the method is, the context."""
    where_defined = where(getattr(type(env), method))
    return AgentError(
        f"environment {type(env).__name__} ({where_defined}): {method} raised {type(err).__name__}: {err}{context}"
    )


def reset_env(
    env: TextEnv, seed: int | None, options: dict[str, Any] | None
) -> tuple[list[Message], dict[str, Any]]:
    """``env.reset(seed, options)`` as messages, an exception in it as an `AgentError` naming the environment."""
    try:
        messages, info = env.reset(seed=seed, options=options)
    except UserError:
        raise
    except Exception as err:
        raise _raised(env, "reset", err, f" with seed {seed}") from err
    return as_messages(messages), dict(info or {})


def step_env(env: TextEnv, action: str, turn: int) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
    """``env.step(action)``, an exception in it as an `AgentError` that names the environment and the turn."""
    try:
        observation, reward, terminated, truncated, info = env.step(action)
    except UserError:
        raise
    except Exception as err:
        raise _raised(env, "step", err, f" on turn {turn} with the action {action[:80]!r}") from err
    return as_messages(observation), float(reward), bool(terminated), bool(truncated), dict(info or {})


def play_turn(
    env: TextEnv, episode: Episode, action: str, n_tokens: int, budget: EpisodeBudget
) -> list[Message] | None:
    """Step ``env`` on the policy's reply ``action`` (``n_tokens`` long) and record the turn in ``episode``;
    the observation messages when the episode goes on, None when it ended (terminated, or truncated by the
    environment or the budget, the environment's `truncation_reward` then added to the turn's reward)."""
    episode.tokens += n_tokens
    observation, reward, terminated, truncated, info = step_env(env, action, len(episode.actions))
    episode.actions.append(action)
    episode.messages.append({"role": "assistant", "content": action})
    episode.rewards.append(reward)
    episode.infos.append(info)
    episode.terminated = terminated
    out_of_budget = len(episode.actions) >= budget.max_turns or episode.tokens >= budget.max_tokens
    episode.truncated = not terminated and (truncated or out_of_budget)
    if episode.truncated:
        episode.rewards[-1] += float(env.truncation_reward())
    if terminated or episode.truncated:
        return None
    episode.messages.extend(observation)
    return observation


def run_episode(
    env: TextEnv,
    policy: Policy,
    budget: EpisodeBudget = EpisodeBudget(),
    count_tokens: Callable[[str], int] = len,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
) -> Episode:
    """Play one episode of ``env`` with ``policy`` within ``budget``.

    Each turn the policy gets the conversation and the tokens it has left, its reply is the action, and the
    step's observation messages are appended. The episode ends when the environment says so or the budget
    (turns, tokens counted by ``count_tokens``) runs out; then it is truncated and the environment's
    `truncation_reward` is added to the last turn's reward. An exception in ``env.step`` is an `AgentError`.
    """
    messages, _ = reset_env(env, seed, options)
    episode = Episode(messages=list(messages), prompt_len=len(messages))
    while not (episode.terminated or episode.truncated):
        action = policy(list(episode.messages), budget.max_tokens - episode.tokens)
        play_turn(env, episode, action, count_tokens(action), budget)
    return episode
