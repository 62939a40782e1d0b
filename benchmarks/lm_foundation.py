"""Benchmarks of the LM foundation (issue 4), one function per part.

Part ``rollout`` (a): generated tokens per second of `postrl.lm.rollout.generate` against
``transformers``' ``generate`` on the same tiny Llama (2 layers, d = 128, vocab 512), in the same process,
interleaved run by run so that machine noise hits both alike. Every row generates exactly ``--new-tokens``
tokens in both (EOS ignored: ``eos_token_id=None`` for postrl, ``min_new_tokens`` for HF), by pure sampling
(temperature 1, no top-k / top-p), from left-padded random prompts of 8–24 tokens.

    .venv/bin/python benchmarks/lm_foundation.py --part rollout [--threads 2] [--batches 1 16 64 256]

Part ``train`` (b): pretraining from scratch and SFT on arithmetic with the demo's budgets (SFT stops at a
held-out accuracy band, default 30%, to leave room for RL): wall time, training tokens per second, held-out
loss, and exact match on 500 held-out prompts with greedy decoding.

    .venv/bin/python benchmarks/lm_foundation.py --part train --threads 1 [--out runs/bench-lm]

Prints a table and ends with ONE JSON line of results. ``OMP_WAIT_POLICY`` defaults to PASSIVE: on a shared,
oversubscribed CPU, OpenMP threads that spin at barriers steal the time slices of their own peers and the
timings of both contenders become noise (minutes instead of seconds); set it in the environment to override.
"""

# ruff: noqa: E402  (OMP_WAIT_POLICY must be set before torch is imported)
from __future__ import annotations

import os

from _record import record

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads OpenMP

import argparse
import json
import resource
import statistics
import time
from collections.abc import Callable

import torch
from transformers import GenerationConfig

from postrl.lm.models import build_tiny_lm
from postrl.lm.rollout import generate, left_pad

PAD, EOS, VOCAB = 0, 1, 512


def _prompts(batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded random prompts [batch, ≤ 24] of 8–24 tokens (no pad / EOS inside)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 25, (batch,), generator=g).tolist()
    return left_pad([torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths], PAD)


def _time(fn: Callable[[], int]) -> float:
    """Tokens per second of one call of ``fn`` (which returns the number of tokens generated)."""
    start = time.perf_counter()
    n = fn()
    return n / (time.perf_counter() - start)


def _rollout_runners(model: torch.nn.Module, batch: int, new_tokens: int) -> dict[str, Callable[[], int]]:
    """The contenders at one batch size; each returns its number of generated tokens."""
    ids, mask = _prompts(batch)
    g = torch.Generator().manual_seed(0)
    hf_config = GenerationConfig(
        do_sample=True,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        pad_token_id=PAD,
        eos_token_id=EOS,
    )

    def postrl() -> int:
        out = generate(
            model, ids, mask, max_new_tokens=new_tokens, eos_token_id=None, pad_token_id=PAD, generator=g
        )
        return int(out.response_mask.sum())

    def hf() -> int:
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=hf_config)
        return (out.shape[1] - ids.shape[1]) * batch

    return {"postrl": postrl, "hf": hf}


def _measure(runners: dict[str, Callable[[], int]], repeats: int) -> list[dict[str, float]]:
    """``repeats`` pairs of runs (tokens/s per contender), the order alternating from pair to pair."""
    for fn in runners.values():  # warm-up (allocator, MKL, HF lazy init)
        fn()
    pairs = []
    for r in range(repeats):
        names = list(runners) if r % 2 == 0 else list(reversed(runners))
        pairs.append({name: _time(runners[name]) for name in names})
    return pairs


def _row(batch: int, pairs: list[dict[str, float]]) -> dict:
    """Best tokens/s of each (the least disturbed run) and two ratios: of the bests, and the median of the
    per-pair ratios (robust to slow drifts of the machine's load)."""
    best = {name: max(p[name] for p in pairs) for name in pairs[0]}
    paired = statistics.median(p["postrl"] / p["hf"] for p in pairs)
    return {
        "batch": batch,
        "postrl_tok_s": round(best["postrl"]),
        "hf_tok_s": round(best["hf"]),
        "ratio": round(best["postrl"] / best["hf"], 2),
        "ratio_paired_median": round(paired, 2),
        "repeats": len(pairs),
    }


