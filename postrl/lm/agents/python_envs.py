"""Environments given to ``postrl.grpo`` as Python objects, as TRL's `GRPOTrainer` takes them: ``tools=``,
``environment_factory=``, ``reward_funcs=`` and rows of data become one `ToolEnv`, registered among the
environment ids (`postrl.lm.agents.registry.ENVS`) as ``python:<module.qualname>`` for the length of the run.

With rows, episode seed ``s`` plays row ``s mod len(rows)`` (``env.n_train`` defaults to the number of rows);
without, the environment owns its data and its ``reset`` gives the prompt (TRL's rule).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from postrl.lm.agents.env import AgentError
from postrl.lm.agents.registry import ENVS
from postrl.lm.agents.tools import ToolEnv

PREFIX = "python:"
"""the ids of environments registered from Python objects"""


def _name(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or "builtins"
    return f"{module}.{getattr(obj, '__qualname__', None) or type(obj).__qualname__}"


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def register_tool_env(
    tools: Sequence[Callable[..., Any]] | Callable[..., Any] | None = None,
    environment_factory: Callable[[], Any] | None = None,
    reward_funcs: Sequence[Callable[..., Any]] | Callable[..., Any] | None = None,
    rows: Iterable[dict[str, Any]] | None = None,
) -> tuple[str, int | None]:
    """Register the `ToolEnv` of these TRL arguments; returns (its id, the number of rows or None). The
    environment is built once here, so a tool without type hints, a factory whose object has no ``reset``
    or no reward source is an `AgentError` before any run folder is touched."""
    tools, reward_funcs = _as_list(tools), _as_list(reward_funcs)
    if environment_factory is None and not tools:
        raise AgentError("an environment from Python needs environment_factory= or tools=")
    for fn in (*tools, *reward_funcs, *([environment_factory] if environment_factory else [])):
        if not callable(fn):
            raise AgentError(f"tools, reward_funcs and environment_factory must be callables, got {fn!r}")
    table = [dict(row) for row in rows] if rows is not None else None
    ToolEnv(tools, environment_factory, reward_funcs, rows=table)  # the checks, before any run folder

    def make(**options: Any) -> ToolEnv:
        return ToolEnv(tools, environment_factory, reward_funcs, rows=table, **options)

    env_id = PREFIX + _name(environment_factory if environment_factory is not None else tools[0])
    ENVS[env_id] = make
    return env_id, None if table is None else len(table)


def release_tool_env(env_id: str) -> None:
    """Forget an environment `register_tool_env` registered."""
    if env_id.startswith(PREFIX):
        ENVS.pop(env_id, None)
