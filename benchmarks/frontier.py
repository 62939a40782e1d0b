"""The gold-reward frontier of every method on the built-in `reviews` task (issue 20). Ends with ONE JSON line.

On held-out review prompts: gold reward (the task's hidden truth) and the reward model's score (the proxy)
against the KL to the SFT policy, for
- best-of-n from the SFT policy ranked by the reward model, n = 1 … 64 (KL = log n − (n − 1)/n);
- PPO-RLHF (configs/ppo-reviews.yaml) at ``--ppo-betas``, a checkpoint every ``--ppo-save`` steps;
- DPO (configs/dpo-reviews.yaml: the RM's own pairs) at ``--dpo-betas``, a checkpoint every ``--dpo-save``;
- GRPO and RLOO (``grpo.advantage=rloo``) with the reward model as their reward (``rewards=[rm:RM]``).
Every checkpoint is measured by the same evaluator (`postrl.lm.dpo.frontier`): ``--samples`` held-out responses
at temperature 1, up to 24 tokens, their mean gold reward, RM score and KL to the SFT policy (k1 summed per
response). Runs whose folder holds a summary.json are reused, so a rerun only measures.

The SFT policy and the reward model are the demo's (``--base RUN_DIR``: a `postrl demo` run folder holding
sft/model and rm/model); build them with ``make demo`` (or ``postrl demo --out runs/demo``) first.

    .venv/bin/python benchmarks/frontier.py --base runs/demo --work runs/frontier --seeds 0

Measured 2026-12-03, seed 0, the demo's SFT policy and RM, 2,789 s on the shared 2-core machine (load average
7.6 at the start, 15 at the end); the chart is docs/frontier.png, the reading the README section "DPO and the
gold-reward frontier". (method: KL, gold, RM score)
- SFT: 0, 0.125, 1.90. Best-of-n, n = 1 2 4 8 16 32 64: KL 0 0.19 0.64 1.20 1.83 2.50 3.17, gold 0.07 0.43 0.68
  0.79 0.82 0.83 0.81, RM 1.83 2.52 3.08 3.46 3.71 3.88 4.04.
- PPO β 0.05, steps 10 … 100: KL 0.60 2.68 3.04 3.28 3.47 5.78 7.16 8.27 9.76 8.06, gold 0.38 0.42 0.70 0.72 0.71
  0.61 0.46 0.22 −0.21 0.12, RM 2.51 3.07 3.45 3.63 3.83 4.18 4.36 4.48 4.62 4.47.
- PPO β 0.2, steps 10 … 100: KL 0.72 1.55 1.21 2.67 2.00 2.23 2.79 2.47 2.33 2.70, gold 0.46 0.46 0.64 0.60 0.74
  0.75 0.71 0.78 0.77 0.77, RM 2.68 2.94 3.19 3.42 3.56 3.70 3.68 3.70 3.64 3.74.
- DPO (steps 25 … 200) β 0.03: KL 0.09 0.81 0.57 0.93 1.10 1.41 0.98 1.38, gold 0.27 0.14 0.27 0.28 0.35 0.41 0.48
  0.46; β 0.1: KL 0.08 0.56 0.31 0.59 0.85 0.78 0.77 0.90, gold 0.27 0.18 0.27 0.28 0.39 0.46 0.51 0.56; β 0.3: KL
  0.05 0.20 0.19 0.43 0.55 0.91 0.78 0.99, gold 0.27 0.24 0.33 0.41 0.47 0.51 0.55 0.58 (RM 2.13 … 2.94).
- GRPO with the RM (steps 10 … 100): KL 0.01 … 0.71, gold 0.16 … 0.37; RLOO: KL 0.01 … 0.53, gold 0.16 … 0.39.
Seed 1 (``--seeds 1 --dpo-betas 0.1 0.3 --ppo-betas 0.2 --grpo``, 867 s, load average 13 → 6): SFT 0, 0.02,
1.71; best-of-n gold 0.07 0.42 0.67 0.80 0.85 0.86 0.88 (RM 1.83 … 4.04); PPO β 0.2 KL 0.31 1.24 1.17 2.22 1.95
2.13 2.45 2.45 2.21 2.13, gold 0.39 0.59 0.68 0.72 0.75 0.78 0.79 0.78 0.83 0.78; DPO β 0.1 KL 0.05 0.21 0.44 0.56
0.60 1.08 1.28 1.25, gold 0.13 0.18 0.22 0.31 0.32 0.37 0.42 0.41; DPO β 0.3 KL 0.04 0.07 0.17 0.37 0.58 0.75 0.80
0.83, gold 0.14 0.22 0.32 0.34 0.42 0.46 0.52 0.55.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _record import record

ROOT = Path(__file__).resolve().parents[1]


def _run(args: list[str], out: Path) -> float:
    """``postrl ARGS --out OUT`` in a fresh process unless OUT already finished; its wall seconds."""
    if (out / "summary.json").is_file():
        print(f"[frontier] reusing {out}", file=sys.stderr)
        return 0.0
    start = time.perf_counter()
    print(f"[frontier] {' '.join(args[:1])} → {out}", file=sys.stderr)
    log = out.parent / f"{out.name}.log"
    with log.open("w") as f:
        resume = ["--resume"] if (out / "config.yaml").is_file() else []
        subprocess.run([sys.executable, "-m", "postrl.cli", *args, "--out", str(out), *resume], check=True,
                       stdout=f, stderr=f, cwd=ROOT)  # fmt: skip
    return time.perf_counter() - start


def train_all(a: argparse.Namespace, sft: str, rm: str, work: Path, seed: int) -> dict[str, Path]:
    """Every method's run folder for one seed (trained when missing): {label: folder}."""
    common = [f"run.seed={seed}", "run.keep_last=0", f"run.threads={a.threads}", "run.device=cpu"]
    runs: dict[str, Path] = {}
    for beta in a.dpo_betas:
        out = work / f"dpo-b{beta}-s{seed}"
        _run(
            ["dpo", "--config", "dpo-reviews", "--model", sft, *common, f"dpo.beta={beta}",
             f"run.steps={a.dpo_steps}", f"run.save_every={a.dpo_save}", "run.eval_every=0", "eval_samples=0"],
            out,
        )  # fmt: skip
        runs[f"DPO β={beta}"] = out
    for beta in a.ppo_betas:
        out = work / f"ppo-b{beta}-s{seed}"
        _run(
            ["ppo", "--config", "ppo-reviews", "--model", sft, "--reward-model", rm, *common, f"kl.beta={beta}",
             f"run.steps={a.ppo_steps}", f"run.save_every={a.ppo_save}", "run.eval_every=0", "plots=false"],
            out,
        )  # fmt: skip
        runs[f"PPO β={beta}"] = out
    for advantage in a.grpo:
        out = work / f"{advantage}-s{seed}"
        _run(
            ["grpo", "--model", sft, "--data", "task:reviews", *common, f"rewards=[rm:{rm}]",
             f"grpo.advantage={advantage}", "grpo.group_size=8", "grpo.prompts_per_step=8", "grpo.beta=0.04",
             "sampling.max_new_tokens=24", "sampling.temperature=1.0", "max_prompt_length=32",
             f"optim.lr={a.grpo_lr}", "optim.warmup_steps=0", "optim.min_lr_ratio=1.0", "optim.betas=[0.9,0.95]",
             f"run.steps={a.grpo_steps}", f"run.save_every={a.grpo_save}", "run.eval_every=0", "eval_size=16",
             "eval_at_start=false"],
            out,
        )  # fmt: skip
        runs[{"grpo": "GRPO", "rloo": "RLOO"}[advantage] + " (RM reward)"] = out
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="a postrl demo run folder (sft/model, rm/model)")
    parser.add_argument("--work", default="runs/frontier", help="run folders, points, chart")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--dpo-betas", type=float, nargs="+", default=[0.03, 0.1, 0.3])
    parser.add_argument("--dpo-steps", type=int, default=200)
    parser.add_argument("--dpo-save", type=int, default=25)
    parser.add_argument("--ppo-betas", type=float, nargs="+", default=[0.05, 0.2])
    parser.add_argument("--ppo-steps", type=int, default=100)
    parser.add_argument("--ppo-save", type=int, default=10)
    parser.add_argument("--grpo", nargs="*", default=["grpo", "rloo"], help="GRPO advantages to run")
    parser.add_argument("--grpo-steps", type=int, default=100)
    parser.add_argument("--grpo-save", type=int, default=10)
    parser.add_argument("--grpo-lr", type=float, default=3e-5)
    parser.add_argument("--samples", type=int, default=256, help="held-out responses per checkpoint")
    parser.add_argument("--bon-prompts", type=int, default=128, help="held-out prompt draws of best-of-n")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--chart", default=None, help="PNG path (default: WORK/frontier.png)")
    a = parser.parse_args()

    import torch

    from postrl.lm.dpo.frontier import best_of_n, frontier_points, plot_frontier
    from postrl.lm.tasks import get_task

    torch.set_num_threads(a.threads)
    base, work = Path(a.base).resolve(), Path(a.work).resolve()
    sft, rm = str(base / "sft" / "model"), str(base / "rm" / "model")
    work.mkdir(parents=True, exist_ok=True)
    task = get_task("reviews")
    load = [round(x, 2) for x in os.getloadavg()]
    start = time.perf_counter()
    points = []
    for seed in a.seeds:
        runs = train_all(a, sft, rm, work, seed)
        for p in frontier_points(runs, sft, rm, task, n=a.samples, seed=seed):
            points.append({**p, "seed": seed})
        for p in best_of_n(sft, rm, task, prompts=a.bon_prompts, seed=seed):
            points.append({**p, "seed": seed})
    (work / "points.json").write_text(json.dumps(points, indent=1))
    chart = plot_frontier(
        [p for p in points if p["seed"] == a.seeds[0]], a.chart or work / "frontier.png",
        title=f"reviews, held-out prompts: gold reward and RM score against KL to SFT (seed {a.seeds[0]})",
    )  # fmt: skip
    best = {}
    for p in points:
        key = p["method"]
        if key not in best or p["gold"] > best[key]["gold"]:
            best[key] = p
    summary = {
        "seeds": a.seeds,
        "load_average_start": load,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "seconds": round(time.perf_counter() - start, 1),
        "chart": str(chart),
        "best_gold_per_method": {
            k: {kk: round(v, 3) if isinstance(v, float) else v for kk, v in p.items()}
            for k, p in best.items()
        },
        "points": [{k: round(v, 3) if isinstance(v, float) else v for k, v in p.items()} for p in points],
    }
    record("frontier", summary)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
