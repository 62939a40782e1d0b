"""Where a postrl GRPO step's time goes (issue 36, "GRPO steps/s vs TRL"), on the TRL task of
``benchmarks/grpo.py --part trl`` from its SFT warm start (2 prompts x G = 8, <= 16 tokens, beta 0.04, 1 torch
thread). Ends with ONE JSON line (``benchmarks/results/grpo-profile.json``).

`postrl grpo` runs in this process with its phases wrapped by timers: thread CPU time (``time.thread_time``)
per phase, and the wall clock of the whole step, medians over the steps after ``--skip``. CPU time is what a
change of code moves; on the shared 2-core machine the wall clock of the same run varies several-fold with
the other helpers' load (recorded with the result), the CPU time by about 10%.

    .venv/bin/python benchmarks/grpo.py --part trl --steps 40    # builds runs/bench-grpo (warm start, prompts)
    .venv/bin/python benchmarks/grpo_profile.py --steps 220 --skip 20

Measured 2026-12-05 (load average 23-37: every helper's jobs), the code before and after the changes of issue
36's "GRPO steps/s" item run at the same time side by side, twice (median thread-CPU ms per step, 200 steps):
21.6 and 22.2 before, 19.8 and 20.6 after (-1.7 ms, 8%): models load with use_kernels=False (transformers 5
re-kernelized the model at every train()/eval(): 0.95 ms per step), sampling skips train()/eval() when a fast
decoder runs the model, the decoders gather a prompt's rows with index_select (33 vs 5 us per 4-d gather),
FastGPT2 splits q, k, v with one unbind, one sampling round and one minibatch are used without index copies,
completion_ids come from Python lists, reward values are checked without resolving the function's source.
Every change leaves the metrics of a `postrl grpo` run and its final weights identical bit for bit.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import record  # noqa: E402
from grpo import trl_task_args  # noqa: E402

import postrl.lm.grpo.algorithm as algorithm  # noqa: E402
from postrl.cli import main as postrl_main  # noqa: E402
from postrl.lm.grpo import engine, objective, rollouts  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# phase → (owner, attribute) of the function whose calls it times; nested phases are subtracted from "rest"
PHASES = {
    "sampling": (engine.TextEngine, "sample"),
    "reward functions": (rollouts, "_rewards"),
    "reference scoring": (engine.TextEngine, "log_probs"),
    "collect": (algorithm, "collect"),  # the step calls the names it imported
    "training forward": (objective, "policy_log_probs"),
    "loss": (objective, "loss_of"),
    "backward": (torch.Tensor, "backward"),
    "gradient clipping": (objective.GRPOObjective, "clip"),
    "optimiser step": (torch.optim.AdamW, "step"),
    "update": (algorithm, "update_grpo"),
}
CHILDREN = {
    "collect": ("sampling", "reward functions", "reference scoring"),
    "update": ("training forward", "loss", "backward", "gradient clipping", "optimiser step"),
}


class Timers:
    """Thread CPU seconds per phase of the current step; ``steps`` keeps each finished step's."""

    def __init__(self) -> None:
        self.now: dict[str, float] = collections.defaultdict(float)
        self.steps: list[dict[str, float]] = []

    def wrap(self, name: str, owner: Any, attr: str) -> None:
        fn = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.now[name] += time.thread_time() - start

        setattr(owner, attr, timed)

    def wrap_step(self, skip: int) -> None:
        step = algorithm.grpo_step

        def timed(run: Any, optimizer: Any, stream: Any, k: int) -> dict[str, float]:
            self.now.clear()
            cpu, wall = time.thread_time(), time.perf_counter()
            out = step(run, optimizer, stream, k)
            if k >= skip:
                phases = dict(self.now)
                phases["step (CPU)"] = time.thread_time() - cpu
                phases["step (wall clock)"] = time.perf_counter() - wall
                for parent, children in CHILDREN.items():
                    phases[f"rest of {parent}"] = phases[parent] - sum(phases.get(c, 0.0) for c in children)
                self.steps.append(phases)
            return out

        algorithm.grpo_step = timed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workdir", default="runs/bench-grpo", help="grpo.py --part trl's folder")
    parser.add_argument("--steps", type=int, default=220, help="GRPO steps")
    parser.add_argument("--skip", type=int, default=20, help="first steps left out (warm-up)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a `postrl grpo` override after the task's (repeatable), e.g. --set lanes.enabled=true",
    )  # fmt: skip
    args = parser.parse_args()
    work = (ROOT / args.workdir).resolve()
    model, train, heldout = work / "sft" / "model", work / "train.jsonl", work / "eval.jsonl"
    if not model.is_dir():
        raise SystemExit(f"{model} is missing: run benchmarks/grpo.py --part trl first")
    task = argparse.Namespace(
        beta=0.04, unbiased_kl=1, lr=1e-4, steps=args.steps, eval_every=args.steps, threads=1, seed=0
    )
    timers = Timers()
    for name, (owner, attr) in PHASES.items():
        timers.wrap(name, owner, attr)
    timers.wrap_step(args.skip)
    before = os.getloadavg()[0]
    postrl_main(trl_task_args(model, train, heldout, work / "profile", task, tuple(args.set)))
    names = sorted(timers.steps[0], key=lambda n: -statistics.median(s[n] for s in timers.steps))
    ms = {n: round(1000 * statistics.median(s[n] for s in timers.steps), 3) for n in names}
    result = {
        "steps_timed": len(timers.steps),
        "median_ms": ms,
        "loadavg": [round(before, 2), round(os.getloadavg()[0], 2)],
    }
    print(f"median ms per step over {len(timers.steps)} steps (thread CPU time unless said):")
    for n in names:
        print(f"  {n:24}{ms[n]:8.2f}")
    record("grpo-profile", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
