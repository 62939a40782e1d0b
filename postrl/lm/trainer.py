"""Supervised fine-tuning (and pretraining): next-token cross-entropy on the completion tokens.

Pretraining is the same loop on plain text with every token in the loss. The loss is a token mean over
the whole optimiser step: each micro-batch's summed loss is divided by the step's total count of target
tokens, so gradient accumulation (and sharding across ranks) gives the gradient of one big batch.

Schedule: linear warmup then cosine decay to ``min_lr_ratio·lr`` (as in nanoGPT / Chinchilla).
Checkpoints hold the model, optimiser, scheduler, data position and every RNG state, so a resumed run
continues bit-for-bit; the final model is written with ``save_pretrained`` (safetensors).
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from postrl.core import masked_sum
from postrl.lm.data import pack_examples, pad
from postrl.runtime import distributed as dist
from postrl.runtime.checkpoint import (
    STATE_FILE,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    write_dir_atomically,
)
from postrl.runtime.logging import RunLogger
from postrl.runtime.progress import Progress
from postrl.runtime.seeding import get_rng_state, set_rng_state


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-3
    """Peak learning rate (AdamW)."""
    min_lr_ratio: float = 0.1
    """The cosine schedule ends at min_lr_ratio · lr."""
    warmup_steps: int = 50
    """Linear warmup steps from 0 to lr."""
    weight_decay: float = 0.0
    """AdamW weight decay (matrices only; norms and biases are not decayed)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    max_grad_norm: float | None = 1.0
    """Global gradient-norm clip; null turns it off."""

    CHECKS = {  # valid ranges (postrl.runtime.config.validate)
        "lr": "> 0",
        "min_lr_ratio": "[0, 1]",
        "warmup_steps": ">= 0",
        "weight_decay": ">= 0",
        "betas": "[0, 1)",
        "max_grad_norm": "> 0",
    }


def cosine_schedule(warmup_steps: int, total_steps: int, min_lr_ratio: float) -> Callable[[int], float]:
    """LR multiplier at optimiser step s: s/warmup during warmup, then cosine from 1 to min_lr_ratio."""

    def factor(step: int) -> float:
        if warmup_steps > 0 and step < warmup_steps:
            return (step + 1) / warmup_steps
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def adamw_kernel(params: Sequence[torch.Tensor]) -> dict[str, bool]:
    """``fused=True`` (one kernel for every tensor's update: 3x faster than ``foreach`` on a small model on
    CPU, the same update to float32 rounding) where torch has it: plain float tensors on CPU or CUDA; else
    ``foreach=True`` (e.g. FSDP's sharded DTensor parameters)."""
    floats = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
    plain = dist.whole_tensors(params) and all(
        p.device.type in ("cpu", "cuda") and p.dtype in floats for p in params
    )
    return {"fused": True} if plain else {"foreach": True}


def make_optimizer(model: torch.nn.Module, cfg: OptimConfig, total_steps: int):
    """AdamW with decay on ≥2-D weights only, and the warmup-cosine LambdaLR."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, **adamw_kernel(decay + no_decay))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, cosine_schedule(cfg.warmup_steps, total_steps, cfg.min_lr_ratio)
    )
    return opt, sched


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation loop shared by pretraining and SFT."""

    max_steps: int = 1000
    """Optimiser steps."""
    batch_size: int = 64
    """Examples per optimiser step (over all micro-batches and ranks)."""
    grad_accum: int = 1
    """Micro-batches per optimiser step (the loss is normalised by the step's token count, so this never
    changes the gradient)."""
    max_length: int = 64
    """Longest example in tokens (prompt + completion + EOS); see `overlong`."""
    overlong: str = "drop"
    """What to do with longer examples: drop, truncate or error (always reported)."""
    packing: bool = False
    """Concatenate whole examples into blocks of max_length tokens."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimiser and schedule."""
    eval_every: int = 100
    """Steps between held-out evaluations (0: only at the end)."""
    eval_examples: int = 256
    """Held-out examples for the held-out loss."""
    save_every: int = 200
    """Steps between checkpoints (0: only at the end)."""
    keep_last: int = 2
    """Checkpoints kept."""
    seed: int = 0
    """Seed of the data order and of everything random."""
    log_every: int = 10
    """Steps between metrics.jsonl rows."""
    max_seconds: float | None = None
    """Stop after this much training wall time (e.g. to compare with an RL stage at equal time)."""
    parallel: str = "ddp"
    """Under torchrun: ddp (replicate the model) or fsdp (shard parameters, gradients and optimiser state
    with FSDP2, for models one device cannot hold). No effect in one process."""

    CHECKS = {  # valid ranges (postrl.runtime.config.validate)
        "max_steps": ">= 1",
        "batch_size": ">= 1",
        "grad_accum": ">= 1",
        "max_length": ">= 2",
        "eval_every": ">= 0",
        "eval_examples": ">= 0",
        "save_every": ">= 0",
        "keep_last": ">= 0",
        "seed": ">= 0",
        "log_every": ">= 1",
        "max_seconds": "> 0",
    }


