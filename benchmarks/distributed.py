"""Throughput of data-parallel training under ``torchrun`` (issue 9): 1 process vs 2 (vs N) on this machine.

The same SFT optimiser step (the built-in tiny Llama, the arithmetic and reviews demonstrations, a fixed
GLOBAL batch) is timed with ``torchrun --standalone --nproc_per_node N`` for each N, one intra-op thread per
process (so N processes use N cores: the fair data-parallel comparison on a CPU). Prints one line per N and
ends with ONE JSON line.

    .venv/bin/python benchmarks/distributed.py --procs 1,2 --steps 20
    .venv/bin/python benchmarks/distributed.py --parallel fsdp          # FSDP2 sharding instead of DDP

Scaling is strong (the global batch is split), so the ideal is N× the 1-process tokens/s; gloo's all-reduce
of the gradients and a machine shared with other work take their share. On GPUs use nccl (the default
there) and ``--device cuda``.

Beside it, classic-control PPO: ``postrl control train --algo ppo --env CartPole-v1`` (the preset: 8 envs ×
32 steps and a batch of 256 per process, 20 epochs) under ``torchrun`` for each N, ``--control-steps`` env
steps per process. Every rank steps its own envs, so this scaling is weak (N× the env steps in the same
time is the ideal); the number is the run's env steps (all ranks) per second of training.

    .venv/bin/python benchmarks/distributed.py --only control --control-steps 16384
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _record import record

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve()


def _prepare(work: Path, width: int, layers: int) -> Path:
    """A tokenizer and a freshly initialised tiny Llama saved in Hugging Face format under ``work``."""
    from postrl.lm.models import TinyLMConfig, build_tiny_lm
    from postrl.lm.tasks import build_corpus
    from postrl.lm.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(build_corpus(n_lines=4000, seed=0), vocab_size=512)
    shape = TinyLMConfig(n_layers=layers, hidden_size=width, n_heads=4, intermediate_size=4 * width)
    model = build_tiny_lm(
        len(tokenizer),
        shape,
        seed=0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    model.save_pretrained(str(work / "model"))
    tokenizer.save_pretrained(str(work / "model"))
    return work / "model"


def worker(args: argparse.Namespace) -> None:
    """One rank: time ``args.steps`` SFT steps after 2 warm-up steps; rank 0 prints a JSON line."""

    from postrl.lm.data import render_rows, tokenize_sft
    from postrl.lm.models import load_causal_lm
    from postrl.lm.tasks import get_task
    from postrl.lm.tokenizer import load_tokenizer
    from postrl.lm.trainer import OptimConfig, TrainConfig, make_optimizer, train_step
    from postrl.runtime import distributed as dist

    info = dist.init_distributed(args.device)
    tokenizer = load_tokenizer(args.model)
    model = dist.wrap_model(load_causal_lm(args.model, device=info.device), info, args.parallel)
    rows = get_task("arithmetic").sft_rows("train") + get_task("reviews").sft_rows("train")
    examples = tokenize_sft(
        render_rows(rows, "sft", tokenizer), tokenizer, max_length=64, overlong="truncate"
    )
    cfg, optim = TrainConfig(batch_size=args.batch_size), OptimConfig(warmup_steps=0)
    optimizer, _ = make_optimizer(dist.unwrap(model), optim, 10**6)
    batches = [list(range(i * cfg.batch_size, (i + 1) * cfg.batch_size)) for i in range(args.steps + 2)]
    tokens = 0
    for k, indices in enumerate(batches):
        if k == 2:  # warm-up done (allocator, gloo buffers, DDP buckets)
            dist.barrier()
            start, tokens = time.perf_counter(), 0
        out = train_step(model, optimizer, examples, indices, cfg, optim, tokenizer.pad_token_id, info.device)
        tokens += int(sum(len(examples[i]["input_ids"]) for i in indices)) if k >= 2 else 0
        del out
    dist.barrier()
    seconds = time.perf_counter() - start
    if info.is_main:
        n_params = sum(p.numel() for p in model.parameters())
        print(json.dumps({"procs": info.world_size, "seconds_per_step": seconds / args.steps,
                          "tokens_per_second": tokens / seconds, "n_params": n_params}))  # fmt: skip
    dist.cleanup()


def launch(n: int, model_dir: Path, args: argparse.Namespace) -> dict:
    """``torchrun --standalone --nproc_per_node n`` of this file in worker mode; rank 0's JSON line."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", str(THIS)]
    cmd += ["--worker", "--model", str(model_dir), "--steps", str(args.steps)]
    cmd += ["--batch-size", str(args.batch_size), "--parallel", args.parallel, "--device", args.device]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"torchrun with {n} processes failed:\n{proc.stderr[-4000:]}")
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])


