"""Real-size models on this machine: seconds per step and peak memory of postrl beside TRL 1.16 (issue #37 item 1).

Models: random initialisations shaped like the models people post-train, saved with ``save_pretrained`` and a
tokenizer of the same vocabulary size, so that both trainers load them as a user's folder:

    qwen0.5b      Qwen2ForCausalLM, Qwen2.5-0.5B's shape: 24 layers, d 896, ffn 4864, 14 heads / 2 KV heads,
                  vocabulary 151,936, tied embeddings (494,032,768 parameters)
    smollm135m    LlamaForCausalLM, SmolLM-135M's shape: 30 layers, d 576, ffn 1536, 9 / 3 heads, vocabulary
                  49,152, tied (134,515,008 parameters)

The tokenizer is postrl's byte-level BPE (`postrl.lm.tokenizer`) trained on the built-in corpus, its vocabulary
filled up to the model's size with tokens no merge produces (so encoding is the small BPE's; the output layer,
its softmax and the sampled ids span the full vocabulary, as a real model's do).

Stages (``--stage``), each contender in its own process, peak memory its resident-set high-water mark
(``os.wait4``'s ru_maxrss of that child), time the median training step after the first (postrl: metrics.jsonl
``time_step``; TRL: a callback, from one optimiser step's end to the next's):

    sft   the built-in arithmetic demonstrations (prompt/completion, loss on the completion), ``--batch`` rows
          per step, ``--max-length`` tokens; ``--fsdp``: postrl alone, 2 ranks (torchrun, gloo, FSDP2) beside
          1 process on the same global batch: peak RSS per rank and the exported weights' largest difference
    dpo   the built-in reviews pairs, ``--batch`` pairs per step, ``--max-length`` tokens, β 0.1, lr 1e-6;
          postrl precomputes the reference log-probs (as it always does), TRL with
          ``precompute_ref_log_probs=True`` (its cheapest setting), the precompute not timed either side
    grpo  the built-in arithmetic prompts, G = ``--group`` (8), ``--prompts`` per step (4), 128 new tokens, β 0
          (no reference model), one optimiser step per batch of G × prompts completions, ``--per-forward`` (8)
          rows per forward (postrl grpo.grad_accum, TRL per_device_train_batch_size × gradient_accumulation_steps);
          a random model's rewards are all 0 on both sides (TRL's reward function returns 0), which changes no
          tensor size or kernel

    .venv/bin/python benchmarks/real_size.py --stage dpo --model qwen0.5b --steps 3
    .venv/bin/python benchmarks/real_size.py --stage grpo --model qwen0.5b --steps 2 [--dtype bfloat16] [--lora]

TRL runs in benchmarks/peers/.venv-trl (``make peers``; ``--trl-python``), this file in ``--trl-worker`` mode. With
``--trl-checkpointing`` TRL recomputes activations too (its ``gradient_checkpointing=True``): the fair partner of
a postrl run given ``--set run.memory.gradient_checkpointing=true``. The postrl process gets
``run.memory.log_probs=auto`` (chunked at this vocabulary) unless ``--full-logits``.

Measured 2026-12-05 on the shared 2-core machine, load average 10-45 (a dozen other jobs: each contender got
a fraction of a core, so step times are inflated several-fold and their ratio is noisy; peak memory is not).
Earlier (before the two fixes below; load 10-18):

    --stage dpo --model qwen0.5b --steps 3 (4 pairs, fp32, full fine-tuning):
      postrl  peak RSS 11,027 MB, step 325 s (390, 284, 366); TRL 9,622 MB, 167 s. Goals (0.6x, 0.67x) NOT met.
    --stage grpo --model qwen0.5b --steps 2 --new-tokens 16 (G 8 x 4 prompts, fp32, full; 16 new tokens, not
      128: at this load a 128-token step would have taken hours):
      postrl  peak RSS 11,458 MB, step 134 s (205, 134; generation 56 s, training 78 s), load 0.9-2.4
      TRL     peak RSS 10,421 MB, step 102 s (124, 102), load falling 10 -> 1

The cause (benchmarks/real_size_profile.py, the resident set per phase, DPO 0.5B, 2 steps, one process at a
time at load 7-12): both trainers hold the same floor (torch's fused AdamW on both sides, 2 threads each, no
float64: weights + gradients + moments = 16 B/parameter = 7.9 GB); TRL's peak is its one backward per step
(7,665 -> 9,701 MB). postrl's was the SECOND backward of a step (dpo.length_groups=2: two forwards per step),
8,925 -> 11,095 MB: gradient accumulation through the shared-prompt forward (prompt pass + response pass, the
KV cache gathered) holds a second full set of gradients while it runs, because autograd sums the two passes'
contributions to each weight before adding them to .grad (--accumulation: one DPO-shaped micro-batch, the
backward onto existing gradients +2.3 GB with shared prompts, +0.5 GB for a first backward). Found and fixed
on the way: the chunked output layer's backward filled a zeroed [V, d] buffer and made a [V, d] temporary per
chunk (2 x 544 MB; ~3 s of page faults each at load 14), and DPO/KTO loaded a second copy of the policy as
the reference for the precompute. After the fixes (step losses bit-identical to the run before them):

    --stage dpo --model qwen0.5b --steps 3, load 19-45:
      postrl  training peak 11,232 MB, step 195 s (239, 232, 157)
      TRL     peak 9,769 MB, step 146 s (205, 144, 148); ratio memory 1.15x, time 1.34x
    ... --only postrl --set dpo.length_groups=1 (one forward and backward per step, as TRL), load 24-28:
      postrl  training peak 9,789 MB (1.00x TRL's), step 242 s (301, 308, 177): the excess was the accumulation
    --stage sft --model smollm135m --steps 3 --fsdp (SFT, 4 rows x 128 tokens), load 25-41:
      1 process 2,672 MB; 2 FSDP2 ranks (gloo) 2,992 MB the larger rank (its final export gathers the whole
      model), all processes together 6,037 MB while training; exported weights' largest difference 2.2e-8.
      Sharding saves ~0.5 GB of gradients and moments per rank at 135M: not visible here (not broken down).

Measured 2026-12-05 20:00-20:16 (commit 0684583+, an Intel Xeon host: the runs above were on an AMD EPYC;
load 1.7-4, other sessions' jobs), fp32 full fine-tuning unless said:

    --stage sft --model qwen0.5b --steps 3 (4 rows of ~18 tokens: 72 tokens per step), load 1.7-2.6:
      postrl  3.0 s/step, 8,710 MB; TRL 20.0 s/step, 8,790 MB (memory 0.99x; time 0.15x, not believed: see
      the bfloat16 line); the same with --threads 1, load 3: postrl 4.7 s (5.9, 3.5), 8,644 MB; TRL 4.2 s
      (4.4, 4.0), 8,765 MB: time 1.12x, memory 0.99x (the fp32 AdamW floor on both sides).
    --stage grpo --model qwen0.5b --steps 2 --group 4 --prompts 1 --per-forward 4 (128 new tokens), load 1.9-2.4:
      postrl  36.3 s/step (generation 24.0 s: Qwen2 runs through the Hugging Face forward, no fast decoder;
      training 12.4 s), training peak 9,958 MB; TRL 37.8 s, 10,068 MB (time 0.96x, memory 0.99x). The same
      with 1 step at load 12: postrl 1,099 s (generation 859 s), TRL 703 s (load falling 12 -> 6), 8,293 vs
      8,290 MB: two torch threads on 2 shared cores at load 12 slowed a step 30-fold, not 6-fold. With
      --threads 1, load 1.3-3.3: postrl 57.8 s (generation 35.1, training 22.6), 10,055 MB; TRL 58.9 s,
      10,058 MB (time 0.98x, memory 1.00x).
    --stage sft --model qwen0.5b --steps 3 --fsdp, load 2.3-4.4: 1 process 8,699 MB while training, 12.0
      s/step; 2 FSDP2 ranks: the largest rank 7,042 MB while training (0.81x), 9,660 MB over the whole run
      (its export gathers the model), all processes 14,126 MB while training, 24.9 s/step (torchrun gives
      each rank OMP_NUM_THREADS=1); exported weights' largest difference 3.6e-8.
    --stage sft --model qwen0.5b --steps 3 --dtype bfloat16 --lora: at 2 threads, load 3, postrl 26.5 s vs
      TRL 1.0 s per step, but postrl's same command took 0.5 s and 7 s per step in back-to-back runs at load
      2.7-2.8 (many small ops: each parallel region waits for the other thread's timeslice on the shared
      cores), so 2-thread times here are not comparable (that file was not kept). With --threads 1 (in the
      name), load 3: postrl 1.0 s, 3,084 MB; TRL 2.1 s, 3,313 MB (time 0.47x, memory 0.93x).

Measured 2026-12-06 02:45-02:50 (AMD EPYC, load 2.0-2.5: two helper jobs), after the shared-prefix forward's
two backwards (``postrl.lm.rollout.forwards.split_backward_at_prefix``: the response pass's share of each
weight goes to .grad at once instead of waiting, summed, for the prompt pass's backward; that wait held a
second set of gradients during the length groups' second backward, the +2.3 GB above):

    --stage dpo --model qwen0.5b --steps 3 --threads 1:
      postrl  training peak 10,049 MB, step 11.0 s (25.9, 12.9, 9.1); TRL 9,599 MB, 9.6 s (25.7, 8.1, 11.1):
      memory 1.05x (1.15x before), time 1.15x at this load. The same command --only postrl a few minutes
      earlier (load 2.3-3.3): training peak 9,824 MB, 10.7 s.
    --stage dpo --model smollm135m --steps 3 --threads 1 (load 1.9-3.7): postrl 2,933 MB, 8.4 s (15.8, 10.0,
      6.9); TRL 2,863 MB, 4.7 s; the code before the change (--only postrl, right after): 3,163 MB, 5.1 s.

Then (03:00-03:11, load 1.4-2.7) with ``postrl`` starting torch with THP_MEM_ALLOC_ENABLE=1 (postrl/cli.py: PyTorch
advises allocations of 2 MB and more to transparent huge pages). The profile of a step (torch.profiler, 2 steps)
had shown the [151,936, 896] buffers a backward allocates afresh bound by page faults: the embedding gradient's
zero fill 596 ms each (4 per step: 2 length groups x the prompt and the response pass), the output layer's
weight gradient 450-1,060 ms per product whose arithmetic is ~55 ms. Alternating postrl-only runs, --steps 4:
THP off 8.86 s/step, 9,347 MB; on 8.13 s, 9,270 MB (on the SmolLM shape 15-25% per step, in 4 alternating
runs). Both contenders, ``--stage dpo --model qwen0.5b --steps 4 --threads 1``: postrl 8.74 s/step (20.6, 8.7,
8.4, 9.3), training peak 9,246 MB; TRL 10.19 s (22.1, 8.7, 10.2, 12.4), 9,687 MB: **memory 0.95x, time 0.86x**.
On the SmolLM-135M shape (--steps 3, load 2.3-2.7): postrl 2.23 s, 2,842 MB; TRL 2.82 s, 2,901 MB (0.98x,
0.79x). Then (03:15-03:18, load 1.0-1.9, the machine otherwise idle) with the chunked output layer adding its
weight gradient into an existing .grad in place (postrl/lm/rollout/chunked.py `_existing_grad`: no fresh
[V, d] product for the second and later backwards of a step), the same command: postrl 7.93 s/step (19.3,
8.2, 7.9, 7.6), training peak 8,754 MB; TRL 8.88 s (22.2, 8.9, 8.6, 10.5), 9,461 MB: **memory 0.93x, time
0.89x**. Then (03:39-03:42, load 0.3-1.2) with the embedding rows added into an existing .grad in place too
(postrl/lm/rollout/forwards.py `_Embedding`: a trainer's shared-prefix forward of a `PLAIN_HEADS` model with a
plain nn.Embedding passes ``inputs_embeds``; before, each of the four passes of a step zero-filled a fresh
[V, d] gradient): postrl 6.85 s/step (18.5, 7.5, 6.6, 6.9), 8,748 MB; TRL 8.20 s (20.7, 6.7, 8.2, 8.2), 9,410
MB: **time 0.84x, memory 0.93x**. What is left is the first backward of each step, which allocates the
gradients as TRL's does.
    --stage grpo --model qwen0.5b --steps 2 --group 4 --prompts 1 --per-forward 4 --threads 1 (03:33-03:39, load
      0.9-1.3, before the embedding change): postrl 62.7 s/step (68.3, 62.7), 9,929 MB; TRL 65.3 s (75.3, 65.3),
      9,858 MB (time 0.96x, memory 1.00x): generation through the Hugging Face forward is most of the step.
    --stage sft --model qwen0.5b --steps 4 --threads 1 (03:43-03:44, load 0.7-1.1; one backward a step, so
      the in-place gradients do not apply): postrl 5.25 s (16.1, 5.2, 6.1, 4.0), 8,663 MB; TRL 5.28 s, 8,766
      MB (time 0.99x, memory 0.99x).

The goal of 0.6x TRL's peak is below the float32 AdamW floor (7.9 GB of TRL's 9.8 GB = 0.81x) for full
fine-tuning on either side; time ratios at these loads are within the noise of the machine.
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

from _record import record

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve()
SHAPES = {
    "qwen0.5b": dict(
        kind="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6,
    ),
    "smollm135m": dict(
        kind="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048, rope_theta=1e4,
    ),
}  # fmt: skip
BETA, LR = 0.1, 1e-6


def make_model(name: str, folder: Path) -> Path:
    """The random-init model ``name`` and its full-vocabulary tokenizer in ``folder`` (kept if already there)."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from postrl.lm.tokenizer import build_default_tokenizer, wrap_tokenizer

    shape = dict(SHAPES[name])
    kind = shape.pop("kind")
    small = build_default_tokenizer(n_lines=4000)
    data = json.loads(small.backend_tokenizer.to_str())
    vocab = data["model"]["vocab"]
    ids = set(vocab.values()) | {t["id"] for t in data["added_tokens"]}
    for i in range(max(ids) + 1, shape["vocab_size"]):
        vocab[f"<unused_{i}>"] = i  # no merge makes them: encoding unchanged, the vocabulary full-size
    vocab["<|endoftext|>"] = vocab.pop(f"<unused_{shape['vocab_size'] - 1}>")  # Qwen2's tokenizer class adds
    # an unknown token of this name when it is missing (one row past the embeddings)
    tokenizer = wrap_tokenizer(Tokenizer.from_str(json.dumps(data)), model_max_length=2048)
    assert len(tokenizer) == shape["vocab_size"], len(tokenizer)
    torch.manual_seed(0)
    common = dict(
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
    )
    common["bos_token_id"] = tokenizer.bos_token_id
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**shape, **common))
    else:
        model = LlamaForCausalLM(LlamaConfig(**shape, **common))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _rss_each(pid: int) -> list[float]:
    """Resident set of ``pid`` and of each of its children now (MB), from /proc (gone ones left out)."""
    out = []
    for p in [pid, *_children(pid)]:
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        out.append(
            next((int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmRSS")), 0)
        )
    return out


def _children(pid: int) -> list[int]:
    kids = []  # children of every thread: a process started from a worker thread is listed under that thread
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
    return kids + [g for k in kids for g in _children(k)]


def measured(cmd: list[str], log: Path, cwd: Path, trained=None) -> tuple[float, float, float, float]:
    """Run ``cmd`` → (wall seconds, peak RSS in MB: ru_maxrss of that child alone, the RSS of it and its
    children sampled every 0.2 s until ``trained()`` says the training steps are over: their peak, before a
    final checkpoint and export, which TRL's runs here do not write; and the largest one process's sample in
    that time: under torchrun, the largest rank while training)."""
    start, sampled, largest = time.perf_counter(), 0.0, 0.0
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=f, cwd=cwd)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if trained is None or not trained():
                each = _rss_each(proc.pid)
                sampled, largest = max(sampled, sum(each)), max([largest, *each])
            time.sleep(0.2)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed (status {proc.returncode}); see {log}")
    return time.perf_counter() - start, usage.ru_maxrss / 1024, sampled, largest


def _last_step_logged(run_dir: Path, steps: int):
    """Whether ``run_dir``'s metrics.jsonl has its last step's row (the spine writes it before the end)."""

    def done() -> bool:
        path = run_dir / "metrics.jsonl"
        return path.exists() and any(
            json.loads(line).get("step") == steps and "loss" in line for line in path.read_text().splitlines()
        )

    return done


def _dpo_data(work: Path, n: int) -> Path:
    from postrl.lm.tasks import get_task

    rows = get_task("reviews", perturb_fraction=0.3, n_pairs_train=n + n // 4).preference_rows("train")
    rows = [r for r in rows if r["chosen"] != r["rejected"]][:n]
    path = work / "pairs.jsonl"
    path.write_text(
        "".join(json.dumps({k: r[k] for k in ("prompt", "chosen", "rejected")}) + "\n" for r in rows)
    )
    return path


def _sft_data(work: Path, n: int) -> Path:
    from postrl.lm.tasks import get_task

    rows = get_task("arithmetic").sft_rows("train")[:n]
    path = work / "sft.jsonl"
    path.write_text("".join(json.dumps({k: r[k] for k in ("prompt", "completion")}) + "\n" for r in rows))
    return path


def _grpo_data(work: Path, n: int) -> Path:
    from postrl.lm.tasks import get_task

    rows = get_task("arithmetic").prompt_rows("train")[:n]
    path = work / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": r["prompt"]}) + "\n" for r in rows))
    return path


def postrl_command(args: argparse.Namespace, model: Path, data: Path, out: Path) -> list[str]:
    """The ``postrl`` command line (without the program) of ``args.stage`` on ``model`` and ``data``."""
    common = [
        "--model", str(model), "--data", str(data), "--out", str(out), "--overwrite", f"run.steps={args.steps}",
        "run.eval_every=0", "run.save_every=0", "run.log_every=1", "run.device=cpu", f"run.threads={args.threads}",
        f"run.dtype={args.dtype}", f"run.lora.enabled={str(args.lora).lower()}", "eval_at_start=false",
        f"run.memory.log_probs={'full' if args.full_logits else 'auto'}", f"optim.lr={LR}", "optim.warmup_steps=0",
    ]  # fmt: skip
    train = [f"train.batch_size={args.batch}", f"train.max_length={args.max_length}"]
    if args.stage == "sft":
        stage = ["sft", *common, *train, "eval_size=0", f"run.parallel={args.parallel}"]
        stage.remove("eval_at_start=false")
    elif args.stage == "dpo":
        stage = ["dpo", *common, *train, f"dpo.beta={BETA}", "eval_size=0", "eval_samples=0", "plots=false"]
    else:
        common[common.index("--data") + 1] = (
            "task:arithmetic"  # its verifier as the reward; TRL: the same prompts
        )
        stage = [
            "grpo",
            *common,
            f"grpo.group_size={args.group}",
            f"grpo.prompts_per_step={args.prompts}",
            "grpo.beta=0",
            f"grpo.grad_accum={grpo_accum(args)}",
        ]
        stage += [
            f"sampling.max_new_tokens={args.new_tokens}",
            "max_prompt_length=64",
            "eval_size=0",
            "grpo.repeat_prompts=true",
        ]
    return stage + list(args.set or [])


def grpo_accum(args: argparse.Namespace) -> int:
    """Micro-batches per GRPO step: ``--per-forward`` completions per forward on both sides."""
    return max(1, args.group * args.prompts // args.per_forward)


def postrl_run(args: argparse.Namespace, model: Path, data: Path, out: Path) -> dict:
    stage = postrl_command(args, model, data, out)
    launch = [sys.executable, "-m", "postrl.cli"]
    if args.ranks > 1:  # torchrun's wait4 usage: the largest of its children (the ranks)
        launch = [
            str(Path(sys.executable).parent / "torchrun"),
            f"--nproc_per_node={args.ranks}",
            "-m",
            "postrl.cli",
        ]
    log = out.parent / f"{out.name}.log"
    wall, rss, sampled, largest = measured([*launch, *stage], log, ROOT, _last_step_logged(out, args.steps))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    times = [r["time_step"] for r in rows if "time_step" in r]
    if not times:  # SFT logs the time since the run started: one step's is the difference
        clock = [0.0] + [r["time"] for r in rows if "loss" in r]
        times = [b - a for a, b in zip(clock, clock[1:], strict=False)]
    return {
        "step_s": statistics.median(times[1:] or times),
        "step_times": times,
        "peak_rss_mb": rss,
        "training_rss_mb": sampled,
        "training_largest_process_mb": largest,
        "wall_s": wall,
    }


def fsdp_pair(args: argparse.Namespace, model: Path, data: Path, tag: str) -> dict:
    """SFT on 1 process and on 2 FSDP ranks: peak RSS of the process / of the largest rank, and the largest
    |difference| of the exported weights (the same global batch: the ranks split each step's rows)."""
    from safetensors.torch import load_file

    out: dict = {}
    for ranks, parallel in ((1, "ddp"), (2, "fsdp")):
        args.ranks, args.parallel = ranks, parallel
        out[f"{ranks}proc"] = postrl_run(args, model, data, args.work / f"{tag}-{parallel}{ranks}")
    one = load_file(str(args.work / f"{tag}-ddp1" / "model" / "model.safetensors"))
    two = load_file(str(args.work / f"{tag}-fsdp2" / "model" / "model.safetensors"))
    out["max_weight_diff"] = max(float((one[k].float() - two[k].float()).abs().max()) for k in one)
    out["same_keys"] = one.keys() == two.keys()
    return out


def trl_run(args: argparse.Namespace, model: Path, data: Path, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        args.trl_python, str(THIS), "--trl-worker", "--stage", args.stage, "--model-dir", str(model),
        "--data", str(data), "--json", str(out / "result.json"), "--steps", str(args.steps), "--batch",
        str(args.batch), "--max-length", str(args.max_length), "--threads", str(args.threads), "--dtype", args.dtype, "--new-tokens", str(args.new_tokens),
        "--group", str(args.group), "--prompts", str(args.prompts), "--per-forward", str(args.per_forward),
    ] + (["--lora"] if args.lora else []) + (["--trl-checkpointing"] if args.trl_checkpointing else [])  # fmt: skip
    wall, rss, sampled, _ = measured(cmd, out / "worker.log", out)
    result = json.loads((out / "result.json").read_text())
    return {"step_s": statistics.median(result["times"][1:] or result["times"]), "step_times": result["times"],
            "peak_rss_mb": rss, "training_rss_mb": sampled, "wall_s": wall, "versions": result["versions"]}  # fmt: skip


def trl_worker(args: argparse.Namespace) -> None:
    """TRL's trainer for ``--stage`` on the same folder and data; step times to ``--json``."""
    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model_dir)
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines()]
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=dtype)
    times: list[float] = []

    class Timer(TrainerCallback):  # optimiser step to optimiser step (generation and accumulation included)
        def on_train_begin(self, a, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            now = time.perf_counter()
            times.append(now - self.t0)
            self.t0 = now

    common = dict(
        output_dir=str(Path(args.json).parent / "trl_out"), max_steps=args.steps, learning_rate=LR,
        lr_scheduler_type="constant", warmup_steps=0, logging_steps=1, save_strategy="no", report_to="none",
        use_cpu=True, bf16=args.dtype == "bfloat16", gradient_checkpointing=args.trl_checkpointing, seed=0, disable_tqdm=True,
        dataloader_num_workers=0, max_grad_norm=1.0, weight_decay=0.0,
    )  # fmt: skip
    peft = None
    if args.lora:
        from peft import LoraConfig

        peft = LoraConfig(
            r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
        )
    if args.stage == "sft":
        cfg = trl.SFTConfig(**common, per_device_train_batch_size=args.batch, max_length=args.max_length)
        trainer = trl.SFTTrainer(model=model, args=cfg, train_dataset=Dataset.from_list(rows), processing_class=tok,
                                 callbacks=[Timer()], peft_config=peft)  # fmt: skip
    elif args.stage == "dpo":
        cfg = trl.DPOConfig(**common, per_device_train_batch_size=args.batch, beta=BETA, loss_type=["sigmoid"],
                            max_length=args.max_length, precompute_ref_log_probs=True)  # fmt: skip
        trainer = trl.DPOTrainer(model=model, args=cfg, train_dataset=Dataset.from_list(rows), processing_class=tok,
                                 callbacks=[Timer()], peft_config=peft)  # fmt: skip
    else:
        per_device = min(args.per_forward, args.group * args.prompts)
        cfg = trl.GRPOConfig(**common, per_device_train_batch_size=per_device, gradient_accumulation_steps=grpo_accum(args),
                             num_generations=args.group, max_completion_length=args.new_tokens,
                             beta=0.0, num_iterations=1, temperature=1.0)  # fmt: skip
        trainer = trl.GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                                  args=cfg, train_dataset=Dataset.from_list(rows), processing_class=tok,
                                  callbacks=[Timer()], peft_config=peft)  # fmt: skip
    trainer.train()
    versions = {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__}
    self_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Path(args.json).write_text(json.dumps({"times": times, "versions": versions, "self_rss_mb": self_rss}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stage", choices=("sft", "dpo", "grpo"), required=True)
    p.add_argument("--model", choices=sorted(SHAPES), default="qwen0.5b")
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "bench_real_size")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=4, help="DPO pairs per step")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128, help="grpo: tokens sampled per completion")
    p.add_argument("--group", type=int, default=8, help="grpo: completions per prompt (G)")
    p.add_argument("--prompts", type=int, default=4, help="grpo: prompts per step")
    p.add_argument("--per-forward", type=int, default=8, help="grpo: completions per forward (TRL's batch)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--lora", action="store_true")
    p.add_argument("--full-logits", action="store_true", help="postrl with run.memory.log_probs=full")
    p.add_argument("--only", choices=("postrl", "trl"), help="run one contender")
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="a postrl override (repeatable; in the name)"
    )
    p.add_argument(
        "--fsdp", action="store_true", help="sft: 2 ranks (torchrun, gloo, FSDP2) beside 1 process"
    )
    p.add_argument(
        "--trl-checkpointing",
        action="store_true",
        help="TRL with its own gradient_checkpointing (beside postrl's run.memory.gradient_checkpointing=true)",
    )
    p.add_argument(
        "--trl-python", default=str(ROOT / "benchmarks" / "peers" / ".venv-trl" / "bin" / "python")
    )
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    p.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.trl_worker:
        return trl_worker(args)
    args.work.mkdir(parents=True, exist_ok=True)
    model = make_model(args.model, args.work / args.model)
    n = args.batch * args.steps  # one pass: the reference precompute of both covers only what is trained
    data = {"sft": _sft_data, "dpo": _dpo_data}.get(args.stage, _grpo_data)(args.work, n)
    tag = f"{args.stage}-{args.model}-{args.dtype}-{'lora' if args.lora else 'full'}"
    if args.stage == "grpo":
        tag += f"-t{args.new_tokens}" if args.new_tokens != 128 else ""
        tag += f"-g{args.group}x{args.prompts}" if (args.group, args.prompts) != (8, 4) else ""
        tag += f"-r{args.per_forward}" if args.per_forward != 8 else ""
    tag += f"-threads{args.threads}" if args.threads != 2 else ""
    tag += "".join(
        f"-{kv.split('.')[-1].replace('=', '')}" for kv in args.set or []
    )  # dpo.length_groups=1: -length_groups1
    tag += "-trl_checkpointing" if args.trl_checkpointing else ""
    result: dict = {"config": tag, "steps": args.steps, "load_avg": os.getloadavg()}
    args.ranks, args.parallel = 1, "ddp"
    if args.fsdp:
        result |= fsdp_pair(args, model, data, tag)
        record(f"real_size_fsdp-{tag}", result)
        return print(json.dumps(result))
    for who, fn in (("postrl", postrl_run), ("trl", trl_run)):
        if args.only in (None, who):
            result[who] = fn(args, model, data, args.work / f"{tag}-{who}")
    if "postrl" in result and "trl" in result:
        # postrl's training peak (sampled until its last step's row: before the final checkpoint and export,
        # which TRL's runs here do not write) over TRL's whole-run peak; with them, the second ratio
        result["memory_ratio"] = result["postrl"]["training_rss_mb"] / result["trl"]["peak_rss_mb"]
        result["memory_ratio_with_export"] = result["postrl"]["peak_rss_mb"] / result["trl"]["peak_rss_mb"]
        result["time_ratio"] = result["postrl"]["step_s"] / result["trl"]["step_s"]
    record(f"real_size-{tag}", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
