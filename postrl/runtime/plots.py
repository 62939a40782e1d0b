"""Learning-curve PNGs (matplotlib, Agg backend: no display needed).

Every training command writes its learning curves to ``RUN_DIR/curves.png`` (`write_curves`), one panel per
metric against the step; a stage may add charts of its own under other names (PPO's ``heldout.png``, the
preference run's ``true_return_vs_labels.png``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def plot_curves(
    rows: Sequence[dict[str, Any]],
    keys: Sequence[str],
    path: str | Path,
    x: str = "step",
    title: str | None = None,
) -> Path | None:
    """Plot each metric in ``keys`` against ``x`` (one panel per key); None when nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in keys if any(r.get(k) is not None for r in rows)]
    if not keys:
        return None
    fig, axes = plt.subplots(len(keys), 1, figsize=(7, 2.6 * len(keys)), squeeze=False, sharex=True)
    for ax, key in zip(axes[:, 0], keys, strict=True):
        pts = [(r[x], r[key]) for r in rows if r.get(key) is not None and r.get(x) is not None]
        # a metric checked once or twice: points, not a line too short to see
        marker = "o" if len(pts) < 3 else None
        ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1.5, marker=marker)
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel(x)
    if title:
        axes[0, 0].set_title(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


CURVES = "curves.png"
"""The file name of every training command's learning curves."""


def write_curves(run_dir: str | Path, keys: Sequence[str], title: str | None = None) -> Path | None:
    """``RUN_DIR/curves.png``: each metric of ``keys`` that ``RUN_DIR/metrics.jsonl`` holds, against the step
    (rows without a metric are skipped in its panel); None when the log has none of them."""
    from postrl.runtime.logging import read_jsonl  # deferred: torch, which `postrl --help` must not import

    run_dir = Path(run_dir)
    log = run_dir / "metrics.jsonl"
    rows = read_jsonl(log) if log.is_file() else []
    return plot_curves(rows, keys, run_dir / CURVES, title=title)
