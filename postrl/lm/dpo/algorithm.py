"""`postrl dpo`: Direct Preference Optimization (Rafailov et al. 2023, arXiv:2305.18290) and IPO (Azar et al.
2023, arXiv:2310.12036) on the preference pairs a reward model would learn from.

DPO skips the reward model and the sampling of RLHF: the policy's log-ratio to a frozen reference,
β·log(π(y|x)/π_ref(y|x)), is an implicit reward, and fitting it to the pairs with the Bradley–Terry loss is
maximum likelihood for the policy that the KL-regularised RL objective would reach. One step:

    B pairs ──collate: 2B rows (chosen, rejected) in the rollout layout──▶ teacher-forced forward of π
      ──Σ log π over each response's tokens──▶ log π(y_w), log π(y_l) [B]
      + log π_ref(y_w), log π_ref(y_l) [B] (computed once before training, `build.reference_log_probs`)
      ──core.dpo_loss (sigmoid or ipo; target p per pair, 0.5 a tie)──▶ AdamW step

Reference. π_ref never changes, so its log-probs of every train and held-out pair are computed once, batched
and without gradients, before the first step (TRL's ``precompute_ref_log_probs``), and written to the run
folder (``reference_logps.safetensors``): a resumed run reads them back, so it trains on the same numbers.
The reference model itself is kept only for the held-out KL of sampled responses (``eval_samples`` > 0).

Distributed (torchrun): the step's pairs are split over ranks (`trainer.micro_batches`), each micro-batch's
loss is its summed pair loss over the step's global pair count, DDP/FSDP average gradients, so N ranks take
the step one process takes on the whole batch.

This file: the step and :class:`DPO`, the algorithm of the shared loop (`postrl.lm.spine`), and `run_dpo`. The
config is in `config.py`; the pairs, log-probs, reference and evaluation in `build.py`.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from postrl.lm.dpo.build import (
    REF_FILE,
    collate,
    dpo_batch_loss,
    heldout_prompts,
    load_or_compute_reference,
    load_pairs,
    pair_metrics,
    reference_log_probs,
    reward_model_scorer,
    sample_metrics,
)
from postrl.lm.dpo.config import DPOConfig
from postrl.lm.spine import LoopState, Parts, accumulate, train_loop
from postrl.lm.trainer import (
    clip_grad_norm,
    export_on_main,
    fit_train_length,
    iterate_batches,
    make_optimizer,
    micro_batches,
    model_parts,
    set_threads,
)
from postrl.runtime import distributed as dist
from postrl.runtime.config import validate
from postrl.runtime.errors import UserError
from postrl.runtime.logging import read_jsonl
from postrl.runtime.plots import plot_curves
from postrl.runtime.rundir import open_run
from postrl.runtime.seeding import seed_everything

STAT_KEYS = ("reward_accuracy", "reward_margin", "chosen_rewards", "rejected_rewards")


# ---- one optimiser step --------------------------------------------------------------------------------
def length_groups(
    rows: list[int], weight: float, pairs: list[dict[str, Any]], groups: int
) -> list[tuple[list[int], float]]:
    """A micro-batch's pairs sorted by length (longer response, then prompt) and cut into ``groups`` parts of
    near-equal counts, each with the micro-batch's loss weight: in the rollout layout a batch is as wide as its
    longest prompt plus its longest response, so one long response would pad every row to its length. Always
    ``groups`` parts (an empty one is a pair with weight 0), so that every rank runs the same forwards."""

    def length(i: int) -> tuple[int, int]:
        e = pairs[i]
        return max(len(e["chosen_ids"]), len(e["rejected_ids"])), len(e["prompt_ids"])

    order = sorted(rows, key=length)
    size, extra = divmod(len(order), groups)
    out, start = [], 0
    for k in range(groups):
        end = start + size + (1 if k < extra else 0)
        out.append((order[start:end], weight) if end > start else ([rows[0]], 0.0))
        start = end
    return out


def dpo_train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    pairs: list[dict[str, Any]],
    ref: Tensor,
    indices: list[int],
    cfg: DPOConfig,
    pad_id: int,
    device: torch.device,
) -> dict[str, float]:
    """One optimiser step over the pairs ``indices`` (all ranks'); returns the loss, the implicit-reward stats
    and the gradient norm, each the mean over the step's pairs.

    The step's loss is Σ_i ℓ_i / N over its N pairs on every micro-batch and rank: a micro-batch of b pairs
    contributes its mean loss · b/N, so accumulation and sharding give the gradient of one big batch."""
    micro = [
        part
        for rows, weight in micro_batches(indices, cfg.train.grad_accum)
        for part in length_groups(rows, weight, pairs, cfg.dpo.length_groups)
    ]
    scale = dist.world_size()  # DDP and FSDP average gradients over ranks; the loss is a global pair sum
    sums = dict.fromkeys(("loss", *STAT_KEYS), 0.0)
    use_fast = cfg.sampling.use_fast

    def micro_loss(mb: tuple[list[int], float]) -> Tensor:
        rows, weight = mb
        share = weight * len(rows) / len(indices)  # b/N; 0 for a rank whose share ran out
        batch = collate([pairs[i] for i in rows], pad_id, device)
        value, stats = dpo_batch_loss(model, batch, ref[rows], cfg.dpo, use_fast)
        sums["loss"] += float(value.detach()) * share
        for key in STAT_KEYS:
            sums[key] += float(stats[key]) * share
        return value * share * scale

    accumulate([model], micro, micro_loss)
    norm = clip_grad_norm(model, cfg.optim.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    out = dist.reduce_metrics(sums)  # the mean over ranks of each rank's share: × world size is the sum
    return {k: v * scale for k, v in out.items()} | {"grad_norm": norm}


# ---- the algorithm on the spine ------------------------------------------------------------------------
class DPO:
    """DPO as a `postrl.lm.spine` algorithm: a step is one AdamW step on a batch of pairs; a checkpoint holds
    the policy (a folder `from_pretrained` loads), AdamW, the schedule and the data position."""

    name = "dpo"

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        pairs: list[dict[str, Any]],
        refs: dict[str, Tensor],
        cfg: DPOConfig,
        *,
        evals: list[dict[str, Any]],
        evaluate_samples: Any = None,
        device: torch.device,
    ) -> None:
        self.model, self.tokenizer, self.pairs, self.evals, self.cfg = model, tokenizer, pairs, evals, cfg
        self.ref, self.eval_ref, self.device = refs["train"], refs["heldout"], device
        self.evaluate_samples = evaluate_samples
        self.optimizer, self.scheduler = make_optimizer(dist.unwrap(model), cfg.optim, cfg.run.steps)
        self.position, self.seconds = 0, 0.0  # batches drawn since step 0; step seconds of this invocation
        self.batches = iterate_batches(len(pairs), cfg.train.batch_size, cfg.run.seed)
        model.train()

    def step(self, step: int) -> dict[str, float]:
        self.position, indices = next(self.batches)
        self.position += 1
        tic = time.perf_counter()
        out = dpo_train_step(
            self.model, self.optimizer, self.pairs, self.ref, indices, self.cfg,
            self.tokenizer.pad_token_id, self.device,
        )  # fmt: skip
        out["time_step"] = time.perf_counter() - tic
        self.seconds += out["time_step"]
        out["lr"] = self.scheduler.get_last_lr()[0]  # the lr this step used
        self.scheduler.step()
        return out

    def bar(self, metrics: dict[str, float]) -> dict[str, float]:
        return {"loss": metrics["loss"], "acc": metrics["reward_accuracy"]}

    def evaluate(self) -> dict[str, float]:
        """Held-out pair metrics and (``eval_samples`` > 0) sampled-response metrics; every rank calls it (an
        FSDP-sharded model needs every rank in each forward) and computes its share."""
        inner = dist.unwrap(self.model)
        was_training = inner.training
        inner.eval()
        with dist.gathered(self.model):  # sampling reads whole weights
            out = pair_metrics(
                inner, self.evals, self.eval_ref, self.cfg.dpo, self.tokenizer.pad_token_id, self.device,
                self.cfg.dpo.ref_batch_size,
            )  # fmt: skip
            if self.evaluate_samples is not None:
                out.update(self.evaluate_samples(inner))
        inner.train(was_training)
        return out

    def parts(self) -> Parts:
        return model_parts(self.model, self.optimizer, self.scheduler, self.tokenizer, self.position)

    def load_extra(self, extra: dict[str, Any]) -> None:
        self.position = int(extra["position"])
        self.batches = iterate_batches(
            len(self.pairs), self.cfg.train.batch_size, self.cfg.run.seed, self.position
        )


# ---- the command ---------------------------------------------------------------------------------------
def check_config(cfg: DPOConfig) -> None:
    """What the value ranges cannot say."""
    if cfg.train.packing:
        raise UserError("train.packing does not apply to DPO (pairs are scored whole)")
    if cfg.run.parallel not in dist.PARALLEL:
        raise UserError(f"run.parallel must be one of {dist.PARALLEL}, got {cfg.run.parallel!r}")
    if cfg.eval_samples and (cfg.sampling.greedy or cfg.sampling.temperature <= 0):
        raise UserError("sampling.greedy must be false for the held-out KL (it is an estimate over samples)")


def run_dpo(
    cfg: DPOConfig, run_dir: str | Path, resume: bool = False, overwrite: bool = False
) -> dict[str, Any]:
    """Train with DPO, export ``RUN_DIR/model`` (HF format), write the run folder, return the summary.
    The models, tokenizer and pairs are loaded and checked before the run folder is touched."""
    # deferred: transformers takes seconds to import; DPOConfig (--list-keys, config errors) needs none of it
    from postrl.lm.models import (
        adapter_free_reference,
        apply_lora,
        check_context,
        check_vocab,
        load_causal_lm,
        resolve_dtype,
    )
    from postrl.lm.rollout.decoders import check_backend
    from postrl.lm.tokenizer import load_tokenizer

    run_dir = Path(run_dir)
    validate(cfg)
    check_config(cfg)
    run = cfg.run
    info = dist.init_distributed(run.device)
    set_threads(run.threads)
    seed_everything(run.seed, info.rank)
    load = {
        "dtype": resolve_dtype(run.dtype, "run.dtype"),
        "device": info.device,
        "trust_remote_code": cfg.trust_remote_code,
    }
    policy = apply_lora(load_causal_lm(cfg.model, **load), run)  # run.lora: adapters, the base frozen
    check_backend(policy, cfg.sampling.backend)
    cfg = replace(cfg, train=fit_train_length(policy, cfg.train))  # a ceiling above the context: clipped
    tokenizer = load_tokenizer(cfg.tokenizer or cfg.model, trust_remote_code=cfg.trust_remote_code)
    check_vocab(policy, tokenizer, "tokenizer" if cfg.tokenizer else "model")
    train, evals, task = load_pairs(cfg, tokenizer)
    what = "ref_model" if cfg.ref_model else "model"
    if run.lora.enabled and not cfg.ref_model:  # the base model: the policy with its adapters disabled
        reference = adapter_free_reference(policy)
    else:
        reference = load_causal_lm(cfg.ref_model or cfg.model, **load, what=what).eval().requires_grad_(False)
    scorer = reward_model_scorer(cfg, info.device)
    prompts = heldout_prompts(task, evals)
    if cfg.eval_samples and prompts.rows:
        longest = max(len(p) for p in tokenizer([r["prompt"] for r in prompts.rows])["input_ids"])
        t = cfg.sampling.max_new_tokens
        check_context(
            policy, longest + t, f"the longest held-out prompt ({longest}) + sampling.max_new_tokens ({t})"
        )
    logger, ckpt = open_run(run_dir, cfg, resume=resume, overwrite=overwrite, tensorboard=run.tensorboard)

    def compute() -> dict[str, Tensor]:
        pad, size, fast = tokenizer.pad_token_id, cfg.dpo.ref_batch_size, cfg.sampling.use_fast
        return {
            "train": reference_log_probs(reference, train, pad, info.device, size, fast),
            "heldout": reference_log_probs(reference, evals, pad, info.device, size, fast),
        }

    refs = load_or_compute_reference(
        run_dir, ckpt is not None, compute, {"train": len(train), "heldout": len(evals)}
    )
    if not cfg.eval_samples:
        reference = None  # its log-probs are all training needs

    def evaluate_samples(inner: torch.nn.Module) -> dict[str, float]:
        return sample_metrics(inner, reference, tokenizer, prompts, cfg, task, scorer)

    model = dist.wrap_model(policy, info, run.parallel)
    algo = DPO(
        model, tokenizer, train, refs, cfg, evals=evals, device=info.device,
        evaluate_samples=evaluate_samples if reference is not None else None,
    )  # fmt: skip
    state = train_loop(algo, run, run_dir, logger, ckpt, eval_at_start=cfg.eval_at_start)
    export_on_main(model, tokenizer, run_dir / "model")
    if info.is_main and cfg.plots:
        plot_dpo(run_dir)
    return logger.finish(summarize(algo, state, len(train)))


def summarize(algo: DPO, state: LoopState, n_pairs: int) -> dict[str, Any]:
    """The last evaluation (and the first, as ``*_start``), the last step's training metrics, throughput."""
    start = {f"{k}_start": v for k, v in state.start_eval.items()}
    last = state.last_metrics
    return {
        **state.last_eval,
        **start,
        "loss": last.get("loss"),
        "reward_accuracy": last.get("reward_accuracy"),
        "steps": state.step,
        "train_pairs": n_pairs,
        "beta": algo.cfg.dpo.beta,
        "loss_type": algo.cfg.dpo.loss_type,
        "train_seconds": round(state.train_seconds, 3),
        "seconds_per_step": state.train_seconds / max(1, state.step),
        "reference_file": REF_FILE,
    }


def plot_dpo(run_dir: Path) -> Path | None:
    """``RUN_DIR/curves.png``: training loss and implicit-reward accuracy and margin, the held-out ones, and the
    sampled responses' gold reward, reward-model score and KL to the reference."""
    keys = ["loss", "reward_accuracy", "reward_margin", "heldout_loss", "heldout_reward_accuracy"]
    keys += ["heldout_gold_reward", "heldout_rm_score", "heldout_kl"]
    return plot_curves(read_jsonl(run_dir / "metrics.jsonl"), keys, run_dir / "curves.png", title="DPO")
