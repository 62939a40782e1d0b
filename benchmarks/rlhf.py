"""Benchmark of the RLHF stages (issue 5) on the built-in `reviews` preference task, from its SFT model.

1. Reward model (`configs/rm-reviews.yaml`): held-out accuracy against the noisy labels and against the
   oracle (noise-free gold ordering), ECE, score statistics of SFT samples.
2. PPO (`configs/ppo-reviews.yaml`): held-out gold reward before and after, KL to the reference at the end,
   generated tokens per second, seconds per PPO step, peak memory. Goal: gold reward up by at least one
   standard deviation of the SFT samples' gold reward, at a bounded KL, within 10 minutes on 2 cores.
3. The same PPO with a small β (``--small-beta``): over-optimisation shows as the RM score rising while the
   gold reward falls (see its heldout.png).
4. Baseline at comparable compute: best-of-n sampling from the SFT model ranked by the RM (n = 4, 16) on the
   same held-out prompts; its KL to the SFT policy is log n − (n−1)/n (Stiennon et al. 2020, app. G.3).

Each training stage runs as its own ``postrl`` process (so its peak RSS is its own), like a user would:

    .venv/bin/python benchmarks/rlhf.py --sft runs/base/sft/model --out runs/bench-rlhf [--threads 1]

When the ``--sft`` folder does not exist it is built first (``build_sft``, deterministic): ``postrl pretrain`` of
the tiny Llama on the generated corpus (the recipe of ``benchmarks/_grpo_sft.BASE_PRETRAIN``) into
``SFT/../../pretrain``, then ``postrl sft`` on both tasks' demonstrations, stopped at 0.3 held-out arithmetic.

Prints a table and ends with ONE JSON line of results (also written to OUT/results.json).

Measured 2026-12-02 (``--sft`` = the recipe's SFT model, ':'-terminated review prompts; 2 cores shared with three
other jobs, load average 4.6): reward model held-out accuracy 0.811 (noisy labels) / 0.916 (oracle), ECE 0.070,
gold correlation 0.877, 186 s. PPO (configs/ppo-reviews.yaml: β 0.2, actor lr 3e-5, 100 steps of 64) raised
the held-out gold reward 0.033 → 0.784 (+0.752 = 1.09 std of the SFT samples' gold, 0.688) at KL 2.03 to the
reference, 473 s (4.43 s/step: generate 22 s, score 42 s, train 379 s in all), 1,742 generated tokens/s,
peak RSS 441 MiB. Best-of-4 0.678 (KL 0.64), best-of-16 0.848 (KL 1.84). β = 0.002: RM score 3.81 and gold
−2.66 at KL 104 (over-optimisation: responses grow from 8 to 21 tokens). With β 0.1 and lr 5e-5 the gold
reward peaked at 0.71 (step 50, KL 4.0) and fell to 0.60 by step 60 while the RM score kept rising.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch
from _record import record

# on top of configs/sft-arithmetic.yaml (the tiny world's SFT values; postrl sft's defaults are TRL's)
SFT_RECIPE = [
    "--data", "task:arithmetic,task:reviews", "task={arithmetic: {digits: 3}}", "run.steps=800",
    "train.batch_size=64", "train.max_length=48", "optim.lr=0.001", "optim.min_lr_ratio=0.1",
    "optim.warmup_steps=50", "run.eval_every=50", "run.save_every=50", "stop_accuracy=0.3",
]  # fmt: skip


def build_sft(sft: Path, threads: int) -> None:
    """Pretrain + SFT into ``sft`` (= RUN/sft/model; the base goes to RUN/pretrain), skipping a finished stage."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _grpo_sft import BASE_PRETRAIN

    base = sft.parent.parent / "pretrain"
    if not (base / "model").is_dir():
        run_stage("pretrain", None, base, [], [*BASE_PRETRAIN, f"run.threads={threads}"])
    flags, over = ["--model", str(base / "model")], [*SFT_RECIPE, f"run.threads={threads}"]
    run_stage("sft", "configs/sft-arithmetic.yaml", sft.parent, flags, over)


