"""postrl on a GPU at half a billion parameters, beside TRL 1.16 (issue 22): one prepared script, one JSON line.

What it measures, on a random Llama-style model of Qwen2.5-0.5B's shape built from its config (hidden 896, 24
layers, 14 query and 2 key/value heads, MLP 4864, vocabulary 151,936, tied embeddings: 494M parameters; no
download) and a word-level tokenizer made here whose 151,936 entries cover the whole vocabulary (every sampled
id decodes), each part in its own process so that its peak GPU memory is its own:

- ``logprobs``: responses sampled by postrl's rollout engine (64 prompts, 128 new tokens, temperature 1) against
  the teacher-forced log-probs of the same tokens (`postrl.lm.rollout.score`, the Hugging Face forward):
  float32 with the fast decoder (FastLlama) and with the Hugging Face decoder, tolerance 1e-4 (max |Δ| over
  every response token); bfloat16 (where the fast decoders refuse and the Hugging Face forward runs with SDPA
  attention), stated tolerance max |Δ| ≤ 0.1 and mean |Δ| ≤ 0.01 nats (bf16 rounds each logit to ~3
  significant digits; KV-cache decoding and a full forward sum in different orders).
- ``grpo`` and ``trl``: GRPO steps at G = 8, 64 prompts per step (512 responses), 256 new tokens, bfloat16
  weights, TRL's defaults on both sides otherwise (β = 0 so no reference model, the token-level "dapo" loss, μ =
  1, lr 1e-6, temperature 1, no gradient checkpointing, use_vllm=False), 64 responses per forward/backward
  (TRL: per_device_train_batch_size 64, gradient_accumulation_steps 8, one generation per optimiser step);
  reward: the share of digits in the completion. Three steps each: seconds per step (median of the two after
  the warm-up step), split
  into generation / scoring / training for postrl, and peak GPU memory, for ``postrl grpo`` and for
  ``trl.GRPOTrainer``; the ratio of steps per second (goal: postrl ≥ 1.5× TRL at no more memory).
- ``sft``: `postrl.lm.trainer.Supervised` on 16 sequences of 1,024 tokens per step in bfloat16: training tokens
  per second and model FLOP utilisation, 6·N·tokens/s over the H200's 989 TFLOP/s dense bfloat16 peak (N: the
  parameters that do matrix products, the tied output layer counted once, attention's own FLOPs left out as
  in Kaplan et al.); then the same with LoRA (rank 16, all-linear): tokens/s, trained share, memory.
- ``ppo``: `postrl ppo` with all four roles on one GPU (actor, critic started from the reward model, frozen
  reference and reward model; a reward model here is a new head on the same random trunk), 64 prompts, 128 new
  tokens, one epoch, bfloat16: seconds per step (median after one warm-up step) and peak memory.

Run on the device (nvidia-h200: torch 2.11 + CUDA 13, transformers 5.17, accelerate, peft, pandas and pyarrow are
there; TRL, datasets, dill and multiprocess are not). Here, once, in the repository's root::

    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \\
        -d .whl trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19      # 1.8 MB together

then one device call, ``carry: [".whl"]``, ``timeout_s: 600``::

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu.py --trl-wheels .whl --out $OUT 2>&1 | tail -c 20000

(the wheels are installed by the script into a folder of its own, for the TRL process only, and imported once
before the TRL part: datasets 5.2 needs pyarrow >= 24; if the image's is older the TRL part reports it and the
others still run; carrying ``pyarrow==26.0.1`` too (55 MB of the 64 MiB a call may carry) fixes it). The whole
run is planned for ≤ 8 minutes (``--budget 470`` seconds: a part that would start with too little time left is
skipped and says so; ``--parts trl,ppo`` reruns some). ``$OUT`` gets ``gpu-result.json`` and ``gpu-logs.txt``
(every part's last 300 log lines); the last line printed is the JSON of the whole run.

Here, the same script end to end on the CPU with a tiny model (< 2 minutes; TRL from its own venv)::

    .venv/bin/python benchmarks/gpu.py --smoke --trl-python benchmarks/peers/.venv-trl/bin/python   # after `make peers`

Results: none on a GPU yet (no device was lent to the session that wrote this script). The smoke run, 2026-12-03,
on the shared 2-core CPU at a load average of 12 (every time inflated; process start-up dominates each part):
all six parts in 163 s; sampled vs teacher-forced log-probs max |Δ| 4.8e-7 in float32 (fast and HF decoders)
and 9.9e-4 in bfloat16 (mean 2.6e-4); GRPO 0.20 s/step for postrl and 0.27 for TRL 1.16 (a 140k-parameter model:
no speed claim); SFT 2,805 tokens/s (LoRA 2,840, 5.5% of the parameters trained); PPO with four roles 0.47 s/step.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _record import record

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve()
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
OFFLINE |= {"TOKENIZERS_PARALLELISM": "false", "WANDB_DISABLED": "true", "HF_HUB_DISABLE_TELEMETRY": "1"}
H200_BF16_PEAK = 989e12  # dense bf16 FLOP/s of the H200's spec sheet (measured GEMMs: ~790e12)

# Qwen2.5-0.5B's shape as a Llama config (Qwen2 differs by biases on q/k/v only); the smoke model is tiny.
MODELS = {
    "real": dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096, rope_theta=1e6,
        rms_norm_eps=1e-6, tie_word_embeddings=True,
    ),
    "smoke": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=1024, max_position_embeddings=512, rope_theta=1e4, rms_norm_eps=1e-6, tie_word_embeddings=True,
    ),
}  # fmt: skip
SETTINGS = {
    "real": dict(
        device="cuda", group=8, prompts=64, new_tokens=256, micro=64, grpo_steps=3, lp_prompts=64, lp_tokens=128,
        sft_batch=16, sft_length=1024, sft_steps=8, ppo_prompts=64, ppo_tokens=128, ppo_steps=3, lora_rank=16,
    ),
    "smoke": dict(
        device="cpu", group=2, prompts=4, new_tokens=8, micro=4, grpo_steps=2, lp_prompts=4, lp_tokens=8,
        sft_batch=4, sft_length=64, sft_steps=3, ppo_prompts=4, ppo_tokens=8, ppo_steps=2, lora_rank=4,
    ),
}  # fmt: skip
# timeout (s) of each, in the order they run: the comparison first
PARTS = {"prepare": 90, "grpo": 150, "trl": 170, "logprobs": 60, "sft": 60, "ppo": 90}
TOLERANCE = {"float32": {"max": 1e-4}, "bfloat16": {"max": 0.1, "mean": 0.01}}


def digit_reward(prompts, completions, **columns):
    """The share of digits in each completion (TRL's reward-function contract; both trainers call it)."""
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


# ---- the parts (each runs in its own process: ``--part NAME``) -------------------------------------------
def part_prepare(work: Path, size: str, s: dict) -> dict:
    """The tokenizer, the random model (bfloat16 safetensors), a reward model on it, and the prompts."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    sys.path.insert(0, str(ROOT))
    from postrl.lm.models import ScalarHeadModel

    cfg = MODELS[size]
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    chars = [chr(c) for c in range(32, 127)]
    words = [f"w{i} " for i in range(cfg["vocab_size"] - len(specials) - len(chars))]  # every id decodes
    vocab = {t: i for i, t in enumerate(specials + chars + words)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # prompts: one token a character
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>"
    )
    tok.padding_side = "left"
    config = LlamaConfig(**cfg, pad_token_id=0, eos_token_id=1, bos_token_id=2, attention_dropout=0.0)
    torch.manual_seed(0)
    device = s["device"]
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, 1
    model.save_pretrained(str(work / "model"))
    tok.save_pretrained(str(work / "model"))
    rm = ScalarHeadModel.from_causal_lm(model, seed=1)  # a new head on the same trunk
    rm.save_pretrained(work / "rm")
    tok.save_pretrained(str(work / "rm"))
    rng = random.Random(0)
    rows = [
        {"prompt": f"Sum {rng.randint(10, 99)} + {rng.randint(10, 99)} ="} for _ in range(16 * s["prompts"])
    ]
    (work / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    n = sum(p.numel() for p in model.parameters())
    return {"params": n, "vocab": len(tok), "config": cfg}


def _peak(device: str) -> dict:
    import torch

    if device != "cuda":
        return {}
    return {
        "peak_allocated_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "peak_reserved_gb": round(torch.cuda.max_memory_reserved() / 2**30, 2),
    }


def _after_warmup(values: list[float]) -> float:
    return statistics.median(values[1:] if len(values) > 1 else values)


def part_logprobs(work: Path, size: str, s: dict) -> dict:
    """Sampled log-probs against teacher-forced ones, per dtype and decoder."""
    import torch

    sys.path.insert(0, str(ROOT))
    from postrl.lm.models import load_causal_lm
    from postrl.lm.rollout import RolloutEngine, SamplingConfig, score
    from postrl.lm.tokenizer import load_tokenizer

    tok = load_tokenizer(work / "model")
    rows = [json.loads(line) for line in (work / "prompts.jsonl").read_text().splitlines()][: s["lp_prompts"]]
    out = {}
    for dtype, backend in (("float32", "fast"), ("float32", "hf"), ("bfloat16", "auto")):
        try:
            model = load_causal_lm(work / "model", dtype=dtype, device=s["device"])
            sampling = SamplingConfig(max_new_tokens=s["lp_tokens"], temperature=1.0, backend=backend)
            generator = torch.Generator(device=s["device"]).manual_seed(0)
            with torch.no_grad():
                rollout = RolloutEngine(model, tok, sampling).generate([r["prompt"] for r in rows], generator)
                forced = score(
                    model, rollout.input_ids, rollout.attention_mask, rollout.prompt_len, use_fast=False
                )
        except (RuntimeError, ValueError) as err:  # one case failing leaves the others' results
            out[f"{dtype}_{backend}"] = {"error": str(err).splitlines()[0][:300]}
            continue
        mask = rollout.response_mask.bool()
        diff = (rollout.log_probs - forced).abs()[mask].float()
        tol = TOLERANCE[dtype]
        result = {"max_abs": float(diff.max()), "mean_abs": float(diff.mean()), "tokens": int(mask.sum())}
        result["pass"] = result["max_abs"] <= tol["max"] and result["mean_abs"] <= tol.get("mean", 1.0)
        out[f"{dtype}_{backend}"] = result | {"tolerance": tol}
        del model, rollout, forced
    return out


def part_grpo(work: Path, size: str, s: dict) -> dict:
    """``postrl grpo`` for a few steps at the comparison's settings."""
    sys.path.insert(0, str(ROOT))
    from postrl.lm.grpo import GRPOConfig, run_grpo
    from postrl.runtime.config import load_config
    from postrl.runtime.logging import read_jsonl

    overrides = [
        f"model={work / 'model'}", f"data={work / 'prompts.jsonl'}", f"rewards=[{THIS}:digit_reward]",
        "eval_size=0", "eval_at_start=false", "max_prompt_length=64",
        f"grpo.group_size={s['group']}", f"grpo.prompts_per_step={s['prompts']}",
        f"grpo.grad_accum={s['prompts'] * s['group'] // s['micro']}", f"sampling.max_new_tokens={s['new_tokens']}",
        f"run.steps={s['grpo_steps']}", f"run.device={s['device']}", "run.dtype=bfloat16",
        "run.eval_every=0", "run.save_every=0", "run.log_every=1", "optim.lr=1e-6",
    ]  # fmt: skip
    cfg = load_config(GRPOConfig, None, overrides)
    run_grpo(cfg, work / "grpo-run", overwrite=True)
    rows = [r for r in read_jsonl(work / "grpo-run" / "metrics.jsonl") if "time_step" in r]
    phases = {k: _after_warmup([r[k] for r in rows]) for k in ("time_generate", "time_score", "time_train")}
    step = _after_warmup([r["time_step"] for r in rows])
    tokens = _after_warmup([r["generated_tokens"] for r in rows])
    return {"seconds_per_step": step, **phases, "generated_tokens_per_step": tokens} | _peak(s["device"])


def part_trl(work: Path, size: str, s: dict) -> dict:
    """TRL 1.16's GRPOTrainer at the same settings (runs in TRL's own Python)."""
    import torch
    import transformers
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    transformers.logging.set_verbosity_error()
    tok = AutoTokenizer.from_pretrained(str(work / "model"))
    tok.padding_side = "left"
    rows = [json.loads(line) for line in (work / "prompts.jsonl").read_text().splitlines()]

    class Timer(TrainerCallback):
        times: list[float] = []

        def on_step_begin(self, args, state, control, **kw):
            if s["device"] == "cuda":
                torch.cuda.synchronize()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if s["device"] == "cuda":
                torch.cuda.synchronize()
            self.times.append(time.perf_counter() - self.t0)

    per_step = s["prompts"] * s["group"]
    cfg = GRPOConfig(
        output_dir=str(work / "trl-run"), max_steps=s["grpo_steps"], per_device_train_batch_size=s["micro"],
        gradient_accumulation_steps=per_step // s["micro"], num_generations=s["group"],
        max_completion_length=s["new_tokens"], learning_rate=1e-6, beta=0.0, loss_type="dapo", num_iterations=1,
        temperature=1.0, logging_steps=1, save_strategy="no", report_to="none", bf16=True, fp16=False,
        gradient_checkpointing=False, use_vllm=False, seed=0, dataloader_num_workers=0, disable_tqdm=True,
        use_cpu=s["device"] == "cpu", model_init_kwargs={"dtype": torch.bfloat16},
    )  # fmt: skip
    timer = Timer()
    trainer = GRPOTrainer(
        model=str(work / "model"), reward_funcs=digit_reward, args=cfg, train_dataset=Dataset.from_list(rows),
        processing_class=tok, callbacks=[timer],
    )  # fmt: skip
    trainer.train()
    import trl

    return {"seconds_per_step": _after_warmup(timer.times), "trl": trl.__version__} | _peak(s["device"])


def _matmul_params(model) -> int:
    """Parameters in matrix products per token: all but the input embedding (the tied output layer once)."""
    embed = model.get_input_embeddings().weight
    return sum(p.numel() for p in model.parameters()) - (
        0 if model.config.tie_word_embeddings else embed.numel()
    )


def _sft_rate(model, tok, s: dict) -> tuple[float, int]:
    import torch

    sys.path.insert(0, str(ROOT))
    from postrl.lm.spine import RunConfig
    from postrl.lm.trainer import OptimConfig, Supervised, TrainConfig

    gen = random.Random(0)
    length, batch = s["sft_length"], s["sft_batch"]
    examples = []
    for _ in range(batch * s["sft_steps"]):
        ids = [gen.randrange(4, len(tok)) for _ in range(length)]
        examples.append({"input_ids": ids, "labels": ids})
    run = RunConfig(steps=s["sft_steps"], device=s["device"], dtype="bfloat16")
    algo = Supervised(
        model, tok, examples, [], TrainConfig(batch_size=batch, max_length=length), OptimConfig(lr=1e-5),
        run, device=torch.device(s["device"]),
    )  # fmt: skip
    times = []
    for step in range(s["sft_steps"]):
        tic = time.perf_counter()
        algo.step(step)  # returns floats: the step has finished on the device
        times.append(time.perf_counter() - tic)
    return batch * (length - 1) / _after_warmup(times), batch * (length - 1)


def part_sft(work: Path, size: str, s: dict) -> dict:
    """Training tokens/s and MFU of full fine-tuning, then of LoRA, in bfloat16."""
    import torch

    sys.path.insert(0, str(ROOT))
    from postrl.lm.models import apply_lora, load_causal_lm, trainable_share
    from postrl.lm.spine import LoraConfig, RunConfig
    from postrl.lm.tokenizer import load_tokenizer

    tok = load_tokenizer(work / "model")
    model = load_causal_lm(work / "model", dtype="bfloat16", device=s["device"])
    n = _matmul_params(model)
    rate, _ = _sft_rate(model, tok, s)
    full = {"tokens_per_second": rate, "mfu": 6 * n * rate / H200_BF16_PEAK, "matmul_params": n}
    full |= _peak(s["device"])
    del model
    if s["device"] == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    lora = RunConfig(lora=LoraConfig(enabled=True, rank=s["lora_rank"], alpha=2.0 * s["lora_rank"]))
    model = apply_lora(load_causal_lm(work / "model", dtype="bfloat16", device=s["device"]), lora)
    rate, _ = _sft_rate(model, tok, s)
    adapted = {"tokens_per_second": rate, "trained_share": trainable_share(model)} | _peak(s["device"])
    return {"full": full, "lora": adapted, "batch_tokens": s["sft_batch"] * s["sft_length"]}


def part_ppo(work: Path, size: str, s: dict) -> dict:
    """``postrl ppo`` with actor, critic, reference and reward model on one device."""
    sys.path.insert(0, str(ROOT))
    from postrl.lm.ppo import PPOConfig, run_ppo
    from postrl.runtime.config import load_config
    from postrl.runtime.logging import read_jsonl

    overrides = [
        f"model={work / 'model'}", f"reward_model={work / 'rm'}", f"data={work / 'prompts.jsonl'}",
        "critic=reward_model", "reward.normalize=none", "eval_size=1", "max_prompt_length=64",
        f"batch_size={s['ppo_prompts']}", f"sampling.max_new_tokens={s['ppo_tokens']}", "ppo.epochs=1",
        "ppo.minibatches=1", "ppo.grad_accum=4", f"run.steps={s['ppo_steps']}", f"run.device={s['device']}",
        "run.dtype=bfloat16", "run.eval_every=0", "run.save_every=0", "run.log_every=1",
    ]  # fmt: skip
    run_ppo(load_config(PPOConfig, None, overrides), work / "ppo-run", overwrite=True)
    rows = [r for r in read_jsonl(work / "ppo-run" / "metrics.jsonl") if "time_generate" in r]
    phases = {k: _after_warmup([r[k] for r in rows]) for k in ("time_generate", "time_score", "time_train")}
    return {"seconds_per_step": sum(phases.values()), **phases} | _peak(s["device"])


PART_FUNCTIONS = {
    "prepare": part_prepare, "logprobs": part_logprobs, "grpo": part_grpo, "trl": part_trl, "sft": part_sft,
    "ppo": part_ppo,
}  # fmt: skip


# ---- the orchestrator ------------------------------------------------------------------------------------
def _trl_env(args: argparse.Namespace, work: Path, env: dict) -> tuple[str, dict]:
    """The Python and environment of the TRL process: ``--trl-python``, or this Python with the wheels of
    ``--trl-wheels`` installed into ``WORK/trl-site`` (put first on its PYTHONPATH)."""
    if not args.trl_wheels:
        return args.trl_python or sys.executable, env
    site = work / "trl-site"
    wheels = sorted(str(p) for p in Path(args.trl_wheels).glob("*.whl"))
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    subprocess.run([*pip, "--target", str(site), *wheels], check=True)
    env = env | {"PYTHONPATH": os.pathsep.join([str(site), env.get("PYTHONPATH", "")])}
    probe = "import pyarrow, datasets, trl; print(trl.__version__, datasets.__version__, pyarrow.__version__)"
    found = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    if found.returncode != 0:  # e.g. datasets 5.2 needs pyarrow >= 24: carry pyarrow==26.0.1 too
        raise OSError("the TRL stack does not import: " + found.stderr.strip().splitlines()[-1])
    return sys.executable, env


def run_part(name: str, python: str, args: argparse.Namespace, work: Path, env: dict, timeout: float) -> dict:
    """One part in its own process; its JSON, or what went wrong (the log's last lines)."""
    log = work / f"{name}.log"
    cmd = [python, str(THIS), "--part", name, "--work", str(work), "--size", args.size]
    tic = time.perf_counter()
    try:
        with log.open("w") as f:
            code = subprocess.run(
                cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout
            ).returncode
    except subprocess.TimeoutExpired:
        code = "timeout"
    seconds = round(time.perf_counter() - tic, 1)
    result_file = work / f"{name}.json"
    if code == 0 and result_file.is_file():
        return json.loads(result_file.read_text()) | {"wall_seconds": seconds}
    tail = log.read_text(errors="replace").strip().splitlines()[-6:] if log.is_file() else []
    failed = {"error": f"exit {code} after {seconds} s", "log_tail": tail}
    metrics = work / f"{name}-run" / "metrics.jsonl"  # a run cut short still logged its steps
    if metrics.is_file():
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        failed["steps_logged"] = [
            {k: v for k, v in r.items() if k.startswith("time_") or k == "step"} for r in rows if "loss" in r
        ]
    return failed


def summarize(results: dict) -> dict:
    """The comparison the issue asks for: postrl's GRPO steps/s over TRL's, and their memory."""
    ours, theirs = results.get("grpo", {}), results.get("trl", {})
    if "seconds_per_step" in ours and "seconds_per_step" in theirs:
        results["grpo_speedup_vs_trl"] = round(theirs["seconds_per_step"] / ours["seconds_per_step"], 3)
        if "peak_allocated_gb" in ours and "peak_allocated_gb" in theirs:
            results["grpo_memory_ratio_vs_trl"] = round(
                ours["peak_allocated_gb"] / theirs["peak_allocated_gb"], 3
            )
    return results


def orchestrate(args: argparse.Namespace) -> dict:
    start = time.perf_counter()
    work = Path(args.work or (ROOT / "runs" / f"gpu-bench-{args.size}")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = os.environ | OFFLINE | {"PYTHONUNBUFFERED": "1"}
    if args.size == "smoke":
        env |= {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    results: dict = {"bench": "gpu", "size": args.size, "settings": SETTINGS[args.size]}
    for name in args.parts.split(","):
        left = args.budget - (time.perf_counter() - start)
        timeout = min(PARTS[name] * (1 if args.size == "real" else 2), left)
        if timeout < 15:
            results[name] = {"skipped": f"{left:.0f} s of the --budget left"}
            continue
        python, part_env = (sys.executable, env)
        if name == "trl":
            try:
                python, part_env = _trl_env(args, work, env)
            except (subprocess.CalledProcessError, OSError) as err:
                results[name] = {"error": f"TRL from --trl-wheels: {err}"}
                continue
        results[name] = run_part(name, python, args, work, part_env, timeout)
        print(f"gpu.py: {name}: {json.dumps(results[name])}", file=sys.stderr, flush=True)
        if name == "prepare" and "error" in results[name]:
            break
    results["wall_seconds"] = round(time.perf_counter() - start, 1)
    results = summarize(results)
    if args.out:  # two files: the device tool brings back at most 8
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu-result.json").write_text(json.dumps(results, indent=1))
        logs = [
            f"==== {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-300:])
            for f in sorted(work.glob("*.log"))
        ]
        (out / "gpu-logs.txt").write_text("\n".join(logs))
    return results


def run_worker(args: argparse.Namespace) -> None:
    """``--part NAME``: one part in this process; writes WORK/NAME.json."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    work, s = Path(args.work), SETTINGS[args.size]
    if s["device"] == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("gpu.py: no CUDA device (use --smoke on a CPU)")
        info = {"device_name": torch.cuda.get_device_name(), "torch": torch.__version__}
    else:
        info = {"device_name": "cpu"}
    result = PART_FUNCTIONS[args.part](work, args.size, s)
    (work / f"{args.part}.json").write_text(json.dumps(result | info))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model on the CPU (< 2 minutes)")
    parser.add_argument("--trl-python", default=None, help="Python with TRL 1.16 (default: this one)")
    parser.add_argument(
        "--trl-wheels", default=None, help="folder of wheels (TRL and what it lacks) to install"
    )
    parser.add_argument(
        "--parts", default=",".join(PARTS), help="comma-separated subset of " + ",".join(PARTS)
    )
    parser.add_argument("--budget", type=float, default=470.0, help="seconds for the whole run")
    parser.add_argument("--work", default=None, help="scratch folder (default runs/gpu-bench-SIZE)")
    parser.add_argument("--out", default=None, help="also copy every part's log and JSON here")
    parser.add_argument("--part", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--size", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.size = args.size or ("smoke" if args.smoke else "real")
    if args.part:
        run_worker(args)
        return
    result = orchestrate(args)
    record(f"gpu-{args.size}", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
