"""The policy-gradient family side by side (issue 25): GRPO, Dr. GRPO, RLOO, REINFORCE++, GSPO and DAPO, and
continued SFT as the baseline, from ONE SFT checkpoint of the built-in arithmetic task, for the same compute
budget, over several seeds. Ends with ONE JSON line.

The checkpoint is `benchmarks/grpo.py --part arithmetic`'s (`_grpo_sft.py`: a tiny Llama pretrained on 3-digit
sums, then SFT on 500 two-digit demonstrations; built under ``--workdir`` unless ``--sft`` is given). Each
contender runs in a fresh process (``--worker``) with 1 torch thread and trains until its **process CPU
seconds** (`time.process_time`, evaluation excluded) reach ``--budget``: on an idle machine with 1 thread that
equals wall time, and on a shared, loaded machine it is the one clock that other processes do not inflate.
The order is seed-major and the contenders are interleaved within a seed, so a drift of the machine's load hits
every contender alike. At fixed CPU times (every ``--budget / --checks`` seconds, and at 0) each contender is
evaluated on the same ``--eval-prompts`` held-out problems (greedy exact match, and one sample at τ = 1), and
its KL to the SFT policy is measured: KL(π‖π_SFT) summed exactly over the vocabulary at every position of the
responses π samples (τ = 1) for those prompts, averaged per response token.

The contenders (the presets' values on the 2-digit task, ≤ 8 new tokens, 32 prompts × G = 8, AdamW 2e-4):

    grpo          configs/grpo-arithmetic.yaml: group-normalised advantages, per-response loss, β 0.04
    dr_grpo       grpo with advantage dr_grpo (no std) and loss_type dr_grpo (sum / (B·T_max))
    rloo          configs/rloo-arithmetic.yaml: leave-one-out baseline, per-response loss, β 0.04
    reinforce_pp  grpo with advantage reinforce_pp (group mean removed, batch-whitened)
    gspo          configs/gspo-arithmetic.yaml: one length-normalised ratio per response
    dapo          configs/dapo-arithmetic.yaml: token loss, ε_high 0.28, dynamic sampling, overlong, β 0
    sft           continued SFT on the checkpoint's 500 demonstrations at its lr (1e-3), batch 64

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/estimators.py --budget 30 --checks 3 \
        --eval-prompts 100 --seeds 0 1 2 --jobs 3

(``--jobs 3`` runs the three seeds at once, each its own sequence of processes: on a shared machine that
only changes the wall time, since every run is timed in its own CPU seconds.)

writes ``docs/estimators.png`` (held-out greedy accuracy vs CPU seconds, one line per contender: the mean over
seeds with a min-max band) and prints the table that README shows.

Measured 2026-12-03 with the command above (the checkpoint: 0.43 greedy on the 100 held-out problems), at a
load average of 12-15 on the shared 2-core machine: each process got about 6% of a core (CPU / wall 0.06), so
the 21 runs took 50 min of wall time for ~13 min of CPU. Greedy accuracy at 30 CPU seconds, mean of 3 seeds
(per seed): grpo 0.637 (0.55 0.67 0.69), dr_grpo 0.597 (0.67 0.60 0.52), rloo 0.600 (0.67 0.54 0.59),
reinforce_pp 0.640 (0.63 0.58 0.71), gspo 0.590 (0.65 0.57 0.55), dapo 0.620 (0.58 0.63 0.65), continued SFT
0.437 (0.46 0.48 0.37); KL to SFT 0.15-0.21 for the members, 0.39 for SFT; 3.1-3.5 steps per CPU second for
the members (~100 steps each), 11.9 for SFT. An earlier, interrupted run at a 60-second budget (grpo and
dr_grpo, seed 0) reached 0.695 and 0.665 on 200 problems.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _record import record

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve()
PRESETS = {
    "grpo": ("grpo-arithmetic", []),
    "dr_grpo": ("grpo-arithmetic", ["grpo.advantage=dr_grpo", "grpo.loss_type=dr_grpo"]),
    "rloo": ("rloo-arithmetic", []),
    "reinforce_pp": ("grpo-arithmetic", ["grpo.advantage=reinforce_pp"]),
    "gspo": ("gspo-arithmetic", []),
    "dapo": ("dapo-arithmetic", []),
}
CONTENDERS = [*PRESETS, "sft"]


# ---- the worker: one contender, one seed, in its own process -------------------------------------------------
def _config(args: argparse.Namespace, member: str) -> Any:
    from postrl.lm.grpo import GRPOConfig
    from postrl.runtime.config import load_config

    preset, extra = PRESETS.get(member, PRESETS["grpo"])  # sft: the GRPO run only holds model and prompts
    overrides = [
        f"model={args.sft}", f"task={json.dumps(json.loads(args.task))}", f"run.seed={args.seed}",
        "run.threads=1", "run.device=cpu", f"eval_size={args.eval_prompts}",
        f"sampling.max_new_tokens={args.max_new_tokens}", *extra,
    ]  # fmt: skip
    return load_config(GRPOConfig, preset, overrides)


def kl_to_reference(run: Any, reference: Any, seed: int) -> float:
    """KL(π‖π_SFT) per response token: exact over the vocabulary at each position of responses sampled from π
    (τ = 1) for the held-out prompts."""
    import torch

    from postrl.lm.rollout import RolloutEngine, left_pad, response_forward

    policy = run.inner
    was_training = policy.training
    policy.eval()
    ids, mask = left_pad(run.engine.heldout.ids, run.tokenizer.pad_token_id)
    engine = RolloutEngine(policy, run.tokenizer, run.cfg.sampling)
    with torch.no_grad():
        rollout = engine.sample(ids, mask, torch.Generator().manual_seed(seed))
        args = (rollout.input_ids, rollout.attention_mask, rollout.prompt_len)
        log_p = torch.log_softmax(response_forward(policy).logits(*args).float(), -1)  # (B, T, V)
        log_q = torch.log_softmax(response_forward(reference).logits(*args).float(), -1)
        kl = (log_p.exp() * (log_p - log_q)).sum(-1)  # (B, T)
        m = rollout.response_mask.to(kl.dtype)
        value = float((kl * m).sum() / m.sum().clamp(min=1))
    policy.train(was_training)
    return value


def _sft_algorithm(args: argparse.Namespace, run: Any) -> Any:
    """Continued SFT on the checkpoint's demonstrations at its lr, constant (as `_grpo_sft.continued_sft`)."""
    import torch

    sys.path.insert(0, str(THIS.parent))
    from _grpo_sft import _sft_settings

    from postrl.lm.data import tokenize_sft
    from postrl.lm.spine import RunConfig
    from postrl.lm.tasks import get_task
    from postrl.lm.trainer import OptimConfig, Supervised, TrainConfig

    lr, batch_size, sft_opts = _sft_settings(Path(args.sft), json.loads(args.task))
    examples = tokenize_sft(get_task("arithmetic", **sft_opts).sft_rows("train"), run.tokenizer, 64)
    return Supervised(
        run.policy, run.tokenizer, examples, [], TrainConfig(batch_size=batch_size, eval_examples=0),
        OptimConfig(lr=lr, warmup_steps=0, min_lr_ratio=1.0), RunConfig(steps=10**6, seed=args.seed),
        device=torch.device("cpu"), name="sft",
    )  # fmt: skip


