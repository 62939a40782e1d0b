"""Benchmarks of GRPO (issue 6), one function per part. Each ends with ONE JSON line of results.

Part ``arithmetic``: the built-in ``arithmetic`` task (2-digit addition) from an SFT checkpoint that the
benchmark builds itself unless ``--sft`` is given (`_grpo_sft.py`: a tiny Llama pretrained on a corpus of
3-digit sums, then SFT on 500 demonstrations). Held-out greedy exact-match
accuracy before and after a fixed training budget (seconds of training, evaluation excluded), seconds per step
and where they go, generated tokens per second and peak memory of `postrl grpo` with the
``configs/grpo-arithmetic.yaml`` preset (32 prompts x G = 8, <= 8 new tokens, temperature 1, AdamW 2e-4
constant, beta 0.04 with k3, eps 0.2, mu = 1, the DeepSeekMath per-response loss), and, from the same checkpoint
and for the same training time, the accuracy that continued SFT on the checkpoint's demonstrations reaches
(the honest alternative; ``--continued-sft-demos all`` gives it every train problem's answer instead).

    .venv/bin/python benchmarks/grpo.py --part arithmetic --budget 180 [--base runs/base/pretrain/model]

Part ``trl``: `postrl grpo` beside Hugging Face TRL's ``GRPOTrainer`` on TRL's own toy task
(``benchmarks/peers/trl_grpo_bench.py``: "add a b =" prompts, character tokenizer, 2-layer GPT-2 of 407k
parameters, its rule-based reward), at equal settings: G = 8, 16 completions of ≤ 16 tokens per step, β 0.04,
``loss_type="grpo"``, μ = 1, AdamW constant lr (1e-4 from the warm start; 1e-3, TRL's, from the random init),
grad-norm clip 1, temperature 1, and TRL 1.16's defaults that its worker below leaves unset, matched on
postrl's side: k3 weighted by the ratio (``use_bias_correction_kl=True``: postrl ``grpo.unbiased_kl=true``;
``--unbiased-kl 0`` turns it off in both), ε 0.2 with ε_high = ε, ``scale_rewards="group"`` (Bessel std + 1e-4),
AdamW betas (0.9, 0.999), eps 1e-8, no weight decay, top_p 1, top_k 0, no masking of truncated completions,
one optimiser step per generation batch (ratio exactly 1 at μ = 1), the reference model loaded (β > 0),
dropout 0 (the model's config; TRL's ``disable_dropout=False`` is then moot). Both start from the same SFT
warm start (a from-scratch policy learns only the format; a second pair of runs from TRL's random init
measures throughput at TRL's own benchmark setting, where completions are long and generation dominates) and
are evaluated alike: greedy completions of the 100 problems, correct when the completion starts with the
answer. postrl loads the GPT-2 through its Hugging Face fallback path. TRL runs in its own virtual environment (this file, ``--trl-worker`` mode):

    make peers    # benchmarks/peers/.venv-trl, from benchmarks/peers/requirements-trl.txt (TRL 1.16, pinned)
    .venv/bin/python benchmarks/grpo.py --part trl --steps 200

Part ``family`` (issue 25): RLOO and DAPO beside TRL on the same task and warm start, β = 0 in both (TRL's
GRPOTrainer default; RLOOTrainer's 0.05 puts the KL in the reward, postrl in the loss, so only β = 0 is the
same algorithm). First the identical-batch check: TRL samples and scores one batch (2 prompts x 8), shifts its
old log-probs by 0.2·N(0, 1) per token so that ratios leave 1 and clipping acts (ε 0.2, ε_high 0.28), and
takes its own ``compute_loss`` and gradient; postrl computes its advantages from the same rewards and the
trainer's loss (`grpo_batch_loss`) of the same tokens and old log-probs. Then ``--steps`` of each contender x
``--repeats`` seeds, interleaved: postrl RLOO (``grpo.advantage=rloo grpo.importance_level=sequence_sum``: the
response's likelihood ratio, as ``RLOOTrainer``) vs ``RLOOTrainer``; postrl's DAPO preset (token loss, ε_high
0.28, dynamic sampling, overlong buffer 4 of 16) and postrl at GRPOTrainer's exact settings (``dapo_trl``:
token loss, ε_high = ε) vs ``GRPOTrainer`` with its default ``loss_type="dapo"``.

    .venv/bin/python benchmarks/grpo.py --part family --steps 60 --eval-every 60 --repeats 3

Measured 2026-12-03 at a load average of 9-16 (every helper's jobs; wall-clock medians are ~10x the idle
machine's, so only the side-by-side ratios mean something): identical batch, RLOO: loss 0.02912172 in both
(|diff| 0), advantages equal, gradient max |diff| 4.2e-7 (max |grad| 0.93), 31% of responses clipped; DAPO:
loss 0.01425120 vs 0.01425118 (|diff| 1.9e-8), advantages 2.4e-7, gradient 2.1e-7 (max 0.28), 16% of tokens
clipped. 60 steps x 3 seeds: RLOO 0.353 s/step vs RLOOTrainer 1.012 (2.87x; TRL's RLOO re-scores old log-probs
every step, GRPOTrainer skips that at μ = 1, as postrl does), peak RSS 424 vs 498 MB; DAPO preset 0.307 vs
GRPOTrainer 0.559 (1.82x), 425 vs 498 MB; at GRPOTrainer's exact settings 0.345 (1.62x). Held-out greedy
accuracy at step 60 (from 0.57; per-seed sd ~0.1): RLOO 0.387 vs 0.453, DAPO preset 0.357 and dapo_trl 0.347
vs 0.470 — postrl lower in this small sample (as in the issue's one seed at β = 0) although the loss and
gradient of one batch agree to 2e-7. More seeds (same day, load 4.5-7, ``--seed 3 --repeats 6 --eval-every 20``
per member, then ``--members rloo --seed 9 --repeats 8 --steps 40 --eval-every 10``) show seed noise, not a
gap: seeds 3-8 at step 60, DAPO preset 0.412 and dapo_trl 0.445 vs GRPOTrainer 0.410, RLOO 0.443 vs
RLOOTrainer 0.420; pooled with seeds 0-2 (9 seeds, standard error ~0.025 each): dapo_trl 0.412 vs 0.430, RLOO
0.424 vs 0.431; seeds 9-16 at step 40: RLOO 0.420 vs 0.438, dapo_trl 0.401 and DAPO preset 0.401 vs
0.415. Averaged over the checks from the first on, postrl sits 0.02-0.04 lower in each of these four samples
(per-seed paired differences -0.021 ± 0.032 RLOO, -0.019 ± 0.033 dapo_trl for seeds 9-16): about 1.5
standard errors pooled; postrl's low tail looked heavier (2 of 17 dapo_trl runs near 0.20, TRL's lowest 0.29).
Settled 2026-12-05 (issue 36): it is seed noise. Coupled (``benchmarks/grpo_coupled.py``: TRL given postrl's
prompt order and postrl's sampling draws, everything else its own), the two trainers take the same completions,
rewards and gradient norms at every step while coupled (60 of 60 on 10 of 12 seeds), and end within 0.01 on every seed (GRPO, dapo_trl
and RLOO; TRL too falls to 0.20-0.24 on the seeds where postrl did); the whole `postrl grpo` trainer fed TRL's
sampled batches (seed 0, 30 steps) ends 3.9e-5 from TRL's weights (TRL moved them 2.2e-3). TRL's per-step
``log_history`` is now kept in the worker's results (``log_history``) beside postrl's metrics.jsonl. The training statistics agree (mean over 60 steps x 6 seeds,
postrl vs TRL: reward 0.485 vs 0.486 DAPO, 0.476 vs 0.489 RLOO; entropy 0.70 vs 0.70; length 3.44 vs 3.43).
Ruled out one by one: the sampler (tests/lm/test_sampling_distribution.py: χ² of the continuations drawn
by the fast and HF decoders against softmax(logits / τ); on this warm start 20,000 draws of 3 tokens per
prompt give z -0.1 and -0.5, as HF ``generate``), the settings (printed side by side: 25 resolved keys
identical, see `_postrl_settings`), the rewards and masks (postrl's reward path on TRL's sampled batch:
|diff| 0), the evaluation (TRL's worker evaluation of postrl's nine final models gives postrl's accuracies
exactly). Both trainers LOWER greedy accuracy from 0.57 while sampled accuracy stays ~0.25: the warm start's
answers are nearly tied (median probability of the top first digit 0.36, a top-2 gap under 0.05 on 21% of
the prompts), so 60 noisy steps at lr 1e-4 reshuffle the greedy answers; the reward does not yet move p(right).
Where postrl's step goes at β = 0 on this task (CPU time per step, 60 steps, in-process): 27.1 ms = sampling
and decoding 9.1, rewards 0.7, the rest of collect 1.0, training forward 5.8, backward 7.3, gradient clipping
0.8, AdamW and bookkeeping 2.2; old-log-prob scoring is skipped at μ = 1 (the sampling log-probs are π_old:
time_score 0.04 ms). No single phase left to drop: TRL does the same generation, forward and backward.

Timings on a shared 2-core machine are noisy (another busy process slows a run many times over): the runs
record the load average, and the parts alternate the two contenders where they can. Use 1 torch thread there:
with 2 threads on a machine whose cores are busy, a forward pass was measured 30x slower than with 1.

Measured 2026-12-02 on the shared 2-core machine at a load average of 12-18 (so every time is inflated):
- arithmetic, evening, idle machine (load 0.5-1.0), after the fast teacher-forced forwards
  (``--part arithmetic --budget 180 --sft runs/grpo-bench/sft500/model``, the same 500-demonstration
  checkpoint as below): GRPO 0.50 -> 0.83 greedy (+33 points; 0.625 at step 20, 0.755 at 80, 0.835 at 120;
  sampled 0.74) in 440 steps / 180 s, 0.41 s/step (generation 0.093, reference 0.085, training 0.23), 2,875
  generated tokens/s (12,667 in generation alone), peak RSS 524 MB; continued SFT for the same 180 s: 0.50 ->
  0.67.
- arithmetic (``--part arithmetic --budget 180``, the 500-demonstration checkpoint, load average 14-17, GRPO
  run at normal priority): GRPO 0.50 -> 0.705 greedy (+20.5 points; 0.625 at step 20, 0.665 at 40; sampled
  0.40 -> 0.535) in 58 steps of 32 x 8, 3.13 s/step (generation 0.71 s, reference scoring 0.74 s, training
  forward/backward 1.67 s), 376 generated tokens/s (1,665 in generation alone), peak RSS 510 MB, 25% of
  groups with zero reward std, k3 KL 0.20; continued SFT on the same 500 demonstrations for the same 181 s:
  0.50 -> 0.595 (0.55-0.65 from 70 s on). An earlier run (same seed) had the same accuracy at steps 20 and 40.
  From the 250-demonstration checkpoint (``--sft-demos 250 --checkpoint-sft-min-lr-ratio 0.1``, 0.315,
  overfit): GRPO 0.315 -> 0.39 (dipping to 0.25 at step 20; 52% zero-std groups) in 62 steps, continued SFT
  0.315 -> 0.195. From the earlier 35% checkpoint (200 steps into an SFT on all 5,000 answers, far from
  converged): GRPO 0.35 -> 0.49 by step 75 and no higher by step 100, continued SFT on the 5,000 answers
  0.35 -> 0.89 in 180 s. So GRPO's gain is bounded by what the policy can already sample: it sharpens (greedy
  and sampled accuracy rise together, entropy falls) more than it teaches; a model that SFT can still teach
  gains more from SFT when answers for every prompt exist. lr: 2e-4 (the preset) learns; 1e-4 gave the same
  accuracy at step 20 (0.63); 5e-4 collapses (0.35 -> 0.16 by step 20, also with 20 warmup steps): one AdamW
  step at 2e-4 already moves the policy by a k3 KL of ~0.1 per token.
- TRL task, 2026-12-03, idle machine (load 0.7-1.0: the benchmark alone), after the fast decoders stopped folding
  LayerNorm into the next GEMM (building one: 0.5 -> 0.16 ms, three per step) and a list-built left_pad
  (``--part trl --steps 200 --scratch-steps 40 --order postrl trl`` x 6): warm start 200 steps x 6 seeds:
  postrl 0.0300 s/step vs TRL 0.0641 (2.14x), generation 6,502 vs 2,780 tokens/s, peak RSS 479 vs 497 MB;
  held-out greedy accuracy at step 200 0.352 vs 0.377 (per seed: postrl 0.22 0.36 0.41 0.35 0.44 0.33, TRL 0.39
  0.54 0.23 0.36 0.47 0.27; difference 0.025, its standard error 0.058), over the ten checks from step 20 on
  0.367 vs 0.387. From the random init, 40 steps x 6: 0.0594 vs 0.1291 s/step (2.17x), accuracy 0.065 vs
  0.042. Where postrl's ~27 ms go (medians, 200 steps): generation 6.9 ms, reference scoring 4.4, training 15.0.
  Arithmetic (``--part arithmetic --budget 180``, its checkpoint built from scratch by the script: 0.725): GRPO
  0.725 -> 0.955 greedy (+23 points; 0.78 at step 20, 0.895 at 100, 0.935 at 300; sampled 0.885) in 447 steps
  / 180 s, 0.403 s/step (generation 0.082, reference 0.081, training 0.238), 2,920 generated tokens/s (14,370
  in generation alone), peak RSS 588 MB; continued SFT for the same 180 s: 0.725 -> 0.925.
- TRL task, 2026-12-02 evening, on the idle machine (load 0.5-1.1), after the teacher-forced forwards through
  the fast decoders (`postrl.lm.rollout.forwards`), fused AdamW and the sigmoid-form GELU: warm start at 0.57,
  lr 1e-4, contenders alternated. 200 steps x 6 seeds: postrl 0.0386 s/step vs TRL 0.0712 (1.84x), generation
  4,954 vs 2,455 tokens/s, peak RSS 413 vs 503 MB; held-out greedy accuracy at step 200 0.363 vs 0.377 (mean
  over seeds; over the ten checks from step 20 on 0.367 vs 0.387; per-seed sd 0.07-0.10, so 0.03 for a mean
  of 6). 60 and 100 steps x 2 seeds: 0.0324 vs 0.0638 (1.97x) and 0.0323 vs 0.0639 (1.98x). From the random
  init (16-token responses), 40 steps x 6: 0.0673 vs 0.1403 (2.08x); 20 steps x 2: 0.0710 vs 0.1302 (1.83x).
  The same morning code measured on the same idle machine: 0.0529 vs 0.0886 (1.67x). Where postrl's ~33 ms
  go (60 steps): generation 8.8 ms, reference scoring 5.5, training 18.9 (forward 5.9, backward 7.8, AdamW 1.1,
  clipping 0.9); GEMMs are ~12 ms of it and close to this CPU's 30 GFLOP/s, the rest is per-op overhead.
- Earlier, on the loaded machine: postrl 0.42 s/step vs TRL 0.69 (1.63x). Accuracy (unbiased KL in both; mean
  over seeds, postrl vs TRL): 10 seeds x 40 steps: 0.397 vs 0.413 at step 20, 0.408
  vs 0.449 at step 40 (per-seed sd 0.07-0.10: seed 0 alone gives postrl 0.20 and TRL 0.35); 6 seeds x 200
  steps: 0.368 vs 0.355 at step 200, 0.361 vs 0.390 averaged over the evaluations at steps 20-200. Both first
  drop from 0.57 within a few steps (group-std scaling magnifies the reward's format credit and tiny length
  term inside all-wrong groups; Adam's first steps move every weight by ~lr). On one fixed batch the two
  trainers' gradients agree to 6e-7 and five AdamW steps to 4e-4 of the weights' movement, and postrl's
  sampler matches the model's probabilities, so the gap a single seed shows is seed variance, not a
  difference of algorithm. (TRL logs frac_reward_zero_std 0 for most all-equal groups: float32 rounding of
  the mean leaves a std of 1.6e-8 > isclose's 1e-8; 5 of 80 groups were all-equal in a 40-step TRL run, so
  its 0 is not comparable with postrl's zero_std_fraction.)

Measured along the way (the commit that made each change names the command): a decoder build 0.5 ms with
LayerNorm folded into the next projection vs 0.16 ms reading its weights (three builds per GRPO step);
`left_pad` 0.4 ms with a slice assignment per row vs 0.09 ms from lists (16 prompts); fused AdamW about 3x
faster than foreach on the tiny model on CPU.
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / "benchmarks" / "peers"  # trl_grpo_bench.py; its venv: `make peers`
THIS = Path(__file__).resolve()
MAX_NEW_TOKENS = 16  # TRL task: max_completion_length


# ---- TRL's task, as postrl reward functions (loaded by spec: benchmarks/grpo.py:trl_reward) -------------------
def _peer():
    if str(PEERS) not in sys.path:
        sys.path.insert(0, str(PEERS))
    import trl_grpo_bench

    return trl_grpo_bench


def trl_reward(prompts: list[str], completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """TRL task's reward (1 for the right answer first, 0.2 format credit, small length shaping)."""
    return _peer().arith_reward_values(completions, answer, MAX_NEW_TOKENS)


