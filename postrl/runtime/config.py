"""Configs: frozen dataclasses loaded from YAML, then overridden on the command line.

A config is a ``@dataclass(frozen=True)`` whose fields each carry a docstring (a string literal under
the field); that docstring is the ``--help`` text. Nested dataclasses group fields per concern
(``ppo.clip_eps``). Every key is checked: an unknown or mistyped key raises :class:`ConfigError` that
names the dotted key and suggests the closest valid one.

Every value is checked too. A config class may declare the valid range of its numeric fields in a class
constant ``CHECKS = {"lr": "> 0", "gamma": "[0, 1]", "batch_size": ">= 1"}`` (open or closed intervals,
or one comparison); a value outside it, and a NaN in any float field, is a :class:`ConfigError` that
names the dotted key, the value and the valid range. Keys renamed between versions are listed in a class
constant ``RENAMED`` (old dotted key → new one): an old key is an error that names its new name.
:func:`validate` runs these checks on a config built in Python; :func:`from_dict` and :func:`load_config` run
them on every config they build.

This module reads YAML and overrides; converting and checking the values is `config_values.py`, the help text
`config_help.py` (their public names are importable from here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from postrl.runtime.config_help import describe as describe
from postrl.runtime.config_help import field_help as field_help
from postrl.runtime.config_help import format_help as format_help
from postrl.runtime.config_values import deep_merge, from_mapping, to_dict
from postrl.runtime.config_values import validate as validate
from postrl.runtime.errors import ConfigError as ConfigError
from postrl.runtime.presets import config_file

T = TypeVar("T")


def from_dict(cls: type[T], data: Mapping[str, Any] | None) -> T:
    """Build config ``cls`` (a dataclass, possibly nested) from a plain mapping, checking every key and
    every value (:func:`validate`)."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"a config must be a mapping of keys to values, got {type(data).__name__}")
    return validate(from_mapping(cls, data))


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"ppo.clip_eps=0.1"`` → ``(["ppo", "clip_eps"], 0.1)``; the value is read as YAML (safe)."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not of the form key=value")
    key, raw = text.split("=", 1)
    key = key.strip().lstrip("-").replace("-", "_")
    if not key:
        raise ConfigError(f"override '{text}' has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def merge_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``a.b=value`` override applied (nested dicts created)."""
    merged = _deepcopy_dict(data)
    for text in overrides:
        path, value = parse_override(text)
        node = merged
        for depth, part in enumerate(path[:-1]):
            child = node.get(part)
            if not isinstance(child, dict):
                if (
                    child is not None
                    and not dataclasses.is_dataclass(child)
                    and not isinstance(child, Mapping)
                ):
                    key = ".".join(path[: depth + 1])
                    raise ConfigError(f"{text}: '{key}' is a value ({child!r}), not a section with keys")
                child = {} if child is None else _as_dict(child)
                node[part] = child
            node = child
        node[path[-1]] = value
    return merged


def _as_dict(x: Any) -> dict[str, Any]:
    return to_dict(x) if dataclasses.is_dataclass(x) else dict(x)


def _deepcopy_dict(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deepcopy_dict(v) if isinstance(v, Mapping) else v for k, v in d.items()}


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping (safe loader) from a file or a shipped preset's name; errors name the file."""
    path = config_file(path)  # a file, else a shipped preset of that name
    try:
        data = yaml.load(path.read_text(encoding="utf-8-sig"), Loader=_UniqueKeyLoader)  # noqa: S506 (safe)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory, not a YAML file") from None
    except OSError as err:
        raise ConfigError(f"config file {path} cannot be read: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start}): a config is a YAML file") from None
    except yaml.YAMLError as err:
        raise ConfigError(_yaml_error(path, err)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys to values")
    return data


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (it would keep the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"the key '{key}' is given twice",
                    key_node.start_mark,
                )
            if isinstance(key, str):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _yaml_error(path: Path, err: yaml.YAMLError) -> str:
    """One line for a YAML syntax error: ``path:line:column: invalid YAML: what`` (PyYAML's own message
    spans several lines and names "<unicode string>" instead of the file)."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    context, start = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context and start is not None and mark is not None and start.line != mark.line:
        context += f" (it starts at line {start.line + 1}, column {start.column + 1})"
    what = "; ".join(str(part) for part in (context, getattr(err, "problem", None)) if part)
    return f"{where}: invalid YAML: {what or ' '.join(str(err).split())}"


def load_config(
    cls: type[T],
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    base: Mapping[str, Any] | None = None,
) -> T:
    """Config ``cls`` from ``base`` (a mapping), then the YAML file at ``path``, then ``a.b=value`` overrides."""
    data: dict[str, Any] = _deepcopy_dict(base or {})
    if path is not None:
        data = deep_merge(data, read_yaml(path))
        try:  # the file alone first, so that an error is blamed on the file only when it is the file's
            from_dict(cls, data)
        except ConfigError as err:
            raise ConfigError(f"{err} (in {path})") from None
    return from_dict(cls, merge_overrides(data, overrides))


def save_config(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as YAML (atomically)."""
    from postrl.runtime.checkpoint import atomic_write_text  # deferred: torch (`postrl --help` has none)

    atomic_write_text(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))