def worker(args: argparse.Namespace) -> None:
    """Train ``args.member`` for ``args.budget`` CPU seconds, evaluating at the fixed checks; write JSON."""
    import torch

    from postrl.lm.grpo.algorithm import GRPO
    from postrl.lm.grpo.build import build_grpo_run, check_grpo_config
    from postrl.lm.grpo.rollouts import evaluate_grpo_heldout
    from postrl.lm.models import load_causal_lm
    from postrl.runtime import distributed as dist
    from postrl.runtime.config import validate
    from postrl.runtime.seeding import seed_everything

    torch.set_num_threads(1)
    cfg = _config(args, args.member)
    validate(cfg)
    info = dist.init_distributed("cpu")
    check_grpo_config(cfg, 1)
    seed_everything(cfg.run.seed, 0)
    run = build_grpo_run(cfg, info)
    reference = load_causal_lm(args.sft).eval().requires_grad_(False)
    algo = _sft_algorithm(args, run) if args.member == "sft" else GRPO(run)
    checks = [args.budget * k / args.checks for k in range(args.checks + 1)]
    curve, cpu, wall, steps, tokens, last = [], 0.0, 0.0, 0, 0.0, {}

    def check() -> None:
        evals = evaluate_grpo_heldout(run, steps)
        kl = kl_to_reference(run, reference, 10_000 + len(curve))
        curve.append({"cpu_s": round(cpu, 2), "step": steps, **evals, "kl_to_sft": kl})

    check()
    for mark in checks[1:]:
        while cpu < mark:
            c0, w0 = time.process_time(), time.perf_counter()
            last = algo.step(steps)
            cpu += time.process_time() - c0
            wall += time.perf_counter() - w0
            steps += 1
            tokens += last.get("generated_tokens", 0.0)
        check()
    result = {
        "member": args.member,
        "seed": args.seed,
        "settings": _settings(args),
        "steps": steps,
        "cpu_s": cpu,
        "wall_s": wall,
        "steps_per_cpu_s": steps / cpu,
        "generated_tokens_per_cpu_s": tokens / cpu if tokens else None,
        "curve": curve,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "time_split": {k: last[k] for k in ("time_generate", "time_score", "time_train") if k in last},
    }
    Path(args.json).write_text(json.dumps(result))