def trl_correct(prompts: list[str], completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """1 when the completion starts with the answer: the accuracy both contenders report."""
    return [1.0 if c.lstrip().startswith(a) else 0.0 for c, a in zip(completions, answer, strict=True)]


def _write_jsonl(rows: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _postrl(*args: str, log: Path) -> dict:
    """Run ``postrl ARGS`` in a fresh process (its own peak memory); return its summary, with
    ``tree_rss_mb``: the resident set of it and its children (a generation lane) summed, sampled every 0.2 s."""
    from real_size import measured  # this folder is on sys.path when a benchmark runs

    _, _, tree, _ = measured([sys.executable, "-m", "postrl.cli", *args], log, ROOT)
    return {**json.loads(log.read_text().strip().splitlines()[-1]), "tree_rss_mb": round(tree, 1)}


def _curve(run_dir: Path, key: str) -> list[tuple[int, float, float]]:
    """(step, training seconds so far, value of key) from a GRPO run's metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    out, seconds = [], 0.0
    for r in rows:
        seconds += r.get("time_step", 0.0)
        if key in r:
            out.append((r["step"], round(seconds, 2), r[key]))
    return out


def _step_times(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["time_step"] for r in rows if "time_step" in r]


# ---- part: arithmetic ---------------------------------------------------------------------------------------
def _phase_means(steps: list[dict]) -> dict[str, float]:
    """Mean per step of where the time goes and of the group statistics (metrics.jsonl rows)."""
    keys = ["time_generate", "time_score", "time_train", "time_step", "zero_std_fraction", "kl", "entropy"]
    return {k: round(statistics.mean(r[k] for r in steps), 3) for k in keys if all(k in r for r in steps)}


def bench_arithmetic(args: argparse.Namespace) -> dict:
    """GRPO from the SFT checkpoint for a fixed training budget vs continued SFT for the same time."""
    # imported here: `postrl grpo` loads this file by path for the TRL part's rewards (no benchmarks/ on sys.path)
    from _grpo_sft import build_checkpoint, continued_sft

    work = Path(args.workdir) / "arithmetic"
    work.mkdir(parents=True, exist_ok=True)
    task_opts = json.loads(args.task)
    sft = Path(args.sft) if args.sft else build_checkpoint(args, task_opts, _postrl)
    before = os.getloadavg()[0]
    summary = _postrl(
        "grpo", "--config", str(ROOT / "configs" / "grpo-arithmetic.yaml"), "--model", str(sft),
        "--out", str(work / "grpo"), "--overwrite", f"task={json.dumps(task_opts)}",
        f"run.max_seconds={args.budget}", "run.steps=1000000", f"run.eval_every={args.eval_every}",
        f"eval_size={args.eval_prompts}", f"sampling.max_new_tokens={args.max_new_tokens}", "run.save_every=0",
        f"run.threads={args.threads}", f"run.seed={args.seed}", *args.grpo_set,
        log=work / "grpo.log",
    )  # fmt: skip
    rows = [json.loads(line) for line in (work / "grpo" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time_step" in r]
    gen_tps = sum(r["generated_tokens"] for r in steps) / sum(r["time_generate"] for r in steps)
    middle = os.getloadavg()[0]
    sft_curve = continued_sft(sft, task_opts, summary["train_seconds"], args)
    grpo_curve = _curve(work / "grpo", "heldout_accuracy")
    result = {
        "checkpoint": str(sft),
        "accuracy_before": summary.get("heldout_accuracy_start"),
        "accuracy_after_grpo": summary["heldout_accuracy"],
        "accuracy_after_grpo_sampled": summary.get("heldout_accuracy_sampled"),
        "accuracy_after_continued_sft": sft_curve[-1][1],
        "continued_sft_demos": args.continued_sft_demos,
        "train_seconds": summary["train_seconds"],
        "steps": summary["steps"],
        "seconds_per_step": summary["seconds_per_step"],
        "per_step": _phase_means(steps),
        "generated_tokens_per_s": summary["tokens_per_second"],
        "generate_only_tokens_per_s": gen_tps,
        "peak_rss_mb": summary["peak_rss_mb"],
        "grpo_curve": grpo_curve,
        "sft_curve": sft_curve,
        "loadavg": [round(before, 2), round(middle, 2), round(os.getloadavg()[0], 2)],
    }
    gain = result["accuracy_after_grpo"] - result["accuracy_before"]
    print(f"\narithmetic {task_opts} from {sft}, {args.eval_prompts} held-out prompts, greedy exact match")
    print(f"  before (SFT checkpoint)      {result['accuracy_before']:.3f}")
    print(f"  GRPO, {result['train_seconds']:.0f} s ({result['steps']} steps) {result['accuracy_after_grpo']:.3f} "
          f"({100 * gain:+.1f} points)")  # fmt: skip
    print(f"  continued SFT, same time     {result['accuracy_after_continued_sft']:.3f} "
          f"(on the {args.continued_sft_demos} demonstrations)")  # fmt: skip
    print(f"  s/step {result['seconds_per_step']:.3f}, generated tokens/s {result['generated_tokens_per_s']:.0f} "
          f"(generation alone {gen_tps:.0f}), peak RSS {result['peak_rss_mb']:.0f} MB")  # fmt: skip
    print("  per step (means):", result["per_step"])
    print("  GRPO curve (step, train s, acc):", grpo_curve)
    print("  SFT curve (train s, acc):", sft_curve)
    print("  load average (1 min) before GRPO / before SFT / after:", result["loadavg"])
    return result


# ---- part: TRL ----------------------------------------------------------------------------------------------
def _trl_task(work: Path, args: argparse.Namespace) -> tuple[Path, Path, Path]:
    """TRL's model + tokenizer (random init, seed 0) and prompts; an SFT warm start of it by `postrl sft`."""
    peer = _peer()
    _, rows, _ = peer.build_task(str(work / "init"), n_prompts=256, seed=0)
    train = _write_jsonl(rows, work / "train.jsonl")
    every = [{"prompt": f"add {a} {b} =", "answer": str(a + b)} for a in range(10) for b in range(10)]
    heldout = _write_jsonl(every, work / "eval.jsonl")
    sft_rows = [{"prompt": r["prompt"], "completion": " " + r["answer"]} for r in rows]
    sft_data = _write_jsonl(sft_rows, work / "sft.jsonl")
    _postrl(
        "sft", "--config", str(ROOT / "configs" / "sft-arithmetic.yaml"), "--model", str(work / "init"),
        "--data", str(sft_data), "--out", str(work / "sft"), "--overwrite", f"run.steps={args.sft_steps}",
        "train.batch_size=32", "optim.lr=0.001", "optim.warmup_steps=10", "run.eval_every=0", "run.save_every=0",
        "run.log_every=10", "run.device=cpu", f"run.threads={args.threads}",
        log=work / "sft.log",
    )  # fmt: skip
    return work / "sft" / "model", train, heldout


def trl_task_args(
    model: Path, train: Path, heldout: Path, out: Path, args: argparse.Namespace, extra: tuple[str, ...] = ()
) -> list[str]:
    """The `postrl grpo` arguments of TRL's task at the settings above (also `grpo_profile.py`'s); ``extra``
    key=value pairs come last (they win)."""
    spec = f"{THIS}:trl"
    return [
        "grpo", "--model", str(model), "--data", str(train), "--out", str(out), "--overwrite", "max_prompt_length=32",
        f"eval_data={heldout}", f"rewards=[{spec}_reward, {spec}_correct]", "reward_weights=[1.0, 0.0]",
        f"verifier={spec}_correct", f"sampling.max_new_tokens={MAX_NEW_TOKENS}", "sampling.temperature=1.0",
        "grpo.group_size=8", "grpo.prompts_per_step=2", f"grpo.beta={args.beta}", "grpo.loss_type=grpo",
        f"grpo.unbiased_kl={str(bool(args.unbiased_kl)).lower()}",
        f"optim.lr={args.lr}", "optim.warmup_steps=0", "optim.min_lr_ratio=1.0", "optim.betas=[0.9, 0.999]",
        "optim.weight_decay=0.0", "optim.max_grad_norm=1.0", f"run.steps={args.steps}",
        f"run.eval_every={args.eval_every}", "eval_size=100", "run.save_every=0", "run.log_every=1",
        "run.device=cpu", f"run.threads={args.threads}", f"run.seed={args.seed}", *extra,
    ]  # fmt: skip


def _postrl_on_trl_task(
    model: Path, train: Path, heldout: Path, out: Path, args: argparse.Namespace, extra: tuple[str, ...] = ()
) -> dict:
    """`postrl grpo` on TRL's task at the settings above; ``extra`` key=value pairs come last (they win)."""
    summary = _postrl(*trl_task_args(model, train, heldout, out, args, extra), log=out.with_suffix(".log"))
    times = _step_times(out)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time_generate" in r]
    return {
        "generate_tokens_per_s": sum(r["generated_tokens"] for r in steps)
        / sum(r["time_generate"] for r in steps),
        "generate_seconds": sum(r["time_generate"] for r in steps),
        "step_time_median_s": statistics.median(times[1:]),
        "train_seconds": sum(times),
        "completion_tokens_per_s": summary["tokens_per_second"],
        "peak_rss_mb": summary["peak_rss_mb"],
        "tree_rss_mb": summary["tree_rss_mb"],  # with a generation lane: both processes
        "accuracy_curve": _curve(out, "heldout_accuracy"),
        "summary": summary,
    }


def _trl_run(model: Path, train: Path, heldout: Path, out: Path, args: argparse.Namespace) -> dict:
    train = getattr(args, "train_override", None) or train  # grpo_coupled.py: postrl's prompt order
    cmd = [
        str(ROOT / args.trl_python),
        str(THIS), "--trl-worker", "--model", str(model), "--train", str(train),
        "--heldout", str(heldout), "--steps", str(args.steps), "--eval-every", str(args.eval_every),
        "--beta", str(args.beta), "--lr", str(args.lr), "--threads", str(args.threads), "--seed", str(args.seed), "--json", str(out),
        "--unbiased-kl", str(args.unbiased_kl), "--member", getattr(args, "member", "grpo"),
    ]  # fmt: skip
    cmd += ["--coupled", args.coupled] if getattr(args, "coupled", None) else []
    with out.with_suffix(".log").open("w") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=f, cwd=out.parent)
    return json.loads(out.read_text())


# the contenders ``--order`` may name beyond postrl and trl: both machine cores used by each trainer
LANES = ("lanes.enabled=true", "lanes.max_staleness=1", "lanes.threads=1")  # asynchronous GRPO, 1 + 1 threads
CONTENDERS = {"postrl": (), "postrl_lanes": LANES, "trl": None, "trl_threads2": None}


def _pair(model: Path, train: Path, heldout: Path, work: Path, args: argparse.Namespace) -> dict:
    """Both contenders from ``model``, in ``args.order`` (e.g. postrl trl postrl trl: alternating, so machine
    noise hits both), each run in a fresh process; a contender's j-th run uses seed ``args.seed + j`` (one
    seed's curve says little: 10 seeds x 40 steps gave accuracies 0.20-0.54 for each contender). Repeated runs
    are summarised by the median of each timing (peak memory: the max) and the mean accuracy curve.
    ``postrl_lanes``: postrl's asynchronous GRPO (`LANES`: generation in a second process, one step stale) at
    ``--threads`` for its training lane; ``trl_threads2``: TRL with 2 torch threads (`CONTENDERS`)."""
    work.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {}
    for k, name in enumerate(args.order):
        if name not in CONTENDERS:
            raise SystemExit(f"--order: unknown contender {name!r} (known: {', '.join(CONTENDERS)})")
        before = os.getloadavg()[0]
        seeded = argparse.Namespace(**{**vars(args), "seed": args.seed + len(runs.get(name, []))})
        if name == "trl_threads2":
            seeded.threads = 2
        if name.startswith("postrl"):
            out = work / f"{name}_grpo_{k}"
            result = _postrl_on_trl_task(model, train, heldout, out, seeded, CONTENDERS[name])
            result.pop("summary")
        else:
            result = _trl_run(model, train, heldout, work / f"trl_{k}.json", seeded)
        result["loadavg"] = [round(before, 2), round(os.getloadavg()[0], 2)]
        result["seed"] = seeded.seed
        runs.setdefault(name, []).append(result)
    out = {}
    for name, results in runs.items():
        timing = [
            "step_time_median_s",
            "completion_tokens_per_s",
            "generate_tokens_per_s",
            "generate_seconds",
        ]
        summary = {key: statistics.median(r[key] for r in results) for key in timing}
        summary["peak_rss_mb"] = max(r["peak_rss_mb"] for r in results)
        if all("tree_rss_mb" in r for r in results):  # postrl: its process tree (with a lane: both processes)
            summary["tree_rss_mb"] = max(r["tree_rss_mb"] for r in results)
        curves = [r["accuracy_curve"] for r in results]
        summary["accuracy_curve"] = [
            (step, seconds, statistics.mean(c[i][2] for c in curves))
            for i, (step, seconds, _) in enumerate(curves[0])
        ]
        summary["loadavg"] = [r["loadavg"] for r in results]
        summary["runs"] = results
        out[name] = summary
    return out


def _table(title: str, p: dict, t: dict) -> None:
    """Both contenders side by side; the last column is postrl's advantage (> 1: postrl better)."""
    print(f"\n{title}")
    print(f"{'':24}{'postrl':>12}{'TRL':>12}{'postrl adv.':>13}")
    rows = [
        ("steps/s", 1 / p["step_time_median_s"], 1 / t["step_time_median_s"], t["step_time_median_s"] / p["step_time_median_s"]),
        ("s/step (median)", p["step_time_median_s"], t["step_time_median_s"], t["step_time_median_s"] / p["step_time_median_s"]),
        ("completion tokens/s", p["completion_tokens_per_s"], t["completion_tokens_per_s"], p["completion_tokens_per_s"] / t["completion_tokens_per_s"]),
        ("generation tokens/s", p["generate_tokens_per_s"], t["generate_tokens_per_s"], p["generate_tokens_per_s"] / t["generate_tokens_per_s"]),
        ("generation s (total)", p["generate_seconds"], t["generate_seconds"], t["generate_seconds"] / p["generate_seconds"]),
        ("peak RSS MB", p["peak_rss_mb"], t["peak_rss_mb"], t["peak_rss_mb"] / p["peak_rss_mb"]),
    ]  # fmt: skip
    for label, a, b, adv in rows:
        print(f"{label:24}{a:>12.4g}{b:>12.4g}{adv:>12.2f}x")
    print(f"load average (1 min) before/after: postrl {p['loadavg']}, TRL {t['loadavg']}")


def _speedups(title: str, runs: dict) -> None:
    """Every contender's median s/step and memory, and each postrl one's speed-up over each TRL one."""
    print(f"\n{title}")
    for name, r in runs.items():
        memory = r.get("tree_rss_mb", r["peak_rss_mb"])
        ups = "  ".join(
            f"{r2['step_time_median_s'] / r['step_time_median_s']:.2f}x vs {n2}"
            for n2, r2 in runs.items()
            if name.startswith("postrl") and n2.startswith("trl")
        )
        print(f"  {name:14} {1000 * r['step_time_median_s']:7.1f} ms/step  {memory:7.0f} MB  {ups}")


def bench_trl(args: argparse.Namespace) -> dict:
    """postrl vs TRL GRPOTrainer on TRL's task: learning from the same SFT warm start (accuracy curves,
    throughput, memory), and throughput from TRL's random init (long completions: generation-bound)."""
    work = Path(args.workdir).resolve()  # the TRL worker runs in another folder
    work.mkdir(parents=True, exist_ok=True)
    model, train, heldout = _trl_task(work, args)
    learn = _pair(model, train, heldout, work / "warm", args)
    p, t = learn["postrl"], learn["trl"]
    settings = f"2 prompts x G=8, <= {MAX_NEW_TOKENS} tokens, beta {args.beta}, lr {args.lr}, {args.threads} thread(s)"
    _table(f"TRL task from the SFT warm start, {args.steps} steps of {settings}", p, t)
    seeds = {name: [r["seed"] for r in learn[name]["runs"]] for name in learn}
    print(f"held-out greedy accuracy, mean over seeds {seeds} (step, postrl, TRL):")
    for (step, _, acc_p), (_, _, acc_t) in zip(p["accuracy_curve"], t["accuracy_curve"], strict=False):
        print(f"  {step:>5} {acc_p:>7.3f} {acc_t:>7.3f}")
    if len(learn) > 2:
        _speedups("every contender from the warm start (memory: postrl's process tree, TRL's peak)", learn)
    scratch_args = argparse.Namespace(
        **{**vars(args), "steps": args.scratch_steps, "eval_every": args.scratch_steps, "lr": args.scratch_lr}
    )
    scratch = _pair(work / "init", train, heldout, work / "scratch", scratch_args)
    _table(
        f"TRL task from TRL's random init (its own benchmark setting), {args.scratch_steps} steps",
        scratch["postrl"],
        scratch["trl"],
    )
    if len(scratch) > 2:
        _speedups("every contender from TRL's random init", scratch)
    return {"warm_start": learn, "from_init": scratch}


# ---- part: family (RLOO and DAPO beside TRL's RLOOTrainer and GRPOTrainer) ---------------------------------------
# member → the `postrl grpo` keys that make it (after the TRL task's settings above, β 0 in both)
FAMILY = {
    # TRL's RLOOTrainer: leave-one-out advantages, the whole response's ratio, mean over responses
    "rloo": (
        "grpo.advantage=rloo",
        "grpo.importance_level=sequence_sum",
        "grpo.loss_type=grpo",
        "grpo.beta=0",
    ),
    # postrl's DAPO preset (configs/dapo-arithmetic.yaml; the overlong buffer a quarter of the 16 tokens)
    "dapo": (
        "grpo.loss_type=token",
        "grpo.beta=0",
        "grpo.clip_eps_high=0.28",
        "grpo.dynamic_sampling=true",
        "grpo.overlong_buffer=4",
    ),  # fmt: skip
    # TRL's GRPOTrainer defaults (loss "dapo" = token, β 0, ε_high = ε, no dynamic sampling): same work per step
    "dapo_trl": ("grpo.loss_type=token", "grpo.beta=0"),
}
FAMILY_LOSS = {  # member → its GRPOLossConfig keys for the identical-batch check
    "rloo": {"advantage": "rloo", "importance_level": "sequence_sum", "loss_type": "grpo"},
    "dapo": {"advantage": "grpo", "scale_rewards": True, "loss_type": "token"},
}


def identical_batch(model: Path, train: Path, work: Path, member: str, args: argparse.Namespace) -> dict:
    """TRL samples and scores one batch and takes its own loss and gradient (`_dump_identical_batch`); postrl
    computes its advantages from the same rewards and the trainer's loss (`grpo_batch_loss`) of the same
    tokens and old log-probs (ε 0.2, ε_high 0.28, β 0). Returns the differences."""
    import torch
    from safetensors.torch import load_file

    from postrl.lm.grpo import GRPOLossConfig
    from postrl.lm.grpo.algorithm import grpo_batch_loss
    from postrl.lm.grpo.rollouts import compute_advantages
    from postrl.lm.models import load_causal_lm
    from postrl.lm.rollout import response_forward
    from postrl.lm.rollout.batch import RolloutBatch

    out = work / f"identical_{member}.safetensors"
    cmd = [
        str(ROOT / args.trl_python), str(THIS), "--trl-worker", "--model", str(model), "--train", str(train),
        "--heldout", str(train), "--steps", "1", "--member", member, "--beta", "0", "--epsilon-high", "0.28",
        "--threads", str(args.threads), "--json", str(work / f"identical_{member}.json"),
        "--identical-batch", str(out),
    ]  # fmt: skip
    with out.with_suffix(".log").open("w") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=f, cwd=work)
    trl = load_file(str(out))
    cfg = GRPOLossConfig(
        group_size=8, prompts_per_step=2, beta=0.0, clip_eps_high=0.28, **FAMILY_LOSS[member]
    )
    advantages = compute_advantages(trl["rewards"], cfg)
    policy = load_causal_lm(model).train()
    batch = RolloutBatch(
        torch.cat([trl["prompt_ids"], trl["completion_ids"]], dim=1),
        torch.cat([trl["prompt_mask"], trl["completion_mask"]], dim=1),
        trl["prompt_ids"].shape[1], trl["completion_mask"], trl["old_per_token_logps"], advantages,
    )  # fmt: skip
    loss, stats = grpo_batch_loss(response_forward(policy), batch, cfg, 1.0, MAX_NEW_TOKENS)
    loss.backward()
    grads = {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}
    theirs = {k[len("grad.") :]: v for k, v in trl.items() if k.startswith("grad.")}
    common = grads.keys() & theirs.keys()
    return {
        "loss_trl": float(trl["loss"]),
        "loss_postrl": float(loss.detach()),
        "loss_abs_diff": abs(float(trl["loss"]) - float(loss.detach())),
        "advantage_max_abs_diff": float((advantages - trl["advantages"]).abs().max()),
        "grad_max_abs_diff": max(float((grads[n] - theirs[n]).abs().max()) for n in common),
        "grad_max_abs": max(float(theirs[n].abs().max()) for n in common),
        "grads_compared": len(common),
        "clip_fraction": float(stats["clip_fraction"]),
    }


