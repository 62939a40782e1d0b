"""`postrl rm`: a reward model learned from preference pairs (Bradley–Terry), the second stage of RLHF.

Model: a causal LM's trunk plus a scalar head (`postrl.lm.models.ScalarHeadModel`, head ~ N(0, 1/(d+1)),
bias 0). r(x, y) is the head on the final hidden state of the LAST REAL token of prompt + response (the EOS
that ends the response; never a pad after it), found from the attention mask, so padding on either side
and pad = EOS tokenizers are safe.

Loss (``loss``): ``soft`` is the cross-entropy of σ(r_1 − r_2) against the label p (1 chosen preferred,
0.5 a tie; Christiano et al. 2017); ``pairwise`` is −log σ(r_w − r_l − m) with the optional ``margin``
column m (Ouyang et al. 2022; Touvron et al. 2023), ties dropped. ``auto`` picks pairwise when the data has
margins, else soft.

After training, the model scores samples of the SFT policy; their mean and std go next to the exported
model (``reward_norm.json``) so PPO can normalise rewards to mean 0, std 1 on SFT samples (Ziegler et al.
2019, §2.2; "The N+ implementation details of RLHF with PPO", Huang et al. 2024). The held-out metrics,
those statistics and the export are in `reward_model_eval.py`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from postrl.core import pairwise_loss, preference_loss
from postrl.lm.reward_model_eval import NORM_FILE as NORM_FILE
from postrl.lm.reward_model_eval import _gold_pairs, evaluate_pairs, export_reward_model, score_policy_samples
from postrl.lm.reward_model_eval import expected_calibration_error as expected_calibration_error
from postrl.lm.reward_model_eval import read_reward_norm as read_reward_norm
from postrl.lm.trainer import (
    LoopState,
    OptimConfig,
    TrainConfig,
    _micro_batches,
    _resume,
    _save,
    check_train_length,
    iterate_batches,
    make_optimizer,
    set_threads,
    to_device,
)
from postrl.runtime import distributed as dist
from postrl.runtime.config import validate
from postrl.runtime.errors import UserError
from postrl.runtime.progress import Progress
from postrl.runtime.rundir import open_run
from postrl.runtime.seeding import seed_everything

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NormConfig:
    """Score statistics on SFT samples (what PPO normalises rewards with)."""

    samples: int = 256
    """Responses sampled from the policy on train prompts and scored (0: skip)."""
    policy: str | None = None
    """Causal LM that samples them (default: `model`, the SFT checkpoint the RM starts from)."""
    max_new_tokens: int = 24
    """Longest sampled response (use PPO's)."""
    temperature: float = 1.0
    """Sampling temperature (use PPO's)."""

    CHECKS = {"samples": ">= 0", "max_new_tokens": ">= 1", "temperature": "> 0"}  # valid ranges


@dataclass(frozen=True)
class RMConfig:
    """`postrl rm --model SFT_DIR --data FILE_OR_TASK --out RUN_DIR`."""

    model: str = "runs/sft/model"
    """Initial model: an SFT checkpoint or any HF causal LM (its trunk gets a new scalar head)."""
    tokenizer: str | None = None
    """Tokenizer folder or name (default: the model's)."""
    data: str = "task:reviews"
    """Preference rows prompt/chosen/rejected (+ target, margin): a file, task:NAME, or a `datasets` name."""
    task: dict[str, Any] = field(default_factory=dict)
    """Options of a built-in task (e.g. {label_noise: 0.2})."""
    eval_data: str | None = None
    """Held-out pairs (default: the test split of a built-in task, else the last 5% of the data)."""
    empty_rows: Literal["error", "skip"] = "error"
    """Rows whose prompt or completion (chosen, rejected) is empty or whitespace-only: error (the default:
    names the first one's file:line:field and the count) or skip (dropped, the count logged)."""
    loss: str = "auto"
    """soft (σ(r1−r2) against the label, ties at 0.5), pairwise (−log σ(r_w−r_l−margin), ties dropped), or
    auto (pairwise when the data has a margin column, else soft)."""
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(
            max_steps=300,
            batch_size=32,
            max_length=64,
            eval_every=100,
            save_every=100,
            optim=OptimConfig(lr=3e-4, warmup_steps=20, min_lr_ratio=0.1),
        )
    )
    """The optimisation loop (batch_size counts pairs; max_length bounds prompt + longer response)."""
    eval_pairs: int = 500
    """Held-out pairs for accuracy, margin, calibration and gold agreement."""
    ece_bins: int = 10
    """Bins of the expected calibration error."""
    norm: NormConfig = field(default_factory=NormConfig)
    """Score statistics on SFT samples."""
    device: str = "auto"
    """cpu, cuda, cuda:1, mps, or auto."""
    dtype: str = "float32"
    """Weights dtype: float32, bfloat16 or float16 (the head stays float32)."""
    threads: int | None = None
    """torch intra-op threads (null: torch's default)."""
    trust_remote_code: bool = False
    """Run the model repository's own code (only for models you trust)."""
    tensorboard: bool = False
    """Also write TensorBoard event files."""
    plots: bool = True
    """Write curves.png at the end."""

    CHECKS = {"eval_pairs": ">= 0", "ece_bins": ">= 1", "threads": ">= 1"}  # valid ranges


