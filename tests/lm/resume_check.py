"""What the GRPO resume tests share: interrupt a finished run after a checkpoint, and compare two runs' weights
and metrics rows (timings left out)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from postrl.runtime.logging import read_jsonl

TIMES = {"time", "time_generate", "time_reward", "time_score", "time_train", "time_step", "tokens_per_second"}


def interrupt_after(run_dir: Path, last_step: int) -> None:
    """Make a finished run look killed after its ``last_step`` checkpoint: remove the later checkpoint(s) and the
    exported model (what steps after it wrote)."""
    for ckpt in (run_dir / "checkpoints").glob("step_*"):
        if int(ckpt.name.split("_")[1]) > last_step:
            shutil.rmtree(ckpt)
    shutil.rmtree(run_dir / "model")


def rows_without_times(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMES} for r in read_jsonl(run_dir / "metrics.jsonl")]


def assert_same_weights(a: Path, b: Path) -> None:
    """The two runs' exported weights are equal bit for bit."""
    wa = load_file(str(a / "model" / "model.safetensors"))
    wb = load_file(str(b / "model" / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=0, atol=0)
