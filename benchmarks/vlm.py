"""Benchmark of RL with visual input (issue 21): the built-in tiny VLM on ``task:shapes``, SFT → GRPO against
continued SFT for the same training time, and the image-free baseline. Ends with ONE JSON line of results.

Per seed, every stage through postrl's own entry points (`run_vlm_pretrain`, `postrl.lm.sft.run_sft`,
`postrl.lm.grpo.run_grpo`, which hand a VLM folder to `postrl.lm.vlm`):

1. alignment: the tiny LLaVA (CLIP tower 32 px / 8 px patches, projector, 2-layer Llama d=128) built from
   the seed and trained on captions of the shapes pictures ("Describe the picture." → "3 red dots");
2. SFT on ``--sft-demos`` demonstrations (the first train scenes), stopped once held-out greedy accuracy
   reaches ``--band`` (checked every 10 steps);
3. from that checkpoint, for ``--budget`` seconds of training each (evaluation excluded):
   GRPO on every train prompt with the verifier as the only signal (no answers shown; the whole VLM trains,
   as TRL's GRPOTrainer, the ``grpo-shapes`` preset's settings), and continued SFT on the same
   demonstrations (``sft-shapes``'s);
4. the image-free baseline: the aligned model fine-tuned on every train demonstration with blank pictures
   (``task.blank``) for the same budget, and the best image-free guess per question text
   (`ShapesTask.prior_accuracy`).

Held-out accuracy: greedy, the first word of the answer against the truth, on ``--eval-size`` held-out scenes.
The setting it measures: demonstrations are the scarce, expensive thing (``--sft-demos``: 100 written answers),
a verifier is cheap and GRPO asks it about all 4,000 train pictures; continued SFT can only repeat the 100.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/vlm.py --seeds 0 1 2 --budget 300

Measured: see the README section "Vision-language models" (numbers with the load average of their run).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from _record import record


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def stages(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    from postrl.lm.grpo import GRPOConfig, run_grpo
    from postrl.lm.grpo.config import GRPOLossConfig
    from postrl.lm.rollout import SamplingConfig
    from postrl.lm.sft import SFTConfig, run_sft
    from postrl.lm.spine import RunConfig
    from postrl.lm.tasks import get_task
    from postrl.lm.trainer import OptimConfig, TrainConfig
    from postrl.lm.vlm import VLMPretrainConfig, run_vlm_pretrain

    out = Path(args.out) / f"seed{seed}"
    shapes = {"n_train": 4000, "n_test": args.eval_size, "difficulty": args.difficulty}
    demos = {**shapes, "n_train": args.sft_demos}
    train = TrainConfig(batch_size=32, max_length=128, eval_examples=128)
    sft_optim = OptimConfig(lr=args.sft_lr, warmup_steps=0, min_lr_ratio=1.0)

    def run(steps: int, **kw: Any) -> RunConfig:
        return RunConfig(seed=seed, steps=steps, save_every=0, log_every=5, threads=args.threads, **kw)

    result: dict[str, Any] = {"seed": seed, "load_start": _load()}
    align_cfg = VLMPretrainConfig(task=shapes, train=train, run=run(args.align_steps, eval_every=0))
    reuse = args.reuse and (out / "align" / "summary.json").is_file()
    align = _summary(out / "align") if reuse else run_vlm_pretrain(align_cfg, out / "align", overwrite=True)
    result["align"] = {k: align[k] for k in ("heldout_loss", "steps", "train_seconds")}

    sft_cfg = SFTConfig(
        model=str(out / "align" / "model"), data="task:shapes", task=demos, train=train, optim=sft_optim,
        run=run(args.sft_max_steps, eval_every=10), eval_size=args.eval_size, eval_max_new_tokens=4,
        stop_accuracy=args.band,
    )  # fmt: skip
    reuse = reuse and args.reuse_sft and (out / "sft" / "summary.json").is_file()
    sft = _summary(out / "sft") if reuse else run_sft(sft_cfg, out / "sft", overwrite=True)
    result["sft"] = {k: sft.get(k) for k in ("heldout_accuracy", "steps", "train_seconds")}
    start = str(out / "sft" / "model")

    grpo_cfg = GRPOConfig(
        model=start, data="task:shapes", task=shapes, eval_size=args.eval_size, max_prompt_length=64,
        sampling=SamplingConfig(max_new_tokens=4, temperature=1.0, top_k=args.top_k),
        grpo=GRPOLossConfig(group_size=args.group_size, prompts_per_step=args.prompts_per_step, beta=0.0,
                            loss_type="grpo"),
        optim=OptimConfig(lr=args.grpo_lr, warmup_steps=args.grpo_warmup, min_lr_ratio=1.0, betas=(0.9, 0.999)),
        run=run(100_000, eval_every=0, max_seconds=args.budget),
    )  # fmt: skip
    result["load_before_grpo"] = _load()
    grpo = run_grpo(grpo_cfg, out / "grpo", overwrite=True)
    result["load_after_grpo"] = _load()
    result["grpo"] = {
        k: grpo.get(k)
        for k in ("heldout_accuracy_start", "heldout_accuracy", "steps", "train_seconds", "tokens_per_second")
    }
    result["grpo"]["steps_per_second"] = grpo["steps"] / grpo["train_seconds"]
    result["grpo"]["peak_rss_mb"] = grpo.get("peak_rss_mb")
    result["grpo"]["by_kind"] = {
        k[len("heldout_accuracy/") :]: v for k, v in grpo.items() if "accuracy/" in k
    }

    more = replace(
        sft_cfg, model=start, run=run(100_000, eval_every=0, max_seconds=args.budget), stop_accuracy=None
    )
    cont = run_sft(more, out / "continued_sft", overwrite=True)
    result["continued_sft"] = {k: cont.get(k) for k in ("heldout_accuracy", "steps", "train_seconds")}
    result["continued_sft"]["by_kind"] = {
        k[len("heldout_accuracy/") :]: v for k, v in cont.items() if "accuracy/" in k
    }
    result["load_after_continued_sft"] = _load()

    task = get_task("shapes", **shapes)
    result["image_free"] = {
        "sft_blank_pictures": None,
        "best_guess_per_question": task.prior_accuracy("test"),
        "chance": task.chance_accuracy("test"),
    }
    result["gain_grpo_over_sft"] = grpo["heldout_accuracy"] - sft["heldout_accuracy"]
    result["gain_grpo_over_continued_sft"] = grpo["heldout_accuracy"] - cont["heldout_accuracy"]
    if not args.skip_image_free:
        result["image_free"]["sft_blank_pictures"] = image_free_sft(args, more, out, shapes, run)
    result["load_end"] = _load()
    print(json.dumps(result), flush=True)
    return result


def image_free_sft(args: argparse.Namespace, more: Any, out: Path, shapes: dict, run: Any) -> float:
    """Held-out accuracy of the aligned model fine-tuned on every demonstration with blank pictures."""
    from postrl.lm.sft import run_sft

    blank_run = run(100_000, eval_every=0, max_seconds=args.image_free_budget or args.budget)
    blank = replace(more, model=str(out / "align" / "model"), task={**shapes, "blank": True}, run=blank_run)
    return run_sft(blank, out / "image_free", overwrite=True)["heldout_accuracy"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument(
        "--budget", type=float, default=300.0, help="training seconds of GRPO and continued SFT"
    )
    parser.add_argument("--image-free-budget", type=float, default=None, help="seconds (default: --budget)")
    parser.add_argument("--align-steps", type=int, default=500)
    parser.add_argument(
        "--sft-demos", type=int, default=100, help="SFT's demonstrations (the first train scenes)"
    )
    parser.add_argument("--sft-max-steps", type=int, default=400)
    parser.add_argument("--sft-lr", type=float, default=3e-4)
    parser.add_argument("--band", type=float, default=0.45, help="SFT stops at this held-out accuracy")
    parser.add_argument("--grpo-lr", type=float, default=1e-4)
    parser.add_argument("--grpo-warmup", type=int, default=10, help="GRPO's linear lr warmup steps")
    parser.add_argument("--top-k", type=int, default=5, help="GRPO draws among the k likeliest tokens")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--difficulty", type=int, default=1)
    parser.add_argument("--eval-size", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="runs/bench-vlm")
    parser.add_argument("--reuse", action="store_true", help="keep an aligned model found in --out")
    parser.add_argument("--reuse-sft", action="store_true", help="with --reuse, keep the SFT checkpoint too")
    parser.add_argument("--skip-image-free", action="store_true", help="no image-free SFT run (tuning)")
    args = parser.parse_args()
    tic = time.perf_counter()
    runs = [stages(args, seed) for seed in args.seeds]

    def mean(path: tuple[str, str]) -> float:
        return sum(r[path[0]][path[1]] for r in runs) / len(runs)

    summary = {
        "benchmark": "vlm",
        "seeds": args.seeds,
        "budget_seconds": args.budget,
        "sft_demos": args.sft_demos,
        "band": args.band,
        "sft": mean(("sft", "heldout_accuracy")),
        "grpo": mean(("grpo", "heldout_accuracy")),
        "continued_sft": mean(("continued_sft", "heldout_accuracy")),
        "image_free_sft": [r["image_free"]["sft_blank_pictures"] for r in runs],
        "image_free_best_guess": mean(("image_free", "best_guess_per_question")),
        "chance": mean(("image_free", "chance")),
        "grpo_steps_per_second": mean(("grpo", "steps_per_second")),
        "grpo_generated_tokens_per_second": mean(("grpo", "tokens_per_second")),
        "peak_rss_mb": max(r["grpo"]["peak_rss_mb"] or 0 for r in runs),
        "runs": runs,
        "wall_seconds": round(time.perf_counter() - tic, 1),
    }
    record("vlm", summary)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