# ---- data ----------------------------------------------------------------------------------------------
def tokenize_pairs(
    rows: Sequence[dict[str, Any]], tokenizer: Any, max_length: int, overlong: str = "drop"
) -> list[dict[str, Any]]:
    """``{"prompt_ids", "chosen_ids", "rejected_ids", "target", "margin"}`` per kept row (responses end with
    EOS). Pairs whose prompt + longer response exceeds ``max_length`` are dropped, have their responses'
    ends cut ("truncate"; prompts that fill the limit are dropped) or refused, and reported."""
    from postrl.lm.data import DataError, apply_length_limit, encode_completions, tokenize_prompts

    kept, prompt_ids = tokenize_prompts(rows, tokenizer, max_length, overlong)
    chosen = encode_completions(tokenizer, [r["chosen"] for r in kept])
    rejected = encode_completions(tokenizer, [r["rejected"] for r in kept])
    longest = [p + max(c, r, key=len) for p, c, r in zip(prompt_ids, chosen, rejected, strict=True)]
    _, keep = apply_length_limit(longest, max_length, overlong, what="preference pairs")
    out = []
    for i in keep:
        room = max_length - len(prompt_ids[i])
        if room <= 0:
            continue
        margin = kept[i].get("margin")
        if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float))):
            raise DataError(f"row {i}: field 'margin': expected a number, got {margin!r}")
        out.append(
            {
                "prompt_ids": prompt_ids[i],
                "chosen_ids": chosen[i][:room],
                "rejected_ids": rejected[i][:room],
                "target": float(kept[i].get("target", 1.0)),
                "margin": None if margin is None else float(margin),
                "row": kept[i],
            }
        )
    return out