# postrl member → the keys where it differs from TRL's trainer on purpose (the DAPO preset: clip-higher 0.28,
# dynamic sampling, the overlong penalty); every other resolved setting must equal TRL's
SETTINGS_NOT_COMPARED = {"dapo": {"epsilon_high", "dynamic_sampling", "overlong_buffer"}}


def _postrl_settings(run_dir: Path) -> dict:
    """The settings of a `postrl grpo` run as it resolved them (its config.yaml and the optimiser and schedule
    `make_optimizer` builds from it), in the keys `_trl_settings` gives TRL's: the side-by-side diff."""
    import torch
    import yaml

    from postrl.lm.trainer import OptimConfig, make_optimizer

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    o, s, g, steps = cfg["optim"], cfg["sampling"], cfg["grpo"], cfg["run"]["steps"]
    optim = OptimConfig(
        lr=o["lr"], min_lr_ratio=o["min_lr_ratio"], warmup_steps=o["warmup_steps"],
        weight_decay=o["weight_decay"], betas=tuple(o["betas"]), max_grad_norm=o["max_grad_norm"],
    )  # fmt: skip
    opt, sched = make_optimizer(torch.nn.Linear(2, 2), optim, steps)
    return {
        "optimizer": type(opt).__name__,
        "lr": opt.defaults["lr"],
        "betas": list(opt.defaults["betas"]),
        "eps": opt.defaults["eps"],
        "weight_decay": sorted({grp["weight_decay"] for grp in opt.param_groups}),
        "lr_multiplier_first_mid_last": [
            round(sched.lr_lambdas[0](k), 6) for k in (0, steps // 2, steps - 1)
        ],
        "max_grad_norm": o["max_grad_norm"],
        "temperature": s["temperature"],
        "top_k": s["top_k"],
        "top_p": s["top_p"],
        "max_new_tokens": s["max_new_tokens"],
        "mask_truncated_completions": False,  # postrl has no such option: truncated completions are trained on
        "advantage": g["advantage"],
        "std_scaling": "group" if g["advantage"] == "grpo" and g["scale_rewards"] else "none",
        "loss_aggregation": g["loss_type"],
        "importance_level": g["importance_level"],
        "epsilon": g["clip_eps"],
        "epsilon_high": g["clip_eps_high"] if g["clip_eps_high"] is not None else g["clip_eps"],
        "beta": g["beta"],
        "iterations": g["epochs"],
        "optimiser_steps_per_generation": g["minibatches"],
        "generations": g["group_size"],
        "prompts_per_step": g["prompts_per_step"],
        "dynamic_sampling": g["dynamic_sampling"],
        "overlong_buffer": g["overlong_buffer"],
    }


def settings_diff(trl: dict, postrl: dict, member: str) -> dict[str, tuple]:
    """{key: (TRL's, postrl's)} where the two differ, less the keys ``member`` changes on purpose."""
    skip = SETTINGS_NOT_COMPARED.get(member, set())
    keys = (trl.keys() | postrl.keys()) - skip
    return {k: (trl.get(k), postrl.get(k)) for k in sorted(keys) if trl.get(k) != postrl.get(k)}


def bench_family(args: argparse.Namespace) -> dict:
    """RLOO and DAPO beside TRL on TRL's task at β 0: the identical-batch loss check, then ``--steps`` of
    each contender, ``len(args.order)`` seeds, contenders interleaved (rotated per seed)."""
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    model, train, heldout = _trl_task(work, args)
    checks = {m: identical_batch(model, train, work, m, args) for m in args.members}
    for m, c in checks.items():
        print(f"identical batch, {m}: loss TRL {c['loss_trl']:.8f} postrl {c['loss_postrl']:.8f} "
              f"|diff| {c['loss_abs_diff']:.2e}; advantages |diff| {c['advantage_max_abs_diff']:.2e}; "
              f"gradient max |diff| {c['grad_max_abs_diff']:.2e} (max |grad| {c['grad_max_abs']:.2e}); "
              f"clip fraction {c['clip_fraction']:.3f}")  # fmt: skip
    contenders = [(who, m) for m in args.members for who in ("postrl", "trl")]
    contenders += [("postrl", "dapo_trl")] if "dapo" in args.members else []
    runs: dict[str, list[dict]] = {}
    for k in range(args.repeats):
        order = contenders[k % len(contenders) :] + contenders[: k % len(contenders)]
        for who, m in order:
            before = os.getloadavg()[0]
            ns = argparse.Namespace(**{**vars(args), "seed": args.seed + k, "member": m, "beta": 0.0})
            if who == "postrl":
                r = _postrl_on_trl_task(model, train, heldout, work / f"postrl_{m}_{k}", ns, FAMILY[m])
                r.pop("summary")
                r["settings"] = _postrl_settings(work / f"postrl_{m}_{k}")
            else:
                r = _trl_run(model, train, heldout, work / f"trl_{m}_{k}.json", ns)
            r["loadavg"] = [round(before, 2), round(os.getloadavg()[0], 2)]
            runs.setdefault(f"{who}:{m}", []).append(r)
            print(f"{who}:{m} seed {ns.seed}: {r['step_time_median_s']:.4f} s/step, load {r['loadavg']}")
    diffs = {}
    for name, results in runs.items():  # the resolved settings of each postrl contender against TRL's
        who, m = name.split(":")
        if who == "postrl":
            trl = runs[f"trl:{'dapo' if m == 'dapo_trl' else m}"][0]["settings"]
            diffs[m] = settings_diff(trl, results[0]["settings"], m)
            print(f"settings, postrl {m} vs TRL ({', '.join(sorted(SETTINGS_NOT_COMPARED.get(m, ()))) or 'all'}"
                  f"{' differ on purpose' if m in SETTINGS_NOT_COMPARED else ' compared'}): "
                  f"{diffs[m] or 'identical'} over {len(trl)} keys")  # fmt: skip
    summary = {}
    for name, results in runs.items():
        summary[name] = {
            "step_time_median_s": statistics.median(r["step_time_median_s"] for r in results),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in results),
            "accuracy_end": statistics.mean(r["accuracy_curve"][-1][2] for r in results),
            "accuracy_end_per_seed": [r["accuracy_curve"][-1][2] for r in results],
            "accuracy_mean_over_checks": statistics.mean(
                statistics.mean(a for _, _, a in r["accuracy_curve"][1:]) for r in results
            ),
            "loadavg": [r["loadavg"] for r in results],
        }
    print(f"\n{'':26}{'s/step':>10}{'steps/s':>10}{'peak RSS MB':>13}{'acc. end':>10}{'vs TRL':>9}")
    for name, r in summary.items():
        trl = summary.get(f"trl:{'dapo' if name.endswith('dapo_trl') else name.split(':')[1]}")
        speed = trl["step_time_median_s"] / r["step_time_median_s"] if trl else float("nan")
        print(f"{name:26}{r['step_time_median_s']:>10.4f}{1 / r['step_time_median_s']:>10.1f}"
              f"{r['peak_rss_mb']:>13.0f}{r['accuracy_end']:>10.3f}{speed:>8.2f}x")  # fmt: skip
    return {"identical_batch": checks, "settings_diff": diffs, "summary": summary, "runs": runs}


