"""The LM parts of `benchmarks/scaling.py` (issue 38 item 3): seconds per training step of postrl and of TRL 1.16
as the work grows, on the same model, data and settings, 1 torch thread each, fp32, CPU.

- ``grpo``: GRPO against the completion length L = 16 → 512 (group size 8, 2 prompts: 16 completions per
  step) and against the group size G = 2 → 32 (L = 16, 2 prompts: 2G completions). TRL's toy task's tiny GPT-2
  (2 layers, d = 128, its character tokenizer, `peers/trl_grpo_bench.py`) with 1,024 positions, built so that
  it never samples EOS (its final layer norm's bias points away from EOS's output embedding: EOS's logit is
  about −300), so every completion is exactly L tokens in both; β 0.04 (a reference forward in both), the
  ``grpo`` loss, one update per batch, lr 1e-6 (the model stays what it was), reward = the share of digits
  in a completion (it varies, so no group's advantages are all 0).
- ``sft``: SFT against the sequence length L = 32 → 512 (8 sequences per step, every row longer than L and
  truncated to L tokens by both), the tiny Llama of `benchmarks/dpo.py` (2 layers, d = 128, vocab 512).
- ``dpo``: DPO against L = prompt + response = 32 → 512 (8 pairs per step; prompt ≈ L/4, chosen and
  rejected ≈ 3L/4 tokens of random text), the same tiny Llama; TRL with its default reference forward in each
  step (postrl stores the reference log-probs once: its step has no reference forward).

Each point: a few steps (``--lm-steps``), the median of the steps after the first; postrl in this process
through `postrl.api`, TRL in one worker process in its own venv (this file with ``--trl-worker``, fed one point
at a time on stdin), postrl's point then TRL's, so load drift hits both. The measure is the CPU seconds of the
process per step (``time.process_time`` between steps: one thread each, so on an idle core it is the wall time;
on the shared machine at load 20+ a process gets ~10% of a core and the wall time is mostly waiting), the wall
seconds are kept beside it (``*_wall``). The exponent b of each curve is the least-squares slope of
log(CPU seconds per step) on log(x), seconds ≈ c·x^b (b = 1: cost in proportion to the work; b < 1: a fixed
part per step still counts; b > 1: a part grows faster than the work, e.g. attention), over the whole range
and over its upper half.

    python benchmarks/scaling.py grpo        # L 16 → 512 and G 2 → 32: benchmarks/results/scaling-grpo.{json,png}
    python benchmarks/scaling.py sft         # L 32 → 512
    python benchmarks/scaling.py dpo
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / "benchmarks" / "peers"
LR = 1e-6
BETA = 0.04
PROMPTS_PER_STEP = 2
BATCH = 8  # SFT sequences / DPO pairs per step
REPLY = "TRL-POINT "  # the worker's answer line (the Trainer prints its logs to stdout too)
# (curve, x axis) of each part; x values are the defaults of --lengths / --groups
CURVES = {"grpo": ("length", "group"), "sft": ("length",), "dpo": ("length",)}


def digit_reward(completions: list[str], **_: object) -> list[float]:
    """The share of digit characters in each completion (TRL's reward contract; both contenders use it)."""
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


# ---- models and data (postrl's venv) --------------------------------------------------------------------
def grpo_model(work: Path) -> Path:
    """TRL's toy-task GPT-2 with 1,024 positions that never samples EOS (module docstring)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    sys.path.insert(0, str(PEERS))
    import trl_grpo_bench

    path = work / "gpt2-no-eos"
    tok = trl_grpo_bench.make_tokenizer()
    torch.manual_seed(0)
    ids = {f"{k}_token_id": getattr(tok, f"{k}_token_id") for k in ("bos", "eos", "pad")}
    cfg = GPT2Config(vocab_size=len(tok), n_positions=1024, n_layer=2, n_head=4, n_embd=128, **ids,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    model = GPT2LMHeadModel(cfg)
    with torch.no_grad():
        u = torch.nn.functional.normalize(torch.randn(128), dim=0)
        model.transformer.ln_f.bias.copy_(10 * u)
        model.transformer.wte.weight[tok.eos_token_id] = -30 * u  # tied: EOS's logit ≈ −300
    for key, value in ids.items():
        setattr(model.generation_config, key, value)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    rows = trl_grpo_bench.make_prompts(64, seed=0)
    (work / "grpo-prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def llama_model(work: Path) -> Path:
    """The tiny Llama of `benchmarks/dpo.py` (random init, seed 0) with 2,048 positions and its tokenizer."""
    from postrl.lm.models import TinyLMConfig, build_tiny_lm
    from postrl.lm.tasks import build_corpus
    from postrl.lm.tokenizer import build_tokenizer

    path = work / "tiny-llama"
    tok = build_tokenizer(build_corpus(n_lines=4000, seed=0), vocab_size=512)
    cfg = TinyLMConfig(
        n_layers=2, hidden_size=128, n_heads=4, intermediate_size=512, max_position_embeddings=2048
    )
    ids = {f"{k}_id": getattr(tok, f"{k}_id") for k in ("pad_token", "eos_token", "bos_token")}
    build_tiny_lm(len(tok), cfg, seed=0, **ids).save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


def _text(tok, n: int, rng: random.Random) -> str:
    """Random text of about ``n`` tokens: ``n`` random non-special vocabulary entries, decoded."""
    special = set(tok.all_special_ids)
    pool = [i for i in range(len(tok)) if i not in special]
    return tok.decode([rng.choice(pool) for _ in range(n)]).strip()


def seq_rows(model: Path, part: str, length: int, n: int = 64) -> list[dict]:
    """SFT rows (prompt ≈ 8 tokens, a completion longer than ``length``: both truncate) or DPO pairs (prompt
    ≈ L/4, chosen and rejected ≈ 3L/4 tokens)."""
    from transformers import AutoTokenizer

    tok, rng = AutoTokenizer.from_pretrained(str(model)), random.Random(length)
    if part == "sft":
        return [{"prompt": _text(tok, 8, rng), "completion": _text(tok, length + 16, rng)} for _ in range(n)]
    p, r = max(4, length // 4), max(4, length - length // 4 - 2)
    return [{"prompt": _text(tok, p, rng), "chosen": _text(tok, r, rng), "rejected": _text(tok, r, rng)}
            for _ in range(n)]  # fmt: skip


# ---- postrl's points (this process) ---------------------------------------------------------------------
def _step_seconds(run_dir: Path) -> dict:
    """The median seconds of a run's steps after the first (``seconds``): ``time_step`` (GRPO, DPO), else the
    differences of SFT's cumulative ``time`` between its training rows; GRPO's also the medians of its phases
    (generation, reference scoring, training) and the mean completion length."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time_step" in r][1:]
    if not steps:
        clock = [r["time"] for r in rows if "loss" in r]
        return {
            "seconds": statistics.median([clock[i + 1] - clock[i] for i in range(len(clock) - 1)])
        }  # from step 2 on
    out = {"seconds": statistics.median(r["time_step"] for r in steps)}
    for key in ("time_generate", "time_score", "time_train"):
        if key in steps[0]:
            out[key.replace("time", "postrl")] = round(statistics.median(r[key] for r in steps), 5)
    if "completion_length_mean" in steps[0]:
        out["postrl_completion_length"] = statistics.mean(r["completion_length_mean"] for r in steps)
    return out


