"""Launch a script of ``tests/dist/scripts`` under ``torchrun --standalone`` (gloo on CPU) and compare what
its rank 0 saved with a one-process run of the same function on the same global batch."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import torch

SCRIPTS = Path(__file__).parent / "scripts"


def torchrun(script: str, args: list[str], nproc: int = 2, timeout: float = 300) -> str:
    """Run ``scripts/<script>`` with ``nproc`` processes; return its output, fail the test with it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    cmd += [str(SCRIPTS / script), *args]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:  # a collective that one rank never joins hangs: say so
        raise AssertionError(f"torchrun {script} timed out after {timeout}s:\n{e.stdout}\n{e.stderr}") from e
    if proc.returncode != 0:
        raise AssertionError(f"torchrun {script} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def load_script(script: str) -> ModuleType:
    """Import ``scripts/<script>`` as a module, to run its function in this (single) process."""
    spec = importlib.util.spec_from_file_location(f"dist_script_{Path(script).stem}", SCRIPTS / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_same_weights(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-5, rtol: float = 1e-5
) -> float:
    """Every tensor of ``a`` equals the one of the same name in ``b`` (keys of ``a`` ⊆ ``b``); returns
    the largest absolute difference."""
    worst = 0.0
    for name, x in a.items():
        torch.testing.assert_close(x, b[name], atol=atol, rtol=rtol, msg=lambda m, n=name: f"{n}: {m}")
        worst = max(worst, float((x - b[name]).abs().max()))
    return worst
