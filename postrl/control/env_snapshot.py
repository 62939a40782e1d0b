"""Snapshots of in-process Gymnasium envs as data, for exact resume without pickle.

Resuming mid-episode exactly needs the simulator state. Each sub-env's wrappers and ``unwrapped`` env are
walked and every attribute that is plain data is kept: None, bool, int, float, str, numpy arrays and
scalars, lists / tuples / dicts of those, and numpy Generators (as their bit generator's state). For classic
control that is the whole state, including each env's RNG and TimeLimit's elapsed steps, so a resumed run
continues bit-for-bit. Constructor arguments, spaces, the spec, callables and render objects are the same in
a fresh env of the same config and are left out. Any other attribute (a Box2D world, MuJoCo data) makes the
env not snapshottable: :func:`snapshot_envs` returns None.

The file is one ``.npz``: the arrays, and a JSON tree (as bytes) in which every JSON object is one tag
(``{"tuple": [...]}``, ``{"array": "a3"}``, ``{"generator": ...}``). It is read with ``allow_pickle=False``
and only those tags and a fixed set of numpy bit generators are understood, so loading never runs code from
the file (a pickle can: that is why checkpoints no longer hold one).
"""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec

__all__ = ["restore_envs", "snapshot_envs"]

FORMAT = 1
STATIC_ATTRS = frozenset({"_saved_kwargs", "screen", "clock", "viewer", "mujoco_renderer"})
"""Attributes that a fresh env of the same config already holds: constructor arguments and render objects."""
BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
_DATA = (type(None), bool, int, float, str)
# what reading a malformed or hostile file may raise
_MALFORMED = (
    ValueError,
    TypeError,
    KeyError,
    AttributeError,
    OSError,
    EOFError,
    RecursionError,
    zipfile.BadZipFile,
)


class _NotData(Exception):
    """A value a snapshot cannot hold as data."""


def snapshot_envs(envs: list[gym.Env], obs: np.ndarray | None) -> bytes | None:
    """The ``.npz`` bytes of ``envs``' state and the vector obs ``obs``; None if an env holds live state."""
    arrays: dict[str, np.ndarray] = {}
    try:
        envs_tree = [[_capture(level, arrays) for level in _chain(env)] for env in envs]
        tree = {"format": FORMAT, "obs": _encode(obs, arrays), "envs": envs_tree}
    except _NotData:
        return None
    buffer = io.BytesIO()
    np.savez(buffer, tree=np.frombuffer(json.dumps(tree).encode(), np.uint8), **arrays)
    return buffer.getvalue()


def restore_envs(envs: list[gym.Env], blob: bytes) -> Any:
    """Set the attributes of ``envs`` (fresh envs of the snapshot's config) from ``blob``; return the obs.

    A file that is not such a snapshot, or one of other envs, is a ValueError and leaves ``envs`` untouched.
    """
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
        tree = json.loads(bytes(arrays.pop("tree")).decode())
        if tree["format"] != FORMAT:
            raise ValueError(f"format {tree['format']!r}, this postrl reads {FORMAT}")
        decoded = [[(cls, _decode_attrs(attrs, arrays)) for cls, attrs in env] for env in tree["envs"]]
        obs = _decode(tree["obs"], arrays)
    except _MALFORMED as err:
        raise ValueError(f"not an env snapshot of postrl ({type(err).__name__}: {err})") from err
    if len(decoded) != len(envs):
        raise ValueError(f"the snapshot holds {len(decoded)} envs, the config {len(envs)} (env.n_envs)")
    for env, levels in zip(envs, decoded, strict=True):
        saved, fresh = [cls for cls, _ in levels], [type(level).__name__ for level in _chain(env)]
        if saved != fresh:
            raise ValueError(f"the snapshot is of envs wrapped as {saved}, this config's are {fresh}")
    for env, levels in zip(envs, decoded, strict=True):
        for level, (_, attrs) in zip(_chain(env), levels, strict=True):
            for name, value in attrs.items():
                setattr(level, name, value)
    return obs


def _chain(env: gym.Env) -> list[gym.Env]:
    """``env``'s wrappers, outermost first, then ``env.unwrapped``."""
    chain = [env]
    while isinstance(chain[-1], gym.Wrapper):
        chain.append(chain[-1].env)
    return chain


def _capture(level: gym.Env, arrays: dict[str, np.ndarray]) -> list:
    """``[class name, {attribute: encoded value}]`` of one level of a wrapper chain."""
    attrs = {}
    for name, value in vars(level).items():
        link = name == "env" and isinstance(level, gym.Wrapper)  # the next level: walked by _chain
        if link or name in STATIC_ATTRS or callable(value) or isinstance(value, (gym.spaces.Space, EnvSpec)):
            continue
        attrs[name] = _encode(value, arrays)
    return [type(level).__name__, attrs]


def _encode(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    """``value`` as tagged JSON; arrays and numpy scalars go to ``arrays`` (their dtype kept)."""
    if type(value) in _DATA:
        return value
    if type(value) is np.ndarray or isinstance(value, np.generic):
        array = np.asarray(value)
        if array.dtype.hasobject:
            raise _NotData("an object array")
        key = f"a{len(arrays)}"
        arrays[key] = array
        return {"array" if type(value) is np.ndarray else "scalar": key}
    if type(value) in (list, tuple):
        return {type(value).__name__: [_encode(v, arrays) for v in value]}
    if type(value) is dict:
        return {"dict": [[_encode(k, arrays), _encode(v, arrays)] for k, v in value.items()]}
    if type(value) is np.random.Generator:
        return {"generator": _encode(value.bit_generator.state, arrays)}
    raise _NotData(type(value).__name__)


def _decode(node: Any, arrays: dict[str, np.ndarray]) -> Any:
    """Inverse of :func:`_encode`; an unknown tag or bit generator is a ValueError."""
    if type(node) in _DATA:
        return node
    if type(node) is not dict or len(node) != 1:
        raise ValueError(f"unexpected {type(node).__name__} in the snapshot")
    ((tag, value),) = node.items()
    if tag == "array":
        return arrays[value]
    if tag == "scalar":
        return arrays[value][()]
    if tag in ("list", "tuple"):
        items = [_decode(v, arrays) for v in value]
        return items if tag == "list" else tuple(items)
    if tag == "dict":
        return {_decode(k, arrays): _decode(v, arrays) for k, v in value}
    if tag == "generator":
        return _generator(_decode(value, arrays))
    raise ValueError(f"unknown tag {tag!r} in the snapshot")


def _generator(state: dict[str, Any]) -> np.random.Generator:
    name = state.get("bit_generator")
    if name not in BIT_GENERATORS:
        raise ValueError(f"bit generator {name!r} is not one of {', '.join(BIT_GENERATORS)}")
    bit_generator = getattr(np.random, name)()
    bit_generator.state = state
    return np.random.Generator(bit_generator)


def _decode_attrs(attrs: dict[str, Any], arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    for name in attrs:
        if not name.isidentifier() or name.startswith("__"):
            raise ValueError(f"attribute name {name!r} in the snapshot")
    return {name: _decode(node, arrays) for name, node in attrs.items()}
