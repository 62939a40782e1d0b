"""PPO-RLHF at real size (issue #37 item 1): the four roles of a Qwen2.5-0.5B-shaped policy on this machine,
postrl alone (TRL's PPOTrainer is not compared here): peak memory, where it goes, seconds per step.

The policy is `real_size.py`'s random-init ``qwen0.5b`` folder; the reward model is the same trunk saved as a
one-label ``Qwen2ForSequenceClassification`` (a fresh ``score`` row, what TRL's ``RewardTrainer`` writes), so
that ``postrl ppo`` loads it as a user's reward model and starts the critic from it (the N+ details' default).
The four roles at once:

    actor       the policy, trained (full: weights + gradients + AdamW moments; LoRA: adapters only)
    reference   full: a second frozen copy of the policy; LoRA: the actor with its adapters off (no copy)
    reward      frozen, its own trunk
    critic      a trainable copy of the reward model (LoRA: adapters on that copy)

``--where`` prints the parameter bytes of each role (no weights are loaded, the meta device); the run records
them, and ``postrl ppo --dry-run``'s estimate of its config, full and LoRA. The run is one process,
instrumented as `real_size_profile.py` does (the resident set sampled every 0.1 s, tagged with the phase:
"load" is everything before the causal LM's first tagged forward (loading the four roles, and sampling and
scoring when postrl's own decoder runs them), then forwards, backwards and optimiser steps); the training peak
is the highest sample up to the last optimiser step (the final held-out sample and the export come after);
it stops above ``--max-rss-mb``. Reviews prompts, one response each, ``--batch`` prompts per
step, ``--new-tokens`` tokens, one PPO epoch of one minibatch, rewards not normalised (a random reward model
has no statistics of SFT samples).

    .venv/bin/python benchmarks/real_size_ppo.py --where                  # the bytes of each role, full and LoRA
    .venv/bin/python benchmarks/real_size_ppo.py --lora --steps 2         # the measured run

Measured 2026-12-05 (load 3, other 0.5B and 135M jobs of this session ran beside its second step):
--lora --steps 2 (4 prompts x 32 tokens, fp32): parameters 6.1 GB (full: 19.8 GB); training peak 7,244 MB
(the dry-run's estimate 7.80 GiB = 8,375 MB), 6,670 MB in the no-grad forwards; the whole run 10,099 MB, its
high-water mark after training (the export merges the critic's LoRA into a full copy of its trunk); steps
12.4 and 41.2 s (generate 6.7 / 6.9, score 2.1 / 8.4, train 3.6 / 25.8).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
from pathlib import Path

import real_size
import real_size_profile
import torch
from _record import record

GB = 1e9


def make_reward_model(base: Path, folder: Path) -> Path:
    """``base``'s trunk with a fresh one-label ``score`` as a ``*ForSequenceClassification`` folder (kept if
    already there), its tokenizer beside it."""
    if (folder / "config.json").is_file():
        return folder
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    torch.manual_seed(1)
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1, dtype=torch.float32)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def role_bytes(model: Path, lora: bool, dtype: str) -> dict[str, dict[str, float]]:
    """Bytes of weights, gradients and AdamW state per role (the meta device: nothing loaded); the critic's
    trunk is the reward model's, which has the policy's parameters (tied embeddings) and a [1, d] score."""
    from postrl.lm.estimate import model_shape
    from postrl.lm.spine import LoraConfig

    shape = model_shape(str(model), LoraConfig(enabled=lora))
    w = {"float32": 4, "bfloat16": 2}[dtype]
    trained_bytes = shape.trained * (4 if lora else w)  # LoRA adapters are float32
    moments = shape.trained * (8 + (4 if w < 4 and not lora else 0))  # + a float32 master for bf16 weights
    trainable = {"weights": shape.params * w, "gradients": trained_bytes, "optimizer": moments}
    return {
        "actor": trainable,
        "reference": {"weights": 0 if lora else shape.params * w},
        "reward model": {"weights": shape.params * w},
        "critic": trainable,
    }


def ppo_command(args: argparse.Namespace, model: Path, rm: Path, out: Path, lora: bool) -> list[str]:
    """The ``postrl ppo`` command line (without the program)."""
    return [
        "ppo", "--model", str(model), "--reward-model", str(rm), "--data", "task:reviews", "--out", str(out),
        "--overwrite", f"run.steps={args.steps}", "run.eval_every=0", "run.save_every=0", "run.log_every=1",
        "run.device=cpu", f"run.threads={args.threads}", f"run.dtype={args.dtype}",
        f"run.lora.enabled={str(lora).lower()}", f"batch_size={args.batch}",
        f"sampling.max_new_tokens={args.new_tokens}", "sampling.temperature=1.0", "max_prompt_length=64",
        "ppo.epochs=1", "ppo.minibatches=1", "reward.normalize=none", "eval_size=1", "plots=false",
        "optim.lr=1e-6", "critic_optim.lr=1e-6", "optim.warmup_steps=0", "critic_optim.warmup_steps=0",
        *(args.set or []),
    ]  # fmt: skip


def dry_run(args: argparse.Namespace, model: Path, rm: Path, lora: bool) -> str:
    """``postrl ppo --dry-run``'s line for the run's config, full or LoRA: its estimate, or its refusal."""
    cmd = [
        sys.executable,
        "-m",
        "postrl.cli",
        *ppo_command(args, model, rm, args.work / "dry", lora),
        "--dry-run",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=real_size.ROOT)
    return (done.stdout.strip() or done.stderr.strip()).splitlines()[-1]


def measure(args: argparse.Namespace, model: Path, rm: Path, out: Path) -> dict:
    """Run ``postrl ppo`` in this process under the phase sampler → step times, peaks, phases."""
    from postrl.cli import main as postrl_main

    phases = real_size_profile.Phases()
    real_size_profile.instrument(phases)
    threading.Thread(target=phases.sample, args=(args.max_rss_mb,), daemon=True).start()
    code = postrl_main(ppo_command(args, model, rm, out, args.lora))
    phases.done = True
    if code:
        raise SystemExit(code)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time_train" in r]
    times = [r["time_generate"] + r["time_score"] + r["time_train"] for r in rows]
    merged = phases.merged()
    last_step = max(i for i, r in enumerate(merged) if r["phase"] == "optimizer step")
    by_phase: dict[str, float] = {}
    for row in merged[: last_step + 1]:
        by_phase[row["phase"]] = max(by_phase.get(row["phase"], 0.0), row["rss_peak"])
    return {
        "step_s": statistics.median(times[1:] or times),
        "step_times": times,
        "split_s": {
            k: statistics.median([r[f"time_{k}"] for r in rows][1:] or [rows[0][f"time_{k}"]])
            for k in ("generate", "score", "train")
        },  # the median step's parts, like step_s
        "split_times": {k: [r[f"time_{k}"] for r in rows] for k in ("generate", "score", "train")},
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "training_rss_mb": max(by_phase.values()),
        "after_training_rss_mb": max(r["rss_peak"] for r in merged[last_step + 1 :]),
        "peak_by_phase_mb": by_phase,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(real_size.SHAPES), default="qwen0.5b")
    p.add_argument("--work", type=Path, default=real_size.ROOT / "runs" / "bench_real_size")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--batch", type=int, default=4, help="prompts per step (one response each)")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--lora", action="store_true")
    p.add_argument(
        "--where", action="store_true", help="print the bytes of each role, full and LoRA, and exit"
    )
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="a postrl override (repeatable)")
    p.add_argument("--max-rss-mb", type=float, default=13000, help="stop the run above this resident set")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    model = real_size.make_model(args.model, args.work / args.model)
    rm = make_reward_model(model, args.work / f"{args.model}-rm")
    where = {
        arm: {role: {k: v / GB for k, v in parts.items()} for role, parts in role_bytes(model, lora, args.dtype).items()}
        for arm, lora in (("full", False), ("lora", True))
    }  # fmt: skip
    totals = {arm: sum(sum(parts.values()) for parts in roles.values()) for arm, roles in where.items()}
    if args.where:
        return print(json.dumps({"GB": where, "total_GB": totals}, indent=1))
    tag = f"{args.model}-{args.dtype}-{'lora' if args.lora else 'full'}"
    result = {"config": tag, "steps": args.steps, "load_avg": os.getloadavg(), "batch": args.batch,
              "new_tokens": args.new_tokens, "parameters_GB": where, "parameters_total_GB": totals}  # fmt: skip
    result["estimate"] = {arm: dry_run(args, model, rm, arm == "lora") for arm in ("full", "lora")}
    result["postrl"] = measure(args, model, rm, args.work / f"{tag}-postrl")
    record(f"real_size_ppo-{tag}", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
