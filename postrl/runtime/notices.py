"""Notices about a run's input that wait until the input is accepted.

Checking a command's input can find things worth saying that are not errors (a length ceiling clipped to the
model's context). Said at once, such a line would stand beside the one ``postrl: error:`` line of an input
refused later in the same checks. So they are deferred: `defer` keeps them, `flush` logs them once the run
folder is opened (`postrl.runtime.rundir.open_run`, every check passed), and a refused input drops them
(`discard`, which the command calls before it starts).
"""

from __future__ import annotations

import logging

_PENDING: list[tuple[logging.Logger, int, str]] = []


def defer(logger: logging.Logger, level: int, message: str) -> None:
    """Keep ``message`` for ``logger`` at ``level`` until the input is accepted."""
    _PENDING.append((logger, level, message))


def flush() -> None:
    """Log the deferred notices (the input has been accepted) and forget them."""
    while _PENDING:
        logger, level, message = _PENDING.pop(0)
        logger.log(level, "%s", message)


def discard() -> None:
    """Forget the deferred notices (their input was refused, or a new command starts)."""
    _PENDING.clear()
