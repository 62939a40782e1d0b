#!/usr/bin/env python
"""SBX (Stable-Baselines Jax, sbx-rl 0.28, JAX on the CPU) PPO on the tasks of ``sb3_bench.py``.

The same configs, timing, return tracking, evaluation and JSON line as the SB3 harness (it registers an
``sbx`` backend there and runs its ``main``), so ``benchmarks/control.py --with-sbx`` reads both alike. SBX
takes SB3's PPO arguments (the rl-zoo schedules included) with its own JAX policy (64×64 tanh MLPs, as SB3's).
``--threads 1`` also limits XLA to one thread (set before JAX is imported), as postrl and SB3 run with one
torch thread.

    make benchmarks/peers/.venv-sbx/.installed    # or: make peers
    benchmarks/peers/.venv-sbx/bin/python benchmarks/peers/sbx_bench.py --config cartpole_zoo --seeds 0
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sb3_bench  # noqa: E402 (after the sys.path line)


def run_sbx(cfg: dict, seed: int, tracker: sb3_bench.ReturnTracker):
    """``sb3_bench.run_sb3`` with SBX's PPO in place of SB3's (a runner as that harness defines it): the
    same vector env, seeds, callback and evaluation policy."""
    import sbx
    import stable_baselines3

    stable_baselines3.PPO = sbx.PPO  # run_sb3 imports PPO from stable_baselines3 when it is called
    return sb3_bench.run_sb3(cfg, seed, tracker)


def main() -> int:
    threads = sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv else "1"
    if threads == "1":
        os.environ.setdefault(
            "XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        )
    sb3_bench.BACKENDS["sbx"] = run_sbx
    if "--backend" not in sys.argv:
        sys.argv[1:1] = ["--backend", "sbx"]
    return sb3_bench.main() or 0


if __name__ == "__main__":
    sys.exit(main())
