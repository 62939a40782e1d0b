"""SIGTERM as Ctrl-C, for commands that run children (the demo's workers, the bench's seeds)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside: SIGTERM (a `kill`, a job scheduler) raises KeyboardInterrupt as Ctrl-C does, so that the
    command stops its children too instead of leaving them training on, orphaned. Off the main thread, where
    Python cannot install a handler, nothing changes."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:
        previous = None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
