"""What every bad-input test checks: a snapshot of a folder (modes and bytes) and the changes between two."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any


def snapshot(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under ``root`` (and ``root``) → (mode, bytes); byte-code caches of imported files aside."""
    out: dict[str, tuple[int, bytes | None]] = {}
    if not root.exists():  # a run folder the command should not create
        return out
    for path in [root, *root.rglob("*")]:
        if "__pycache__" in path.parts:
            continue
        st = path.lstat()
        out[path.relative_to(root).as_posix()] = (
            st.st_mode,
            path.read_bytes() if stat.S_ISREG(st.st_mode) else None,
        )
    return out


def changes(before: dict[str, Any], after: dict[str, Any]) -> str:
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    parts = [
        f"{name} {paths[:4]}"
        for name, paths in (("added", added), ("removed", removed), ("changed", changed))
        if paths
    ]
    return "; ".join(parts)