# ---- TRL worker (runs inside the TRL virtual environment; imports nothing from postrl) --------------------------
def _greedy_accuracy(model, tok, rows: list[dict]) -> float:
    import torch

    was_training = model.training
    model.eval()
    enc = tok([r["prompt"] for r in rows], return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(
            **enc, do_sample=False, max_new_tokens=MAX_NEW_TOKENS, pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )  # fmt: skip
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    model.train(was_training)
    answers = [r["answer"] for r in rows]
    return sum(trl_correct([], texts, answers)) / len(rows)


def _dump_identical_batch(trainer, train: list[dict], rewards_seen: list, args: argparse.Namespace) -> None:
    """TRL's side of the identical-batch check: one generation batch (the first 2 prompts x G = 8) sampled and
    scored by the trainer itself, its old log-probs moved off the current policy by a fixed random shift
    (0.2 per token, so that ratios leave 1 and clipping acts), then the trainer's own ``compute_loss`` and
    its gradient. Saves the batch, the rewards, TRL's advantages, the loss and the gradient (safetensors)."""
    import torch
    from safetensors.torch import save_file

    model = trainer.model
    model.train()
    if getattr(trainer, "current_gradient_accumulation_steps", None) is None:
        trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train() otherwise
    rows = [r for r in train[:2] for _ in range(8)]  # TRL's sampler repeats each prompt G times in a row
    inputs = trainer._generate_and_score_completions(rows)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    T = inputs["completion_ids"].shape[1]
    with torch.no_grad():
        current, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, T)
    shift = 0.2 * torch.randn(current.shape, generator=torch.Generator().manual_seed(0))
    old = (current + shift) * inputs["completion_mask"]
    if args.member == "rloo":
        inputs["old_logps"] = (old * inputs["completion_mask"]).sum(1)
    else:
        inputs["old_per_token_logps"] = old
    model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(model, inputs)
    loss.backward()
    out = {
        k: inputs[k].contiguous() for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
    }
    out |= {"old_per_token_logps": old, "advantages": inputs["advantages"], "loss": loss.detach().reshape(1)}
    out["rewards"] = torch.tensor(rewards_seen[-1], dtype=torch.float32)
    out |= {
        f"grad.{n}": p.grad.detach().contiguous() for n, p in model.named_parameters() if p.grad is not None
    }
    save_file(out, args.identical_batch)


