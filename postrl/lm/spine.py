"""The loop every LM trainer shares: steps, logging, evaluation cadence, time limit, checkpoints, resume.

An algorithm (pretraining and SFT, the reward model, PPO-RLHF, GRPO) is an object with

- ``name``: the progress bar's label;
- ``step(step) -> metrics``: one optimiser step or RL iteration, data fetching included;
- ``evaluate() -> metrics``: held-out evaluation (called on every rank; it gathers what it needs);
- ``parts() -> Parts``: the modules, optimisers, schedulers and plain-data state a checkpoint holds;
- ``load_extra(extra)``: its own state back from a checkpoint (the weights are loaded by the loop);
- optionally ``bar(metrics) -> dict`` (the progress bar's fields) and ``should_stop(evals) -> bool``.

A Python API caller's ``on_iteration(info)`` (`postrl.runtime.callbacks`) is called after every step, the last
one included; returning ``False`` ends the run there as a finished one (evaluated, checkpointed); raising
checkpoints that step and ends the run with a `UserError` naming the callback and the step.

:func:`train_loop` runs it for ``run.steps`` steps (or ``run.max_seconds`` of step time, rank 0's clock), logs
every ``run.log_every`` steps, evaluates every ``run.eval_every`` steps and at the end, and checkpoints every
``run.save_every`` steps and at the end. A checkpoint holds the full (gathered) weights as safetensors (with
``run.lora``: the trained adapters and heads only, `trained_state_dict`; the frozen base is the model's own), the
optimiser and schedule states, every rank's RNG state, the loop's counters, the algorithm's state and the
count of metrics rows written so far, so a resumed run continues bit for bit and its log equals an
uninterrupted run's (`postrl.runtime.rundir`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from postrl.lm.memory import MemoryConfig
from postrl.lm.step_in_backward import check_one_backward
from postrl.runtime import callbacks
from postrl.runtime import distributed as dist
from postrl.runtime.checkpoint import STATE_FILE, load_checkpoint, save_checkpoint
from postrl.runtime.errors import UserError
from postrl.runtime.logging import RunLogger, jsonable
from postrl.runtime.progress import Progress
from postrl.runtime.seeding import get_rng_state, set_rng_state


@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters (LoRA, Hu et al. 2021) through peft: train ΔW = (alpha/rank)·B·A beside each frozen
    target weight W instead of W itself (`postrl.lm.models.lora`). TRL's names: use_peft, lora_r, lora_alpha,
    lora_dropout, lora_target_modules; peft's: r, lora_alpha, lora_dropout, target_modules."""

    enabled: bool = False
    """Train adapters instead of every weight (needs peft: pip install 'postrl[lora]'); the reference model of
    PPO and GRPO is then the policy with its adapters disabled (no second copy in memory)."""
    rank: int = 16
    """r: the adapters' rank (TRL's default 16)."""
    alpha: float = 32.0
    """lora_alpha: ΔW is scaled by alpha / rank (TRL's default 32)."""
    dropout: float = 0.0
    """lora_dropout on the adapters' input (TRL: 0.05). PPO and GRPO need 0: their log-probs must not change
    between sampling and training."""
    target_modules: str | list[str] = "all-linear"
    """Modules that get adapters: all-linear (every Linear of the transformer blocks, not the output layer:
    QLoRA, Dettmers et al. 2023), a list of module names (e.g. [q_proj, v_proj], TRL's default through
    peft's per-architecture table) or one regular expression."""
    merge_on_export: bool = False
    """The exported RUN_DIR/model holds merged weights (W + ΔW: a plain model that transformers loads without
    peft) and the adapter goes to RUN_DIR/adapter; false: RUN_DIR/model is the adapter (a peft folder that
    names its base model). A reward model or critic is always exported merged."""

    CHECKS = {"rank": ">= 1", "alpha": "> 0", "dropout": "[0, 1)"}
    RENAMED = {"r": "rank", "lora_r": "rank", "lora_alpha": "alpha", "lora_dropout": "dropout"}
    RENAMED |= {"lora_target_modules": "target_modules", "use_peft": "enabled"}


