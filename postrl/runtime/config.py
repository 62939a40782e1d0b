"""Configs: frozen dataclasses loaded from YAML, then overridden on the command line.

A config is a ``@dataclass(frozen=True)`` whose fields each carry a docstring (a string literal under
the field); that docstring is the ``--help`` text. Nested dataclasses group fields per concern
(``ppo.clip_eps``). Every key is checked: an unknown or mistyped key raises :class:`ConfigError` that
names the dotted key and suggests the closest valid one.

Every value is checked too. A config class may declare the valid range of its numeric fields in a class
constant ``CHECKS = {"lr": "> 0", "gamma": "[0, 1]", "batch_size": ">= 1"}`` (open or closed intervals,
or one comparison); a value outside it, and a NaN in any float field, is a :class:`ConfigError` that
names the dotted key, the value and the valid range. Keys renamed between versions are listed in a class
constant ``RENAMED`` (old dotted key → new one): an old key is an error that names its new name. :func:`validate` runs these checks on a config built
in Python; :func:`from_dict` and :func:`load_config` run them on every config they build.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import math
import re
import textwrap
import types
import typing
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import yaml

from postrl.runtime.errors import ConfigError as ConfigError
from postrl.runtime.presets import config_file

T = TypeVar("T")


def _suggest(key: str, valid: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.5)
    return f"; did you mean '{close[0]}'?" if close else f"; valid keys: {', '.join(sorted(valid))}"


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Return ``value`` converted to type ``tp``, or raise ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, typing.get_args(tp), key)
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            choices = ", ".join(repr(a) for a in typing.get_args(tp))
            raise ConfigError(f"'{key}': {value!r} is not one of {choices}")
        return value
    if origin in (list, tuple, Sequence):
        return _coerce_sequence(value, tp, key)
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"'{key}': expected a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"'{key}': expected a mapping of {tp.__name__} fields, got {value!r}")
        return _from_dict(tp, value, prefix=f"{key}.")
    return _coerce_scalar(value, tp, key)


def _coerce_union(value: Any, args: tuple[Any, ...], key: str) -> Any:
    if value is None and type(None) in args:
        return None
    errors = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _coerce(value, arg, key)
        except ConfigError as err:
            errors.append(str(err))
    raise ConfigError(errors[0] if errors else f"'{key}': cannot be None")


def _coerce_sequence(value: Any, tp: Any, key: str) -> Any:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"'{key}': expected a list, got {value!r}")
    item_tp, *rest = typing.get_args(tp) or (Any,)
    items = [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    return tuple(items) if typing.get_origin(tp) is tuple or rest else items


_NO = object()  # "this converter does not accept the value"


def _to_bool(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.lower() in ("true", "yes", "1")
    return _NO


def _to_int(value: Any) -> Any:
    if isinstance(value, bool):
        return _NO
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        value = _to_float(value)  # "1e5" from the command line
    if isinstance(value, float) and value.is_integer():
        return int(value)  # YAML reads 1e5 as a float; an integral one is a fine int
    return _NO


def _to_float(value: Any) -> Any:
    if isinstance(value, bool):
        return _NO
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)  # PyYAML reads "1e-3" (no dot) as a string
        except ValueError:
            return _NO
    return _NO


def _to_str(value: Any) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return _NO


_SCALARS = {bool: _to_bool, int: _to_int, float: _to_float, str: _to_str}


def _coerce_scalar(value: Any, tp: Any, key: str) -> Any:
    convert = _SCALARS.get(tp)
    if convert is not None:
        out = convert(value)
    else:
        out = value if isinstance(tp, type) and isinstance(value, tp) else _NO
    if out is _NO:
        name = getattr(tp, "__name__", str(tp))
        raise ConfigError(f"'{key}': expected {name}, got {value!r}")
    return out


def _check_renamed(cls: type, key: str, value: Any, prefix: str) -> None:
    """An old key name is an error that names the new one. A config class lists its old names in a class
    constant ``RENAMED = {"train.max_steps": "run.steps", "device": "run.device"}`` (dotted paths relative
    to the class; an old section, e.g. ``train``, is matched through the keys given under it)."""
    renamed: Mapping[str, str] = getattr(cls, "RENAMED", {})
    paths = [key]
    if isinstance(value, Mapping):
        paths += [f"{key}.{sub}" for sub in value]
    for old in paths:
        if old in renamed:
            raise ConfigError(f"'{prefix}{old}' was renamed: use '{prefix}{renamed[old]}'")


def _from_dict(cls: type[T], data: Mapping[str, Any], prefix: str = "") -> T:
    types_ = _field_types(cls)
    for key, value in data.items():  # old names, also under a section that still exists (train.max_steps)
        _check_renamed(cls, key, value, prefix)
    unknown = [k for k in data if k not in types_]
    if unknown:
        key = unknown[0]
        valid = [prefix + name for name in types_]
        raise ConfigError(f"unknown config key '{prefix}{key}'{_suggest(prefix + key, valid)}")
    defaults = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {
        k: _coerce(_with_field_default(v, defaults[k], types_[k]), types_[k], prefix + k)
        for k, v in data.items()
    }
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"missing required config key '{prefix}{missing[0]}'")
    return cls(**kwargs)


def _with_field_default(value: Any, f: dataclasses.Field, tp: Any) -> Any:
    """A partial mapping for a nested config starts from the field's own default, not the nested class's:
    ``train.max_steps=5`` keeps every other value of the parent's ``train`` default."""
    if not (dataclasses.is_dataclass(tp) and isinstance(value, Mapping)):
        return value
    if f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    elif f.default is not dataclasses.MISSING:
        default = f.default
    else:
        return value
    return _deep_merge(to_dict(default), value) if dataclasses.is_dataclass(default) else value


