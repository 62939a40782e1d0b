"""Checkpoints written, deleted and read crash-safely.

A checkpoint is a folder ``root/step_{step:08d}/`` holding ``{name}.safetensors`` for every module
and ``state.pt`` for everything else (optimizers, schedulers, the step, every RNG state, ``extra``).
``state.pt`` holds only tensors and plain python, and is read with ``torch.load(weights_only=True)``,
so loading a checkpoint never runs code.

A kill (SIGKILL, power loss) at any moment leaves every ``step_`` folder whole:
- writing: a temp folder ``.tmp-step_…`` is filled, fsynced and renamed into place in one step;
- replacing: the existing folder is first renamed to ``.old-{name}-{pid}`` (put back by :func:`clean_leftovers`
  if the kill came before the new folder was in place);
- deleting: the folder is first renamed to ``.del-{name}-…``, then removed (:func:`delete_folder`).
Those dot-names are never listed; :func:`clean_leftovers` removes them at the next start. A checkpoint damaged
some other way (a cut-short copy, a full disk) is caught by :func:`latest_checkpoint`, which falls back to the
previous intact one. Finding and checking the checkpoint to resume from is `checkpoint_recovery.py` (its
names are importable from here too).

Files and folders are created with modes 0o666 / 0o777, so the kernel applies the user's umask (and a
folder's default ACL) as for any file the user writes: ``tempfile.mkstemp``/``mkdtemp`` would force
0600 / 0700, leaving configs and model folders that the user's group cannot read. The umask is never read:
``os.umask`` can only be read by setting it, which races with other threads creating files.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from postrl.runtime.checkpoint_recovery import PREFIX as PREFIX
from postrl.runtime.checkpoint_recovery import STATE_FILE as STATE_FILE
from postrl.runtime.checkpoint_recovery import STEP, list_checkpoints, step_dir
from postrl.runtime.checkpoint_recovery import checkpoint_problem as checkpoint_problem
from postrl.runtime.checkpoint_recovery import latest_checkpoint as latest_checkpoint
from postrl.runtime.seeding import get_rng_state, set_rng_state

# Temp files of atomic_write_bytes: ".{name}.{8 random characters}.tmp" (the same shape mkstemp gave).
_TEMP_FILE = re.compile(r"\..+\.[A-Za-z0-9_]{8}\.tmp")


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


def _new_temp(parent: Path, prefix: str, suffix: str = "", *, folder: bool = False) -> Path:
    """Create a file or folder with a fresh random name, mode 0o666 / 0o777 less the umask (see the module
    docstring for why not ``tempfile``)."""
    for _ in range(100):
        path = parent / f"{prefix}{secrets.token_hex(4)}{suffix}"
        try:
            if folder:
                os.mkdir(path, 0o777)
            else:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free temporary name {prefix}*{suffix} in {parent}")


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same folder, fsync, rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_temp(path.parent, f".{path.name}.", ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
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
    """True when a parameter is a view into a larger storage (``postrl.control.fast.flat.FlatParameters``):
    safetensors' ``save_model``/``load_model`` refuse those, and such a module has no tied weights for them
    to handle, so it is saved and loaded as a plain state dict."""
    return any(p.untyped_storage().nbytes() != p.numel() * p.element_size() for p in module.parameters())


def _finish_tree(folder: Path) -> None:
    """fsync every file of ``folder`` and give it the mode ``open(file, "w")`` would, 0o666 less the umask (read
    off the folder's own mode, 0o777 less the umask): safetensors' writer creates its files 0600."""
    file_mode = stat.S_IMODE(folder.stat().st_mode) & 0o666
    for file in folder.rglob("*"):
        if file.is_file() and not file.is_symlink():
            os.chmod(file, file_mode)
            with open(file, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(folder)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def delete_folder(path: str | Path) -> None:
    """Delete ``path`` crash-safely: rename it to ``.del-{name}-{pid}-{random}`` (one atomic step, to a name that
    no listing returns), then remove that. A kill during the removal leaves a ``.del-`` folder for
    :func:`clean_leftovers`, never a half-deleted folder under its own name. A missing ``path`` is no error."""
    path = Path(path)
    aside = path.parent / f".del-{path.name}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        os.replace(path, aside)
    except FileNotFoundError:  # already gone, e.g. removed by another process
        return
    _fsync_dir(path.parent)  # the rename reaches the disk before the first file inside is unlinked
    _remove(aside)


def write_dir_atomically(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Fill a temp folder next to ``path`` with ``write(tmp)``, fsync it and rename it to ``path``.

    An existing ``path`` is renamed to ``.old-{name}-{pid}`` first and deleted (:func:`delete_folder`) after the
    swap. A kill at any point leaves the old folder or the new one complete, at worst beside a ``.tmp-``,
    ``.old-`` or ``.del-`` leftover for :func:`clean_leftovers` (which puts ``.old-`` back when ``path`` is
    missing); an exception puts the old folder back at once.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_temp(path.parent, f".tmp-{path.name}-", folder=True)
    old = path.parent / f".old-{path.name}-{os.getpid()}"
    try:
        write(tmp)
        _finish_tree(tmp)
        if path.exists():
            delete_folder(old)  # a stale one, left by an earlier process with our pid
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not path.exists():
            os.replace(old, path)
        raise
    if old.exists():
        delete_folder(old)
    return path


def _put_back(folder: Path) -> None:
    """Rename each ``.old-{name}-{pid}`` whose ``name`` is missing back to ``name``: the kill came between moving
    the old copy aside and renaming the new one into place, so the old copy is the only complete one."""
    for entry in sorted(p for p in folder.iterdir() if p.name.startswith(".old-")):
        target = folder / entry.name[len(".old-") :].rsplit("-", 1)[0]
        if not entry.is_dir() or target.exists():
            continue
        try:
            os.replace(entry, target)
        except OSError:  # e.g. another process put it back first
            continue
        print(
            f"postrl: restored {target} from {entry.name}, moved aside by an interrupted write",
            file=sys.stderr,
        )


def _leftover_reason(entry: Path, checkpoints: bool) -> str | None:
    """Why ``entry`` is left over from an interrupted write or delete (None: keep it)."""
    name = entry.name
    if name.startswith(".tmp-") or (_TEMP_FILE.fullmatch(name) and entry.is_file()):
        return "left by an interrupted write"
    if name.startswith(".del-"):
        return "left by an interrupted delete"
    if name.startswith(".old-"):
        return "the previous copy of a folder, left by an interrupted write"
    if checkpoints and STEP.fullmatch(name) and entry.is_dir() and not (entry / STATE_FILE).exists():
        # only a delete by an older postrl (rmtree in place) leaves a step folder without its state file;
        # one whose state file is damaged is kept for latest_checkpoint to report, never deleted
        return f"an incomplete checkpoint: no {STATE_FILE}"
    return None


def _clean(folder: Path, checkpoints: bool) -> list[Path]:
    if not folder.is_dir():
        return []
    _put_back(folder)
    removed = []
    for entry in sorted(folder.iterdir()):
        reason = _leftover_reason(entry, checkpoints)
        if reason is None:
            continue
        if STEP.fullmatch(entry.name):
            delete_folder(entry)
        else:
            _remove(entry)
        print(f"postrl: removed {entry} ({reason})", file=sys.stderr)
        removed.append(entry)
    return removed


def clean_leftovers(root: str | Path) -> list[Path]:
    """Finish what a killed checkpoint write or delete under checkpoint root ``root`` left; return what it removed.

    Removes ``.tmp-*`` (unfinished writes), ``.del-*`` (unfinished deletes), ``.old-*`` (a replaced folder's
    previous copy, put back instead when the new one never arrived) and ``step_N`` folders without ``state.pt``
    (half-deleted by an older postrl), with one stderr line each; a damaged ``state.pt`` is the user's to see
    (:func:`latest_checkpoint` names it), so its folder is kept. Idempotent; a missing ``root`` is fine. Call it
    from the one process that writes, before it writes: a ``.tmp-`` folder being filled would go too.
    """
    return _clean(Path(root), checkpoints=True)


def clean_run_leftovers(run_dir: str | Path) -> list[Path]:
    """:func:`clean_leftovers` for the top level of a run folder: the ``.tmp-``/``.old-``/``.del-`` folders of
    :func:`write_dir_atomically` exports (e.g. ``.tmp-model-*``) and the ``.{name}.*.tmp`` files of
    :func:`atomic_write_bytes`. Not recursive: the checkpoint root is :func:`clean_leftovers`' job."""
    return _clean(Path(run_dir), checkpoints=False)


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
    """Write checkpoint ``root/step_{step:08d}`` atomically and keep the newest ``keep_last`` (older ones are
    deleted crash-safely: :func:`delete_folder`).

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
            "modules": sorted(modules),  # lets checkpoint_problem notice a missing weights file
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
            delete_folder(old)
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
