"""A run folder: ``config.yaml``, ``metrics.jsonl``, optional TensorBoard, and ``summary.json``.

``metrics.jsonl`` holds one JSON object per logged step, with ``step`` and ``time`` (wall seconds
since the logger started, continuing across a resume). ``summary.json`` holds the final metrics plus
``wall_seconds`` and ``peak_rss_mb`` and is written at the end of every training command.
"""

from __future__ import annotations

import json
import math
import resource
import sys
import time
from pathlib import Path
from typing import Any

from postrl.runtime.checkpoint import atomic_write_text
from postrl.runtime.config import save_config
from postrl.runtime.errors import UserError


def peak_rss_mb() -> float:
    """Peak resident memory of this process, in MiB (ru_maxrss is KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSONL file; a malformed line raises ValueError naming the file and line."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: malformed JSON: {err.msg}") from None
    return rows


def read_run_rows(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl of a run being resumed: a last line torn by a kill mid-write is dropped, not an error."""
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = []
    for lineno, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if lineno < len(lines):  # not a line torn by a kill: the file was edited or damaged
                raise UserError(
                    f"{path}:{lineno}: malformed JSON (only the last line may be torn by a kill); repair that "
                    "line, or pass --overwrite to start the run over"
                ) from None
    return rows


def jsonable(value: Any) -> Any:
    """Tensors and numpy numbers → python; NaN/inf → None (JSON has no NaN)."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


class RunLogger:
    """Writes a run folder's metrics. With ``enabled=False`` (ranks other than 0) it writes nothing."""

    def __init__(
        self,
        run_dir: str | Path,
        config: Any = None,
        tensorboard: bool = False,
        enabled: bool = True,
        resume: bool = False,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self._start = time.perf_counter()
        self._time_offset = 0.0
        self._tb = None
        self.rows = 0  # rows in metrics.jsonl: a checkpoint records it, a resume cuts the file back to it
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        # a resume writes nothing until its checkpoint is loaded (resume_at): a refused one leaves the run as is
        self._config = config if resume else None
        if resume and self.metrics_path.exists():
            rows = read_run_rows(self.metrics_path)
            self.rows = len(rows)
            self._time_offset = float(rows[-1].get("time", 0.0)) if rows else 0.0
        elif self.metrics_path.exists():
            self.metrics_path.unlink()
        if config is not None and not resume:
            save_config(config, self.run_dir / "config.yaml")
        if tensorboard:
            self._tb = _open_tensorboard(self.run_dir / "tb")

    @property
    def elapsed(self) -> float:
        """Wall seconds of this run, including the time before a resume."""
        return self._time_offset + time.perf_counter() - self._start

    def truncate_after(self, step: int) -> None:
        """Drop logged rows past ``step`` (a resumed run replays from its checkpoint's step)."""
        self.resume_at(step)

    def resume_at(self, step: int, rows: int | None = None) -> None:
        """Cut metrics.jsonl back to what it held when the checkpoint being resumed was written: its first
        ``rows`` rows (the count the checkpoint recorded), or, for a checkpoint without the count, the rows
        up to ``step``. The resumed run then appends exactly what the uninterrupted run wrote next."""
        if not self.enabled:
            return
        # the resume is known good: a finished run being redone is unfinished until it ends again (a kill while
        # it re-exports its model leaves a run the same command resumes, not a "finished" one without its model)
        (self.run_dir / "summary.json").unlink(missing_ok=True)
        if self._config is not None:
            save_config(self._config, self.run_dir / "config.yaml")
            self._config = None
        if not self.metrics_path.exists():
            return
        kept = read_run_rows(self.metrics_path)
        kept = kept[:rows] if rows is not None else [r for r in kept if r.get("step", 0) <= step]
        atomic_write_text(self.metrics_path, "".join(json.dumps(r) + "\n" for r in kept))
        self.rows = len(kept)
        self._time_offset = float(kept[-1].get("time", 0.0)) if kept else 0.0
        self._start = time.perf_counter()

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Append one row ``{"step", "time", **metrics}`` to metrics.jsonl (and TensorBoard)."""
        if not self.enabled:
            return
        row = {"step": int(step), "time": round(self.elapsed, 4), **jsonable(metrics)}
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        self.rows += 1
        if self._tb is not None:
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(key, value, int(step))

    def finish(self, metrics: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write summary.json: ``metrics`` plus ``wall_seconds`` and ``peak_rss_mb``; return it."""
        summary = {
            **jsonable(dict(metrics or {})),
            "wall_seconds": round(self.elapsed, 3),
            "peak_rss_mb": round(peak_rss_mb(), 1),
        }
        if self.enabled:
            atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        self.close()
        return summary

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _open_tensorboard(log_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # optional extra: say so instead of failing the run
        print(
            "postrl: tensorboard is not installed (pip install 'postrl[tensorboard]'); "
            "metrics go to metrics.jsonl only",
            file=sys.stderr,
        )
        return None
    return SummaryWriter(log_dir=str(log_dir))