def collate(examples: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """2b rows (chosen 0..b−1, rejected b..2b−1) in the rollout layout, plus ``target`` and ``margin`` [b]."""
    from postrl.lm.data import collate_preferences

    batch = collate_preferences(examples, pad_id)
    if examples and examples[0]["margin"] is not None:
        batch["margin"] = torch.tensor([e["margin"] for e in examples], dtype=torch.float32)
    return batch


def load_pair_rows(cfg: RMConfig, tokenizer: Any) -> tuple[list[dict], list[dict], Any]:
    """(train rows, held-out rows, the built-in task or None) as plain-text preference rows."""
    from postrl.lm.data import load_train_heldout, render_rows
    from postrl.lm.tasks import get_task

    task = get_task(cfg.data[len("task:") :], **cfg.task) if cfg.data.startswith("task:") else None
    rows, heldout = load_train_heldout(cfg.data, "prefs", cfg.eval_data, cfg.task, empty=cfg.empty_rows)
    return render_rows(rows, "prefs", tokenizer), render_rows(heldout, "prefs", tokenizer), task


# ---- the loss ------------------------------------------------------------------------------------------
def _soft(chosen: torch.Tensor, rejected: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return preference_loss(chosen, rejected, batch["target"])


def _pairwise(chosen: torch.Tensor, rejected: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return pairwise_loss(chosen, rejected, batch.get("margin"))


LOSSES: dict[str, Callable[..., torch.Tensor]] = {"soft": _soft, "pairwise": _pairwise}


def choose_loss(name: str, examples: Sequence[dict[str, Any]]) -> str:
    """Resolve ``auto`` and check that the data fits the loss."""
    has_margin = [e["margin"] is not None for e in examples]
    if any(has_margin) and not all(has_margin):
        raise UserError("some preference rows have a 'margin' and some do not; give it on every row or none")
    if name == "auto":
        name = "pairwise" if any(has_margin) else "soft"
    if name not in LOSSES:
        raise UserError(f"unknown reward-model loss {name!r}; expected auto, soft or pairwise")
    if name == "soft" and any(has_margin):
        raise UserError("loss 'soft' takes no margin; use loss=pairwise (or auto) for rows with 'margin'")
    return name


def drop_ties(examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pairs with target 1 only (the pairwise loss has no tie); reports how many were dropped."""
    kept = [e for e in examples if e["target"] == 1.0]
    if len(kept) < len(examples):
        log.warning(
            "pairwise loss: dropped %d of %d pairs with target != 1", len(examples) - len(kept), len(examples)
        )
    return kept


def pair_scores(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(r_chosen [b], r_rejected [b]): each row's score at its last real token (mask-based, pad-safe)."""
    from postrl.lm.models import gather_last

    values = model(batch["input_ids"], batch["attention_mask"])  # (2b, L)
    scores = gather_last(values, batch["attention_mask"])  # (2b,)
    b = scores.shape[0] // 2
    return scores[:b], scores[b:]


def rm_loss(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], loss: str
) -> tuple[torch.Tensor, dict[str, float]]:
    """Batch → (loss, metrics): the preference loss and the accuracy on its non-tie pairs."""
    chosen, rejected = pair_scores(model, batch)
    value = LOSSES[loss](chosen, rejected, batch)
    decided = batch["target"] != 0.5
    correct = ((chosen > rejected) == (batch["target"] > 0.5))[decided]
    return value, {"accuracy": float(correct.float().mean()) if correct.numel() else float("nan")}


# ---- the loop ------------------------------------------------------------------------------------------
def rm_train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    examples: Sequence[dict[str, Any]],
    indices: list[int],
    cfg: TrainConfig,
    loss: str,
    pad_id: int,
    device: torch.device,
) -> dict[str, float]:
    """One optimiser step over ``indices`` (all ranks' pairs): each micro-batch's mean loss is weighted by
    its share of the step's pairs, so accumulation and sharding give the gradient of one big batch."""
    # the same number of micro-batches on every rank (DDP syncs in the last backward, FSDP gathers in every
    # forward); a rank whose share ran out runs one pair with weight 0
    micro = [
        (to_device(collate([examples[i] for i in c], pad_id), device), w)
        for c, w in _micro_batches(indices, cfg)
    ]
    total, accuracy = 0.0, 0.0
    for k, (batch, weight) in enumerate(micro):
        share = weight * batch["target"].shape[0] / len(indices)
        with dist.no_grad_sync(model) if k < len(micro) - 1 else _nullcontext():
            value, metrics = rm_loss(model, batch, loss)
            (value * share * dist.world_size()).backward()  # DDP and FSDP average over ranks
        total += float(value.detach()) * share
        accuracy += metrics["accuracy"] * share
    norm = dist.grad_norm(model.parameters(), cfg.optim.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    out = dist.reduce_metrics({"loss": total, "accuracy": accuracy})
    return {k: v * dist.world_size() for k, v in out.items()} | {"grad_norm": norm}


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def run_rm(
    cfg: RMConfig, run_dir: str | Path, resume: bool = False, overwrite: bool = False
) -> dict[str, Any]:
    """Train the reward model, export ``RUN_DIR/model`` (+ ``reward_norm.json``), return the summary.
    The model and the pairs are loaded and checked before the run folder is touched."""
    from postrl.lm.models import ScalarHeadModel, resolve_dtype
    from postrl.lm.tokenizer import load_tokenizer

    run_dir = Path(run_dir)
    validate(cfg)
    if cfg.train.packing:
        raise UserError("train.packing does not apply to a reward model (pairs are scored whole)")
    info = dist.init_distributed(cfg.device)
    set_threads(cfg.threads)
    seed_everything(cfg.train.seed, info.rank)
    rm = ScalarHeadModel.from_pretrained(
        cfg.model,
        dtype=resolve_dtype(cfg.dtype),
        device=info.device,
        trust_remote_code=cfg.trust_remote_code,
        new_head=True,
        seed=cfg.train.seed,
    )
    check_train_length(rm, cfg.train)
    tokenizer = load_tokenizer(cfg.tokenizer or cfg.model, trust_remote_code=cfg.trust_remote_code)
    rows, heldout, task = load_pair_rows(cfg, tokenizer)
    train = tokenize_pairs(rows, tokenizer, cfg.train.max_length, cfg.train.overlong)
    evals = tokenize_pairs(heldout, tokenizer, cfg.train.max_length, "drop")[: cfg.eval_pairs]
    loss = choose_loss(cfg.loss, train)
    if loss == "pairwise":
        train, evals = drop_ties(train), drop_ties(evals)
    if not train:
        raise UserError(f"{cfg.data}: no preference pair fits max_length={cfg.train.max_length}")
    gold, gold_tie = (
        _gold_pairs(task, evals),
        float(getattr(getattr(task, "config", None), "tie_tolerance", 0.0)),
    )
    pad_id = tokenizer.pad_token_id

    def evaluate() -> dict[str, float]:
        return evaluate_pairs(
            rm, evals, pad_id, info.device, loss, gold=gold, gold_tie=gold_tie, bins=cfg.ece_bins
        )

    logger, ckpt = open_run(run_dir, cfg, resume=resume, overwrite=overwrite, tensorboard=cfg.tensorboard)
    model = dist.wrap_model(rm, info, cfg.train.parallel, forward_methods=("score",))
    state, optimizer, scheduler = _train_loop(
        model, rm, train, cfg, loss, pad_id, info, run_dir, logger, evaluate, ckpt
    )
    metrics = evaluate() if evals else {}
    logger.log(state.step, metrics)
    norm = None
    if cfg.norm.samples > 0:
        prompts = sorted({e["row"]["prompt"] for e in train})
        norm = score_policy_samples(rm, tokenizer, prompts, cfg, info.device, task)
    if dist.is_sharded(model):  # rank 0 writes the gathered weights from an unsharded copy
        weights = dist.model_state_dict(model)  # a collective: the full tensors on rank 0, {} elsewhere
        if info.is_main:
            rm = ScalarHeadModel.from_pretrained(
                cfg.model,
                dtype=resolve_dtype(cfg.dtype),
                trust_remote_code=cfg.trust_remote_code,
                new_head=True,
            )
            rm.load_state_dict(weights)
    if info.is_main:
        export_reward_model(rm, tokenizer, run_dir / "model", norm)
    dist.barrier()
    if info.is_main and cfg.plots:
        _plot(run_dir)
    summary = {**metrics, "steps": state.step, "train_pairs": len(train), "loss_type": loss}
    if norm is not None:
        summary.update({f"sft_score_{k}": v for k, v in norm.items() if k in ("mean", "std")})
        summary.update({f"sft_{k}": v for k, v in norm.items() if k.startswith("gold")})
    return logger.finish(summary)


def _train_loop(model, rm, train, cfg: RMConfig, loss, pad_id, info, run_dir, logger, evaluate, ckpt):
    """Optimiser steps over pairs in a (seed, epoch) order, periodic evaluation, checkpoints, resume from
    checkpoint folder ``ckpt`` (None: from step 0)."""
    c = cfg.train
    optimizer, scheduler = make_optimizer(rm, c.optim, c.max_steps)
    state = LoopState()
    ckpt_root = run_dir / "checkpoints"
    if ckpt is not None:
        state, rows = _resume(ckpt, model, optimizer, scheduler)
        logger.resume_at(state.step, rows)
    batches = iterate_batches(len(train), c.batch_size, c.seed, start=state.position)
    model.train()
    with Progress(c.max_steps, "rm", initial=state.step, disable=None if info.is_main else True) as bar:
        while state.step < c.max_steps:
            state.position, indices = next(batches)
            state.position += 1
            out = rm_train_step(model, optimizer, train, indices, c, loss, pad_id, info.device)
            scheduler.step()
            state.step += 1
            bar.update(1, loss=out["loss"])
            if state.step % c.log_every == 0:
                logger.log(state.step, {**out, "lr": scheduler.get_last_lr()[0]})
            done = state.step == c.max_steps
            if c.eval_every and state.step % c.eval_every == 0 and not done:
                metrics = evaluate()
                logger.log(state.step, metrics)
                bar.write(f"rm step {state.step}: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
            if done or (c.save_every and state.step % c.save_every == 0):
                _save(
                    ckpt_root, state, model, optimizer, scheduler, c,
                    hf_folder=False, metrics_rows=logger.rows,
                )  # fmt: skip
    return state, optimizer, scheduler


def _plot(run_dir: Path) -> None:
    from postrl.runtime.logging import read_jsonl
    from postrl.runtime.plots import plot_curves

    rows = read_jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    keys = ["loss", "accuracy", "heldout_loss", "heldout_accuracy", "heldout_ece", "gold_accuracy"]
    plot_curves(rows, keys, run_dir / "curves.png", title="reward model")
