"""`postrl grpo`: Group Relative Policy Optimization (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

No critic: each prompt gets a group of G sampled responses and the group's own rewards are the baseline,
A_i = (r_i − mean_g r) / (std_g r + ε) (or without the std: Dr. GRPO, Liu et al. 2025, arXiv:2503.20783).
One step:

    B prompts ──generate(π_old) × G──▶ Rollout [B·G, P+T] + log π_old ──reward fns──▶ r [B·G]
      ──core.group_advantages──▶ A [B·G]   (+ log π_ref from the frozen reference when β > 0)
      ──μ passes × minibatches × micro-batches: core.grpo_loss (clip ε / ε_high, β·k3)──▶ AdamW steps

Old log-probs. π_old is the policy that sampled, so the sampling log-probs recorded by the rollout engine are
log π_old and no extra forward is needed. That is what μ = 1 uses (the ratio is then 1 up to float rounding of
the decode path, so the clip fraction is 0 and the loss value is ≈ 0 while its gradient is not). With μ > 1
the batch is re-scored teacher-forced once before the first update, so the ratio measures the policy's change
only, not the small numeric difference between the decode and the training forward.

Distributed (torchrun): every rank draws the same global prompts and takes its share of whole groups (so group
statistics are exact), samples them with its own generator, the loss normaliser is the global count
(all-reduce), gradients are averaged by DDP and only rank 0 writes. With ``parallel: fsdp`` the policy (and
reference) are sharded (FSDP2): sampling and scoring run inside `dist.gathered` (whole weights on every rank),
the training forward through FSDP. On the same global batch, N ranks take the same update as 1 process
(tests/dist); with minibatches > 1 too when each rank's rows are a multiple of them.
Options from DAPO (Yu et al. 2025, arXiv:2503.14476): clip-higher (``clip_eps_high``), token-level loss
(``loss_type: token``), dynamic sampling and the soft overlong penalty.

This file: the batch → loss, the optimisation, evaluation and the loop. The configs are in `grpo_config.py`;
the prompt stream, sampling, rewards and the batch (`collect`) in `grpo_rollouts.py`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from postrl.core import entropy_from_logits, grpo_loss, masked_mean
from postrl.lm.grpo_config import GRPOConfig, GRPOLossConfig
from postrl.lm.grpo_rollouts import (
    Batch,
    PromptStream,
    Run,
    _accuracy,
    _generator,
    _load_prompts,
    _rewards,
    _sample,
    collect,
)
from postrl.lm.grpo_rollouts import overlong_penalty as overlong_penalty
from postrl.lm.models import check_context, load_causal_lm, resolve_dtype
from postrl.lm.rewards import combine, load_reward_fns
from postrl.lm.rollout import token_log_probs as _token_log_probs
from postrl.lm.shared_prefix import response_logits
from postrl.lm.trainer import OptimConfig as OptimConfig
from postrl.lm.trainer import _clip, _nullcontext, export_on_main, make_optimizer, set_threads
from postrl.runtime import distributed as dist
from postrl.runtime.checkpoint import load_checkpoint, save_checkpoint
from postrl.runtime.config import validate
from postrl.runtime.errors import UserError
from postrl.runtime.logging import RunLogger, read_jsonl
from postrl.runtime.progress import Progress
from postrl.runtime.rundir import open_run
from postrl.runtime.seeding import seed_everything

log = logging.getLogger(__name__)
MU_ONE_NOTE = (
    "grpo: mu=1, so the policy ratio is 1 at every token (each batch is used for one pass): clip_fraction "
    "is 0 and the loss value is ~0 (group advantages have zero mean). This is expected; the gradient is not 0."
)


# ---- the batch's loss -----------------------------------------------------------------------------------
def policy_log_probs(
    model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, prompt_len: int, temperature: float
) -> tuple[Tensor, Tensor]:
    """One teacher-forced forward → (log π_τ of the response tokens [b, T], entropy per token [b, T] detached).
    A group's shared prompt runs once (`postrl.lm.shared_prefix`)."""
    logits = response_logits(model, input_ids, attention_mask, prompt_len).float() / temperature  # (b, T, V)
    mask = attention_mask[:, prompt_len:].to(logits.dtype)
    log_probs = _token_log_probs(logits, input_ids[:, prompt_len:]) * mask
    with torch.no_grad():
        entropy = entropy_from_logits(logits) * mask
    return log_probs, entropy