@dataclass(frozen=True)
class RunConfig:
    """How long a run lasts, how often it logs, evaluates and checkpoints, and where it runs."""

    steps: int = 1000
    """Optimiser steps (RL: iterations, each sampling a batch and optimising on it)."""
    seed: int = 0
    """Seed of the data order, the sampling and everything random."""
    save_every: int = 200
    """Steps between checkpoints (0: only at the end)."""
    keep_last: int = 2
    """Checkpoints kept (0: all)."""
    log_every: int = 10
    """Steps between metrics.jsonl rows."""
    eval_every: int = 100
    """Steps between held-out evaluations (0: only at the end)."""
    max_seconds: float | None = None
    """Also stop after this many seconds of training steps (evaluation and checkpoints excluded); null: no
    time limit."""
    device: str = "auto"
    """cpu, cuda, cuda:1, mps, or auto."""
    dtype: str = "float32"
    """Weights dtype: float32, bfloat16 or float16."""
    threads: int | None = None
    """torch intra-op threads (null: torch's default)."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """Under torchrun: ddp (replicate the model) or fsdp (shard parameters, gradients and optimiser state
    with FSDP2, for models one device cannot hold). No effect in one process."""
    tensorboard: bool = False
    """Also write TensorBoard event files."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Low-rank adapters instead of full fine-tuning (off by default)."""
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    """What the run keeps in memory: chunked log-probs, activation checkpointing (postrl.lm.memory)."""

    CHECKS = {  # valid ranges (postrl.runtime.config.validate)
        "steps": ">= 1",
        "seed": ">= 0",
        "save_every": ">= 0",
        "keep_last": ">= 0",
        "log_every": ">= 1",
        "eval_every": ">= 0",
        "max_seconds": "> 0",
        "threads": ">= 1",
    }


# The keys every LM stage's run section took over (their old names, for RENAMED tables).
RUN_KEYS = ("seed", "save_every", "keep_last", "log_every", "eval_every", "max_seconds", "device", "dtype")
RUN_KEYS += ("threads", "parallel", "tensorboard", "lora")


@dataclass
class Parts:
    """What a checkpoint holds besides the loop's counters. ``modules[k]`` is trained by ``optimizers[k]``
    (same key; a module may be DDP/FSDP-wrapped: its full weights are gathered for the file)."""

    modules: dict[str, torch.nn.Module]
    optimizers: dict[str, torch.optim.Optimizer]
    schedulers: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    write_files: Callable[[Path], None] | None = None
    """Adds files to the checkpoint folder (e.g. the model's config and tokenizer: a loadable HF folder)."""


class Algorithm(Protocol):
    name: str

    def step(self, step: int) -> dict[str, float]: ...

    def evaluate(self) -> dict[str, float]: ...

    def parts(self) -> Parts: ...

    def load_extra(self, extra: dict[str, Any]) -> None: ...


@dataclass
class LoopState:
    """The loop's counters (saved with every checkpoint)."""

    step: int = 0
    train_seconds: float = 0.0
    start_eval: dict[str, float] = field(default_factory=dict)
    last_eval: dict[str, float] = field(default_factory=dict)
    last_metrics: dict[str, float] = field(default_factory=dict)


def accumulate(
    models: Sequence[torch.nn.Module], micro_batches: Sequence[Any], loss: Callable[[Any], torch.Tensor]
) -> float:
    """Gradient accumulation, the one place postrl does it: backward ``loss(mb)`` for each micro-batch, with
    the gradient all-reduce (DDP) or reduce-scatter (FSDP2) of ``models`` only in the last backward.

    ``loss(mb)`` must already be the micro-batch's share of the step's loss: its sum over the micro-batch
    divided by the step's count over every micro-batch and rank (tokens, responses or pairs), so that the
    accumulated gradient is exactly that of the whole step's batch. Returns Σ of the losses."""
    check_one_backward(models, len(micro_batches))
    total = torch.zeros((), dtype=torch.float64)
    for k, mb in enumerate(micro_batches):
        with contextlib.ExitStack() as stack:
            if k < len(micro_batches) - 1:
                for model in models:
                    stack.enter_context(dist.no_grad_sync(model))
            value = loss(mb)
            value.backward()
        # summed on the loss's device in float64 (the sum a Python float would make): one host sync per step,
        # not one per micro-batch, so a GPU is never left idle waiting for the next forward to be queued
        total = total.to(value.device) + value.detach().double()
    return float(total)


