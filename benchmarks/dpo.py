"""`postrl dpo` beside Hugging Face TRL's ``DPOTrainer`` (TRL 1.16): steps/s, peak memory, and the loss of one
identical batch. Ends with ONE JSON line of results.

Same model, data and batch for both: a tiny Llama of the demo's size (2 layers, d = 128, vocab 512; ``--model``
takes any postrl/HF causal-LM folder with its tokenizer, e.g. the demo's SFT model, default: one built here
with a random init), the built-in ``reviews`` task's labelled pairs (``perturb_fraction`` 0.3, the RM's data)
as plain prompt/chosen/rejected text, 32 pairs per step, CPU, fp32, 1 torch thread, β 0.1, the sigmoid loss,
AdamW (0.9, 0.999), no weight decay, gradients clipped to 1, a constant lr 1e-5 (no warmup), dropout off.
TRL keeps its defaults elsewhere except two that make no sense for a tiny model on a CPU: ``bf16=False``
(fp32, as the issue asks) and ``gradient_checkpointing=False`` (TRL's default True recomputes every block in the
backward, which only pays when activations do not fit). TRL runs twice: with its default reference handling
(a reference forward in every step) and with ``precompute_ref_log_probs=True`` (what postrl always does:
the reference's log-probs once before training); the precompute itself is timed apart, as postrl's is (it is
not a training step in either).

Timing: the median seconds of a training step after the first 5 (each contender in a fresh process, its own
peak RSS: ``ru_maxrss``), alternated, on a shared 2-core machine (the load average is recorded). The identical
batch: the first ``--batch`` pairs tokenised by postrl (prompt ids as generation encodes them, each response
+ EOS), and their ids are compared with TRL's own tokenisation of the same text; the loss of that batch under
a policy and a different reference (two random inits, so that h ≠ 0 and the loss is not just log 2) is
computed by postrl (`postrl.lm.dpo.build.dpo_batch_loss` with the stored-reference path) and by TRL
(``DPOTrainer._compute_loss`` on its collator's batch, reference forward on the fly) and must agree within 1e-5.

    .venv/bin/python benchmarks/dpo.py --steps 60 [--model runs/demo/sft/model]

TRL runs in its own virtual environment (this file in ``--trl-worker`` mode), as in benchmarks/grpo.py:

    make peers    # benchmarks/peers/.venv-trl, from benchmarks/peers/requirements-trl.txt (TRL 1.16, pinned)

Latest (benchmarks/results/dpo.json: ``--steps 60 --repeats 3 --breakdown``, 2026-12-06 03:19-03:21 UTC, the
machine otherwise idle, load average 0.75 at the start, 0.98 at the end): postrl 18.95 steps/s (0.0528 s/step),
TRL 5.35 (**3.54x**), TRL with precompute 6.80 (2.79x); identical batch |difference| 6.0e-8, the same token
ids; peak RSS 474 vs 642 MB (634). Breakdown (median ms): padded data 1.7, forward 29.6, backward 53.4, optimiser
2.4 = 87.1; padding-free 1.5, 18.7, 31.8, 2.4 = 54.4 (1.60x). The same command at 02:17 (load 0.9-2.0, a helper
starting): 17.92 vs 5.12 steps/s (3.50x), precompute 6.84 (2.62x).

The run before (2026-12-05, load average 23.3 at
the start, 22.8-31 during, 35.9 at the end, from other jobs), with the padding-free forward (``dpo.padding_free``
auto: `postrl.lm.fast.packed`): postrl 3.98 steps/s (0.251 s/step), TRL 1.17 (3.39x), TRL with precompute 1.35
(2.95x); identical batch |difference| 6.0e-8, the same token ids; peak RSS 469 vs 635 MB (636). Where postrl's
step goes (``--breakdown``, the two paths alternated step by step in one process, median ms): padded (the path
before, 2 length groups) data 8.9, forward 213, backward 390, optimiser 12.3 = 625; padding-free data 9.8,
forward 145, backward 232, optimiser 13.4 = 400 (1.56x: the 32 pairs hold ~730 real tokens in ~1,900 padded
positions). What is left: the products of the real tokens (forward and backward ~ 95% of the step).
The run before it, the same command 20 minutes earlier (load 12.7 → 18.8, 18-30 during): postrl 2.97 steps/s,
TRL 0.77 (3.87x), precompute 0.63 (4.73x: slower than TRL's default in that run, the load moved between the
alternated runs); breakdown padded 393 ms (forward 138, backward 240, optimiser 13.0, data 2.1), padding-free
246 (85, 143, 13.5, 3.4): 1.60x.
Before the padding-free forward (``--steps 60 --repeats 2``, load 14): postrl 2.30 steps/s, TRL 0.98 (2.36x),
precompute 1.34 (1.72x); peak RSS 536 vs 673 MB.

Measured 2026-12-03 on the shared 2-core machine, load average 5.7-6.3 (``--steps 40 --repeats 2``, same
set-up as below): postrl 3.95 steps/s (0.253 s/step), TRL 1.63 (0.614): 2.43x; TRL with precompute 2.36
(0.424): 1.68x; peak RSS 456 vs 629 MB (628); identical batch |difference| 1.2e-7 again.
Earlier the same day, load average 12-15 (four other engineers' jobs; every time is
inflated several-fold, the ratios are of alternated runs), ``--steps 40 --repeats 2``, the built tiny Llama,
1,024 pairs, 32 per step:
- postrl 1.35 steps/s (0.740 s/step), TRL 1.16 0.63 (1.594 s/step): 2.15x; TRL with
  ``precompute_ref_log_probs=True`` 0.86 (1.158 s/step): 1.56x. Peak RSS postrl 457 MB, TRL 632 MB (630 MB).
  TRL's precompute of the 1,024 pairs' reference log-probs took 20 s of its 20.1 s set-up; postrl's is in
  its run before step 1 (not timed either side).
- the identical batch (32 pairs; the two tokenisations agree id for id): postrl 0.68322170, TRL 0.68322158,
  |difference| 1.2e-7.
- before ``dpo.length_groups`` (one padded forward per micro-batch, as TRL; load 11-13): 1.12 steps/s vs 0.60
  (1.85x) and 0.80 (1.40x); 513 vs 633 MB.
Where postrl's time goes (cProfile, 10 steps): backward 61%, forward 35% (GEMMs about half of it), collation 2%;
the reference forward TRL runs in every step by default is the largest part of the 2x.
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
BETA, LR = 0.1, 1e-5


# ---- the shared inputs (postrl's venv) ------------------------------------------------------------------
def _build_models(work: Path, model: str | None) -> tuple[Path, Path]:
    """(policy, a different reference): ``--model`` and a random init of its shape, or two random inits of
    the demo's tiny Llama with a tokenizer trained on the generated corpus."""
    from postrl.lm.models import TinyLMConfig, build_tiny_lm, load_causal_lm
    from postrl.lm.tasks import build_corpus
    from postrl.lm.tokenizer import build_tokenizer, load_tokenizer

    out = []
    if model is not None:
        tokenizer, base = load_tokenizer(model), load_causal_lm(model)
        config = TinyLMConfig(
            n_layers=base.config.num_hidden_layers,
            hidden_size=base.config.hidden_size,
            n_heads=base.config.num_attention_heads,
            intermediate_size=base.config.intermediate_size,
            max_position_embeddings=base.config.max_position_embeddings,
        )
        out.append(Path(model))
        seeds = [1]
    else:
        tokenizer = build_tokenizer(build_corpus(n_lines=4000, seed=0), vocab_size=512)
        config = TinyLMConfig(
            n_layers=2, hidden_size=128, n_heads=4, intermediate_size=512, max_position_embeddings=512
        )
        seeds = [0, 1]
    ids = {f"{k}_id": getattr(tokenizer, f"{k}_id") for k in ("pad_token", "eos_token", "bos_token")}
    for seed in seeds:
        path = work / f"tiny_llama_seed{seed}"
        build_tiny_lm(len(tokenizer), config, seed=seed, **ids).save_pretrained(str(path))
        tokenizer.save_pretrained(str(path))
        out.append(path)
    return out[0], out[1]