def postrl_point(point: dict, work: Path, steps: int) -> dict:
    """postrl at ``point`` ({part, x, model, ...}): `_step_seconds` of its run."""
    import postrl

    run = {"steps": steps, "eval_every": 0, "save_every": 0, "log_every": 1, "device": "cpu", "threads": 1}
    optim = {"lr": LR, "warmup_steps": 0, "min_lr_ratio": 1.0, "weight_decay": 0.0, "max_grad_norm": 1.0}
    out, part = work / f"postrl-{point['name']}", point["part"]
    clock: list[float] = []  # this process's CPU seconds after each step: robust to other jobs' load
    common = {"model": point["model"], "out": str(out), "overwrite": True, "run": run, "optim": optim,
              "on_iteration": lambda info: clock.append(time.process_time())}  # fmt: skip
    if part == "grpo":
        postrl.grpo(
            **common, data=str(work / "grpo-prompts.jsonl"), rewards=[digit_reward], max_prompt_length=32,
            sampling={"max_new_tokens": point["length"], "temperature": 1.0},
            grpo={"group_size": point["group"], "prompts_per_step": PROMPTS_PER_STEP, "beta": BETA,
                  "loss_type": "grpo"},
            eval_size=0,
        )  # fmt: skip
    elif part == "sft":
        train = {"batch_size": BATCH, "max_length": point["length"], "overlong": "truncate"}
        postrl.sft(**common, data=point["rows"], train=train)
    else:
        train = {"batch_size": BATCH, "max_length": 2 * point["length"]}
        postrl.dpo(**common, data=point["rows"], train=train, dpo={"beta": 0.1}, eval_size=0, eval_samples=0,
                   eval_at_start=False, plots=False)  # fmt: skip
    cpu = [clock[i + 1] - clock[i] for i in range(len(clock) - 1)]  # steps 2 … n
    return _step_seconds(out) | {"cpu_seconds": statistics.median(cpu)}