def grpo_batch_loss(
    model: torch.nn.Module,
    batch: Batch,
    cfg: GRPOLossConfig,
    temperature: float,
    max_len: int,
    normalizer: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The GRPO loss of ``batch`` under ``model`` and its stats (clip fraction, k3 KL, ratio, entropy).

    ``normalizer``: the global count of the whole minibatch (`loss_normalizer`), so that micro-batch losses sum
    to the minibatch loss; None normalises by this batch alone.
    """
    log_probs, entropy = policy_log_probs(
        model, batch.input_ids, batch.attention_mask, batch.prompt_len, temperature
    )
    loss, stats = grpo_loss(
        log_probs,
        batch.old_log_probs,
        batch.ref_log_probs,
        batch.advantages,
        batch.response_mask,
        cfg.clip_eps,
        cfg.beta,
        cfg.loss_type,
        clip_eps_high=cfg.clip_eps_high,
        max_len=max_len,
        normalizer=normalizer,
        unbiased_kl=cfg.unbiased_kl,
    )
    return loss, {**stats, "entropy": masked_mean(entropy, batch.response_mask)}


def loss_normalizer(response_mask: Tensor, loss_type: str, max_len: int) -> float:
    """The global denominator of `grpo_loss` for a minibatch: responses, tokens, or responses · max_len."""
    local = {
        "grpo": response_mask.shape[0],
        "token": int(response_mask.sum()),
        "dr_grpo": response_mask.shape[0] * max_len,
    }[loss_type]
    return float(dist.all_reduce_sum(torch.tensor(float(local))).item())


def backward_minibatch(
    model: torch.nn.Module, batch: Batch, cfg: GRPOLossConfig, temperature: float, max_len: int
) -> dict[str, float]:
    """Accumulate the minibatch's gradient over micro-batches (exactly the full-batch gradient); token-weighted
    mean stats."""
    n = batch.input_ids.shape[0]
    size = cfg.micro_batch_size or n
    normalizer = loss_normalizer(batch.response_mask, cfg.loss_type, max_len)
    scale = dist.world_size()  # DDP / FSDP average gradients over ranks; the normaliser is already global
    starts = list(range(0, n, size))
    totals: dict[str, float] = {}
    tokens = 0
    for k, start in enumerate(starts):
        micro = batch.rows(slice(start, start + size))
        # gradients are averaged over ranks (DDP all-reduce / FSDP reduce-scatter) once, at the last micro-batch
        with dist.no_grad_sync(model) if k < len(starts) - 1 else _nullcontext():
            loss, stats = grpo_batch_loss(model, micro, cfg, temperature, max_len, normalizer)
            (loss * scale).backward()
        count = int(micro.response_mask.sum())
        tokens += count
        # × world: the rank average of this (reduce_metrics) is then the global loss, the sum over ranks
        totals["loss"] = totals.get("loss", 0.0) + float(loss.detach()) * scale
        for key, value in stats.items():
            totals[key] = totals.get(key, 0.0) + float(value) * count
    return {k: v if k == "loss" else v / max(1, tokens) for k, v in totals.items()}


def optimise(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    cfg: GRPOLossConfig,
    temperature: float,
    max_len: int,
    max_grad_norm: float | None,
) -> dict[str, float]:
    """μ passes over ``batch``, ``minibatches`` optimiser steps each; returns the stats averaged over steps."""
    n = batch.input_ids.shape[0]
    m = min(cfg.minibatches, n)
    history: list[dict[str, float]] = []
    for _ in range(cfg.mu):
        for k in range(m):
            # minibatch k: every m-th row from row k. Rank r's row i is global row r·n + i, so when m divides
            # n this is the same split of the global batch at any number of ranks (contiguous cuts are not)
            rows = torch.arange(k, n, m, device=batch.input_ids.device)
            stats = backward_minibatch(model, batch.rows(rows), cfg, temperature, max_len)
            stats["grad_norm"] = _clip(model, max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            history.append(stats)
    return {k: sum(h[k] for h in history) / len(history) for k in history[0]}


def grpo_step(
    run: Run, optimizer: torch.optim.Optimizer, stream: PromptStream, step: int
) -> dict[str, float]:
    """One GRPO step: collect a batch, μ passes of the clipped objective; metrics averaged over ranks."""
    start = time.perf_counter()
    batch, metrics = collect(run, stream, step)
    middle = time.perf_counter()
    stats = optimise(
        run.policy,
        optimizer,
        batch,
        run.cfg.grpo,
        run.cfg.sampling.temperature,
        run.cfg.sampling.max_new_tokens,
        run.cfg.optim.max_grad_norm,
    )
    metrics.update(stats)
    metrics["time_train"] = time.perf_counter() - middle
    metrics["time_step"] = time.perf_counter() - start
    metrics["tokens_per_second"] = metrics["generated_tokens"] / metrics["time_step"]
    return dist.reduce_metrics(metrics)


# ---- evaluation ---------------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(run: Run, batch_size: int = 256) -> dict[str, float]:
    """Held-out greedy and sampled (pass@1, one sample per prompt at the training temperature) reward, and
    accuracy where a verifier exists. Every rank evaluates the same prompts (only rank 0 logs)."""
    n = len(run.heldout.rows)
    out: dict[str, float] = {}
    if n == 0:
        return out
    modes = {"": replace(run.cfg.sampling, greedy=True), "_sampled": replace(run.cfg.sampling, greedy=False)}
    for suffix, sampling in modes.items():
        rewards, accuracy = [], []
        for start in range(0, n, batch_size):
            indices = list(range(start, min(n, start + batch_size)))
            gen = _generator(run, "eval", start)
            _, rows, texts = _sample(run, run.heldout, indices, 1, sampling, gen)
            terms = _rewards(run, rows, texts)
            rewards.append(combine(run.fns, terms))
            acc = _accuracy(run, terms)
            if acc is not None:
                accuracy.append(acc)
        out[f"heldout_reward{suffix}"] = float(torch.cat(rewards).mean())
        if accuracy:
            out[f"heldout_accuracy{suffix}"] = float(torch.cat(accuracy).mean())
    return out


# ---- the loop -----------------------------------------------------------------------------------------------
@dataclass
class GRPOState:
    """What a checkpoint restores besides the weights and optimiser."""

    step: int = 0
    position: int = 0
    train_seconds: float = 0.0
    generated_tokens: float = 0.0
    start_eval: dict[str, float] = field(default_factory=dict)


def _check_config(cfg: GRPOConfig, world: int) -> None:
    g = cfg.grpo
    problems = {
        f"grpo.group_size must be >= 2 (a group of {g.group_size} has no baseline)": g.group_size < 2,
        f"grpo.prompts_per_step={g.prompts_per_step} must be a positive multiple of the {world} ranks": (
            g.prompts_per_step < world or g.prompts_per_step % world != 0
        ),
        "grpo.mu and grpo.minibatches must be >= 1": g.mu < 1 or g.minibatches < 1,
        "sampling.greedy must be false for training (a group would be G copies)": cfg.sampling.greedy,
        "grpo.overlong_buffer must be within [0, sampling.max_new_tokens]": not (
            0 <= g.overlong_buffer <= cfg.sampling.max_new_tokens
        ),
        f"parallel must be one of {dist.PARALLEL}, got '{cfg.parallel}'": cfg.parallel not in dist.PARALLEL,
    }
    bad = [message for message, failed in problems.items() if failed]
    if bad:
        raise UserError("; ".join(bad))


def _reward_fns(cfg: GRPOConfig, rows: list[dict[str, Any]], device: torch.device) -> list:
    """The reward functions of ``cfg.rewards`` (default: the built-in task's), signature-checked against the
    data's columns, with the verifier marked."""
    specs = list(cfg.rewards)
    if not specs:
        if not cfg.data.startswith("task:"):
            raise UserError(
                f"no reward function: set rewards (e.g. rewards=[my_module:fn]) for data {cfg.data}"
            )
        specs = [cfg.data]
    columns = sorted({k for r in rows for k in r} - {"prompt"})
    fns = load_reward_fns(specs, cfg.reward_weights, task_kwargs=cfg.task, device=device, columns=columns)
    if cfg.verifier is not None:
        if cfg.verifier not in specs:
            raise UserError(f"verifier {cfg.verifier!r} is not one of the rewards {specs}")
        fns = [replace(f, is_verifier=f.name == cfg.verifier) for f in fns]
    return fns


def _build_run(cfg: GRPOConfig, info: dist.DistInfo) -> Run:
    """Load and check everything a run needs (models, tokenizer, prompts, reward functions)."""
    from postrl.lm.tokenizer import load_tokenizer

    load = {
        "dtype": resolve_dtype(cfg.dtype),
        "device": info.device,
        "trust_remote_code": cfg.trust_remote_code,
    }
    policy = load_causal_lm(cfg.model, **load)
    p, t = cfg.max_prompt_length, cfg.sampling.max_new_tokens
    check_context(policy, p + t, f"max_prompt_length ({p}) + sampling.max_new_tokens ({t})")
    tokenizer = load_tokenizer(cfg.tokenizer or cfg.model, trust_remote_code=cfg.trust_remote_code)
    train, heldout = _load_prompts(cfg, tokenizer)
    if len(train.rows) < cfg.grpo.prompts_per_step and not cfg.grpo.repeat_prompts:
        raise UserError(
            f"{cfg.data}: {len(train.rows)} prompts for grpo.prompts_per_step={cfg.grpo.prompts_per_step}; "
            "lower it or set grpo.repeat_prompts=true"
        )
    fns = _reward_fns(cfg, train.rows, info.device)
    ref = None
    if cfg.grpo.beta != 0:  # β = 0: no reference model is loaded at all
        what = "ref_model" if cfg.ref_model else "model"
        ref = load_causal_lm(cfg.ref_model or cfg.model, **load, what=what).eval().requires_grad_(False)
        if cfg.parallel == "fsdp":  # sharded at rest too; scoring gathers it (grpo_rollouts.collect)
            ref = dist.wrap_model(ref, info, "fsdp")
    policy = dist.wrap_model(policy, info, cfg.parallel)
    return Run(cfg, policy, ref, tokenizer, fns, train, heldout, info.device)


def _save(run_dir: Path, run: Run, optimizer, scheduler, state: GRPOState, metrics_rows: int) -> None:
    weights, opt_state = dist.saved_state(run.policy, optimizer)  # gathered on rank 0 under fsdp
    if dist.is_main():
        save_checkpoint(
            run_dir / "checkpoints",
            state.step,
            modules={"policy": weights},
            optimizers={"opt": opt_state},
            schedulers={"sched": scheduler},
            extra={
                "position": state.position,
                "train_seconds": state.train_seconds,
                "generated_tokens": state.generated_tokens,
                "start_eval": state.start_eval,
                "metrics_rows": metrics_rows,
            },
            keep_last=run.cfg.keep_last,
        )
    dist.barrier()


def _restore(last: Path, run: Run, optimizer, scheduler, logger: RunLogger) -> GRPOState:
    """The state of checkpoint ``last``; metrics.jsonl is cut back to what it held then."""
    sharded = dist.is_sharded(run.policy)
    loaded = load_checkpoint(
        last,
        modules={} if sharded else {"policy": run.inner},
        optimizers={} if sharded else {"opt": optimizer},
        schedulers={"sched": scheduler},
    )
    if sharded:
        dist.load_sharded(last, run.policy, optimizer, "policy", "opt")
    extra = loaded["extra"]
    logger.resume_at(loaded["step"], extra.get("metrics_rows"))
    return GRPOState(
        loaded["step"],
        int(extra["position"]),
        float(extra["train_seconds"]),
        float(extra["generated_tokens"]),
        dict(extra.get("start_eval", {})),
    )


def _loop(run: Run, optimizer, scheduler, state: GRPOState, logger: RunLogger, run_dir: Path) -> dict:
    cfg = run.cfg
    stream = PromptStream(len(run.train.rows), cfg.seed, state.position)
    evals: dict[str, float] = {}
    if cfg.eval_at_start and state.step == 0:
        evals = state.start_eval = evaluate(run)
        logger.log(0, evals)
    metrics: dict[str, float] = {}
    with Progress(cfg.max_steps, "grpo", initial=state.step, disable=None if dist.is_main() else True) as bar:
        if cfg.grpo.mu == 1 and dist.is_main():
            log.info(MU_ONE_NOTE)
            bar.write(MU_ONE_NOTE)
        while state.step < cfg.max_steps:
            start = time.perf_counter()
            metrics = grpo_step(run, optimizer, stream, state.step)
            metrics["lr"] = scheduler.get_last_lr()[0]
            scheduler.step()
            state.step, state.position = state.step + 1, stream.position
            state.train_seconds += time.perf_counter() - start
            state.generated_tokens += metrics["generated_tokens"] * dist.world_size()
            bar.update(1, reward=metrics["reward_mean"], kl=metrics["kl"])
            if state.step % cfg.log_every == 0:
                logger.log(state.step, metrics)
            done = state.step == cfg.max_steps or (
                cfg.max_seconds is not None and state.train_seconds >= cfg.max_seconds
            )
            if cfg.max_seconds is not None:  # rank 0's clock decides: every rank stops at the same step
                done = dist.broadcast_object(done)
            if done or (cfg.eval_every and state.step % cfg.eval_every == 0):
                evals = evaluate(run)
                logger.log(state.step, evals)
                bar.write(f"grpo step {state.step}: " + ", ".join(f"{k} {v:.4g}" for k, v in evals.items()))
            if done or (cfg.save_every and state.step % cfg.save_every == 0):
                _save(run_dir, run, optimizer, scheduler, state, logger.rows)
            if done:
                break
    return {"metrics": metrics, "evals": evals}


def _summary(run: Run, state: GRPOState, result: dict) -> dict[str, Any]:
    evals, metrics = result["evals"], result["metrics"]
    start = {f"{k}_start": v for k, v in state.start_eval.items()}
    return {
        "heldout_accuracy": evals.get("heldout_accuracy"),
        **evals,
        **start,
        "kl_to_ref": metrics.get("kl") if run.ref is not None else None,
        "reward_mean": metrics.get("reward_mean"),
        "steps": state.step,
        "train_seconds": round(state.train_seconds, 3),
        "seconds_per_step": state.train_seconds / max(1, state.step),
        "tokens_per_second": state.generated_tokens / max(1e-9, state.train_seconds),
    }


def plot_run(run_dir: Path) -> Path | None:
    """``RUN_DIR/curves.png``: reward, held-out accuracy (greedy and sampled), KL, entropy, length."""
    from postrl.runtime.plots import plot_curves

    keys = [
        "reward_mean",
        "heldout_accuracy",
        "heldout_accuracy_sampled",
        "heldout_reward",
        "kl",
        "entropy",
        "completion_length_mean",
    ]
    rows = read_jsonl(run_dir / "metrics.jsonl")
    return plot_curves(rows, keys, run_dir / "curves.png", title="GRPO")


def run_grpo(
    cfg: GRPOConfig, run_dir: str | Path, resume: bool = False, overwrite: bool = False
) -> dict[str, Any]:
    """Train with GRPO, export ``RUN_DIR/model`` (HF format), write the run folder, return the summary.
    Models, prompts and reward functions are loaded and checked before the run folder is touched."""
    run_dir = Path(run_dir)
    validate(cfg)
    info = dist.init_distributed(cfg.device)
    _check_config(cfg, info.world_size)
    set_threads(cfg.threads)
    seed_everything(cfg.seed, info.rank)
    run = _build_run(cfg, info)
    logger, ckpt = open_run(run_dir, cfg, resume=resume, overwrite=overwrite, tensorboard=cfg.tensorboard)
    optimizer, scheduler = make_optimizer(run.inner, cfg.optim, cfg.max_steps)
    state = GRPOState() if ckpt is None else _restore(ckpt, run, optimizer, scheduler, logger)
    result = _loop(run, optimizer, scheduler, state, logger, run_dir)
    export_on_main(run.policy, run.tokenizer, run_dir / "model")
    if info.is_main:
        plot_run(run_dir)
    return logger.finish(_summary(run, state, result))