def run_stage(stage: str, config: str | None, out: Path, flags: list[str], overrides: list[str]) -> dict:
    """``postrl STAGE [--config CONFIG] --out OUT FLAGS OVERRIDES`` in a fresh process → its summary.json."""
    config_flags = [] if config is None else ["--config", config]
    cmd = [sys.executable, "-m", "postrl.cli", stage, *config_flags, "--out", str(out), "--overwrite", *flags]
    cmd += overrides
    print("$ " + " ".join(cmd[1:]), flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    summary = json.loads((out / "summary.json").read_text())
    summary["process_seconds"] = time.perf_counter() - start
    return summary


@torch.no_grad()
def best_of_n(sft: str, rm_dir: Path, ns: list[int], samples: int, max_new_tokens: int, seed: int) -> dict:
    """Gold reward of the RM's favourite among n SFT samples per held-out prompt (the prompts in turn, as
    PPO's evaluation), and of plain SFT samples (n = 1) with their std."""
    from postrl.lm.models import ScalarHeadModel, load_causal_lm
    from postrl.lm.ppo.advantages import reward_model_scores
    from postrl.lm.rollout import RolloutEngine, SamplingConfig
    from postrl.lm.tasks import get_task
    from postrl.lm.tokenizer import load_tokenizer

    task = get_task("reviews")
    prompts = task.prompts("test")
    prompts = [prompts[i % len(prompts)] for i in range(samples)]
    tokenizer = load_tokenizer(sft)
    engine = RolloutEngine(
        load_causal_lm(sft).eval(), tokenizer, SamplingConfig(max_new_tokens=max_new_tokens, temperature=1.0)
    )
    rm = ScalarHeadModel.from_pretrained(rm_dir).eval()
    generator = torch.Generator().manual_seed(seed)
    n_max = max(ns)
    start = time.perf_counter()
    gold = torch.zeros(n_max, samples)
    score = torch.zeros(n_max, samples)
    for k in range(n_max):  # sample k of every prompt
        for i in range(0, samples, 128):
            rollout = engine.generate(prompts[i : i + 128], generator=generator)
            score[k, i : i + 128] = reward_model_scores(rm, rollout)
            gold[k, i : i + 128] = torch.tensor(task.gold_reward(rollout.prompts, rollout.texts))
    out = {
        "sft_gold_reward": float(gold[0].mean()),
        "sft_gold_std": float(gold[0].std()),
        "sft_rm_score": float(score[0].mean()),
        "seconds": time.perf_counter() - start,
    }
    for n in ns:
        best = score[:n].argmax(0)  # (samples,)
        out[f"bon{n}_gold_reward"] = float(gold[:n].gather(0, best[None])[0].mean())
        out[f"bon{n}_rm_score"] = float(score[:n].gather(0, best[None])[0].mean())
        out[f"bon{n}_kl"] = math.log(n) - (n - 1) / n
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sft", default="runs/base/sft/model", help="SFT model of the reviews task (built when missing)"
    )
    parser.add_argument("--out", default="runs/bench-rlhf", help="folder for the runs and results.json")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads per stage")
    parser.add_argument("--rm-steps", type=int, default=None, help="RM steps (default: the preset's)")
    parser.add_argument("--ppo-steps", type=int, default=None, help="PPO steps (default: the preset's)")
    parser.add_argument(
        "--small-beta", type=float, default=0.002, help="β of the over-optimisation run (0: skip)"
    )
    parser.add_argument("--skip-rm", action="store_true", help="reuse OUT/rm from an earlier run")
    parser.add_argument("--eval-size", type=int, default=256, help="held-out samples per evaluation")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    common = [f"run.threads={args.threads}"]
    if not Path(args.sft).is_dir():
        build_sft(Path(args.sft), args.threads)
    if args.skip_rm:
        rm = json.loads((out / "rm" / "summary.json").read_text())
    else:
        rm_over = common + ([] if args.rm_steps is None else [f"run.steps={args.rm_steps}"])
        rm = run_stage("rm", "configs/rm-reviews.yaml", out / "rm", ["--model", args.sft], rm_over)
    ppo_flags = ["--model", args.sft, "--reward-model", str(out / "rm" / "model")]
    ppo_over = [*common, f"eval_size={args.eval_size}"]
    if args.ppo_steps is not None:
        ppo_over.append(f"run.steps={args.ppo_steps}")
    ppo = run_stage("ppo", "configs/ppo-reviews.yaml", out / "ppo", ppo_flags, ppo_over)
    small = None
    if args.small_beta > 0:
        over = [*ppo_over, f"kl.beta={args.small_beta}"]
        small = run_stage("ppo", "configs/ppo-reviews.yaml", out / "ppo-small-beta", ppo_flags, over)
    bon = best_of_n(args.sft, out / "rm" / "model", [4, 16], args.eval_size, 24, seed=1)
    result = report(rm, ppo, small, bon)
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    record("rlhf", result)
    print(json.dumps(result))


