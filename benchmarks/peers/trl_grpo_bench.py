#!/usr/bin/env python
"""Offline CPU micro-benchmark of TRL's GRPOTrainer on a toy arithmetic task.

Everything is built locally (no Hugging Face Hub access):
  * a character-level tokenizer built with `tokenizers` and wrapped as PreTrainedTokenizerFast,
  * a tiny GPT-2 (2 layers, 4 heads, 128 dims) initialised from scratch and saved to a local folder,
  * a synthetic prompt-only dataset ("add 3 4 =" -> answer "7"),
  * a rule-based reward: 1.0 if the completion starts with the right digit string, plus a small length term.

The task definition (tokenizer, prompts, reward) lives in `make_tokenizer()`, `make_prompts()`,
`arith_reward_values()` and `build_task()` so another GRPO implementation can import this file and run
on exactly the same task (same seed -> same prompts, same initial weights):

    from trl_grpo_bench import build_task, arith_reward_values
    tok, rows, n_params = build_task("tiny-gpt2-char")   # saves model + tokenizer there

Timing is extremely sensitive to other processes on a 2-core box (a concurrent 2-thread job made steps
20-50x slower); the JSON records loadavg before/after so contended runs can be spotted.

Usage (from the repository root; `make peers` builds the venv from requirements-trl.txt):
    make peers
    benchmarks/peers/.venv-trl/bin/python benchmarks/peers/trl_grpo_bench.py     # 20 steps, G=8, 16 completions/step
    benchmarks/peers/.venv-trl/bin/python benchmarks/peers/trl_grpo_bench.py --steps 40 --beta 0 --loss_type dapo --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time

# Offline before importing anything from the HF stack.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("TQDM_DISABLE", "1")

# ----------------------------------------------------------------------------------------------
# Task definition (implementation-independent; reuse this from other benchmarks)
# ----------------------------------------------------------------------------------------------
PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
VOCAB_CHARS = list("0123456789") + ["a", "d", " ", "="]  # enough for "add 3 4 ="


def make_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = [PAD, EOS, BOS, UNK]
    vocab = {tok: i for i, tok in enumerate(specials + VOCAB_CHARS)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    tk.decoder = decoders.Fuse()  # join characters back without inserted spaces
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token=PAD, eos_token=EOS, bos_token=BOS, unk_token=UNK
    )
    tok.padding_side = "left"
    return tok


def make_prompts(n: int, seed: int = 0):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append({"prompt": f"add {a} {b} =", "answer": str(a + b)})
    return rows


def arith_reward_values(completions, answers, max_completion_length):
    """Pure-python rule-based reward, one float per completion.

    * 1.0  if the completion (left-stripped) starts with the right digit string (e.g. "7" for "add 3 4 =")
    * 0.2  format credit if the completion's first non-space character is a digit
    * 0.05 * (1 - len/max_completion_length) length shaping, only for digit-led completions, so that the
      policy cannot hack the reward by emitting EOS immediately (an unconditional length bonus made a
      from-scratch policy collapse to empty completions in a first version of this script).
    Range: [0, 1.25].
    """
    out = []
    for c, ans in zip(completions, answers, strict=True):
        s = c.lstrip()
        r = 1.0 if s.startswith(ans) else 0.0
        if s[:1].isdigit():
            r += 0.2 + 0.05 * max(0.0, 1.0 - len(c) / max_completion_length)
        out.append(r)
    return out


def build_task(model_dir: str, n_prompts: int = 256, seed: int = 0, n_layer=2, n_head=4, n_embd=128):
    """Create tokenizer + tiny GPT-2 from scratch, save both to model_dir, return (tokenizer, rows)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = make_tokenizer()
    torch.manual_seed(seed)
    cfg = GPT2Config(
        vocab_size=len(tok),
        n_positions=64,
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = GPT2LMHeadModel(cfg)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    n_params = sum(p.numel() for p in model.parameters())
    return tok, make_prompts(n_prompts, seed), n_params


# ----------------------------------------------------------------------------------------------
# TRL benchmark
# ----------------------------------------------------------------------------------------------
def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--num_generations", type=int, default=8)
    p.add_argument(
        "--batch_size", type=int, default=16, help="per_device_train_batch_size = completions per step"
    )
    p.add_argument("--max_completion_length", type=int, default=16)
    p.add_argument("--n_prompts", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--beta", type=float, default=0.04, help="KL coef (k3). TRL's own default is 0.0")
    p.add_argument(
        "--loss_type", default="grpo", help="TRL default is 'dapo'; 'grpo' = per-response length norm"
    )
    p.add_argument("--scale_rewards", default="group")
    p.add_argument("--num_iterations", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", default=None, help="write results JSON here")
    p.add_argument(
        "--skip_first", type=int, default=1, help="warm-up steps excluded from the median step time"
    )
    args = p.parse_args()

    t_start = time.perf_counter()
    load_before = os.getloadavg()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    transformers.logging.set_verbosity_error()

    workdir = args.workdir or tempfile.mkdtemp(prefix="trl_grpo_bench_")
    model_dir = os.path.join(workdir, "tiny-gpt2-char")
    tok, rows, n_params = build_task(model_dir, args.n_prompts, args.seed)
    dataset = Dataset.from_list(rows)

    # -------- instrumentation --------
    stats = {"gen_calls": 0, "gen_time": 0.0, "gen_new_tokens": 0, "reward_calls": [], "completion_tokens": 0}

    def arith_reward(prompts, completions, completion_ids, answer, **kwargs):
        # TRL passes extra dataset columns (here: `answer`) as lists aligned with completions.
        vals = arith_reward_values(completions, answer, args.max_completion_length)
        stats["reward_calls"].append(sum(vals) / len(vals))
        stats["completion_tokens"] += sum(len(ids) for ids in completion_ids)
        return vals

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.t0 = None
            self.times = []

        def on_step_begin(self, a, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            self.times.append(time.perf_counter() - self.t0)

    timer = StepTimer()

    cfg = GRPOConfig(
        output_dir=os.path.join(workdir, "out"),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=1,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=args.beta,
        loss_type=args.loss_type,
        scale_rewards=args.scale_rewards,
        num_iterations=args.num_iterations,
        temperature=1.0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,  # GRPOConfig defaults bf16=True; keep fp32 on CPU
        fp16=False,
        gradient_checkpointing=False,  # GRPOConfig defaults to True; pointless for a 2-layer model
        use_vllm=False,
        seed=args.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )

    trainer = GRPOTrainer(
        model=model_dir,  # local folder: TRL loads policy (and ref model when beta>0) from here
        reward_funcs=arith_reward,
        args=cfg,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[timer],
    )

    # Time plain-transformers generation separately by wrapping the policy's generate().
    policy = trainer.model
    orig_generate = policy.generate

    def timed_generate(*a, **kw):
        t = time.perf_counter()
        out = orig_generate(*a, **kw)
        stats["gen_time"] += time.perf_counter() - t
        stats["gen_calls"] += 1
        inp = kw.get("input_ids", a[0] if a else None)
        seqs = out.sequences if hasattr(out, "sequences") else out
        if inp is not None:
            new = seqs[:, inp.shape[1] :]
            pad_id = tok.pad_token_id
            stats["gen_new_tokens"] += int((new != pad_id).sum())
        return out

    policy.generate = timed_generate

    t_setup = time.perf_counter() - t_start
    t_train0 = time.perf_counter()
    trainer.train()
    t_train = time.perf_counter() - t_train0
    t_total = time.perf_counter() - t_start

    logs = [h for h in trainer.state.log_history if "reward" in h]
    rewards = [h["reward"] for h in logs]
    first_k = rewards[: max(1, min(3, len(rewards)))]
    last_k = rewards[-max(1, min(3, len(rewards))) :]
    step_times = timer.times
    # Skip the first step (warm-up) for the median when we have enough steps.
    steady = step_times[args.skip_first :] if len(step_times) > args.skip_first + 2 else step_times
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB

    res = {
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
        },
        "torch_threads": torch.get_num_threads(),
        "model_params": n_params,
        "config": {
            "steps": args.steps,
            "num_generations": args.num_generations,
            "completions_per_step": args.batch_size,
            "prompts_per_step": args.batch_size // args.num_generations,
            "max_completion_length": args.max_completion_length,
            "lr": args.lr,
            "beta": args.beta,
            "loss_type": args.loss_type,
            "scale_rewards": args.scale_rewards,
            "num_iterations": args.num_iterations,
        },
        "steps_completed": trainer.state.global_step,
        "step_time_median_s": statistics.median(steady) if steady else None,
        "step_time_first_s": step_times[0] if step_times else None,
        "step_time_mean_s": statistics.mean(step_times) if step_times else None,
        "train_seconds": t_train,
        "setup_seconds": t_setup,
        "total_seconds": t_total,
        "completion_tokens_total": stats["completion_tokens"],
        "completion_tokens_per_s_train": stats["completion_tokens"] / t_train if t_train else None,
        "generate_calls": stats["gen_calls"],
        "generate_seconds": stats["gen_time"],
        "generate_new_tokens": stats["gen_new_tokens"],
        "generate_tokens_per_s": stats["gen_new_tokens"] / stats["gen_time"] if stats["gen_time"] else None,
        "generate_fraction_of_train": stats["gen_time"] / t_train if t_train else None,
        "peak_rss_mb": peak_rss_mb,
        "cpu_count": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "step_times_s": [round(t, 4) for t in step_times],
        "reward_first_step": rewards[0] if rewards else None,
        "reward_last_step": rewards[-1] if rewards else None,
        "reward_first3_mean": statistics.mean(first_k) if rewards else None,
        "reward_last3_mean": statistics.mean(last_k) if rewards else None,
        "reward_first10pct_mean": statistics.mean(rewards[: max(1, len(rewards) // 10)]) if rewards else None,
        "reward_last10pct_mean": statistics.mean(rewards[-max(1, len(rewards) // 10) :]) if rewards else None,
        "reward_per_step": rewards,
        "kl_last": logs[-1].get("kl") if logs else None,
        "mean_completion_length_per_step": [h.get("completions/mean_length") for h in logs],
    }

    print("\n===== TRL GRPO CPU benchmark =====")
    for k in (
        "versions",
        "torch_threads",
        "model_params",
        "config",
        "steps_completed",
        "step_time_median_s",
        "step_time_first_s",
        "train_seconds",
        "total_seconds",
        "completion_tokens_total",
        "completion_tokens_per_s_train",
        "generate_seconds",
        "generate_tokens_per_s",
        "generate_fraction_of_train",
        "peak_rss_mb",
        "loadavg_before",
        "loadavg_after",
        "reward_first_step",
        "reward_last_step",
        "reward_first3_mean",
        "reward_last3_mean",
        "reward_first10pct_mean",
        "reward_last10pct_mean",
        "kl_last",
    ):
        v = res[k]
        print(f"{k:32s} {v:.4f}" if isinstance(v, float) else f"{k:32s} {v}")
    print("reward_per_step                 ", [round(r, 3) for r in rewards])
    print("step_times_s                    ", res["step_times_s"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
        print("wrote", args.json)
    return res


if __name__ == "__main__":
    main()
