"""The per-iteration callback of the Python API: ``on_iteration(info) -> bool``, SB3's convention.

A training loop (the control loop, the LM spine) calls `poll(info)` once per iteration, the last one included;
it calls the function installed by `on_iteration` (the Python API installs it for the length of one run) and
reports whether the function returned ``False``, which stops the run early, as Stable-Baselines3's
``_on_step`` returning ``False`` does. Any other return value (``True``, ``None``) continues. A stopped run
ends as a finished one: final evaluation, checkpoint, export and ``summary.json`` (a later resume can continue
it).

The function's signature is checked when it is installed, before the run folder is touched: one that cannot
take ``info`` would otherwise fail at step 1, after ``overwrite=True`` had removed the previous run. A function
that raises during the run is reported by `poll` (naming it and the step); the loop then checkpoints that step
and raises a `UserError`, so the run stays resumable.

The function travels in a `ContextVar` rather than as an argument, so that each stage's ``run_*`` function
keeps the command line's signature and the CLI and the Python API stay one code path.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from postrl.runtime.errors import UserError

IterationCallback = Callable[[dict[str, Any]], Any]

_CALLBACK: ContextVar[IterationCallback | None] = ContextVar("postrl_on_iteration", default=None)


def _describe(fn: Any) -> str:
    """``fn``'s name as an error names it (``module.qualname``)."""
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{name}" if module else name


def check_callback(fn: Any) -> None:
    """A :class:`UserError` unless ``fn`` is None or can be called with one positional argument (info)."""
    if fn is None:
        return
    if not callable(fn):
        raise UserError(f"on_iteration must be a function of one argument (info), got {type(fn).__name__}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: it will tell at the call
        return
    try:
        signature.bind({})
    except TypeError as err:
        raise UserError(
            f"on_iteration={_describe(fn)}{signature} cannot be called with one argument, info ({err}); "
            "write it as def on_iteration(info): ..."
        ) from None


@contextlib.contextmanager
def on_iteration(fn: IterationCallback | None) -> Iterator[None]:
    """Install ``fn`` as the iteration callback of the runs started inside the ``with`` block (None: none);
    a ``fn`` that cannot take one argument is refused here (`check_callback`)."""
    check_callback(fn)
    token = _CALLBACK.set(fn)
    try:
        yield
    finally:
        _CALLBACK.reset(token)


def active() -> bool:
    """Whether a callback is installed (the loops skip building ``info`` otherwise)."""
    return _CALLBACK.get() is not None


def poll(info: dict[str, Any]) -> tuple[bool, str | None]:
    """Call the installed callback with ``info``: ``(stop, error)``, ``stop`` True when it returned ``False``;
    ``error`` the message naming the callback and the step when it raised (the loop checkpoints, then raises
    it as a `UserError`: every rank must reach that checkpoint, so it is not raised here)."""
    fn = _CALLBACK.get()
    if fn is None:
        return False, None
    try:
        return fn(dict(info)) is False, None
    except Exception as err:  # the user's code: any exception is theirs to see, with where it happened
        return True, (
            f"on_iteration={_describe(fn)} raised {type(err).__name__} at step {info.get('step')}: {err} "
            f"(the run is checkpointed at that step: resume=True continues it)"
        )


def stop_requested(info: dict[str, Any]) -> bool:
    """Call the installed callback with ``info``; True when it returned ``False`` (stop), else False. An
    exception it raises becomes a `UserError` naming it and the step."""
    stop, error = poll(info)
    if error is not None:
        raise UserError(error)
    return stop