def report(rm: dict, ppo: dict, small: dict | None, bon: dict) -> dict:
    """Print the table; return the results."""
    keep = ("gold_reward", "start_gold_reward", "rm_score", "start_rm_score", "kl_to_ref", "kl_k3")
    keep += ("seconds_per_step", "tokens_per_second", "time_generate", "time_score", "time_train")
    keep += ("wall_seconds", "peak_rss_mb", "steps", "beta")

    def pick(s: dict | None) -> dict | None:
        return None if s is None else {k: s.get(k) for k in keep}

    rm_keep = ("heldout_accuracy", "gold_accuracy", "heldout_margin", "heldout_ece", "gold_correlation")
    rm_keep += (
        "sft_score_mean",
        "sft_score_std",
        "sft_gold_mean",
        "sft_gold_std",
        "wall_seconds",
        "peak_rss_mb",
    )
    result = {
        "rm": {k: rm.get(k) for k in rm_keep},
        "ppo": pick(ppo),
        "ppo_small_beta": pick(small),
        "best_of_n": bon,
    }
    gain = ppo["gold_reward"] - ppo["start_gold_reward"]
    result["ppo_gold_gain"] = gain
    result["ppo_gold_gain_in_sft_std"] = gain / bon["sft_gold_std"]
    result["goal_met"] = gain >= bon["sft_gold_std"] and ppo["wall_seconds"] <= 600
    print(
        f"\nreward model: held-out accuracy {rm['heldout_accuracy']:.3f} (noisy labels), "
        f"{rm['gold_accuracy']:.3f} (oracle), ECE {rm['heldout_ece']:.3f}, {rm['wall_seconds']:.0f} s"
    )
    print(f"{'policy':<22} {'gold':>7} {'RM score':>9} {'KL':>7}")
    print(
        f"{'SFT (held-out)':<22} {ppo['start_gold_reward']:>7.3f} {ppo['start_rm_score']:>9.3f} {0.0:>7.3f}"
    )
    print(f"{'PPO':<22} {ppo['gold_reward']:>7.3f} {ppo['rm_score']:>9.3f} {ppo['kl_to_ref']:>7.3f}")
    if small is not None:
        name = f"PPO beta={small['beta']:.3g}"
        print(f"{name:<22} {small['gold_reward']:>7.3f} {small['rm_score']:>9.3f} {small['kl_to_ref']:>7.3f}")
    for n in (4, 16):
        print(
            f"{f'best-of-{n}':<22} {bon[f'bon{n}_gold_reward']:>7.3f} {bon[f'bon{n}_rm_score']:>9.3f} {bon[f'bon{n}_kl']:>7.3f}"
        )
    print(
        f"PPO: gold +{gain:.3f} = {result['ppo_gold_gain_in_sft_std']:.2f} SFT std ({bon['sft_gold_std']:.3f}); "
        f"{ppo['seconds_per_step']:.2f} s/step, {ppo['tokens_per_second']:.0f} generated tok/s, "
        f"{ppo['wall_seconds']:.0f} s, peak RSS {ppo['peak_rss_mb']:.0f} MiB; goal met: {result['goal_met']}"
    )
    return result


if __name__ == "__main__":
    main()