def _trl_settings(trainer, steps: int) -> dict:
    """TRL's resolved settings (the optimiser and schedule its Trainer builds from the arguments, the
    generation config it samples with), in the keys of postrl's `_postrl_settings`."""
    import torch
    from transformers import get_scheduler

    a, gen = trainer.args, trainer.generation_config
    opt_cls, opt_kw = trainer.get_optimizer_cls_and_kwargs(a, trainer.model)
    dummy = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = get_scheduler(
        a.lr_scheduler_type, dummy, num_warmup_steps=a.get_warmup_steps(steps), num_training_steps=steps
    )
    rloo = type(trainer).__name__ == "RLOOTrainer"
    if rloo:
        std_scaling = "batch" if a.normalize_advantages else "none"
    else:
        std_scaling = {True: "group", False: "none"}.get(a.scale_rewards, a.scale_rewards)
    return {
        "optimizer": opt_cls.__name__,
        "lr": opt_kw["lr"],
        "betas": list(opt_kw["betas"]),
        "eps": opt_kw["eps"],
        "weight_decay": sorted({a.weight_decay, 0.0} if a.weight_decay else {0.0}),
        "lr_multiplier_first_mid_last": [
            round(sched.lr_lambdas[0](k), 6) for k in (0, steps // 2, steps - 1)
        ],
        "max_grad_norm": a.max_grad_norm,
        "temperature": gen.temperature,
        "top_k": gen.top_k or 0,
        "top_p": gen.top_p if gen.top_p is not None else 1.0,
        "max_new_tokens": gen.max_new_tokens,
        "mask_truncated_completions": a.mask_truncated_completions,
        "advantage": "rloo" if rloo else "grpo",
        "std_scaling": std_scaling,
        "loss_aggregation": "grpo"
        if rloo
        else {"dapo": "token", "bnpo": "token"}.get(a.loss_type, a.loss_type),
        "importance_level": "sequence_sum" if rloo else a.importance_sampling_level,
        "epsilon": a.epsilon,
        "epsilon_high": a.epsilon_high if a.epsilon_high is not None else a.epsilon,
        "beta": a.beta,
        "iterations": a.num_iterations,
        "optimiser_steps_per_generation": a.steps_per_generation,
        "generations": a.num_generations,
        "prompts_per_step": a.generation_batch_size // a.num_generations,
        "dynamic_sampling": False,
        "overlong_buffer": 0,
    }


def trl_worker(args: argparse.Namespace) -> None:
    """Train TRL's GRPOTrainer from ``--model`` with the settings of `bench_trl`; write results JSON."""
    peer = _peer()  # also sets the offline environment variables
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    tok = AutoTokenizer.from_pretrained(args.model)
    tok.padding_side = "left"
    train = [json.loads(line) for line in Path(args.train).read_text().splitlines()]
    heldout = [json.loads(line) for line in Path(args.heldout).read_text().splitlines()]
    tokens = [0]
    rewards_seen: list[list[float]] = []

    def arith_reward(prompts, completions, completion_ids, answer, **kw):
        tokens[0] += sum(len(ids) for ids in completion_ids)
        rewards_seen.append(peer.arith_reward_values(completions, answer, MAX_NEW_TOKENS))
        return rewards_seen[-1]

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.t0, self.times, self.curve, self.evaluating = 0.0, [], [], False

        def on_step_begin(self, a, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, model=None, **kw):
            self.times.append(time.perf_counter() - self.t0)  # evaluation below is not timed
            if state.global_step % args.eval_every == 0:
                self.evaluating = True
                acc = _greedy_accuracy(model, tok, heldout)
                self.evaluating = False
                self.curve.append((state.global_step, round(sum(self.times), 2), acc))

    timer = Timer()
    common = dict(
        output_dir=str(Path(args.json).parent / "trl_out"), max_steps=args.steps, per_device_train_batch_size=16,
        gradient_accumulation_steps=1, num_generations=8, max_completion_length=MAX_NEW_TOKENS,
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, beta=args.beta, num_iterations=1,
        temperature=1.0, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, bf16=False,
        fp16=False, gradient_checkpointing=False, use_vllm=False, seed=args.seed, dataloader_num_workers=0,
        disable_tqdm=True, shuffle_dataset=not args.coupled,  # coupled: the file is in postrl's order
    )  # fmt: skip
    if args.member == "rloo":  # RLOOTrainer's defaults otherwise (normalize_advantages False, ε 0.2)
        from trl import RLOOConfig, RLOOTrainer

        trainer_cls, cfg = RLOOTrainer, RLOOConfig(**common, epsilon_high=args.epsilon_high)
    elif args.member == "dapo":  # GRPOTrainer's default loss "dapo", scale_rewards "group"
        cfg = GRPOConfig(**common, loss_type="dapo", scale_rewards="group", epsilon_high=args.epsilon_high)
        trainer_cls = GRPOTrainer
    else:
        cfg = GRPOConfig(
            **common, loss_type="grpo", scale_rewards="group", use_bias_correction_kl=bool(args.unbiased_kl)
        )
        trainer_cls = GRPOTrainer
    trainer = trainer_cls(
        model=args.model, reward_funcs=arith_reward, args=cfg, train_dataset=Dataset.from_list(train),
        processing_class=tok, callbacks=[timer],
    )  # fmt: skip
    if args.identical_batch:
        _dump_identical_batch(trainer, train, rewards_seen, args)
        return
    timer.curve.append((0, 0.0, _greedy_accuracy(trainer.model, tok, heldout)))
    gen = {"seconds": 0.0, "tokens": 0}
    original = trainer.model.generate

    draws = json.loads(Path(args.coupled).read_text())["seeds"] if args.coupled else None

    def timed_generate(*a, **kw):  # as the peer script: time TRL's generation on its own
        start = time.perf_counter()
        if draws is not None and not timer.evaluating:  # grpo_coupled.py: postrl's draws for this step
            from grpo_coupled import coupled_draws

            with coupled_draws(draws[trainer.state.global_step]):
                out = original(*a, **kw)
        else:
            out = original(*a, **kw)
        if not timer.evaluating:
            gen["seconds"] += time.perf_counter() - start
            sequences = out.sequences if hasattr(out, "sequences") else out
            prompt = kw.get("input_ids", a[0] if a else None)
            new = sequences[:, prompt.shape[1] :] if prompt is not None else sequences[:, :0]
            gen["tokens"] += int((new != tok.pad_token_id).sum())
        return out

    trainer.model.generate = timed_generate
    trainer.train()
    train_seconds = sum(timer.times)
    result = {
        "versions": {
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
        "step_time_median_s": statistics.median(timer.times[1:]),
        "train_seconds": train_seconds,
        "completion_tokens_per_s": tokens[0] / train_seconds,
        "generate_tokens_per_s": gen["tokens"] / max(1e-9, gen["seconds"]),
        "generate_seconds": gen["seconds"],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "accuracy_curve": timer.curve,
        "settings": _trl_settings(trainer, args.steps),
        "log_history": [r for r in trainer.state.log_history if "reward" in r],  # per step (logging_steps=1)
    }
    Path(args.json).write_text(json.dumps(result, indent=2))


PARTS = {"arithmetic": bench_arithmetic, "trl": bench_trl, "family": bench_family}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=sorted(PARTS), default="trl", help="which benchmark to run")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (1: fastest on a shared CPU)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of both trainers")
    parser.add_argument("--workdir", default="runs/bench-grpo", help="folder for models and runs")
    parser.add_argument("--steps", type=int, default=200, help="trl: GRPO steps of each contender")
    parser.add_argument("--eval-every", type=int, default=20, help="trl: steps between accuracy checks")
    parser.add_argument("--beta", type=float, default=0.04, help="KL coefficient of both")
    parser.add_argument(
        "--unbiased-kl", type=int, choices=[0, 1], default=1,
        help="trl: k3 weighted by the ratio in both (TRL's use_bias_correction_kl; postrl grpo.unbiased_kl)",
    )  # fmt: skip
    parser.add_argument("--lr", type=float, default=1e-4, help="trl: AdamW lr of both (warm start)")
    parser.add_argument("--scratch-lr", type=float, default=1e-3, help="trl: lr from the random init (TRL's)")
    parser.add_argument("--scratch-steps", type=int, default=40, help="trl: steps of the from-init run")
    parser.add_argument("--sft-steps", type=int, default=100, help="trl: SFT steps of the warm start")
    parser.add_argument(
        "--trl-python", default=str(PEERS / ".venv-trl" / "bin" / "python"), help="python of the TRL venv"
    )
    parser.add_argument("--order", nargs="+", default=["postrl", "trl"], help="trl: contender order")
    parser.add_argument("--sft", help="arithmetic: the SFT checkpoint (default: built, see _grpo_sft.py)")
    parser.add_argument("--base", help="arithmetic: pretrained base of the built checkpoint (default: built)")
    parser.add_argument("--sft-demos", type=int, default=500, help="arithmetic: demonstrations of the SFT")
    parser.add_argument("--checkpoint-sft-steps", type=int, default=300, help="arithmetic: its SFT steps")
    parser.add_argument(
        "--checkpoint-sft-min-lr-ratio", type=float, default=1.0, help="arithmetic: its final lr / peak lr"
    )
    parser.add_argument(
        "--continued-sft-demos", choices=["sft", "all"], default="sft",
        help="arithmetic: continued SFT on the checkpoint's demonstrations, or on every train problem's",
    )  # fmt: skip
    parser.add_argument("--grpo-set", nargs="*", default=[], help="arithmetic: extra `postrl grpo` key=value")
    parser.add_argument("--task", default='{"digits": 2}', help="arithmetic: task options (JSON)")
    parser.add_argument("--budget", type=float, default=180.0, help="arithmetic: GRPO training seconds")
    parser.add_argument("--eval-prompts", type=int, default=200, help="arithmetic: held-out prompts")
    parser.add_argument("--max-new-tokens", type=int, default=8, help="arithmetic: tokens per answer")
    parser.add_argument("--sft-eval-every", type=int, default=20, help="arithmetic: SFT steps per check")
    parser.add_argument(
        "--members", nargs="+", default=["rloo", "dapo"], choices=["rloo", "dapo"],
        help="family: the members compared with TRL (rloo: RLOOTrainer, dapo: GRPOTrainer's default loss)",
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3, help="family: seeds of each contender")
    parser.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--member", default="grpo", help=argparse.SUPPRESS)
    parser.add_argument("--epsilon-high", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--identical-batch", help=argparse.SUPPRESS)
    parser.add_argument("--coupled", help=argparse.SUPPRESS)  # grpo_coupled.py's draws for the TRL worker
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--train", help=argparse.SUPPRESS)
    parser.add_argument("--heldout", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_worker:
        trl_worker(args)
        return
    from _record import record  # here: `postrl grpo` loads this file by path for the TRL part's rewards

    result = {"part": args.part, **PARTS[args.part](args)}
    record(f"grpo-{args.part}", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