def bench_rollout(args: argparse.Namespace) -> dict:
    """Part (a): rollout throughput, postrl vs HF generate, per batch size."""
    model = build_tiny_lm(VOCAB, seed=0, pad_token_id=PAD, eos_token_id=EOS).eval()
    print(
        f"rollout: {args.new_tokens} new tokens, {torch.get_num_threads()} threads, tiny Llama d=128 L=2, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}; best of the repeats"
    )
    print(f"{'batch':>6} {'postrl tok/s':>13} {'HF tok/s':>10} {'ratio':>6} {'paired':>7}")
    rows = []
    for batch in args.batches:
        repeats = max(2, args.repeats // 2) if batch == 1 else args.repeats
        row = _row(batch, _measure(_rollout_runners(model, batch, args.new_tokens), repeats))
        rows.append(row)
        print(
            f"{batch:>6} {row['postrl_tok_s']:>13,} {row['hf_tok_s']:>10,} {row['ratio']:>5.2f}x "
            f"{row['ratio_paired_median']:>6.2f}x",
            flush=True,
        )
    return {"new_tokens": args.new_tokens, "rows": rows}


def bench_train(args: argparse.Namespace) -> dict:
    """Part (b): pretrain the built-in model from scratch, then SFT on arithmetic until the held-out accuracy
    band (the demo's budgets), then exact match on 500 held-out prompts with greedy decoding."""
    import dataclasses
    import tempfile
    from pathlib import Path

    from postrl.demo import DemoConfig
    from postrl.lm.evaluation import evaluate_task
    from postrl.lm.models import load_causal_lm
    from postrl.lm.pretrain import run_pretrain
    from postrl.lm.sft import run_sft
    from postrl.lm.tasks import get_task
    from postrl.lm.tokenizer import load_tokenizer

    demo = DemoConfig()
    out = Path(args.out or tempfile.mkdtemp(prefix="lm-foundation-"))
    pre_cfg = dataclasses.replace(demo.pretrain, threads=args.threads)
    pre = run_pretrain(pre_cfg, out / "pretrain", overwrite=True)
    sft_cfg = dataclasses.replace(
        demo.sft,
        model=str(out / "pretrain" / "model"),
        data="task:arithmetic",
        task=demo.sft.task["arithmetic"],
        threads=args.threads,
        stop_accuracy=args.stop_accuracy,
    )
    sft = run_sft(sft_cfg, out / "sft", overwrite=True)
    model = load_causal_lm(out / "sft" / "model")
    tokenizer = load_tokenizer(out / "sft" / "model")
    task = get_task("arithmetic", **demo.sft.task["arithmetic"])
    accuracy = evaluate_task(model, tokenizer, task, n=500, max_new_tokens=8)["reward"]
    keys = ("wall_seconds", "heldout_loss", "train_tokens_per_second", "steps", "peak_rss_mb")
    result = {
        "pretrain": {k: pre.get(k) for k in keys},
        "sft": {**{k: sft.get(k) for k in keys}, "heldout_accuracy_500": accuracy},
        "run_dir": str(out),
    }
    for stage in ("pretrain", "sft"):
        r = result[stage]
        print(
            f"{stage:>8}: {r['wall_seconds']:.0f} s, {r['steps']} steps, "
            f"{r['train_tokens_per_second']:,.0f} train tokens/s, held-out loss {r['heldout_loss']:.3f}"
        )
    print(f"exact match on 500 held-out prompts (greedy): {accuracy:.3f}")
    return result


PARTS: dict[str, Callable[[argparse.Namespace], dict]] = {"rollout": bench_rollout, "train": bench_train}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=sorted(PARTS), default="rollout", help="which benchmark to run")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256], help="batch sizes")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per row")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per contender (half at batch 1)")
    parser.add_argument("--out", default=None, help="part train: run folder (default: a temp folder)")
    parser.add_argument(
        "--stop-accuracy", type=float, default=0.3, help="part train: stop SFT at this held-out accuracy"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = PARTS[args.part](args)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak_rss_mb:.0f} MiB")
    header = {
        "part": args.part,
        "threads": args.threads,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
    }
    result = {**header, "peak_rss_mb": round(peak_rss_mb), **result}
    record(f"lm_foundation-{args.part}", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
