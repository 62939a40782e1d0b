"""A progress bar with step, throughput and the key metrics; quiet when stderr is not a terminal."""

from __future__ import annotations

import sys
from typing import Any

from tqdm.auto import tqdm

from postrl.runtime.distributed import is_main


class Progress:
    """``with Progress(total, "ppo") as bar: bar.update(n, loss=0.3)``.

    ``disable=None`` shows the bar only on a TTY, so CI logs and redirected output stay clean.
    """

    def __init__(
        self, total: int | None, desc: str, unit: str = "step", disable: bool | None = None, initial: int = 0
    ) -> None:
        if disable is None:
            disable = not sys.stderr.isatty()
        self.disabled = disable
        self._bar = tqdm(
            total=total,
            desc=desc,
            unit=unit,
            disable=disable,
            initial=initial,
            dynamic_ncols=True,
            leave=True,
            file=sys.stderr,
        )

    def update(self, n: int = 1, **metrics: Any) -> None:
        if self.disabled:
            return
        if metrics:
            self._bar.set_postfix({k: _short(v) for k, v in metrics.items()}, refresh=False)
        self._bar.update(n)

    def write(self, text: str) -> None:
        """Print a line without breaking the bar (on rank 0 only, under torchrun)."""
        if is_main():
            tqdm.write(text, file=sys.stderr)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _short(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float):
        return f"{value:.4g}"
    return value
