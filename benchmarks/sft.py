#!/usr/bin/env python
"""SFT's padding-free forward (``padding_free``, issue 37 item 2): seconds per step padded vs padding-free, and
TRL 1.16 beside them, on the built-in arithmetic SFT.

The built-in base model (`postrl.lm.base_model`, the tiny Llama) on ``task:arithmetic`` with the settings of
``configs/sft-arithmetic.yaml`` (64 examples per step, max_length 64, lr 1e-3, constant here): each repeat runs
postrl with ``padding_free=off`` (the padded Hugging Face forward, the path before), then ``auto`` (the
padding-free one, `postrl.lm.packed_sft`), then, with ``--trl``, TRL's ``SFTTrainer`` on the same rendered
rows, batch and length (its padded forward; `benchmarks/scaling_lm.py`'s TRL worker in the TRL venv: ``make
peers``), so load drift hits all three. The measure is CPU seconds of the process per step (one torch thread
each: on a loaded machine a process gets a fraction of a core and the wall time is mostly waiting), the
median over the steps after the first; wall seconds are kept beside it. An arithmetic row is 17 or 18 tokens
(completion 4 or 5 with EOS), every prompt distinct: a padded batch is 2% padding. ``--data task:reviews``:
completions of 4 to 23 tokens, 38% padding, 149 distinct prompts over 4,000 rows.

Measured 2026-12-05 at load 13.8-14.3 from other jobs, CPU seconds per step (median of 3 rounds of 20 steps):
arithmetic padded 0.085, padding-free 0.088 (0.96×: nothing to remove, and the attention split between
prompts and completions costs a little), TRL 0.110 (1.25× postrl padding-free); reviews padded 0.114,
padding-free 0.073 (1.58×), TRL 0.134 (1.84×).

    python benchmarks/sft.py --trl               # benchmarks/results/sft.json
    python benchmarks/sft.py --trl --data task:reviews   # longer completions of varied length: sft-reviews.json
    python benchmarks/sft.py --steps 10 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _record import record  # noqa: E402 (after the sys.path line)

BATCH, MAX_LENGTH = 64, 64  # configs/sft-arithmetic.yaml
OPTIM = {"lr": 1e-3, "warmup_steps": 0, "min_lr_ratio": 1.0, "betas": [0.9, 0.95], "max_grad_norm": 1.0}


def task_rows(model: str, data: str) -> list[dict]:
    """A built-in task's SFT rows (``data``: task:NAME), rendered as `postrl sft` renders them (plain prompt
    and completion text: what TRL is given too)."""
    from postrl.lm.sft import SFTConfig, load_sft_rows
    from postrl.lm.tokenizer import load_tokenizer

    rows, _, _ = load_sft_rows(SFTConfig(model=model, data=data), load_tokenizer(model))
    return [{"prompt": r["prompt"], "completion": r["completion"]} for r in rows]


def postrl_point(model: str, rows: list[dict], padding_free: str, steps: int, out: Path) -> dict:
    """Median CPU and wall seconds per step (steps 2 … n) of `postrl sft` with ``padding_free``."""
    import postrl

    clock: list[float] = []
    run = {"steps": steps, "eval_every": 0, "save_every": 0, "log_every": 1, "device": "cpu", "threads": 1}
    postrl.sft(
        model=model, data=rows, out=str(out), overwrite=True, padding_free=padding_free, run=run, optim=OPTIM,
        train={"batch_size": BATCH, "max_length": MAX_LENGTH}, eval_size=0,
        on_iteration=lambda info: clock.append(time.process_time()),
    )  # fmt: skip
    logged = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    wall = [r["time"] for r in logged if "loss" in r]
    return {
        "cpu_seconds": statistics.median(b - a for a, b in zip(clock, clock[1:], strict=False)),
        "seconds": statistics.median(b - a for a, b in zip(wall, wall[1:], strict=False)),
        "final_loss": [r["loss"] for r in logged if "loss" in r][-1],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--steps", type=int, default=20, help="steps per run (the first is not timed)")
    parser.add_argument("--repeats", type=int, default=3, help="padded / padding-free (/ TRL) rounds")
    parser.add_argument("--trl", action="store_true", help="TRL 1.16 beside them (needs make peers)")
    parser.add_argument("--data", default="task:arithmetic", help="a built-in task (results: sft-NAME.json "
                        "for one other than arithmetic)")  # fmt: skip
    parser.add_argument("--work", default=str(ROOT / "runs" / "bench-sft"), help="scratch folder")
    args = parser.parse_args()
    import torch

    from postrl.lm.base_model import BASE_LM

    torch.set_num_threads(1)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = str(BASE_LM.path())
    rows = task_rows(model, args.data)
    trl = None
    if args.trl:
        from scaling_lm import PEERS, TRLWorker

        trl = TRLWorker(str(PEERS / ".venv-trl" / "bin" / "python"), work / "trl-worker.log")
    load_start = os.getloadavg()[0]
    points: list[dict] = []
    for repeat in range(args.repeats):
        point: dict = {"repeat": repeat, "load": round(os.getloadavg()[0], 2)}
        for mode in ("off", "auto"):
            got = postrl_point(model, rows, mode, args.steps, work / f"postrl-{mode}")
            point |= {f"{mode}_{k}": round(v, 5) for k, v in got.items()}
        if trl is not None:
            got = trl.point({"part": "sft", "model": model, "rows": rows, "length": MAX_LENGTH, "batch": BATCH,
                             "steps": args.steps, "out": str(work / "trl")})  # fmt: skip
            point |= {
                "trl_cpu_seconds": round(got["cpu_seconds"], 5),
                "trl_seconds": round(got["seconds"], 5),
            }
        points.append(point)
        print(json.dumps(point), file=sys.stderr, flush=True)
    if trl is not None:
        trl.close()

    def median(key: str) -> float:
        return statistics.median(p[key] for p in points)

    result = {
        "model": "postrl.lm.base_model", "data": args.data, "batch_size": BATCH,
        "max_length": MAX_LENGTH, "steps": args.steps, "repeats": args.repeats, "threads": 1,
        "load_average_at_start": round(load_start, 2), "load_average_at_end": round(os.getloadavg()[0], 2),
        "points": points, "padded_cpu_seconds": median("off_cpu_seconds"),
        "padding_free_cpu_seconds": median("auto_cpu_seconds"),
    }  # fmt: skip
    result["speedup_cpu"] = round(result["padded_cpu_seconds"] / result["padding_free_cpu_seconds"], 2)
    result["speedup_wall"] = round(median("off_seconds") / median("auto_seconds"), 2)
    if trl is not None:
        result["trl_cpu_seconds"] = median("trl_cpu_seconds")
        result["vs_trl_padded_cpu"] = round(result["trl_cpu_seconds"] / result["padded_cpu_seconds"], 2)
        result["vs_trl_padding_free_cpu"] = round(
            result["trl_cpu_seconds"] / result["padding_free_cpu_seconds"], 2
        )
    name = args.data.removeprefix("task:")
    record("sft" if name == "arithmetic" else f"sft-{name}", result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