# ---- TRL's points (its venv; imports nothing from postrl) -----------------------------------------------
def _trl_trainer(point: dict, out: str, callbacks: list):
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(point["model"])
    common = dict(
        output_dir=out, max_steps=point["steps"], learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
        bf16=False, fp16=False, gradient_checkpointing=False, seed=0, dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    if point["part"] == "grpo":
        rows = [json.loads(line) for line in Path(point["prompts"]).read_text().splitlines()]
        cfg = trl.GRPOConfig(
            **common, per_device_train_batch_size=PROMPTS_PER_STEP * point["group"],
            num_generations=point["group"], max_completion_length=point["length"], beta=BETA, loss_type="grpo",
            num_iterations=1, temperature=1.0, use_vllm=False,
        )  # fmt: skip
        return trl.GRPOTrainer(model=point["model"], reward_funcs=digit_reward, args=cfg,
                               train_dataset=Dataset.from_list(rows), processing_class=tok, callbacks=callbacks)  # fmt: skip
    data = Dataset.from_list(point["rows"])
    if point["part"] == "sft":
        cfg = trl.SFTConfig(
            **common,
            per_device_train_batch_size=point.get("batch", BATCH),
            max_length=point["length"],
            packing=False,
        )
        return trl.SFTTrainer(model=point["model"], args=cfg, train_dataset=data, processing_class=tok,
                              callbacks=callbacks)  # fmt: skip
    cfg = trl.DPOConfig(**common, per_device_train_batch_size=BATCH, max_length=2 * point["length"], beta=0.1,
                        loss_type=["sigmoid"])  # fmt: skip
    return trl.DPOTrainer(model=point["model"], args=cfg, train_dataset=data, processing_class=tok,
                          callbacks=callbacks)  # fmt: skip


def trl_worker() -> None:
    """Read one point per stdin line, train TRL on it, print {"seconds": median step seconds} per line."""
    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch
    import transformers
    from transformers import TrainerCallback

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.t0, self.c0, self.times, self.cpu = 0.0, 0.0, [], []

        def on_step_begin(self, a, state, control, **kw):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, a, state, control, **kw):
            self.times.append(time.perf_counter() - self.t0)
            self.cpu.append(time.process_time() - self.c0)

    for line in sys.stdin:
        point = json.loads(line)
        timer = Timer()
        trainer = _trl_trainer(point, point["out"], [timer])
        trainer.train()
        reply = {
            "seconds": statistics.median(timer.times[1:]),
            "cpu_seconds": statistics.median(timer.cpu[1:]),
        }
        lengths = [
            h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h
        ]
        if lengths:
            reply["trl_completion_length"] = statistics.mean(lengths)
        print(REPLY + json.dumps(reply), flush=True)


# ---- the part: both contenders point by point ------------------------------------------------------------
def slope(x: list[float], y: list[float]) -> float:
    """b of y ≈ c·x^b: the least-squares slope of log y on log x."""
    import numpy as np

    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


