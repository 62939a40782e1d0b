"""Loading reward functions from specs: ``task:NAME``, ``module:function`` (or ``file.py:function``) and
``rm:PATH``; a user's function is imported by attribute name (never ``eval``-ed) and checked against the call.
``callable:NAME`` is a Python function given to the Python API (``postrl.grpo(rewards=[fn])``), found in
`CALLABLES` while that call runs: a config records its qualified name, and a resume needs it passed again.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import math
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from postrl.lm.rewards.contract import RewardCallable, RewardError, RewardFunction, check_signature
from postrl.lm.rewards.scorer import RewardModelScorer
from postrl.lm.tasks import get_task
from postrl.runtime.errors import UserError

CALLABLES: dict[str, RewardCallable] = {}
"""``callable:NAME`` specs → the Python functions the API was given (filled and emptied by `postrl.api`)."""


def _callable_reward(spec: str, columns: Sequence[str] | None) -> RewardCallable:
    fn = CALLABLES.get(spec)
    if fn is None:
        raise RewardError(
            f"reward spec {spec!r}: a Python function given to postrl's Python API (rewards=[fn]); functions "
            "are not saved with a run, so pass it again (e.g. postrl.grpo(out=RUN_DIR, resume=True, "
            "rewards=[fn]))"
        )
    check_signature(fn, spec, columns)
    return fn


def _task_reward(name: str, task_kwargs: dict[str, Any] | None) -> tuple[RewardCallable, bool]:
    task = get_task(name, **(task_kwargs or {}))
    first = (task.prompt_rows("test")[:1] or [{}])[0]
    return task.reward_fn, "answer" in first


def _import_problem(err: BaseException, target: str) -> str:
    """What went wrong while importing the user's ``target`` (a file or a module), with file:line."""
    if isinstance(err, SyntaxError):
        return f"{err.filename}:{err.lineno}: {type(err).__name__}: {err.msg}"
    if isinstance(err, ModuleNotFoundError) and err.name:
        return f"{target} imports module {err.name!r}, which is not installed (or not on the path)"
    frames = [f for f in traceback.extract_tb(err.__traceback__) if not f.filename.startswith("<frozen")]
    at = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"importing {target} raised {type(err).__name__}{at}: {err}"


