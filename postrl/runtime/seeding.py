"""Seeding and device choice. Nothing here runs at import: trainers call these explicitly."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from postrl.runtime.errors import UserError


def seed_everything(seed: int, rank: int = 0) -> int:
    """Seed python, numpy and torch (CPU and CUDA) with ``seed + rank``; return the seed used.

    The per-rank offset gives each process of a distributed run its own sampling stream while the
    whole run stays reproducible from one seed.
    """
    used = int(seed) + int(rank)
    random.seed(used)
    np.random.seed(used % 2**32)
    torch.manual_seed(used)
    return used


def resolve_device(name: str = "auto") -> torch.device:
    """``"auto"`` → CUDA when available, else MPS when available, else CPU; any other name as given."""
    if name != "auto":
        try:
            device = torch.device(name)
        except (RuntimeError, TypeError) as err:
            raise UserError(
                f"run.device={name!r} is not a device: use auto, cpu, cuda, cuda:N or mps"
            ) from err
        if device.type == "cuda" and not torch.cuda.is_available():
            raise UserError(f"run.device={name!r} was asked for but CUDA is not available on this machine")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def get_rng_state() -> dict[str, Any]:
    """Every RNG state (python, numpy, torch CPU, CUDA) as tensors and plain python.

    The result round-trips through ``torch.save`` / ``torch.load(weights_only=True)``.
    """
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": py_version, "state": list(py_state), "gauss": py_gauss},
        "numpy": {
            "name": np_name,
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "gauss": float(np_gauss),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the RNG states saved by :func:`get_rng_state`."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    n = state["numpy"]
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state((n["name"], keys, n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