class TRLWorker:
    """The TRL worker process (its venv's python running this file), fed one point at a time."""

    def __init__(self, python: str, log: Path) -> None:
        import subprocess

        self.log = log.open("w")
        cmd = [python, str(Path(__file__).resolve()), "--trl-worker"]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, cwd=log.parent)  # fmt: skip

    def point(self, point: dict) -> dict:
        self.proc.stdin.write(json.dumps(point) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(REPLY):
                return json.loads(line[len(REPLY) :])
        raise RuntimeError(f"the TRL worker stopped (its log: {self.log.name})")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.log.close()


def _points(part: str, args, work: Path) -> list[dict]:
    if part == "grpo":
        model = str(grpo_model(work))
        prompts = str(work / "grpo-prompts.jsonl")
        by_length = [{"curve": "length", "x": n, "length": n, "group": 8} for n in args.lengths]
        by_group = [{"curve": "group", "x": g, "length": 16, "group": g} for g in args.groups]
        return [{**p, "part": part, "model": model, "prompts": prompts, "name": f"{p['curve']}{p['x']}"}
                for p in by_length + by_group]  # fmt: skip
    model = llama_model(work)
    return [{"part": part, "curve": "length", "x": n, "length": n, "model": str(model),
             "rows": seq_rows(model, part, n), "name": f"length{n}"} for n in args.seq_lengths]  # fmt: skip


def plot(part: str, points: list[dict], exponents: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    curves = CURVES[part]
    fig, axes = plt.subplots(1, len(curves), figsize=(5.5 * len(curves), 4), squeeze=False)
    for ax, curve in zip(axes[0], curves, strict=True):
        for backend, marker, name in (("postrl", "o", "postrl"), ("trl", "s", "TRL")):
            mine = [p for p in points if p["curve"] == curve]
            b = exponents[curve][backend]["all"]
            ax.plot(
                [p["x"] for p in mine],
                [p[backend] for p in mine],
                marker=marker,
                label=f"{name} (b = {b:.2f})",
            )
        xlabel = {"length": "completion length L (tokens)" if part == "grpo" else "sequence length L (tokens)",
                  "group": "group size G (2G completions per step)"}[curve]  # fmt: skip
        ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel="CPU seconds per step (1 thread)")
        xs = [p["x"] for p in points if p["curve"] == curve]
        ax.set_xticks(xs, [str(x) for x in xs])  # the measured x values, no minor-tick labels
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(f"{part.upper()}: postrl vs TRL 1.16, seconds ≈ c·x^b")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_part(part: str, args) -> dict:
    """Every point of ``part`` with both contenders; the plot, the exponents, the points."""
    import torch

    torch.set_num_threads(1)
    work = Path(args.workdir).resolve() / part
    work.mkdir(parents=True, exist_ok=True)
    points = _points(part, args, work)
    worker = TRLWorker(args.trl_python, work / "trl-worker.log")
    try:
        for p in points:
            p["load"] = round(os.getloadavg()[0], 2)
            mine = postrl_point(p, work, args.lm_steps)
            trl_point = {k: v for k, v in p.items() if k != "load"}
            theirs = worker.point(
                {**trl_point, "steps": args.lm_steps, "out": str(work / f"trl-{p['name']}")}
            )
            timings = ("seconds", "cpu_seconds")
            p.update({k: v for k, v in mine.items() if k not in timings})
            p.update({k: v for k, v in theirs.items() if k not in timings})
            p["postrl"], p["trl"] = round(mine["cpu_seconds"], 5), round(theirs["cpu_seconds"], 5)
            p["postrl_wall"], p["trl_wall"] = round(mine["seconds"], 5), round(theirs["seconds"], 5)
            p["ratio"] = round(p["trl"] / p["postrl"], 2)
            p["ratio_wall"] = round(p["trl_wall"] / p["postrl_wall"], 2)
            print(
                json.dumps({k: v for k, v in p.items() if k not in ("rows", "model")}),
                file=sys.stderr,
                flush=True,
            )
    finally:
        worker.close()
    exponents = {}
    for curve in CURVES[part]:
        mine = [p for p in points if p["curve"] == curve]
        xs, upper = [p["x"] for p in mine], mine[len(mine) // 2 :]
        exponents[curve] = {
            b: {"all": round(slope(xs, [p[b] for p in mine]), 3),
                "upper_half": round(slope([p["x"] for p in upper], [p[b] for p in upper]), 3)}
            for b in ("postrl", "trl")
        }  # fmt: skip
    png = Path(args.out) / f"scaling-{part}.png"
    plot(part, points, exponents, png)
    drop = ("rows", "model", "prompts", "name", "part")
    return {
        "part": part,
        "steps_per_point": args.lm_steps,
        "load_average_at_start": args.load,
        "load_average_at_end": round(os.getloadavg()[0], 2),
        "points": [{k: v for k, v in p.items() if k not in drop} for p in points],
        "exponents": exponents,
        "png": str(png.resolve().relative_to(ROOT)) if png.resolve().is_relative_to(ROOT) else str(png),
    }


if __name__ == "__main__" and "--trl-worker" in sys.argv:
    trl_worker()
