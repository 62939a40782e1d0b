"""Tools as TRL's `GRPOTrainer` takes them, and the environment that runs them.

``tools=[fn]``: plain functions with type hints and a Google-style docstring; their JSON schema is exactly
what ``transformers.utils.get_json_schema`` makes (the form chat templates take). ``environment_factory``: a
callable that returns a fresh environment object per episode; its public methods are tools, ``reset(**row)``
(may return a string appended to the last user message) starts it and an optional ``get_reward()`` scores it.
The model calls a tool in the Qwen/Hermes format, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
(one or more per reply); a reply without a tool call is its final answer and ends the episode. A tool that
raises or runs past its timeout answers ``{'error': ...}`` (as TRL does), so the model sees the failure.
"""

from __future__ import annotations

import inspect
import json
import random
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from transformers.utils import get_json_schema

from postrl.lm.agents.env import AgentError, Message, TextEnv, where

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
RESERVED = ("reset", "get_reward")
"""methods of an environment object that are not tools"""


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The JSON schema of a tool, as ``transformers.utils.get_json_schema`` makes it; a function it cannot
    describe (an argument without a type hint, no docstring) is an `AgentError` that names it and its file."""
    try:
        return get_json_schema(fn)
    except Exception as err:  # transformers' TypeHintParsingException / DocstringParsingException
        name = getattr(fn, "__name__", repr(fn))
        raise AgentError(f"tool {name} ({where(fn)}): {err}") from err


@dataclass(frozen=True)
class ToolCall:
    """One tool call read from a reply."""

    name: str
    arguments: dict[str, Any]
    error: str | None = None
    """why the call could not be read (it is answered with this error), None when it could"""


def parse_tool_calls(text: str) -> list[ToolCall]:
    """The tool calls in a reply, in order: each ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
    A call whose JSON is malformed is returned with its ``error`` set (the model is told, the run goes on)."""
    calls = []
    for body in _TOOL_CALL.findall(text):
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as err:
            calls.append(ToolCall("", {}, f"tool call is not valid JSON: {err}"))
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            calls.append(ToolCall("", {}, 'tool call must be {"name": ..., "arguments": {...}}'))
            continue
        arguments = payload.get("arguments", {})
        if isinstance(arguments, str):  # some templates write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = None
        if not isinstance(arguments, dict):
            calls.append(ToolCall(payload["name"], {}, "tool call arguments must be a JSON object"))
            continue
        calls.append(ToolCall(payload["name"], arguments))
    return calls


def call_tool(fn: Callable[..., Any], arguments: dict[str, Any], timeout_s: float) -> Any:
    """``fn(**arguments)`` within ``timeout_s`` seconds; an exception or a timeout becomes ``{"error": ...}``.

    The call runs in a daemon thread: a tool that never returns is abandoned (Python cannot stop a thread),
    and the episode goes on without it.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn(**arguments)
        except Exception as err:
            box["error"] = f"{type(err).__name__}: {err}"

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return {"error": f"tool {getattr(fn, '__name__', fn)} timed out after {timeout_s:g} s"}
    return {"error": box["error"]} if "error" in box else box["result"]


def environment_tools(instance: Any) -> list[Callable[..., Any]]:
    """The tools of an environment object: its public methods except `reset` and `get_reward` (TRL's rule:
    functions of its class, so properties are not evaluated)."""
    return [
        getattr(instance, name)
        for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if name not in RESERVED and not name.startswith("_")
    ]


def seeded(seed: int | None, fn: Callable[..., Any], /, **kwargs: Any) -> Any:
    """``fn(**kwargs)`` with Python's `random` seeded by ``seed`` (None: as it is), its state restored after."""
    if seed is None:
        return fn(**kwargs)
    state = random.getstate()
    random.seed(seed)
    try:
        return fn(**kwargs)
    finally:
        random.setstate(state)


RewardFn = Callable[..., Sequence[float]]
"""TRL's reward function: ``fn(prompts=[...], completions=[...], **columns) -> list[float]``"""