def _import_file(path: Path, spec: str) -> ModuleType:
    if not path.is_file():
        raise RewardError(f"reward spec {spec!r}: no such file {path}")
    module_spec = importlib.util.spec_from_file_location(f"postrl_reward_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:
        raise RewardError(f"reward spec {spec!r}: {path} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(module_spec)
    # registered before it runs, as `import` does: dataclasses, pickling and typing look the module up by name
    sys.modules[module_spec.name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:  # the user's code: any failure is theirs to fix, reported with file:line
        del sys.modules[module_spec.name]
        raise RewardError(f"reward spec {spec!r}: {_import_problem(err, str(path))}") from err
    return module


def _import_target(target: str, spec: str) -> Any:
    """The module named ``target`` (dotted) or loaded from a ``.py`` file path."""
    if target.endswith(".py"):
        return _import_file(Path(target).expanduser(), spec)
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as err:
        if err.name and (target == err.name or target.startswith(err.name + ".")):
            raise RewardError(
                f"reward spec {spec!r}: cannot import module {target!r}: no such module (a file needs its "
                "path ending in .py, e.g. rewards/my_rewards.py:fn)"
            ) from None
        raise RewardError(f"reward spec {spec!r}: {_import_problem(err, target)}") from err
    except Exception as err:  # the user's code: any failure is theirs to fix
        raise RewardError(f"reward spec {spec!r}: {_import_problem(err, target)}") from err


def _missing_attribute(spec: str, owner: Any, where: str, part: str) -> RewardError:
    names = [n for n in dir(owner) if not n.startswith("_")]
    close = difflib.get_close_matches(part, names, n=3, cutoff=0.5)
    functions = [n for n in names if inspect.isfunction(getattr(owner, n, None))]
    hint = (
        f"did you mean {', '.join(close)}?" if close else f"its functions: {', '.join(functions) or 'none'}"
    )
    return RewardError(f"reward spec {spec!r}: {where} has no attribute {part!r}; {hint}")


def _function_reward(spec: str, columns: Sequence[str] | None) -> RewardCallable:
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise RewardError(f"reward spec {spec!r}: expected 'module:function' or 'path/file.py:function'")
    obj, where = _import_target(target, spec), target
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise _missing_attribute(spec, obj, where, part)
        obj, where = getattr(obj, part), f"{where}:{part}"
    if not callable(obj):
        raise RewardError(f"reward spec {spec!r}: {attr} is a {type(obj).__name__}, not a function")
    check_signature(obj, spec, columns)
    return obj


def _reward_model(path: str, device: str | torch.device) -> RewardModelScorer:
    # deferred: transformers takes seconds to import, and configs and reward functions do not need it
    from postrl.lm.models import ScalarHeadModel
    from postrl.lm.tokenizer import load_tokenizer

    if not Path(path).expanduser().is_dir():
        raise RewardError(f"reward spec 'rm:{path}': no reward-model folder there (run `postrl rm` first)")
    try:
        model = ScalarHeadModel.from_pretrained(path, device=device, what="reward model")
        return RewardModelScorer(model, load_tokenizer(path, what="reward model's tokenizer"))
    except UserError as err:
        raise RewardError(f"reward spec 'rm:{path}': {err}") from err


def load_reward_fn(
    spec: str,
    weight: float = 1.0,
    *,
    task_kwargs: dict[str, Any] | None = None,
    device: str | torch.device = "cpu",
    columns: Sequence[str] | None = None,
) -> RewardFunction:
    """One `RewardFunction` from ``task:NAME``, ``rm:PATH`` or ``module:function`` (see `postrl.lm.rewards`).

    A user's function is checked against the call postrl makes (`check_signature`); give ``columns`` (the
    prompt data's columns other than ``prompt``) to check that every argument it needs is there.
    """
    if spec.startswith("task:"):
        fn, verifier = _task_reward(spec[len("task:") :], task_kwargs)
        return RewardFunction(spec, fn, weight, verifier)
    if spec.startswith("rm:"):
        return RewardFunction(spec, _reward_model(spec[len("rm:") :], device), weight)
    if spec.startswith("callable:"):
        return RewardFunction(spec, _callable_reward(spec, columns), weight)
    return RewardFunction(spec, _function_reward(spec, columns), weight)


def load_reward_fns(
    specs: Sequence[str],
    weights: Sequence[float] | None = None,
    *,
    task_kwargs: dict[str, Any] | None = None,
    device: str | torch.device = "cpu",
    columns: Sequence[str] | None = None,
) -> list[RewardFunction]:
    """Load every spec; ``weights`` (default all 1) must match ``specs`` in length. Names are made unique.
    ``columns``: see `load_reward_fn`."""
    if not specs:
        raise RewardError("no reward function given")
    weights = [1.0] * len(specs) if weights is None else list(weights)
    if len(weights) != len(specs):
        raise RewardError(
            f"reward_weights has {len(weights)} weight(s) for {len(specs)} reward function(s) {list(specs)}: "
            "give one weight per reward function"
        )
    bad = [
        w for w in weights if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w)
    ]
    if bad:
        raise RewardError(f"reward weights must be finite numbers; got {bad[0]!r}")
    fns, seen = [], set()
    for spec, weight in zip(specs, weights, strict=True):
        fn = load_reward_fn(spec, float(weight), task_kwargs=task_kwargs, device=device, columns=columns)
        name = fn.name if fn.name not in seen else f"{fn.name}#{len(fns)}"
        seen.add(name)
        fns.append(RewardFunction(name, fn.fn, fn.weight, fn.is_verifier))
    return fns