def _data(work: Path, n: int) -> Path:
    from postrl.lm.tasks import get_task

    rows = get_task("reviews", perturb_fraction=0.3, n_pairs_train=n + n // 20).preference_rows("train")
    rows = [r for r in rows if r["chosen"] != r["rejected"]][:n]  # a pair with one answer twice is refused
    path = work / "pairs.jsonl"
    fields = ("prompt", "chosen", "rejected")
    path.write_text("".join(json.dumps({k: r[k] for k in fields}) + "\n" for r in rows))
    return path


def _postrl_loss(
    policy: Path, reference: Path, data: Path, batch: int, max_length: int
) -> tuple[float, list]:
    """postrl's loss of the first ``batch`` pairs (reference log-probs as training uses them: precomputed),
    and the pairs' token ids."""
    import torch

    from postrl.lm.data import load_rows, render_rows
    from postrl.lm.dpo import DPOLossConfig
    from postrl.lm.dpo.build import collate_dpo_batch, dpo_batch_loss, reference_pair_log_probs
    from postrl.lm.models import load_causal_lm
    from postrl.lm.reward_model.pairs import tokenize_pairs
    from postrl.lm.rollout import response_forward
    from postrl.lm.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(policy)
    rows = render_rows(load_rows(str(data), "prefs")[:batch], "prefs", tokenizer)
    pairs = tokenize_pairs(rows, tokenizer, max_length)
    ref = reference_pair_log_probs(
        response_forward(load_causal_lm(reference), gradients=False),
        pairs,
        tokenizer.pad_token_id,
        torch.device("cpu"),
        64,
    )
    loss, _ = dpo_batch_loss(
        response_forward(load_causal_lm(policy)), collate_dpo_batch(pairs, tokenizer.pad_token_id, torch.device("cpu")), ref,
        DPOLossConfig(beta=BETA),
    )  # fmt: skip
    ids = [[p["prompt_ids"], p["chosen_ids"], p["rejected_ids"]] for p in pairs]
    return float(loss.detach()), ids


def _postrl_run(policy: Path, data: Path, out: Path, args: argparse.Namespace) -> dict:
    """`postrl dpo` in a fresh process: the median step time (after the first 5), peak RSS, precompute time."""
    cmd = [
        sys.executable, "-m", "postrl.cli", "dpo", "--model", str(policy), "--data", str(data), "--out", str(out),
        f"run.steps={args.steps}", "run.eval_every=0", "run.save_every=0", "run.log_every=1", "run.device=cpu",
        f"run.threads={args.threads}", f"run.seed={args.seed}", f"train.batch_size={args.batch}",
        f"train.max_length={args.max_length}", f"dpo.beta={BETA}", f"optim.lr={LR}", "optim.min_lr_ratio=1.0",
        "optim.warmup_steps=0", "eval_size=0", "eval_samples=0", "eval_at_start=false", "plots=false",
        "--overwrite",
    ]  # fmt: skip
    start = time.perf_counter()
    log = out.parent / f"{out.name}.log"
    with log.open("w") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=f, cwd=ROOT)
    wall = time.perf_counter() - start
    summary = json.loads(log.read_text().strip().splitlines()[-1])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    times = [r["time_step"] for r in rows if "time_step" in r]
    return {
        "step_time_median_s": statistics.median(times[5:]),
        "steps_per_s": 1.0 / statistics.median(times[5:]),
        "peak_rss_mb": summary["peak_rss_mb"],
        "wall_s": wall,
        "loss_last": [r["loss"] for r in rows if "loss" in r][-1],
    }