def token_losses(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token next-token NLL and its mask, both [B, L−1]: position t predicts token t+1."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    targets = batch["labels"][:, 1:]  # (B, L-1)
    mask = targets != -100
    nll = F.cross_entropy(
        logits[:, :-1].flatten(0, 1).float(), targets.clamp_min(0).flatten(), reduction="none"
    ).view_as(targets)
    return nll, mask


def sft_step_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor], n_tokens: int) -> torch.Tensor:
    """Σ NLL over this micro-batch's target tokens / ``n_tokens`` (the whole step's count)."""
    nll, mask = token_losses(model, batch)
    return masked_sum(nll, mask) / max(1, n_tokens)


@torch.no_grad()
def heldout_loss(model: torch.nn.Module, batches: Sequence[dict[str, torch.Tensor]]) -> float:
    """Token-mean NLL over held-out batches (dropout off)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for batch in batches:
        nll, mask = token_losses(model, batch)
        total += float(masked_sum(nll, mask))
        count += int(mask.sum())
    model.train(was_training)
    return total / max(1, count)


def batch_order(n_examples: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Example indices for each batch of ``epoch``: a permutation that depends only on (seed, epoch)."""
    order = list(range(n_examples))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return [order[i : i + batch_size] for i in range(0, n_examples, batch_size)]


