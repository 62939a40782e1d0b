"""`postrl kto` beside Hugging Face TRL's ``KTOTrainer`` (TRL 1.16): the loss of one identical batch, steps/s
and peak memory. Ends with ONE JSON line of results.

Same models, data and batch for both: two random inits of the demo's tiny Llama (2 layers, d = 128, vocab 512;
the policy and a different reference, so that the implicit rewards and the KL reference point z0 are not 0),
the built-in ``reviews`` task's labelled pairs unpaired as TRL's ``unpair_preference_dataset`` does (every
chosen answer desirable, every rejected one undesirable, the desirable rows first), ``--batch`` rows per step,
CPU, fp32, 1 torch thread, β 0.1, weights 1, AdamW (0.9, 0.999), no weight decay, gradients clipped to 1, a
constant lr 1e-5, dropout off; TRL with ``gradient_checkpointing=False`` and ``bf16=False`` (as in
benchmarks/dpo.py) and its default reference handling (a reference forward in every step).

The identical batch: the first ``--batch`` rows (TRL's sampler is sequential for KTO, so its first batch is these
rows, with its mismatched completions: each row's predecessor in the batch). postrl tokenises them (its ids are
compared with TRL's, id for id), computes the reference's log-probs as training does (once, stored), z0 on the
batch's mismatched pairs (`postrl.lm.kto.build.kl_reference_point`) and the loss (`build.batch_loss`); TRL runs
``KTOTrainer._compute_loss`` on its collator's batch. They must agree within 1e-5.

    .venv/bin/python benchmarks/kto.py --steps 40

TRL runs in its own virtual environment (this file in ``--trl-worker`` mode), as in benchmarks/dpo.py:

    make peers    # benchmarks/peers/.venv-trl, from benchmarks/peers/requirements-trl.txt (TRL 1.16, pinned)

Measured 2026-12-04 on the shared 2-core machine (load average 2.8-3.4, other jobs running), ``--steps 40``:
identical batch loss postrl 0.50007129, TRL 0.50007129 (|difference| 0.0; z0 0.413079 vs 0.413080), the same
token ids; 8.34 vs 3.25 steps/s (2.57x), peak RSS 421 vs 509 MB.

The gain on the reviews task (not run by this script): the preset from the demo's SFT model (seed 0), beside
DPO's preset on the same model, the same 200 steps and lr:

    postrl kto --config kto-reviews --model runs/demo/sft/model --out runs/kto
    postrl dpo --config dpo-reviews --model runs/demo/sft/model --out runs/dpo

held-out gold reward of sampled responses -0.109 -> 0.553 with KTO (KL to the reference 4.79; greedy -0.126 ->
0.671), -0.109 -> 0.514 with DPO (KL 3.40; greedy 0.619); 0.19 s per step each.
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
sys.path.insert(0, str(ROOT / "benchmarks"))
BETA, LR = 0.1, 1e-5


def _data(work: Path, n: int) -> Path:
    from postrl.lm.data import unpair
    from postrl.lm.tasks import get_task

    pairs = get_task("reviews", perturb_fraction=0.3, n_pairs_train=n).preference_rows("train")
    rows = unpair([{k: r[k] for k in ("prompt", "chosen", "rejected")} for r in pairs])
    # interleave the two kinds by blocks of 4 so that the first batch holds both (TRL keeps the file's order)
    good, bad = [r for r in rows if r["label"]], [r for r in rows if not r["label"]]
    mixed = [row for k in range(0, len(good), 4) for row in good[k : k + 4] + bad[k + 1 : k + 5]]
    path = work / "unpaired.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in mixed))
    return path


def _postrl_loss(policy: Path, reference: Path, data: Path, batch: int, max_length: int) -> tuple[dict, list]:
    """postrl's loss of the first ``batch`` rows, z0, and the rows' token ids (prompt, completion, mismatched)."""
    import torch

    from postrl.lm.kto import KTOLossConfig
    from postrl.lm.kto.build import batch_loss, kl_reference_point, reference_completion_log_probs
    from postrl.lm.kto.data import collate_kto_rows, tokenize
    from postrl.lm.models import load_causal_lm
    from postrl.lm.rollout import response_forward
    from postrl.lm.tokenizer import load_tokenizer

    cpu = torch.device("cpu")
    tokenizer = load_tokenizer(policy)
    rows = [json.loads(line) for line in data.read_text().splitlines()][:batch]
    examples = tokenize(rows, tokenizer, max_length, "drop", batch)
    assert len(examples) == batch, "a row of the identical batch is over --max-length"
    pad = tokenizer.pad_token_id
    ref = reference_completion_log_probs(
        response_forward(load_causal_lm(reference), gradients=False), examples, pad, cpu, 64
    )
    model = load_causal_lm(policy).train()
    everything = [(list(range(batch)), 1.0)]
    z0 = kl_reference_point(response_forward(model, gradients=False), examples, ref, everything, pad, cpu)
    loss, stats = batch_loss(
        response_forward(model), collate_kto_rows(examples, pad), ref[:, 0], z0, KTOLossConfig(beta=BETA)
    )
    ids = [[e["prompt_ids"], e["completion_ids"], e["kl_completion_ids"]] for e in examples]
    return {"loss": float(loss.detach()), "kl": float(z0), **{k: float(v) for k, v in stats.items()}}, ids


def _postrl_run(policy: Path, data: Path, out: Path, args: argparse.Namespace) -> dict:
    """`postrl kto` in a fresh process: the median step time (after the first 5) and peak RSS."""
    cmd = [
        sys.executable, "-m", "postrl.cli", "kto", "--model", str(policy), "--data", str(data), "--out", str(out),
        f"run.steps={args.steps}", "run.eval_every=0", "run.save_every=0", "run.log_every=1", "run.device=cpu",
        f"run.threads={args.threads}", f"run.seed={args.seed}", f"train.batch_size={args.batch}",
        f"train.max_length={args.max_length}", f"kto.beta={BETA}", f"optim.lr={LR}", "optim.min_lr_ratio=1.0",
        "optim.warmup_steps=0", "eval_size=0", "eval_samples=0", "eval_at_start=false", "plots=false",
        "--overwrite",
    ]  # fmt: skip
    log = out.parent / f"{out.name}.log"
    with log.open("w") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=f, cwd=ROOT)
    summary = json.loads(log.read_text().strip().splitlines()[-1])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    times = [r["time_step"] for r in rows if "time_step" in r]
    return {"step_time_median_s": statistics.median(times[5:]), "peak_rss_mb": summary["peak_rss_mb"]}


def trl_worker(args: argparse.Namespace) -> None:
    """TRL's loss of the identical batch, then ``--steps`` training steps of KTOTrainer on the rows."""
    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import KTOConfig, KTOTrainer

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    tok = AutoTokenizer.from_pretrained(args.model)
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines()]

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.t0, self.times = 0.0, []

        def on_step_begin(self, a, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            self.times.append(time.perf_counter() - self.t0)

    def config(steps: int) -> KTOConfig:
        return KTOConfig(
            output_dir=str(Path(args.json).parent / "trl_out"), max_steps=steps,
            per_device_train_batch_size=args.batch, gradient_accumulation_steps=1, learning_rate=LR,
            lr_scheduler_type="constant", warmup_steps=0, beta=BETA, max_length=args.max_length,
            logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, bf16=False, fp16=False,
            gradient_checkpointing=False, seed=args.seed, dataloader_num_workers=0, disable_tqdm=True,
            max_grad_norm=1.0, weight_decay=0.0,
        )  # fmt: skip

    check = KTOTrainer(
        model=AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32),
        ref_model=AutoModelForCausalLM.from_pretrained(args.ref, dtype=torch.float32),
        args=config(1), train_dataset=Dataset.from_list(rows[: args.batch]), processing_class=tok,
    )  # fmt: skip
    inputs = next(iter(check.get_train_dataloader()))
    trl_ids = [[e["prompt_ids"], e["completion_ids"], e["KL_completion_ids"]] for e in check.train_dataset]
    check.model.train()
    with torch.no_grad():
        loss = float(check._compute_loss(check.model, inputs, False))
    kl = check._metrics["train"]["kl"][-1]
    del check

    timer = Timer()
    trainer = KTOTrainer(
        model=args.model, args=config(args.steps), train_dataset=Dataset.from_list(rows), processing_class=tok,
        callbacks=[timer],
    )  # fmt: skip
    trainer.train()
    result = {
        "versions": {
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
        "identical_batch": {"loss": loss, "kl": kl},
        "ids": trl_ids,
        "step_time_median_s": statistics.median(timer.times[5:]),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    Path(args.json).write_text(json.dumps(result))


def bench(args: argparse.Namespace) -> dict:
    from dpo import _build_models  # the same two tiny Llamas as benchmarks/dpo.py

    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    reference, policy = _build_models(
        work, None
    )  # this way round z0 > 0 (0.41), so the clamp is not what agrees
    data = _data(work, args.pairs)
    ours, ids = _postrl_loss(policy, reference, data, args.batch, args.max_length)
    load = os.getloadavg()
    out_trl = work / "trl"
    out_trl.mkdir(exist_ok=True)
    cmd = [
        args.trl_python, str(THIS), "--trl-worker", "--model", str(policy), "--ref", str(reference),
        "--data", str(data), "--json", str(out_trl / "result.json"), "--steps", str(args.steps),
        "--batch", str(args.batch), "--max-length", str(args.max_length), "--threads", str(args.threads),
        "--seed", str(args.seed),
    ]  # fmt: skip
    with (out_trl / "worker.log").open("w") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=f, cwd=out_trl)
    theirs = json.loads((out_trl / "result.json").read_text())
    mine = _postrl_run(policy, data, work / "postrl", args)
    out = {
        "steps": args.steps,
        "rows_per_step": args.batch,
        "load_average_before": [round(x, 2) for x in load],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "identical_batch": {
            "postrl": ours,
            "trl": theirs["identical_batch"],
            "abs_diff_loss": abs(ours["loss"] - theirs["identical_batch"]["loss"]),
            "abs_diff_kl": abs(ours["kl"] - theirs["identical_batch"]["kl"]),
            "same_token_ids": ids == theirs["ids"][: len(ids)],
        },
        "steps_per_s": {
            "postrl": round(1 / mine["step_time_median_s"], 2),
            "trl": round(1 / theirs["step_time_median_s"], 2),
        },
        "speedup_vs_trl": round(theirs["step_time_median_s"] / mine["step_time_median_s"], 2),
        "peak_rss_mb": {"postrl": round(mine["peak_rss_mb"], 1), "trl": round(theirs["peak_rss_mb"], 1)},
        "versions": theirs["versions"],
    }
    d = out["identical_batch"]
    print(
        f"identical batch: postrl {ours['loss']:.8f} (z0 {ours['kl']:.6f})  TRL {theirs['identical_batch']['loss']:.8f} "
        f"(kl {theirs['identical_batch']['kl']:.6f})  |diff| {d['abs_diff_loss']:.2e}  same ids {d['same_token_ids']}",
        file=sys.stderr,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps of each contender")
    parser.add_argument("--batch", type=int, default=16, help="rows per step")
    parser.add_argument("--pairs", type=int, default=512, help="train pairs before unpairing")
    parser.add_argument("--max-length", type=int, default=64, help="prompt + completion, in tokens")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default="runs/bench-kto", help="models, data and runs")
    parser.add_argument(
        "--trl-python",
        default=str(ROOT / "benchmarks" / "peers" / ".venv-trl" / "bin" / "python"),
        help="python of the TRL venv (`make peers`)",
    )
    parser.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--model", "--ref", "--data", "--json"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_worker:
        trl_worker(args)
        return
    result = bench(args)
    record("kto", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