def launch_control(n: int, args: argparse.Namespace) -> dict:
    """``torchrun ... -m postrl.cli control train --algo ppo`` with ``n`` processes; its summary.json."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"]
        cmd += ["-m", "postrl.cli", "control", "train", "--algo", "ppo", "--env", args.control_env]
        cmd += ["--total-steps", str(args.control_steps * n), "--out", tmp]
        cmd += [f"ppo.batch_size={256 * n}", "run.eval_episodes=1", "run.save_every=0"]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"control ppo with {n} processes failed:\n{proc.stderr[-4000:]}")
        summary = json.loads((Path(tmp) / "summary.json").read_text())
    return {"procs": n, "env_steps": summary["env_steps"], "steps_per_second": summary["steps_per_second"]}


def _speedups(results: list[dict], key: str) -> list[dict]:
    """Add ``speedup_vs_1``: ``key`` over the first run's per-process ``key``."""
    base = results[0][key] / results[0]["procs"]
    for r in results:
        r["speedup_vs_1"] = r[key] / base
    return results


def _report_control(args: argparse.Namespace) -> list[dict]:
    results = _speedups([launch_control(int(n), args) for n in args.procs.split(",")], "steps_per_second")
    for r in results:
        print(
            f"control ppo {args.control_env}, {r['procs']} process(es): {r['steps_per_second']:.0f} env "
            f"steps/s ({r['env_steps']} steps), x{r['speedup_vs_1']:.2f}"
        )
    return results


def _report_lm(args: argparse.Namespace) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = _prepare(Path(tmp), args.width, args.layers)
        results = [launch(int(n), model_dir, args) for n in args.procs.split(",")]
    for r in _speedups(results, "tokens_per_second"):
        print(
            f"{r['procs']} process(es), {args.parallel}: {r['seconds_per_step']:.3f} s/step, "
            f"{r['tokens_per_second']:.0f} tokens/s, x{r['speedup_vs_1']:.2f}"
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", default="1,2", help="comma-separated process counts (1,2)")
    parser.add_argument("--steps", type=int, default=20, help="timed optimiser steps per run (20)")
    parser.add_argument("--batch-size", type=int, default=32, help="global examples per step (32)")
    parser.add_argument("--width", type=int, default=128, help="model width d (128)")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (4)")
    parser.add_argument("--parallel", default="ddp", choices=["ddp", "fsdp"], help="ddp or fsdp (ddp)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cpu)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per process (1)")
    parser.add_argument("--only", choices=["lm", "control"], help="run one of the two benchmarks (both)")
    parser.add_argument(
        "--control-env", default="CartPole-v1", help="Gymnasium id of the PPO run (CartPole-v1)"
    )
    parser.add_argument("--control-steps", type=int, default=16384, help="PPO env steps per process (16384)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    results = _report_lm(args) if args.only != "control" else []
    control = _report_control(args) if args.only != "lm" else []
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    result = {"parallel": args.parallel, "batch_size": args.batch_size, "load_avg": load,
              "results": results, "control_ppo": control}  # fmt: skip
    record(f"distributed-{args.parallel}", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
