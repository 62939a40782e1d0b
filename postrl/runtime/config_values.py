"""From a mapping to a checked config: each value converted to its field's type (nested configs recursively),
unknown and renamed keys refused, and every number checked against its class's ``CHECKS`` ranges
(`postrl.runtime.config` explains the rules).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from postrl.runtime.errors import ConfigError

T = TypeVar("T")


def _suggest(key: str, valid: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.5)
    return f"; did you mean '{close[0]}'?" if close else f"; valid keys: {', '.join(sorted(valid))}"


def field_types(cls: type) -> dict[str, Any]:
    """The resolved type of each field of dataclass ``cls``, by field name."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Return ``value`` converted to type ``tp``, or raise ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, typing.get_args(tp), key)
    if origin is typing.Literal:
        value = _yaml_word(value, typing.get_args(tp))
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
        return from_mapping(tp, value, prefix=f"{key}.")
    return _coerce_scalar(value, tp, key)


_YAML_BOOL_WORDS = {True: ("on", "true", "yes"), False: ("off", "false", "no")}


def _yaml_word(value: Any, choices: tuple[Any, ...]) -> Any:
    """YAML reads ``off``/``on``/``yes``/``no`` as booleans: for a choice among words, the word that was written
    (``padding_free: off`` is "off", not False; a word that is not a choice is named as ``on``/``off`` in the
    error); any other value unchanged."""
    if isinstance(value, bool) and value not in choices:
        words = _YAML_BOOL_WORDS[value]
        return next((word for word in words if word in choices), words[0])
    return value


def _coerce_union(value: Any, args: tuple[Any, ...], key: str) -> Any:
    if value is None and type(None) in args:
        return None
    errors = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return coerce(value, arg, key)
        except ConfigError as err:
            errors.append(str(err))
    raise ConfigError(errors[0] if errors else f"'{key}': cannot be None")


def _coerce_sequence(value: Any, tp: Any, key: str) -> Any:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"'{key}': expected a list, got {value!r}")
    item_tp, *rest = typing.get_args(tp) or (Any,)
    if typing.get_origin(tp) is tuple and rest and rest != [Ellipsis] and len(value) != len(rest) + 1:
        raise ConfigError(f"'{key}': expected {len(rest) + 1} values, got {len(value)}: {list(value)!r}")
    items = [coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
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


def from_mapping(cls: type[T], data: Mapping[str, Any], prefix: str = "") -> T:
    """Config ``cls`` from ``data``: every key known (old names refused, naming the new ones), every value of
    its field's type; ``prefix`` (e.g. ``"ppo."``) is the dotted path named in errors. Ranges are not checked
    here (:func:`validate`)."""
    types_ = field_types(cls)
    for odd in (k for k in data if not isinstance(k, str)):  # YAML's `1: 2` or `null: x`
        raise ConfigError(f"config key {odd!r} under '{prefix.rstrip('.') or 'the top level'}' is not a name")
    for key, value in data.items():  # old names, also under a section that still exists (train.max_steps)
        _check_renamed(cls, key, value, prefix)
    unknown = [k for k in data if k not in types_]
    if unknown:
        key = unknown[0]
        valid = [prefix + name for name in types_]
        raise ConfigError(f"unknown config key '{prefix}{key}'{_suggest(prefix + key, valid)}")
    defaults = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {
        k: coerce(_with_field_default(v, defaults[k], types_[k]), types_[k], prefix + k)
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
    return deep_merge(to_dict(default), value) if dataclasses.is_dataclass(default) else value


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
    if isinstance(value, float) and not math.isfinite(value):  # inf passes "> 0", and trains on NaN
        what = "NaN" if math.isnan(value) else repr(value)
        raise ConfigError(f"'{key}' is {what}; it must be a finite number" + (f" {spec}" if spec else ""))
    if spec is not None and not _in_range(value, spec):
        raise ConfigError(f"'{key}' must be {spec}, got {value!r}")


def validate(cfg: T, prefix: str = "") -> T:
    """Check every numeric field of config ``cfg`` (and of its nested configs) against its class's
    ``CHECKS`` ranges, that every float is finite and that a ``Literal`` field holds one of its values (a config
    built in Python skips `coerce`); raise :class:`ConfigError` naming the dotted key.
    Returns ``cfg``, so ``cfg = validate(Config(...))`` reads naturally."""
    checks: Mapping[str, str] = getattr(type(cfg), "CHECKS", {})
    types = field_types(type(cfg))
    for f in dataclasses.fields(cfg):  # type: ignore[arg-type]
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            validate(value, prefix=f"{prefix}{f.name}.")
        else:
            if typing.get_origin(types[f.name]) is typing.Literal:
                coerce(value, types[f.name], prefix + f.name)
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


def changed_keys(before: Mapping[str, Any], now: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two plain configs (`to_dict`), among the keys both have."""
    changed: list[str] = []
    for key in before.keys() & now.keys():
        a, b = before[key], now[key]
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            changed += changed_keys(a, b, f"{prefix}{key}.")
        elif _plain(a) != _plain(b):
            changed.append(f"{prefix}{key}")
    return sorted(changed)


def deep_merge(a: dict[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """``a`` updated with ``b``, nested mappings merged key by key (neither is modified)."""
    out = dict(a)
    for k, v in b.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out
