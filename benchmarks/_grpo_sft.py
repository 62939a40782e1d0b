"""The SFT side of `benchmarks/grpo.py --part arithmetic`: the checkpoint GRPO starts from, and continued SFT.

The checkpoint recipe (deterministic from ``--seed``; each stage is skipped when its model folder exists):

1. base: `postrl pretrain` of the built-in tiny Llama (2 layers, d = 128, 590k parameters) on the generated
   corpus whose arithmetic lines are 3-digit additions (the recipe of ``runs/base``), so the base knows the
   "What is a+b? c" format and digits but has never seen a 2-digit sum (``--base PATH`` skips this stage);
2. SFT: `postrl sft` on a SMALL demonstration set, ``--sft-demos`` 2-digit additions (default 500), lr 1e-3
   after 20 warmup steps, for ``--checkpoint-sft-steps`` (default 300, ~38 epochs at batch 64), decayed by a
   cosine to ``--checkpoint-sft-min-lr-ratio`` × lr (default 1: constant).

Why such a checkpoint: RL is worth having when a verifier can score far more prompts than there are
demonstrations. GRPO draws its prompts from the task's 5,000 train problems and is rewarded by the exact-match
verifier; continued SFT, the honest alternative, trains on the demonstrations the checkpoint was made from
(``--continued-sft-demos all`` gives it every train problem's answer instead: with answers for all 5,000
problems, SFT on them is the stronger use of compute, see the notes in `benchmarks/grpo.py`). The default
checkpoint (500 demonstrations, 0.50 held-out) has NOT used its demonstrations up: continued SFT still gains.
With ``--sft-demos 250 --checkpoint-sft-min-lr-ratio 0.1`` SFT has: its held-out loss rises from step 100 on
(0.58 → 0.84) while its accuracy stays at 0.28-0.34, and continued SFT only overfits further.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# benchmarks/grpo.py's `_postrl(*args, log=...)`: run `postrl ARGS` in a fresh process, return its summary
PostRL = Callable[..., dict]
# the tiny world's SFT values (postrl sft's defaults are TRL's, for a real model)
SFT_PRESET = Path(__file__).resolve().parents[1] / "configs" / "sft-arithmetic.yaml"

BASE_PRETRAIN = [
    "model.n_layers=2", "model.hidden_size=128", "model.n_heads=4", "model.intermediate_size=512",
    "vocab_size=512", "corpus_lines=20000", "arithmetic={digits: 3}", "run.steps=800",
    "train.batch_size=64", "train.max_length=64", "train.packing=false", "optim.lr=0.001",
    "optim.min_lr_ratio=0.1", "optim.warmup_steps=50", "optim.weight_decay=0.0",
    "run.eval_every=100", "run.save_every=0", "run.device=cpu",
]  # fmt: skip


def sft_task(args: argparse.Namespace, task_opts: dict) -> dict:
    """Task options of the SFT demonstrations: the GRPO task restricted to the first ``--sft-demos`` problems."""
    return {**task_opts, "n_train": args.sft_demos}


def build_checkpoint(args: argparse.Namespace, task_opts: dict, postrl: PostRL) -> Path:
    """The recipe above → ``WORKDIR/arithmetic/sft-DEMOS-STEPS-RATIO-SEED/model`` (existing stages are reused)."""
    work = Path(args.workdir) / "arithmetic"
    base = Path(args.base) if args.base else work / f"base-{args.seed}" / "model"
    if not base.is_dir():
        postrl(
            "pretrain", "--out", str(base.parent), "--overwrite", *BASE_PRETRAIN, f"run.seed={args.seed}",
            f"run.threads={args.threads}", log=work / f"base-{args.seed}.log",
        )  # fmt: skip
    recipe = f"{args.sft_demos}-{args.checkpoint_sft_steps}-{args.checkpoint_sft_min_lr_ratio:g}-{args.seed}"
    model = work / f"sft-{recipe}" / "model"  # a changed recipe builds a new checkpoint
    if not model.is_dir():
        postrl(
            "sft", "--config", str(SFT_PRESET), "--model", str(base), "--data", "task:arithmetic",
            "--out", str(model.parent), "--overwrite", f"task={json.dumps(sft_task(args, task_opts))}",
            f"run.steps={args.checkpoint_sft_steps}", "train.batch_size=64", "train.max_length=48",
            "optim.lr=0.001", "optim.warmup_steps=20", f"optim.min_lr_ratio={args.checkpoint_sft_min_lr_ratio}",
            "run.eval_every=25", "run.save_every=0", f"run.seed={args.seed}", f"eval_size={args.eval_prompts}",
            "run.device=cpu", f"run.threads={args.threads}",
            log=work / f"sft-{recipe}.log",
        )  # fmt: skip
    return model


def _sft_settings(model: Path, task_opts: dict) -> tuple[float, int, dict]:
    """(lr, batch size, arithmetic task options) of the SFT run that wrote ``model`` (RUN_DIR/model), else
    (1e-3, 64, task_opts)."""
    config = model.parent / "config.yaml"
    if not config.is_file():
        return 1e-3, 64, task_opts
    import yaml

    cfg = yaml.safe_load(config.read_text())
    train, task = cfg.get("train", {}), cfg.get("task") or {}
    task = task.get("arithmetic", task)  # mixed-data SFT runs nest the options per task
    optim = cfg.get("optim") or train.get("optim", {})  # a run written before `optim:` left `train:`
    lr, batch = float(optim.get("lr", 1e-3)), int(train.get("batch_size", 64))
    return lr, batch, {**task_opts, **task}


def continued_sft(model_dir: Path, task_opts: dict, seconds: float, args: argparse.Namespace) -> list:
    """Continue SFT from ``model_dir`` for ``seconds`` of training (evaluation excluded), at the SFT run's lr
    held constant, on its demonstrations (``--continued-sft-demos all``: every train problem's); returns
    [(training seconds, held-out greedy accuracy)]."""
    import torch

    from postrl.lm.data import tokenize_sft
    from postrl.lm.evaluation import evaluate_task
    from postrl.lm.models import load_causal_lm
    from postrl.lm.spine import RunConfig
    from postrl.lm.tasks import get_task
    from postrl.lm.tokenizer import load_tokenizer
    from postrl.lm.trainer import OptimConfig, Supervised, TrainConfig, run_training
    from postrl.runtime.logging import RunLogger

    torch.set_num_threads(args.threads)
    tok, model = load_tokenizer(model_dir), load_causal_lm(model_dir)
    lr, batch_size, sft_opts = _sft_settings(model_dir, task_opts)
    if args.continued_sft_demos == "all":
        sft_opts = {**sft_opts, "n_train": get_task("arithmetic", **task_opts).config.n_train}
    task = get_task("arithmetic", **sft_opts)  # held-out problems do not depend on n_train
    examples = tokenize_sft(task.sft_rows("train"), tok, 64)
    cfg = TrainConfig(batch_size=batch_size, eval_examples=32)
    optim = OptimConfig(lr=lr, warmup_steps=0, min_lr_ratio=1.0)  # constant
    run = RunConfig(steps=10**6, eval_every=args.sft_eval_every, save_every=0, log_every=10, seed=args.seed)
    clock = {"start": time.perf_counter(), "eval": 0.0}

    def train_seconds() -> float:
        return time.perf_counter() - clock["start"] - clock["eval"]

    def accuracy(m: Any) -> float:
        return evaluate_task(m, tok, task, n=args.eval_prompts, max_new_tokens=args.max_new_tokens)["reward"]

    def evaluate(m: Any) -> dict[str, float]:
        now, start = train_seconds(), time.perf_counter()
        curve.append((round(now, 2), accuracy(m)))
        clock["eval"] += time.perf_counter() - start
        return {"heldout_accuracy": curve[-1][1]}

    curve: list = [(0.0, accuracy(model))]
    clock["start"] = time.perf_counter()
    out = Path(args.workdir) / "arithmetic" / "sft_continued"
    algo = Supervised(
        model, tok, examples, examples[:32], cfg, optim, run, device=torch.device("cpu"), name="sft",
        evaluate=evaluate, should_stop=lambda _: train_seconds() >= seconds,
    )  # fmt: skip
    run_training(algo, out, RunLogger(out))
    return curve