def frozen_base(module: torch.nn.Module) -> bool:
    """Whether ``module`` trains LoRA adapters on a frozen base (peft's ``lora_`` parameters,
    `postrl.lm.models.lora`): its checkpoint then holds only the trained tensors (adapters, heads); the frozen
    ones are read again from the model the run starts from, which a resume loads the same way. (Other
    partly frozen models, e.g. a VLM with its vision tower frozen, keep full checkpoints.)"""
    return any(".lora_" in name for name, _ in dist.unwrap(module).named_parameters())


def trained_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trained tensors of ``module`` by their state-dict names (all of them unless `frozen_base`)."""
    inner = dist.unwrap(module)
    if not frozen_base(inner):  # gathered when sharded (a collective); tied copies under their first name
        return dist.without_tied_copies(module, dist.model_state_dict(module))
    names = {n for n, p in inner.named_parameters() if p.requires_grad}
    return {k: v.detach() for k, v in inner.state_dict(keep_vars=True).items() if k in names}


def load_trained(module: torch.nn.Module, file: Path) -> None:
    """Load the trained tensors `trained_state_dict` wrote into ``file`` back into a `frozen_base` module;
    every trained tensor must be there and nothing else."""
    from safetensors.torch import load_file

    inner = dist.unwrap(module)
    tensors = load_file(str(file), device=str(next(inner.parameters()).device))
    want = {n for n, p in inner.named_parameters() if p.requires_grad}
    if set(tensors) != want:
        odd = sorted(set(tensors) ^ want)[:3]
        raise ValueError(
            f"{file}: its tensors are not this model's trained ones (e.g. {odd}); same run.lora?"
        )
    inner.load_state_dict(tensors, strict=False)


def save(run_dir: Path, algo: Algorithm, state: LoopState, keep_last: int, metrics_rows: int) -> None:
    """Checkpoint ``run_dir/checkpoints/step_N`` (a collective: every rank calls it, rank 0 writes)."""
    parts = algo.parts()
    # full weights (gathered when sharded: a collective), tied copies under their first name only, as
    # save_pretrained writes them: a checkpoint folder is also a model folder from_pretrained loads (with
    # LoRA: the adapters and heads only, see trained_state_dict)
    saved = {
        k: (trained_state_dict(m), dist.optimizer_state_dict(m, parts.optimizers[k]))
        for k, m in parts.modules.items()
    }
    rng_ranks = dist.all_gather_object(get_rng_state())
    if dist.is_main():
        loop = {"step": state.step, "train_seconds": state.train_seconds, "start_eval": state.start_eval}
        loop |= {"last_eval": state.last_eval, "last_metrics": _numbers(state.last_metrics)}
        save_checkpoint(
            run_dir / "checkpoints",
            state.step,
            modules={k: weights for k, (weights, _) in saved.items()},
            optimizers={k: opt for k, (_, opt) in saved.items()},
            schedulers=parts.schedulers,
            extra={
                "loop": loop,
                "algorithm": parts.extra,
                "rng_ranks": rng_ranks,
                "metrics_rows": metrics_rows,
            },
            keep_last=keep_last,
            write_files=parts.write_files,
        )
    dist.barrier()


def restore(path: Path, algo: Algorithm) -> tuple[LoopState, int | None]:
    """Load checkpoint ``path`` into the algorithm (same world size); returns the loop's counters and the
    count of metrics rows written before it."""
    parts = algo.parts()
    sharded = any(dist.is_sharded(m) for m in parts.modules.values())
    modules = {} if sharded else {k: dist.unwrap(m) for k, m in parts.modules.items()}
    adapted = {k: modules.pop(k) for k in list(modules) if frozen_base(modules[k])}
    loaded = load_checkpoint(path, modules=modules, schedulers=parts.schedulers, restore_rng=False)
    for k, module in adapted.items():
        load_trained(module, path / f"{k}.safetensors")
    if sharded:
        for k, module in parts.modules.items():
            dist.load_sharded(path, module, parts.optimizers[k], k, k)
    else:
        saved = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
        for k, opt in parts.optimizers.items():
            dist.load_optimizer_state_dict(parts.modules[k], opt, saved["optimizers"][k])
    extra = loaded["extra"]
    ranks = extra["rng_ranks"]
    if len(ranks) != dist.world_size():
        raise ValueError(
            f"{path} was written by {len(ranks)} process(es); resume it with the same number "
            "(the weights in its safetensors files load anywhere)"
        )
    set_rng_state(ranks[dist.rank()])
    algo.load_extra(dict(extra["algorithm"]))
    loop = extra["loop"]
    state = LoopState(
        int(loop["step"]),
        float(loop["train_seconds"]),
        dict(loop["start_eval"]),
        dict(loop["last_eval"]),
        dict(loop.get("last_metrics", {})),  # the last step's numbers: a summary that reports them has them
    )
    return state, extra.get("metrics_rows")


def _numbers(metrics: dict[str, Any]) -> dict[str, float | int]:
    """The plain numbers of a step's metrics (what a checkpoint keeps of them), as metrics.jsonl has them."""
    plain = jsonable(metrics)
    return {k: v for k, v in plain.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _log_eval(algo: Algorithm, state: LoopState, logger: RunLogger, bar: Progress) -> dict[str, float]:
    evals = algo.evaluate()
    logger.log(state.step, evals)
    bar.write(f"{algo.name} step {state.step}: " + ", ".join(f"{k} {v:.4g}" for k, v in evals.items()))
    return evals


def _on_iteration(state: LoopState, metrics: dict[str, Any], run_dir: Path) -> tuple[bool, str | None]:
    """The Python API's on_iteration after every step, the last one included (`callbacks.poll`): rank 0 calls
    it and its ``(stop, error)`` is every rank's."""
    if not callbacks.active():
        return False, None
    info = {"step": state.step, "iteration": state.step, "metrics": metrics, "run_dir": str(run_dir)}
    answer = callbacks.poll(info) if dist.is_main() else (False, None)
    stop, error = dist.broadcast_object(answer)
    return bool(stop) and error is None, error


def train_loop(
    algo: Algorithm,
    run: RunConfig,
    run_dir: Path,
    logger: RunLogger,
    checkpoint: Path | None = None,
    *,
    eval_at_start: bool = False,
) -> LoopState:
    """Run ``algo`` from ``checkpoint`` (None: step 0) to ``run.steps`` steps; returns the loop's state."""
    state = LoopState()
    if checkpoint is not None:
        state, rows = restore(checkpoint, algo)
        logger.resume_at(state.step, rows)
    fields = getattr(algo, "bar", lambda metrics: {})
    should_stop = getattr(algo, "should_stop", lambda evals: False)
    with Progress(run.steps, algo.name, initial=state.step, disable=None if dist.is_main() else True) as bar:
        if eval_at_start and state.step == 0:
            state.start_eval = state.last_eval = _log_eval(algo, state, logger, bar)
        while state.step < run.steps:
            tic = time.perf_counter()
            metrics = algo.step(state.step)
            state.train_seconds += time.perf_counter() - tic
            state.step += 1
            state.last_metrics = metrics
            bar.update(1, **fields(metrics))
            if state.step % run.log_every == 0:
                logger.log(state.step, metrics)
            done = state.step == run.steps
            if run.max_seconds is not None:  # rank 0's clock decides, so every rank stops at the same step
                done = dist.broadcast_object(done or state.train_seconds >= run.max_seconds)
            stop, error = _on_iteration(state, metrics, run_dir)
            done = done or stop
            if done or (run.eval_every and state.step % run.eval_every == 0):
                state.last_eval = _log_eval(algo, state, logger, bar)
                done = done or bool(dist.broadcast_object(should_stop(state.last_eval)))
            if done or error or (run.save_every and state.step % run.save_every == 0):
                save(run_dir, algo, state, run.keep_last, logger.rows)
            if error is not None:  # the user's callback raised: this step is checkpointed (resumable)
                raise UserError(error)
            if done:
                break
    return state
