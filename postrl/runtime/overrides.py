"""Keyword overrides of the Python API: ``f(optim={"lr": 1e-5})`` or ``f(**{"optim.lr": 1e-5})``, the twin of
the command line's ``optim.lr=1e-5``, as one nested mapping to merge over a config (`config_values.deep_merge`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from postrl.runtime.config_values import deep_merge


def plain(value: Any) -> Any:
    """Paths as strings, tuples as lists, mappings as dicts (recursively): what YAML and a config take."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    return value


def nested_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``{"optim.lr": 1e-5, "run": {"steps": 3}}`` → ``{"optim": {"lr": 1e-5}, "run": {"steps": 3}}``; later
    keys win where two set the same value."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        *parents, last = key.split(".")
        node: dict[str, Any] = {last: plain(value)}
        for part in reversed(parents):
            node = {part: node}
        out = deep_merge(out, node)
    return out


def apply_overrides(cls: type, cfg: Any, overrides: Mapping[str, Any]) -> Any:
    """Config ``cfg`` (of dataclass ``cls``) with the keyword ``overrides``, every key and value checked."""
    from postrl.runtime.config import from_dict, to_dict

    if not overrides:
        return cfg
    return from_dict(cls, deep_merge(to_dict(cfg), nested_overrides(overrides)))
