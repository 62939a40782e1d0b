"""The per-iteration callback of the Python API: ``on_iteration(info) -> bool``, SB3's convention.

A training loop (the control loop, the LM spine) calls `stop_requested(info)` once per iteration; it calls the
function installed by `on_iteration` (the Python API installs it for the length of one run) and reports
whether the function returned ``False``, which stops the run early, as Stable-Baselines3's ``_on_step``
returning ``False`` does. Any other return value (``True``, ``None``) continues. A stopped run ends as a
finished one: final evaluation, checkpoint, export and ``summary.json`` (a later resume can continue it).

The function travels in a `ContextVar` rather than as an argument, so that each stage's ``run_*`` function
keeps the command line's signature and the CLI and the Python API stay one code path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

IterationCallback = Callable[[dict[str, Any]], Any]

_CALLBACK: ContextVar[IterationCallback | None] = ContextVar("postrl_on_iteration", default=None)


@contextlib.contextmanager
def on_iteration(fn: IterationCallback | None) -> Iterator[None]:
    """Install ``fn`` as the iteration callback of the runs started inside the ``with`` block (None: none)."""
    if fn is not None and not callable(fn):
        from postrl.runtime.errors import UserError

        raise UserError(f"on_iteration must be a function of one argument (info), got {type(fn).__name__}")
    token = _CALLBACK.set(fn)
    try:
        yield
    finally:
        _CALLBACK.reset(token)


def active() -> bool:
    """Whether a callback is installed (the loops skip building ``info`` otherwise)."""
    return _CALLBACK.get() is not None


def stop_requested(info: dict[str, Any]) -> bool:
    """Call the installed callback with ``info``; True when it returned ``False`` (stop), else False."""
    fn = _CALLBACK.get()
    return fn is not None and fn(dict(info)) is False