def _trl_run(policy: Path, reference: Path, data: Path, ids: list, out: Path, args, precompute: bool) -> dict:
    cmd = [
        args.trl_python, str(THIS), "--trl-worker", "--model", str(policy), "--ref", str(reference),
        "--data", str(data), "--ids", str(out / "ids.json"), "--json", str(out / "result.json"),
        "--steps", str(args.steps), "--batch", str(args.batch), "--max-length", str(args.max_length),
        "--threads", str(args.threads), "--seed", str(args.seed), "--precompute", str(int(precompute)),
    ]  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "ids.json").write_text(json.dumps(ids))
    with (out / "worker.log").open("w") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=f, cwd=out)
    return json.loads((out / "result.json").read_text())


def breakdown(policy: Path, data: Path, args: argparse.Namespace) -> dict:
    """Where a postrl step's time goes, padded (``dpo.padding_free=off``, 2 length groups: the path before the
    padding-free forward) and padding-free, alternated step by step in one process on the same model and pairs:
    median ms of collation (data), the loss's forward, the backward and the optimiser (clip + AdamW)."""
    import torch

    from postrl.lm.data import load_rows, render_rows
    from postrl.lm.dpo import DPOLossConfig
    from postrl.lm.dpo.algorithm import length_groups
    from postrl.lm.dpo.build import collate_dpo_batch, dpo_batch_loss
    from postrl.lm.models import load_causal_lm
    from postrl.lm.reward_model.pairs import tokenize_pairs
    from postrl.lm.rollout import response_forward
    from postrl.lm.rollout.forwards import PackedForward
    from postrl.lm.tokenizer import load_tokenizer

    torch.set_num_threads(args.threads)
    tok = load_tokenizer(policy)
    pairs = tokenize_pairs(render_rows(load_rows(str(data), "prefs"), "prefs", tok), tok, args.max_length)
    model = load_causal_lm(policy).train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    ref, cfg, cpu = torch.zeros(len(pairs), 2), DPOLossConfig(beta=BETA), torch.device("cpu")
    paths = {"padded": (response_forward(model), 2), "padding_free": (PackedForward(model), 1)}
    times = {k: {p: [] for p in ("data", "forward", "backward", "optimiser")} for k in paths}
    for step in range(args.steps):
        start = step * args.batch % (len(pairs) - args.batch + 1)
        for name, (forward, groups) in paths.items():
            parts = dict.fromkeys(times[name], 0.0)
            for rows, _ in length_groups(list(range(start, start + args.batch)), 1.0, pairs, groups):
                t0 = time.perf_counter()
                batch = collate_dpo_batch([pairs[i] for i in rows], tok.pad_token_id, cpu)
                t1 = time.perf_counter()
                loss, _ = dpo_batch_loss(forward, batch, ref[rows], cfg)
                t2 = time.perf_counter()
                (loss * len(rows) / args.batch).backward()
                parts["data"], parts["forward"] = parts["data"] + t1 - t0, parts["forward"] + t2 - t1
                parts["backward"] += time.perf_counter() - t2
            t3 = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            parts["optimiser"] = time.perf_counter() - t3
            for k, v in parts.items():
                times[name][k].append(v)
    out = {}
    for name, parts in times.items():
        out[name] = {k: round(1000 * statistics.median(v[5:]), 2) for k, v in parts.items()}
        out[name]["total"] = round(sum(out[name].values()), 2)
    return out


