"""Checkpoints written atomically: a temp folder, fsync, then one rename.

A checkpoint is a folder ``root/step_{step:08d}/`` holding ``{name}.safetensors`` for every module
and ``state.pt`` for everything else (optimizers, schedulers, the step, every RNG state, ``extra``).
``state.pt`` holds only tensors and plain python, and is read with ``torch.load(weights_only=True)``,
so loading a checkpoint never runs code. A crash before the rename leaves the previous checkpoint
untouched; a crash after it leaves the new one complete.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from postrl.runtime.seeding import get_rng_state, set_rng_state

STATE_FILE = "state.pt"
PREFIX = "step_"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some platforms cannot open a folder; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same folder, fsync, rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def _to_safe(x: Any) -> Any:
    """numpy arrays and scalars → tensors / python numbers, so ``weights_only`` loading accepts them."""
    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(x))
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, Mapping):
        return {k: _to_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to_safe(v) for v in x)
    return x


def _unshared(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous tensors, each with its own storage (safetensors refuses shared ones, e.g. tied weights)."""
    seen: set[int] = set()
    out = {}
    for name, t in state.items():
        t = t.detach().contiguous()
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return out


def _is_flat_view(module: torch.nn.Module) -> bool:
    """True when a parameter is a view into a larger storage (``postrl.control.flat.FlatParameters``):
    safetensors' ``save_model``/``load_model`` refuse those, and such a module has no tied weights for them
    to handle, so it is saved and loaded as a plain state dict."""
    return any(p.untyped_storage().nbytes() != p.numel() * p.element_size() for p in module.parameters())


def _fsync_tree(folder: Path) -> None:
    for file in folder.rglob("*"):
        if file.is_file():
            with open(file, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(folder)


def write_dir_atomically(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Fill a temp folder next to ``path`` with ``write(tmp)``, fsync it and rename it to ``path``.

    An existing ``path`` is moved aside first and deleted after the swap, so a crash at any point leaves the
    old folder or the new one complete (at worst beside a ``.tmp-``/``.old-`` leftover), never half of one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".tmp-{path.name}-"))
    try:
        write(tmp)
        _fsync_tree(tmp)
        if path.exists():
            old = path.parent / f".old-{path.name}-{os.getpid()}"
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{PREFIX}{step:08d}"


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first (temp folders are ignored)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)]
    found = [p for p in found if (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root``, or None."""
    found = list_checkpoints(root)
    return found[-1] if found else None


def save_checkpoint(
    root: str | Path,
    step: int,
    *,
    modules: Mapping[str, torch.nn.Module | Mapping[str, torch.Tensor]],
    optimizers: Mapping[str, torch.optim.Optimizer | Mapping[str, Any]] | None = None,
    schedulers: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    keep_last: int = 3,
    write_files: Callable[[Path], None] | None = None,
) -> Path:
    """Write checkpoint ``root/step_{step:08d}`` atomically and keep the newest ``keep_last``.

    A module may be given as its state dict and an optimizer as its ``state_dict()`` (what a sharded run
    gathers on rank 0). ``extra`` holds plain python, tensors or numpy arrays (stored as tensors). ``write_files(tmp)``
    may add files (e.g. a ``save_pretrained`` export) inside the folder before it is renamed into place.
    """
    root = Path(root)
    final = step_dir(root, step)

    def write(tmp: Path) -> None:
        for name, module in modules.items():
            if isinstance(module, Mapping):  # a gathered state dict (e.g. of an FSDP-sharded model)
                save_file(_unshared(module), str(tmp / f"{name}.safetensors"))
            elif _is_flat_view(module):
                save_file(_unshared(module.state_dict()), str(tmp / f"{name}.safetensors"))
            else:
                save_model(module, str(tmp / f"{name}.safetensors"))
        state = {
            "step": int(step),
            "optimizers": {
                k: dict(o) if isinstance(o, Mapping) else o.state_dict()
                for k, o in (optimizers or {}).items()
            },
            "schedulers": {k: s.state_dict() for k, s in (schedulers or {}).items()},
            "rng": get_rng_state(),
            "extra": _to_safe(dict(extra or {})),
        }
        torch.save(state, tmp / STATE_FILE)
        if write_files is not None:
            write_files(tmp)

    write_dir_atomically(final, write)
    if keep_last > 0:
        for old in list_checkpoints(root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(
    path: str | Path,
    *,
    modules: Mapping[str, torch.nn.Module] | None = None,
    optimizers: Mapping[str, torch.optim.Optimizer] | None = None,
    schedulers: Mapping[str, Any] | None = None,
    restore_rng: bool = True,
    map_location: str | torch.device = "cpu",
) -> dict[str, Any]:
    """Load checkpoint folder ``path`` into the given objects; return ``{"step", "extra"}``."""
    path = Path(path)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {STATE_FILE})")
    for name, module in (modules or {}).items():
        file = path / f"{name}.safetensors"
        if not file.is_file():
            raise FileNotFoundError(f"checkpoint {path} has no weights for '{name}' ({file.name})")
        if _is_flat_view(module):
            module.load_state_dict(load_file(str(file), device=str(map_location)), strict=True)
        else:
            load_model(module, str(file), strict=True, device=str(map_location))
    state = torch.load(path / STATE_FILE, map_location=map_location, weights_only=True)
    for name, opt in (optimizers or {}).items():
        opt.load_state_dict(state["optimizers"][name])
    for name, sched in (schedulers or {}).items():
        sched.load_state_dict(state["schedulers"][name])
    if restore_rng:
        set_rng_state(state["rng"])
    return {"step": state["step"], "extra": state["extra"], "rng": state["rng"]}