def from_dict(cls: type[T], data: Mapping[str, Any] | None) -> T:
    """Build config ``cls`` (a dataclass, possibly nested) from a plain mapping, checking every key and
    every value (:func:`validate`)."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"a config must be a mapping of keys to values, got {type(data).__name__}")
    return validate(_from_dict(cls, data))


_RANGE = re.compile(r"^([\[(])\s*(\S+)\s*,\s*(\S+)\s*([\])])$")
_COMPARE = re.compile(r"^(>=|<=|>|<)\s*(\S+)$")


def _in_range(x: float, spec: str) -> bool:
    """Whether number ``x`` satisfies ``spec``: ``"> 0"``, ``">= 1"``, ``"[0, 1]"``, ``"(0, 1]"``, …"""
    if m := _COMPARE.match(spec):
        op, bound = m.group(1), float(m.group(2))
        return {">": x > bound, ">=": x >= bound, "<": x < bound, "<=": x <= bound}[op]
    m = _RANGE.match(spec)
    if m is None:
        raise ValueError(f"malformed range {spec!r}")  # a bug in a CHECKS table, not a user error
    lo, hi = float(m.group(2)), float(m.group(3))
    above = x > lo if m.group(1) == "(" else x >= lo
    below = x < hi if m.group(4) == ")" else x <= hi
    return above and below


def _check_value(value: Any, spec: str | None, key: str) -> None:
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_value(item, spec, f"{key}[{i}]")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if isinstance(value, float) and math.isnan(value):
        raise ConfigError(f"'{key}' is NaN" + (f"; it must be {spec}" if spec else ""))
    if spec is not None and not _in_range(value, spec):
        raise ConfigError(f"'{key}' must be {spec}, got {value!r}")


def validate(cfg: T, prefix: str = "") -> T:
    """Check every numeric field of config ``cfg`` (and of its nested configs) against its class's
    ``CHECKS`` ranges, and that no float is NaN; raise :class:`ConfigError` naming the dotted key.
    Returns ``cfg``, so ``cfg = validate(Config(...))`` reads naturally."""
    checks: Mapping[str, str] = getattr(type(cfg), "CHECKS", {})
    for f in dataclasses.fields(cfg):  # type: ignore[arg-type]
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            validate(value, prefix=f"{prefix}{f.name}.")
        else:
            _check_value(value, checks.get(f.name), prefix + f.name)
    return cfg


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain python (nested dicts, lists), ready for YAML or JSON."""
    out = dataclasses.asdict(cfg)
    return _plain(out)


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


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
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
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
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: invalid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys to values")
    return data


def load_config(
    cls: type[T],
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    base: Mapping[str, Any] | None = None,
) -> T:
    """Config ``cls`` from ``base`` (a mapping), then the YAML file at ``path``, then ``a.b=value`` overrides."""
    data: dict[str, Any] = _deepcopy_dict(base or {})
    if path is not None:
        data = _deep_merge(data, read_yaml(path))
        try:  # the file alone first, so that an error is blamed on the file only when it is the file's
            from_dict(cls, data)
        except ConfigError as err:
            raise ConfigError(f"{err} (in {path})") from None
    return from_dict(cls, merge_overrides(data, overrides))


def _deep_merge(a: dict[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def save_config(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as YAML (atomically)."""
    from postrl.runtime.checkpoint import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))


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
    types_ = _field_types(cls)
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
