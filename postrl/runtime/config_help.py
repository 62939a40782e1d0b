"""Config help: each field's docstring is its ``--help`` text; `describe` lists every dotted key with its
default, `format_help` prints them (``--list-keys``).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from collections.abc import Mapping
from functools import cache
from typing import Any

from postrl.runtime.config_values import field_types


@cache
def field_help(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass ``cls`` (its ``--help`` text), by field name."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _defaults(cls: type) -> Any:
    """An instance of ``cls`` with every default, or None when a field is required."""
    try:
        return cls()
    except TypeError:
        return None


def describe(cls: type, prefix: str = "", values: Any = None) -> list[tuple[str, str, str]]:
    """``(dotted key, default, help)`` for every leaf field of config ``cls``: the override reference.

    The defaults are the values a run with no overrides uses: a nested config's are those of its parent's
    default (``SFTConfig().train.max_steps``), not its own class's (``TrainConfig().max_steps``)."""
    values = _defaults(cls) if values is None else values
    rows: list[tuple[str, str, str]] = []
    docs = field_help(cls)
    checks: Mapping[str, str] = getattr(cls, "CHECKS", {})
    types_ = field_types(cls)
    for f in dataclasses.fields(cls):
        tp = types_[f.name]
        value = dataclasses.MISSING if values is None else getattr(values, f.name)
        if dataclasses.is_dataclass(tp):
            nested = None if value is dataclasses.MISSING else value
            rows += describe(tp, prefix=f"{prefix}{f.name}.", values=nested)
            continue
        if value is not dataclasses.MISSING:
            default = repr(value)
        elif f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = repr(f.default_factory())
        else:
            default = "(required)"
        doc = docs.get(f.name, "")
        if f.name in checks:
            doc = f"{doc} (valid: {checks[f.name]})".strip()
        rows.append((prefix + f.name, default, doc))
    return rows


def format_help(cls: type) -> str:
    """A help paragraph listing every overridable key with its default and docstring."""
    lines = ["config keys (override on the command line as key=value, e.g. run.steps=100):"]
    for key, default, doc in describe(cls):
        lines.append(f"  {key} = {default}" + (f"\n      {doc}" if doc else ""))
    return "\n".join(lines)
