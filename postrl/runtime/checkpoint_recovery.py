"""Which checkpoint a run resumes from: the layout of a checkpoint root, listing its checkpoints, and
checking that one is intact without reading its tensors.

A checkpoint root holds ``step_{step:08d}/`` folders, each with ``state.pt`` and ``{name}.safetensors`` per
module (`postrl.runtime.checkpoint` writes them). :func:`latest_checkpoint` returns the newest intact one and
falls back past a damaged one (a cut-short copy, a full disk), naming its bad file.
"""

from __future__ import annotations

import json
import pickle
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from postrl.runtime.errors import UserError

STATE_FILE = "state.pt"
PREFIX = "step_"
STEP = re.compile(rf"{PREFIX}(\d+)")
"""The name of a checkpoint folder; group 1 is its step."""


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{PREFIX}{step:08d}"


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under ``root`` (``step_N`` folders holding ``state.pt``), oldest first.

    Nothing is read, so this stays cheap; :func:`latest_checkpoint` verifies the one it returns."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if STEP.fullmatch(p.name) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def _first_sentence(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0].split(". ")[0] if text else type(err).__name__


def _read_state(file: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(state, None)`` with ``state.pt`` memory-mapped (its tensors are not read), or ``(None, why not)``."""
    if not file.is_file():
        return None, f"{file} is missing"
    if not zipfile.is_zipfile(file):  # torch.save writes a zip archive, whose directory is at its very end
        return None, f"{file} is truncated or not written by torch.save (no zip directory at its end)"
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except (RuntimeError, OSError, EOFError, ValueError, pickle.UnpicklingError) as err:
        return None, f"{file} cannot be loaded ({_first_sentence(err)})"
    if not isinstance(state, dict) or "step" not in state:
        return None, f"{file} holds no checkpoint state (no 'step')"
    return state, None


def _safetensors_size(file: Path, size: int) -> int | None:
    """The byte length ``file``'s header promises (8 + header + tensor data); None if the header is unreadable."""
    try:
        with open(file, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n > size - 8:  # also keeps a garbage length from allocating gigabytes
                return None
            header = json.loads(f.read(n))
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
        return 8 + n + max(ends, default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None


def _safetensors_problem(file: Path) -> str | None:
    size = file.stat().st_size
    expected = _safetensors_size(file, size)
    if expected is not None and size < expected:
        return f"{file} is truncated ({size:,} of the {expected:,} bytes its header promises)"
    try:  # checks the header against the file (offsets, dtypes, length) without reading the tensors
        with safe_open(str(file), framework="pt"):
            return None
    except (SafetensorError, OSError) as err:
        return f"{file} cannot be opened ({_first_sentence(err)})"


def checkpoint_problem(path: str | Path) -> str | None:
    """Why checkpoint folder ``path`` cannot be resumed from, naming the file at fault; None when intact.

    ``state.pt`` must load with ``weights_only=True`` (memory-mapped: its tensors are not read), every
    ``*.safetensors`` must open and be as long as its header promises (only the header is read), and every
    module that ``state.pt`` lists must have its file. A flipped bit inside tensor data goes unnoticed.
    """
    path = Path(path)
    state, problem = _read_state(path / STATE_FILE)
    if state is None:
        return problem
    for name in state.get("modules", []):  # checkpoints written before this list was kept have none
        if not (path / f"{name}.safetensors").is_file():
            return f"{path / name}.safetensors is missing"
    for file in sorted(path.glob("*.safetensors")):
        if problem := _safetensors_problem(file):
            return problem
    return None


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest intact checkpoint under ``root`` (:func:`checkpoint_problem`), or None when there is none.

    A corrupt newer one is skipped with one stderr line naming its bad file and why. When checkpoints exist
    but none is intact the run cannot be resumed: a :class:`UserError` names the newest one's bad file.
    """
    problems = []
    for path in reversed(list_checkpoints(root)):
        problem = checkpoint_problem(path)
        if problem is None:
            for skipped in problems:  # said only when there is a checkpoint to fall back to
                print(f"postrl: {skipped}; skipping that checkpoint", file=sys.stderr)
            return path
        problems.append(problem)
    if problems:
        raise UserError(
            f"{problems[0]}, and no older checkpoint in {root} is intact: the run cannot be resumed "
            "(--overwrite starts it over)"
        )
    return None