def iterate_batches(
    n_examples: int, batch_size: int, seed: int, start: int = 0
) -> Iterator[tuple[int, list[int]]]:
    """Endless ``(position, indices)``; position counts batches from the start of training, so a resume at
    position p continues with exactly the batch a straight run would have drawn next."""
    per_epoch = math.ceil(n_examples / batch_size)
    position = start
    while True:
        epoch, within = divmod(position, per_epoch)
        yield position, batch_order(n_examples, batch_size, seed, epoch)[within]
        position += 1


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def make_batches(examples: Sequence[dict[str, list[int]]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad tokenised examples: ``input_ids``, ``attention_mask``, ``labels`` (−100 = no loss), [B, L]."""
    ids, mask = pad([e["input_ids"] for e in examples], pad_token_id, side="right")
    labels, _ = pad([e["labels"] for e in examples], -100, side="right")
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def prepare_examples(examples: list[dict[str, list[int]]], cfg: TrainConfig) -> list[dict[str, list[int]]]:
    return pack_examples(examples, cfg.max_length) if cfg.packing else examples


@dataclass
class LoopState:
    """What the loop carries from step to step (and what a checkpoint restores)."""

    step: int = 0
    position: int = 0
    best: dict[str, float] = field(default_factory=dict)


def _micro_batches(indices: list[int], cfg: TrainConfig) -> list[tuple[list[int], float]]:
    """This rank's share of a step's examples cut into micro-batches, each with its loss weight.

    Every rank gets the same number of micro-batches (FSDP gathers parameters in every forward, DDP syncs in
    the last backward, so the ranks must stay in step); a rank whose share runs out, e.g. on the last batch
    of an epoch, runs one example with weight 0.
    """
    mine = [indices[i] for i in dist.shard_range(len(indices))]
    largest = math.ceil(len(indices) / dist.world_size())  # the largest share, the same on every rank
    size = max(1, math.ceil(largest / cfg.grad_accum))
    count = max(1, math.ceil(largest / size))
    chunks = [mine[k * size : (k + 1) * size] for k in range(count)]
    return [(c, 1.0) if c else ([indices[0]], 0.0) for c in chunks]


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    examples: Sequence[dict[str, list[int]]],
    indices: list[int],
    cfg: TrainConfig,
    pad_token_id: int,
    device: torch.device,
) -> dict[str, float]:
    """One optimiser step over ``indices`` (all ranks' examples); returns loss and gradient norm.

    The loss is Σ NLL over the global step's target tokens / their global count, so 1 process with the
    whole batch and N processes with a share each take the same step.
    """
    micro = [
        (to_device(make_batches([examples[i] for i in m], pad_token_id), device), w)
        for m, w in _micro_batches(indices, cfg)
    ]
    local_tokens = sum(int((b["labels"][:, 1:] != -100).sum()) * w for b, w in micro)
    n_tokens = int(dist.all_reduce_sum(torch.tensor(local_tokens)).item())
    scale = dist.world_size()  # DDP and FSDP average gradients over ranks; the loss is a global token sum
    total = 0.0
    for k, (batch, weight) in enumerate(micro):
        with dist.no_grad_sync(model) if k < len(micro) - 1 else _nullcontext():
            loss = sft_step_loss(model, batch, n_tokens) * (scale * weight)
            loss.backward()
        total += float(loss.detach()) / scale
    total = float(dist.all_reduce_sum(torch.tensor(total)).item())
    norm = _clip(model, cfg.optim.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": total, "grad_norm": norm, "tokens": n_tokens}


_nullcontext = contextlib.nullcontext  # (imported by the RL trainers)


def _clip(model: torch.nn.Module, max_norm: float | None) -> float:
    """Global gradient norm (over all ranks' shards), clipped to ``max_norm`` when it is not None."""
    return dist.grad_norm(model.parameters(), max_norm)


def run_training(
    model: torch.nn.Module,
    tokenizer: Any,
    train_examples: list[dict[str, list[int]]],
    eval_examples: list[dict[str, list[int]]],
    cfg: TrainConfig,
    run_dir: Path,
    logger: RunLogger,
    *,
    device: torch.device,
    desc: str = "sft",
    evaluate: Callable[[torch.nn.Module], dict[str, float]] | None = None,
    should_stop: Callable[[dict[str, float]], bool] | None = None,
    resume: bool | Path | None = False,
) -> dict[str, float]:
    """The loop: batches in a (seed, epoch) order, optimiser steps, periodic held-out loss (and the
    ``evaluate`` callback, e.g. accuracy), atomic checkpoints, exact resume. Returns the last evaluation.

    ``resume``: the checkpoint folder to continue from (what `postrl.runtime.rundir.open_run` returns), or
    True for the newest one under ``run_dir/checkpoints``."""
    if not train_examples:
        raise ValueError("no training examples left after tokenisation and the length limit")
    inner = dist.unwrap(model)
    optimizer, scheduler = make_optimizer(inner, cfg.optim, cfg.max_steps)
    ckpt_root = run_dir / "checkpoints"
    last = latest_checkpoint(ckpt_root) if resume is True else (resume or None)
    state = LoopState()
    if last is not None:
        state, rows = _resume(last, model, optimizer, scheduler)
        logger.resume_at(state.step, rows)
    eval_batches = [
        make_batches(eval_examples[i : i + 64], tokenizer.pad_token_id)
        for i in range(0, min(len(eval_examples), cfg.eval_examples), 64)
    ]
    eval_batches = [to_device(b, device) for b in eval_batches]
    batches = iterate_batches(len(train_examples), cfg.batch_size, cfg.seed, start=state.position)
    metrics: dict[str, float] = {}
    tokens, train_seconds = 0, 0.0  # target tokens trained on in this invocation, and the time it took
    model.train()
    with Progress(cfg.max_steps, desc, initial=state.step, disable=None if dist.is_main() else True) as bar:
        while state.step < cfg.max_steps:
            state.position, indices = next(batches)
            state.position += 1
            tic = time.perf_counter()
            out = train_step(model, optimizer, train_examples, indices, cfg, tokenizer.pad_token_id, device)
            train_seconds += time.perf_counter() - tic
            tokens += out["tokens"]
            scheduler.step()
            state.step += 1
            bar.update(1, loss=out["loss"])
            if state.step % cfg.log_every == 0:
                logger.log(
                    state.step,
                    {"loss": out["loss"], "grad_norm": out["grad_norm"], "lr": scheduler.get_last_lr()[0]},
                )
            done = state.step == cfg.max_steps
            if cfg.max_seconds is not None:  # rank 0's clock decides, so every rank stops at the same step
                done = dist.broadcast_object(done or logger.elapsed >= cfg.max_seconds)
            if done or (cfg.eval_every and state.step % cfg.eval_every == 0):
                metrics = _evaluate(model, eval_batches, evaluate)
                logger.log(state.step, metrics)
                bar.write(
                    f"{desc} step {state.step}: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())
                )
                if should_stop is not None and should_stop(metrics):
                    done = True
            if done or (cfg.save_every and state.step % cfg.save_every == 0):
                _save(ckpt_root, state, model, optimizer, scheduler, cfg, tokenizer, metrics_rows=logger.rows)
            if done:
                break
    return {**metrics, "steps": state.step, "train_tokens_per_second": tokens / max(train_seconds, 1e-9)}


def _evaluate(
    model: torch.nn.Module,
    eval_batches: list[dict[str, torch.Tensor]],
    evaluate: Callable[[torch.nn.Module], dict[str, float]] | None,
) -> dict[str, float]:
    """Held-out loss (and ``evaluate``): on rank 0, sent to the others, so every rank takes the same
    stop decision; an FSDP-sharded model needs every rank in each forward, so there all ranks compute."""
    inner = dist.unwrap(model)
    metrics: dict[str, float] = {}
    if dist.is_main() or dist.is_sharded(model):
        metrics = {"heldout_loss": heldout_loss(inner, eval_batches) if eval_batches else float("nan")}
        if evaluate is not None:
            with dist.gathered(model):  # generation reads whole weights
                metrics.update(evaluate(inner))
    return dist.broadcast_object(metrics)


def _resume(last: Path, model: torch.nn.Module, optimizer, scheduler) -> tuple[LoopState, int | None]:
    """Restore model, optimiser, schedule and this rank's RNG from checkpoint ``last`` (same world size);
    returns the loop state and the count of metrics rows written before the checkpoint (None if unknown)."""
    from safetensors.torch import load_file

    sharded = dist.is_sharded(model)
    modules = {} if sharded else {"model": dist.unwrap(model)}
    loaded = load_checkpoint(last, modules=modules, schedulers={"sched": scheduler}, restore_rng=False)
    if sharded:
        dist.load_model_state_dict(model, load_file(str(last / "model.safetensors")))
    saved = torch.load(last / STATE_FILE, map_location="cpu", weights_only=True)
    dist.load_optimizer_state_dict(model, optimizer, saved["optimizers"]["opt"])
    extra = loaded["extra"]
    ranks = extra.get("rng_ranks") or [loaded["rng"]]
    if len(ranks) != dist.world_size():
        raise ValueError(
            f"{last} was written by {len(ranks)} process(es); resume it with the same number "
            f"(the weights in model.safetensors load anywhere)"
        )
    set_rng_state(ranks[dist.rank()])
    state = LoopState(step=loaded["step"], position=int(extra["position"]), best=dict(extra.get("best", {})))
    return state, extra.get("metrics_rows")


def _save(
    root: Path,
    state: LoopState,
    model,
    optimizer,
    scheduler,
    cfg: TrainConfig,
    tokenizer: Any = None,
    hf_folder: bool = True,
    metrics_rows: int | None = None,
) -> None:
    """Checkpoint written by rank 0: full (gathered) weights as safetensors, so 1 process can load it,
    plus every rank's RNG state for an exact resume at the same world size. With the model's config and
    the tokenizer beside ``model.safetensors``, the folder is also a Hugging Face model folder
    (``from_pretrained(checkpoint)`` loads that step); ``hf_folder=False`` leaves them out (a model that
    is not a causal LM, e.g. the reward model)."""
    config = getattr(dist.unwrap(model), "config", None) if hf_folder else None

    def hf_files(folder: Path) -> None:
        if config is not None:
            config.save_pretrained(str(folder))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(folder))

    weights = dist.without_tied_copies(model, dist.model_state_dict(model))  # gathered when sharded
    opt_state = dist.optimizer_state_dict(model, optimizer)
    rng_ranks = dist.all_gather_object(get_rng_state())
    if dist.is_main():
        save_checkpoint(
            root,
            state.step,
            modules={"model": weights},
            optimizers={"opt": opt_state},
            schedulers={"sched": scheduler},
            extra={
                "position": state.position,
                "best": state.best,
                "rng_ranks": rng_ranks,
                "metrics_rows": metrics_rows,
            },
            keep_last=cfg.keep_last,
            write_files=hf_files,
        )
    dist.barrier()


def export_model(
    model: torch.nn.Module, tokenizer: Any, path: Path, state_dict: dict[str, torch.Tensor] | None = None
) -> Path:
    """``save_pretrained`` the model (safetensors) and tokenizer into ``path`` atomically
    (`postrl.runtime.checkpoint.write_dir_atomically`).

    ``state_dict``: the full weights when the model is sharded (see :func:`export_on_main`)."""

    def write(tmp: Path) -> None:
        dist.unwrap(model).save_pretrained(str(tmp), safe_serialization=True, state_dict=state_dict)
        tokenizer.save_pretrained(str(tmp))

    return write_dir_atomically(path, write)


def export_on_main(model: torch.nn.Module, tokenizer: Any, path: Path) -> None:
    """Called by every rank: gather a sharded model's weights, rank 0 writes ``path``, all wait for it."""
    state = dist.model_state_dict(model) if dist.is_sharded(model) else None
    if dist.is_main():
        export_model(model, tokenizer, path, state_dict=state)
    dist.barrier()


def check_train_length(model: Any, cfg: TrainConfig) -> None:
    """``train.max_length`` must fit the model's context: positions past it have no embedding."""
    from postrl.lm.models import check_context

    check_context(model, cfg.max_length, f"train.max_length ({cfg.max_length})")


def set_threads(threads: int | None) -> None:
    """Use ``threads`` intra-op threads (None: torch's default)."""
    if threads:
        torch.set_num_threads(threads)