class ToolEnv(TextEnv):
    """A `TextEnv` over TRL-style ``tools`` and/or an ``environment_factory``.

    ``reset(options=row)`` starts an episode on a data row (``row["prompt"]``: a string or messages; the other
    columns go to the environment's ``reset`` and to the reward functions); ``reset(seed)`` plays row
    ``seed mod len(rows)`` of ``rows`` when the environment was given rows, else a row whose prompt is one empty
    user message (TRL's rows when an environment owns its data: `reset`'s string becomes the prompt). Each
    step runs the reply's tool calls and observes their results as ``tool`` messages; a reply with no tool
    call ends the episode, scored by the sum of the reward functions on the conversation and the
    environment's ``get_reward()``.

    The environment object's ``reset`` runs with Python's `random` seeded from the episode's seed (its state
    restored afterwards), so an environment that draws its task with `random` (TRL's documented
    ``IncrementEnv``) gives the G episodes of a group one task, and a run is reproducible.
    """

    def __init__(
        self,
        tools: Sequence[Callable[..., Any]] = (),
        environment_factory: Callable[[], Any] | None = None,
        reward_funcs: Sequence[RewardFn] = (),
        tool_timeout_s: float = 10.0,
        rows: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        self._rows = [dict(row) for row in rows] if rows is not None else None
        if self._rows is not None and not self._rows:
            raise AgentError("ToolEnv: rows is empty")
        self._standalone = list(tools)
        self._factory = environment_factory
        self._reward_funcs = list(reward_funcs)
        self._timeout = tool_timeout_s
        self._instance: Any = None
        probe = self._fresh() if environment_factory is not None else None  # fail early, as TRL does
        self._functions = self._standalone + (environment_tools(probe) if probe is not None else [])
        self.tools = [tool_schema(fn) for fn in self._functions]
        self._owns_reward = probe is not None and callable(getattr(probe, "get_reward", None))
        if not self._reward_funcs and not self._owns_reward:
            raise AgentError(
                "no reward source: pass reward_funcs, or an environment_factory whose environment defines get_reward"
            )

    def _fresh(self) -> Any:
        instance = self._factory()
        if not callable(getattr(instance, "reset", None)):
            raise AgentError(
                f"environment_factory {getattr(self._factory, '__name__', self._factory)} ({where(self._factory)})"
                " must return an object with a callable reset method"
            )
        return instance

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        row = dict(options) if options else self._row_of(seed)
        if "prompt" not in row:
            raise AgentError("ToolEnv.reset: options must hold the data row, with its 'prompt'")
        prompt = row["prompt"]
        messages = (
            [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        )
        self._row, self._prompt, self._turns = row, list(messages), []
        by_name = {fn.__name__: fn for fn in self._standalone}
        if self._factory is not None:
            self._instance = self._fresh()  # a fresh object per episode: interactions stay isolated
            by_name.update({fn.__name__: fn for fn in environment_tools(self._instance)})
            observation = seeded(seed, self._instance.reset, **row)
            if isinstance(observation, str):
                messages[-1] = {**messages[-1], "content": f"{messages[-1]['content']}{observation}"}
        self._by_name = by_name
        return messages, {}

    def _row_of(self, seed: int | None) -> dict[str, Any]:
        if self._rows is None:
            return {
                "prompt": [{"role": "user", "content": ""}]
            }  # TRL's row when the environment owns the data
        return dict(self._rows[(seed or 0) % len(self._rows)])

    def step(self, action: str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        self._turns.append({"role": "assistant", "content": action})
        calls = parse_tool_calls(action)
        if not calls:
            return [], self._score(), True, False, {"tool_calls": 0, "tool_failures": 0}
        observation, failures = [], 0
        for call in calls:
            result = self._run(call)
            failures += isinstance(result, dict) and "error" in result
            content = result if isinstance(result, list) else str(result)
            observation.append({"role": "tool", "name": call.name, "content": content})
        self._turns.extend(observation)
        return observation, 0.0, False, False, {"tool_calls": len(calls), "tool_failures": failures}

    def _run(self, call: ToolCall) -> Any:
        if call.error is not None:
            return {"error": call.error}
        fn = self._by_name.get(call.name)
        if fn is None:
            return {"error": f"Tool {call.name} not found."}
        return call_tool(fn, call.arguments, self._timeout)

    def truncation_reward(self) -> float:
        return self._score()

    def _score(self) -> float:
        """Σ reward functions on (prompt, the conversation after it, the environment object as TRL passes it:
        ``environments=[obj]``) + the environment's get_reward()."""
        columns = {k: [v] for k, v in self._row.items() if k != "prompt"}
        if self._instance is not None:  # TRL passes each rollout's environment object to the reward functions
            columns["environments"] = [self._instance]
        total = 0.0
        for fn in self._reward_funcs:
            values = fn(prompts=[self._prompt], completions=[list(self._turns)], **columns)
            total += float(values[0]) if values[0] is not None else 0.0
        if self._owns_reward:
            total += float(self._instance.get_reward())
        return total