# ---- the driver -----------------------------------------------------------------------------------------------
def _checkpoint(args: argparse.Namespace) -> Path:
    if args.sft:
        return Path(args.sft)
    sys.path.insert(0, str(THIS.parent))
    from _grpo_sft import build_checkpoint
    from grpo import _postrl

    ns = argparse.Namespace(
        workdir=args.workdir, seed=0, threads=1, sft_demos=500, checkpoint_sft_steps=300,
        checkpoint_sft_min_lr_ratio=1.0, eval_prompts=args.eval_prompts, base=None,
    )  # fmt: skip
    (Path(args.workdir) / "arithmetic").mkdir(parents=True, exist_ok=True)
    return build_checkpoint(ns, json.loads(args.task), _postrl)


def _settings(args: argparse.Namespace) -> dict:
    """What a worker's result depends on besides member and seed (a saved result is reused when equal)."""
    keys = ("sft", "budget", "checks", "task", "eval_prompts", "max_new_tokens")
    return {k: str(getattr(args, k)) for k in keys}


def _run_one(args: argparse.Namespace, member: str, seed: int, out: Path) -> dict:
    if out.is_file():  # an interrupted benchmark resumes: the same run again gives the same curve
        saved = json.loads(out.read_text())
        if saved.get("settings") == _settings(args):
            return saved
    cmd = [
        sys.executable, str(THIS), "--worker", "--member", member, "--seed", str(seed), "--sft", str(args.sft),
        "--budget", str(args.budget), "--checks", str(args.checks), "--task", args.task,
        "--eval-prompts", str(args.eval_prompts), "--max-new-tokens", str(args.max_new_tokens),
        "--json", str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with out.with_suffix(".log").open("w") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=f, cwd=ROOT, env=env)
    return json.loads(out.read_text())


def _summary(runs: list[dict]) -> dict:
    """Mean (and min, max) over seeds of each check's accuracy and KL, and of the throughput."""
    n_checks = min(len(r["curve"]) for r in runs)
    curve = []
    for i in range(n_checks):
        acc = [r["curve"][i]["heldout_accuracy"] for r in runs]
        curve.append(
            {
                "cpu_s": statistics.mean(r["curve"][i]["cpu_s"] for r in runs),
                "accuracy": statistics.mean(acc),
                "accuracy_min": min(acc),
                "accuracy_max": max(acc),
                "accuracy_sampled": statistics.mean(r["curve"][i]["heldout_accuracy_sampled"] for r in runs),
                "kl_to_sft": statistics.mean(r["curve"][i]["kl_to_sft"] for r in runs),
            }
        )
    tokens = [r["generated_tokens_per_cpu_s"] for r in runs if r["generated_tokens_per_cpu_s"]]
    return {
        "curve": curve,
        "steps_per_cpu_s": statistics.mean(r["steps_per_cpu_s"] for r in runs),
        "generated_tokens_per_cpu_s": statistics.mean(tokens) if tokens else None,
        "steps": statistics.mean(r["steps"] for r in runs),
        "cpu_over_wall": statistics.mean(r["cpu_s"] / r["wall_s"] for r in runs),
        "final_accuracy_per_seed": [r["curve"][-1]["heldout_accuracy"] for r in runs],
    }