# ---- TRL's side (its own venv) ---------------------------------------------------------------------------
def trl_worker(args: argparse.Namespace) -> None:
    """Train TRL's DPOTrainer for ``--steps`` steps on the pairs; also its loss on postrl's identical batch."""
    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    tok = AutoTokenizer.from_pretrained(args.model)
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines()]
    postrl_ids = json.loads(Path(args.ids).read_text())

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.t0, self.times = 0.0, []

        def on_step_begin(self, a, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            self.times.append(time.perf_counter() - self.t0)

    def config(steps: int, precompute: bool) -> DPOConfig:
        return DPOConfig(
            output_dir=str(Path(args.json).parent / "trl_out"), max_steps=steps,
            per_device_train_batch_size=args.batch, gradient_accumulation_steps=1, learning_rate=LR,
            lr_scheduler_type="constant", warmup_steps=0, beta=BETA, loss_type=["sigmoid"],
            max_length=args.max_length, precompute_ref_log_probs=precompute, logging_steps=1, save_strategy="no",
            report_to="none", use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, seed=args.seed,
            dataloader_num_workers=0, disable_tqdm=True, max_grad_norm=1.0, weight_decay=0.0,
        )  # fmt: skip

    # the identical batch: postrl's ids through TRL's collator, the reference forward on the fly
    check = DPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32),
        ref_model=AutoModelForCausalLM.from_pretrained(args.ref, dtype=torch.float32),
        args=config(1, False), train_dataset=Dataset.from_list(rows[: args.batch]), processing_class=tok,
    )  # fmt: skip
    trl_ids = [[e["prompt_ids"], e["chosen_ids"], e["rejected_ids"]] for e in check.train_dataset]
    examples = [{"prompt_ids": p, "chosen_ids": c, "rejected_ids": r} for p, c, r in postrl_ids]
    inputs = {k: v for k, v in check.data_collator(examples).items()}
    check.model.train()
    with torch.no_grad():
        loss = float(check._compute_loss(check.model, inputs, False))
    del check

    timer = Timer()
    start = time.perf_counter()
    trainer = DPOTrainer(
        model=args.model, args=config(args.steps, bool(args.precompute)), train_dataset=Dataset.from_list(rows),
        processing_class=tok, callbacks=[timer],
    )  # fmt: skip
    setup = time.perf_counter() - start
    trainer.train()
    result = {
        "versions": {
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
        "identical_batch_loss": loss,
        "same_token_ids": trl_ids == postrl_ids,
        "first_pair_ids": {"trl": trl_ids[0], "postrl": postrl_ids[0]},
        "step_time_median_s": statistics.median(timer.times[5:]),
        "steps_per_s": 1.0 / statistics.median(timer.times[5:]),
        "setup_s (tokenise, models, precompute)": setup,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "loss_last": trainer.state.log_history[-2].get("loss")
        if len(trainer.state.log_history) > 1
        else None,
    }
    Path(args.json).write_text(json.dumps(result, indent=2))


# ---- the comparison --------------------------------------------------------------------------------------
def bench(args: argparse.Namespace) -> dict:
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    policy, reference = _build_models(work, args.model)
    data = _data(work, args.pairs)
    postrl_loss, ids = _postrl_loss(policy, reference, data, args.batch, args.max_length)
    load = os.getloadavg()
    runs: dict[str, list[dict]] = {"postrl": [], "trl": [], "trl_precompute": []}
    for r in range(args.repeats):
        for name in args.order:
            if name == "postrl":
                runs["postrl"].append(_postrl_run(policy, data, work / f"postrl-{r}", args))
            else:
                for pre in (False, True):
                    key = "trl_precompute" if pre else "trl"
                    runs[key].append(_trl_run(policy, reference, data, ids, work / f"{key}-{r}", args, pre))
            print(f"[dpo bench] repeat {r} {name} done, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    med = {k: statistics.median(x["step_time_median_s"] for x in v) for k, v in runs.items()}
    peak = {k: max(x["peak_rss_mb"] for x in v) for k, v in runs.items()}
    trl_loss = runs["trl"][0]["identical_batch_loss"]
    times = breakdown(policy, data, args) if args.breakdown else None
    out = {
        "steps": args.steps,
        "pairs_per_step": args.batch,
        "repeats": args.repeats,
        "load_average_before": [round(x, 2) for x in load],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "step_time_median_s": {k: round(v, 5) for k, v in med.items()},
        "steps_per_s": {k: round(1 / v, 2) for k, v in med.items()},
        "speedup_vs_trl": round(med["trl"] / med["postrl"], 2),
        "speedup_vs_trl_precompute": round(med["trl_precompute"] / med["postrl"], 2),
        "peak_rss_mb": {k: round(v, 1) for k, v in peak.items()},
        "identical_batch_loss": {
            "postrl": postrl_loss,
            "trl": trl_loss,
            "abs_diff": abs(postrl_loss - trl_loss),
        },
        "same_token_ids": runs["trl"][0]["same_token_ids"],
        "trl_setup_s": {
            k: round(statistics.median(x["setup_s (tokenise, models, precompute)"] for x in runs[k]), 2)
            for k in ("trl", "trl_precompute")
        },
        "versions": runs["trl"][0]["versions"],
    }
    if times is not None:
        out["breakdown_ms"] = times
    print(
        f"identical batch: postrl {postrl_loss:.8f}  TRL {trl_loss:.8f}  |diff| {abs(postrl_loss - trl_loss):.2e}\n"
        f"steps/s: postrl {out['steps_per_s']['postrl']}, TRL {out['steps_per_s']['trl']} (precompute "
        f"{out['steps_per_s']['trl_precompute']}); peak RSS MB {out['peak_rss_mb']}",
        file=sys.stderr,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="policy folder (default: a tiny Llama built here)")
    parser.add_argument("--steps", type=int, default=60, help="training steps of each contender")
    parser.add_argument("--batch", type=int, default=32, help="pairs per step")
    parser.add_argument("--pairs", type=int, default=1024, help="train pairs")
    parser.add_argument("--max-length", type=int, default=64, help="prompt + longer response, in tokens")
    parser.add_argument("--repeats", type=int, default=1, help="alternated runs of each contender")
    parser.add_argument("--order", nargs="+", default=["postrl", "trl"], help="contender order")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--breakdown", action="store_true", help="also time a step's parts, padded and padding-free"
    )
    parser.add_argument("--workdir", default="runs/bench-dpo", help="models, data and runs")
    parser.add_argument(
        "--trl-python",
        default=str(ROOT / "benchmarks" / "peers" / ".venv-trl" / "bin" / "python"),
        help="python of the TRL venv (`make peers`)",
    )
    parser.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--ref", "--data", "--ids", "--json"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--precompute", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_worker:
        trl_worker(args)
        return
    result = bench(args)
    record("dpo", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