def _plot(summaries: dict[str, dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name, s in summaries.items():
        x = [c["cpu_s"] for c in s["curve"]]
        style = {"linestyle": "--", "color": "black"} if name == "sft" else {}
        (line,) = ax.plot(x, [c["accuracy"] for c in s["curve"]], marker="o", label=name, **style)
        lo, hi = [c["accuracy_min"] for c in s["curve"]], [c["accuracy_max"] for c in s["curve"]]
        ax.fill_between(x, lo, hi, alpha=0.12, color=line.get_color())
    ax.set_xlabel("training seconds (process CPU, 1 thread)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(ncol=2, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def _table(summaries: dict[str, dict], seeds: list[int]) -> str:
    checks = [round(c["cpu_s"]) for c in next(iter(summaries.values()))["curve"]]
    head = " | ".join(f"acc @{t}s" for t in checks)
    lines = [
        f"| contender | {head} | KL to SFT (end) | steps/s | gen. tokens/s |",
        "|---|" + "---|" * (len(checks) + 3),
    ]
    for name, s in summaries.items():
        accs = " | ".join(f"{c['accuracy']:.3f}" for c in s["curve"])
        tps = f"{s['generated_tokens_per_cpu_s']:.0f}" if s["generated_tokens_per_cpu_s"] else "—"
        kl = s["curve"][-1]["kl_to_sft"]
        lines.append(f"| {name} | {accs} | {kl:.3f} | {s['steps_per_cpu_s']:.2f} | {tps} |")
    lines.append(f"(mean over seeds {seeds}; per-second rates are per CPU second of training)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=30.0, help="training CPU seconds of every contender")
    parser.add_argument("--checks", type=int, default=3, help="evaluations after 0 (every budget/checks s)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--members", nargs="+", default=CONTENDERS, choices=CONTENDERS)
    parser.add_argument("--sft", help="the SFT checkpoint (default: built as benchmarks/grpo.py builds it)")
    parser.add_argument("--workdir", default="runs/bench-estimators", help="checkpoint and per-run outputs")
    parser.add_argument("--task", default='{"digits": 2}', help="arithmetic task options (JSON)")
    parser.add_argument("--eval-prompts", type=int, default=200, help="held-out prompts per check")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--plot", default=str(ROOT / "docs" / "estimators.png"))
    parser.add_argument(
        "--jobs", type=int, default=1, help="seeds run at once (each run is timed in its own CPU seconds)"
    )
    parser.add_argument(
        "--reverse", action="store_true",
        help="each seed's contenders in the reverse order: a second driver beside a running one (same workdir) "
        "takes the runs from the other end, and each reuses what the other saved",
    )  # fmt: skip
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--member", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    args.sft = str(_checkpoint(args).resolve())
    work = Path(args.workdir) / "estimators"
    work.mkdir(parents=True, exist_ok=True)
    load = [round(os.getloadavg()[0], 2)]
    start = time.perf_counter()

    def one_seed(seed: int) -> dict[str, dict]:
        """The contenders one after another (rotated per seed): a drift of the load hits all of them alike."""
        k = args.seeds.index(seed) % len(args.members)
        order = args.members[k:] + args.members[:k]
        out = {}
        for member in order[::-1] if args.reverse else order:
            out[member] = result = _run_one(args, member, seed, work / f"{member}-{seed}.json")
            load.append(round(os.getloadavg()[0], 2))
            acc = result["curve"][-1]["heldout_accuracy"]
            print(f"{member:>13} seed {seed}: {result['steps']} steps, accuracy {acc:.3f}, load {load[-1]}")
        return out

    with ThreadPoolExecutor(args.jobs) as pool:  # --jobs seeds at once, each its own sequence of processes
        per_seed = list(pool.map(one_seed, args.seeds))
    runs = {m: [s[m] for s in per_seed] for m in args.members}
    summaries = {m: _summary(r) for m, r in runs.items()}
    title = f"arithmetic 2-digit, from one SFT checkpoint; mean of seeds {args.seeds}, band min-max"
    _plot(summaries, Path(args.plot), title)
    print(_table(summaries, args.seeds))
    print(f"load average (1 min) before and after each run: {load}; wall {time.perf_counter() - start:.0f} s")
    result = {"benchmark": "estimators", "budget_cpu_s": args.budget, "sft": args.sft, "seeds": args.seeds,
              "loadavg": load, "summaries": summaries, "runs": runs}  # fmt: skip
    record("estimators", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
