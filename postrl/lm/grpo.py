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
(all-reduce), gradients are averaged by DDP and only rank 0 writes. On the same global batch, N ranks take the
same update as 1 process (tests/dist); with minibatches > 1 too when each rank's rows are a multiple of them.
Options from DAPO (Yu et al. 2025, arXiv:2503.14476): clip-higher (``clip_eps_high``), token-level loss
(``loss_type: token``), dynamic sampling and the soft overlong penalty.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from postrl.core import entropy_from_logits, group_advantages, grpo_loss, masked_mean
from postrl.lm.models import load_causal_lm, position_ids_from_mask, resolve_dtype
from postrl.lm.rewards import RewardFunction, combine, load_reward_fns, reward_terms
from postrl.lm.rollout import Rollout, RolloutEngine, SamplingConfig, generate, left_pad, score
from postrl.lm.rollout import token_log_probs as _token_log_probs
from postrl.lm.tasks.base import stable_hash
from postrl.lm.trainer import OptimConfig, _clip, _nullcontext, export_model, make_optimizer, set_threads
from postrl.runtime import distributed as dist
from postrl.runtime.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from postrl.runtime.errors import UserError
from postrl.runtime.logging import RunLogger, read_jsonl
from postrl.runtime.progress import Progress
from postrl.runtime.seeding import seed_everything

log = logging.getLogger(__name__)
MU_ONE_NOTE = (
    "grpo: mu=1, so the policy ratio is 1 at every token (each batch is used for one pass): clip_fraction "
    "is 0 and the loss value is ~0 (group advantages have zero mean). This is expected; the gradient is not 0."
)


@dataclass(frozen=True)
class GRPOLossConfig:
    """Groups, advantages, the clipped objective and its aggregation."""

    group_size: int = 8
    """G: responses sampled per prompt."""
    prompts_per_step: int = 32
    """B: prompts per step (over all ranks); a step trains on B·G responses."""
    mu: int = 1
    """μ: optimisation passes over each batch (TRL's num_iterations)."""
    minibatches: int = 1
    """Optimiser steps per pass, each on an equal share of the batch."""
    micro_batch_size: int = 0
    """Responses per forward/backward (gradient accumulation; 0: the whole minibatch). Never changes the
    gradient: every micro-batch's loss is divided by the minibatch's global count."""
    clip_eps: float = 0.2
    """ε: the ratio is clipped to [1 − ε, 1 + ε_high]."""
    clip_eps_high: float | None = None
    """ε_high (DAPO clip-higher, e.g. 0.28); null: ε."""
    beta: float = 0.04
    """β: coefficient of the k3 KL to the frozen reference; 0 loads no reference model."""
    loss_type: Literal["grpo", "token", "dr_grpo"] = "grpo"
    """grpo: mean over each response's tokens, then over responses (DeepSeekMath); token: mean over all
    tokens (DAPO); dr_grpo: sum / (responses · max_new_tokens) (Dr. GRPO)."""
    scale_rewards: bool = True
    """Divide advantages by the group's reward std (false: Dr. GRPO)."""
    adv_eps: float = 1e-4
    """ε added to the group std."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal and refill with new prompts."""
    max_refills: int = 4
    """Most refill rounds per step; a batch still short is topped up with dropped groups (zero gradient)."""
    overlong_buffer: int = 0
    """DAPO soft overlong penalty: the last this many tokens before max_new_tokens cost up to
    overlong_penalty, linearly (0: off)."""
    overlong_penalty: float = 1.0
    """Penalty at max_new_tokens when overlong_buffer > 0."""
    repeat_prompts: bool = False
    """Allow a prompt to appear twice in one step (needed when the data has fewer than B prompts)."""


@dataclass(frozen=True)
class GRPOConfig:
    """`postrl grpo --model SFT_MODEL --data FILE_OR_TASK --out RUN_DIR`."""

    model: str = "runs/sft/model"
    """Policy to start from (and the reference): a Hugging Face causal LM folder, or a hub name when online."""
    tokenizer: str | None = None
    """Tokenizer folder or name (default: the model's)."""
    ref_model: str | None = None
    """Frozen reference for the KL (default: the starting model); not loaded when grpo.beta is 0."""
    data: str = "task:arithmetic"
    """Prompt rows: a JSONL/JSON/Parquet file, task:NAME (built-in), or a `datasets` name. Every column is
    passed to the reward functions."""
    task: dict[str, Any] = field(default_factory=dict)
    """Options of a built-in task, for the data and the task: rewards (e.g. {digits: 3})."""
    eval_data: str | None = None
    """Held-out prompt rows (default: the test split of a built-in task, else the last 5% of the data)."""
    rewards: list[str] = field(default_factory=list)
    """Reward functions: task:NAME, module:function (or file.py:function), rm:PATH; empty: the built-in
    task's reward when data is task:NAME."""
    reward_weights: list[float] | None = None
    """Weight of each reward function (default: all 1; 0 keeps a function as a metric only)."""
    verifier: str | None = None
    """The reward spec (one of rewards) that checks correctness (0/1): its mean is logged as accuracy.
    Default: the task: reward of a built-in task with answers."""
    max_prompt_length: int = 256
    """Longest prompt in tokens; see overlong_prompts."""
    overlong_prompts: str = "drop"
    """Longer prompts are dropped, truncated (from the left) or refused (error); always reported."""
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(max_new_tokens=16))
    """How responses are sampled (the temperature also defines the optimised policy π_τ)."""
    grpo: GRPOLossConfig = field(default_factory=GRPOLossConfig)
    """Groups, advantages and the loss."""
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=2e-4, warmup_steps=0, min_lr_ratio=1.0, max_grad_norm=1.0)
    )
    """Optimiser and schedule (the default lr suits the built-in tiny models; ~1e-6 for billion-parameter ones)."""
    max_steps: int = 200
    """GRPO steps (each: generate, reward, μ passes)."""
    max_seconds: float | None = None
    """Also stop after this many seconds of training (evaluation excluded); null: no time limit."""
    eval_every: int = 20
    """Steps between held-out evaluations (0: only at the end)."""
    eval_prompts: int = 200
    """Held-out prompts per evaluation (greedy and one sample each: pass@1)."""
    eval_at_start: bool = True
    """Evaluate the starting policy before the first step."""
    save_every: int = 50
    """Steps between checkpoints (0: only at the end)."""
    keep_last: int = 2
    """Checkpoints kept."""
    log_every: int = 1
    """Steps between metrics.jsonl rows."""
    seed: int = 0
    """Seed of the prompt order, the sampling and everything random."""
    device: str = "auto"
    """cpu, cuda, cuda:1, mps, or auto."""
    dtype: str = "float32"
    """Weights dtype: float32, bfloat16 or float16."""
    threads: int | None = None
    """torch intra-op threads (null: torch's default; 1–2 is fastest for tiny models on a CPU)."""
    trust_remote_code: bool = False
    """Run the model repository's own code (only for models you trust)."""
    tensorboard: bool = False
    """Also write TensorBoard event files."""


# ---- the batch and its loss -------------------------------------------------------------------------------
@dataclass
class Batch:
    """One step's training data on this rank, G contiguous rows per prompt, in the rollout layout."""

    input_ids: Tensor
    """[N, P + T] prompt (left-padded) then response (right-padded)"""
    attention_mask: Tensor
    """[N, P + T]"""
    prompt_len: int
    """P"""
    response_mask: Tensor
    """[N, T]"""
    old_log_probs: Tensor
    """[N, T] log π_old (sampling policy, temperature applied)"""
    advantages: Tensor
    """[N] group-relative advantages"""
    ref_log_probs: Tensor | None = None
    """[N, T] log π_ref, or None when β = 0"""

    def rows(self, index: slice | Tensor) -> Batch:
        """Rows ``index``, right padding trimmed to their longest response (padding adds nothing to the loss)."""
        width = max(1, int(self.response_mask[index].sum(-1).max()))
        end = self.prompt_len + width
        ref = None if self.ref_log_probs is None else self.ref_log_probs[index, :width]
        return Batch(
            self.input_ids[index, :end],
            self.attention_mask[index, :end],
            self.prompt_len,
            self.response_mask[index, :width],
            self.old_log_probs[index, :width],
            self.advantages[index],
            ref,
        )


def policy_log_probs(
    model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, prompt_len: int, temperature: float
) -> tuple[Tensor, Tensor]:
    """One teacher-forced forward → (log π_τ of the response tokens [b, T], entropy per token [b, T] detached)."""
    T = input_ids.shape[1] - prompt_len
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
        logits_to_keep=T + 1,
    )
    logits = out.logits[:, :-1].float() / temperature  # (b, T, V): position P−1+t predicts response token t
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
    scale = dist.world_size()  # DDP averages gradients over ranks; the normaliser is already global
    starts = list(range(0, n, size))
    totals: dict[str, float] = {}
    tokens = 0
    for k, start in enumerate(starts):
        micro = batch.rows(slice(start, start + size))
        sync = k == len(starts) - 1 or not hasattr(model, "no_sync")
        with model.no_sync() if not sync else _nullcontext():
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


def overlong_penalty(lengths: Tensor, max_len: int, buffer: int, penalty: float) -> Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025, eq. 13): 0 up to max_len − buffer, then falling linearly
    to −penalty at max_len. lengths: [N] → [N]."""
    if buffer <= 0:
        return torch.zeros(lengths.shape, dtype=torch.float32)
    over = (lengths.float() - (max_len - buffer)).clamp(min=0.0)
    return -penalty * (over / buffer).clamp(max=1.0)


# ---- prompts ------------------------------------------------------------------------------------------------
class PromptStream:
    """Prompt indices in a (seed, epoch) shuffled order. ``position`` counts indices consumed since the start
    of training, so a run resumed at position p draws exactly what the straight run drew next."""

    def __init__(self, n: int, seed: int, position: int = 0) -> None:
        self.n, self.seed, self.position = n, seed, position
        self._cache: tuple[int, list[int]] = (-1, [])

    def _order(self, epoch: int) -> list[int]:
        if self._cache[0] != epoch:
            order = list(range(self.n))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._cache = (epoch, order)
        return self._cache[1]

    def take(self, k: int, seen: set[int] | None = None) -> list[int]:
        """The next ``k`` indices; with ``seen``, indices already in it are skipped (until all n were seen)."""
        out: list[int] = []
        while len(out) < k:
            epoch, within = divmod(self.position, self.n)
            index = self._order(epoch)[within]
            self.position += 1
            if seen is not None:
                if len(seen) >= self.n:
                    seen.clear()
                if index in seen:
                    continue
                seen.add(index)
            out.append(index)
        return out


@dataclass
class Prompts:
    """Prompt rows (with all their columns) and their token ids."""

    rows: list[dict[str, Any]]
    ids: list[list[int]]


def _load_prompts(cfg: GRPOConfig, tokenizer: Any) -> tuple[Prompts, Prompts]:
    """(train, held-out) prompts, rendered with the chat template where conversational, length-limited."""
    from postrl.lm.data import DataError, apply_length_limit, encode_prompts, load_rows, render_rows

    rows = load_rows(cfg.data, "prompts", "train", task_kwargs=cfg.task)
    if cfg.eval_data is not None:
        heldout = load_rows(cfg.eval_data, "prompts", "test", task_kwargs=cfg.task)
    elif cfg.data.startswith("task:"):
        heldout = load_rows(cfg.data, "prompts", "test", task_kwargs=cfg.task)
    else:
        cut = max(1, len(rows) // 20)
        rows, heldout = rows[:-cut], rows[-cut:]
    out = []
    for part in (rows, heldout[: cfg.eval_prompts]):
        rendered = render_rows(part, "prompts", tokenizer)
        ids = encode_prompts(tokenizer, [r["prompt"] for r in rendered])
        ids, keep = apply_length_limit(ids, cfg.max_prompt_length, cfg.overlong_prompts)
        out.append(Prompts([part[i] for i in keep], ids))
    if not out[0].rows:
        raise DataError(f"{cfg.data}: no prompt fits max_prompt_length={cfg.max_prompt_length}")
    return out[0], out[1]


def _columns(rows: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    keys = dict.fromkeys(k for r in rows for k in r if k != "prompt")
    return {k: [r.get(k) for r in rows] for k in keys}


# ---- sampling and scoring -----------------------------------------------------------------------------------
@dataclass
class Run:
    """What one GRPO run holds: the models, rewards, prompts and config."""

    cfg: GRPOConfig
    policy: torch.nn.Module
    """the policy (DDP-wrapped when distributed)"""
    ref: torch.nn.Module | None
    tokenizer: Any
    fns: list[RewardFunction]
    train: Prompts
    heldout: Prompts
    device: torch.device

    @property
    def inner(self) -> torch.nn.Module:
        return dist.unwrap(self.policy)


def _generator(run: Run, *parts: object) -> torch.Generator:
    seed = stable_hash(":".join(str(p) for p in (run.cfg.seed, *parts))) % 2**63
    return torch.Generator(device=run.device).manual_seed(seed)


def _sample(run: Run, prompts: Prompts, indices: list[int], repeat: int, sampling: SamplingConfig, gen):
    """Responses to ``prompts[indices]``, each prompt ``repeat`` times in a row → (Rollout, rows, texts)."""
    rows = [prompts.rows[i] for i in indices for _ in range(repeat)]
    ids, mask = left_pad([prompts.ids[i] for i in indices for _ in range(repeat)], run.tokenizer.pad_token_id)
    was_training = run.inner.training
    run.inner.eval()
    rollout = generate(
        run.inner,
        ids.to(run.device),
        mask.to(run.device),
        max_new_tokens=sampling.max_new_tokens,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        eos_token_id=run.tokenizer.eos_token_id,
        pad_token_id=run.tokenizer.pad_token_id,
        generator=gen,
        greedy=sampling.greedy,
    )
    run.inner.train(was_training)
    texts = RolloutEngine(run.inner, run.tokenizer).decode(rollout)
    return rollout, rows, texts


def _rewards(run: Run, rows: list[dict[str, Any]], texts: list[str]) -> dict[str, Tensor]:
    """Checked reward terms of each function (name → [N]) for completions ``texts`` of ``rows``."""
    return reward_terms(run.fns, [r["prompt"] for r in rows], texts, _columns(rows))


def _accuracy(run: Run, terms: dict[str, Tensor]) -> Tensor | None:
    verifiers = [f.name for f in run.fns if f.is_verifier]
    return terms[verifiers[0]] if verifiers else None


def _merge(parts: list[Rollout], pad_id: int) -> Rollout:
    """Concatenate rollouts of different widths: prompts re-padded on the left, responses on the right."""
    if len(parts) == 1:
        return parts[0]
    P, T = max(p.prompt_len for p in parts), max(p.response_ids.shape[1] for p in parts)

    def widen(x: Tensor, left: int, right: int, value: float) -> Tensor:
        return torch.nn.functional.pad(x, (left, right), value=value)

    cols: dict[str, list[Tensor]] = {"ids": [], "mask": [], "rmask": [], "lp": [], "fin": []}
    for p in parts:
        dl, dr = P - p.prompt_len, T - p.response_ids.shape[1]
        cols["ids"].append(widen(p.input_ids, dl, dr, pad_id))
        cols["mask"].append(widen(p.attention_mask, dl, dr, 0))
        cols["rmask"].append(widen(p.response_mask, 0, dr, 0))
        cols["lp"].append(widen(p.log_probs, 0, dr, 0.0))
        cols["fin"].append(p.finished)
    ids = torch.cat(cols["ids"])
    return Rollout(
        ids,
        torch.cat(cols["mask"]),
        P,
        ids[:, P:],
        torch.cat(cols["rmask"]),
        torch.cat(cols["lp"]),
        torch.cat(cols["fin"]),
    )


@dataclass
class _Round:
    """One sampling round on this rank: B_local·G responses and their rewards."""

    rollout: Rollout
    rewards: Tensor
    """[n] weighted reward sum (+ overlong penalty)"""
    terms: dict[str, Tensor]
    informative: Tensor
    """[n / G] bool: the group's rewards are not all equal"""


def _sample_round(run: Run, indices: list[int], step: int, round_: int, timers: dict[str, float]) -> _Round:
    g, sampling = run.cfg.grpo, run.cfg.sampling
    start = time.perf_counter()
    gen = _generator(run, "train", step, dist.rank(), round_)
    rollout, rows, texts = _sample(run, run.train, indices, g.group_size, sampling, gen)
    middle = time.perf_counter()
    terms = _rewards(run, rows, texts)
    rewards = combine(run.fns, terms) + overlong_penalty(
        rollout.response_lengths, sampling.max_new_tokens, g.overlong_buffer, g.overlong_penalty
    )
    groups = rewards.view(-1, g.group_size)  # (n/G, G)
    informative = ~(groups == groups[:, :1]).all(-1)
    timers["time_generate"] += middle - start
    timers["time_reward"] += time.perf_counter() - middle
    return _Round(rollout, rewards, terms, informative)


def _select(rounds: list[_Round], wanted: int, dynamic: bool) -> list[tuple[int, int]]:
    """(round, group) pairs for the batch: all of round 0, or (dynamic sampling) informative groups first,
    topped up with uninformative ones if the refills fell short."""
    every = [(r, k) for r, rnd in enumerate(rounds) for k in range(rnd.informative.numel())]
    if not dynamic:
        return every[:wanted]
    good = [(r, k) for r, k in every if bool(rounds[r].informative[k])]
    rest = [(r, k) for r, k in every if not bool(rounds[r].informative[k])]
    return (good + rest)[:wanted]


def _gather(run: Run, rounds: list[_Round], chosen: list[tuple[int, int]]) -> tuple[Rollout, Tensor]:
    """The chosen groups' rows as one rollout (G contiguous rows per group) and their rewards."""
    G = run.cfg.grpo.group_size
    parts, rewards = [], []
    for r, rnd in enumerate(rounds):
        rows = torch.tensor([k * G + j for rr, k in chosen if rr == r for j in range(G)], dtype=torch.long)
        if rows.numel() == 0:
            continue
        ro = rnd.rollout
        parts.append(
            Rollout(
                ro.input_ids[rows],
                ro.attention_mask[rows],
                ro.prompt_len,
                ro.response_ids[rows],
                ro.response_mask[rows],
                ro.log_probs[rows],
                ro.finished[rows],
            )
        )
        rewards.append(rnd.rewards[rows])
    return _merge(parts, run.tokenizer.pad_token_id), torch.cat(rewards)


def collect(run: Run, stream: PromptStream, step: int) -> tuple[Batch, dict[str, float]]:
    """Sample this rank's groups (with dynamic-sampling refills), reward them, and build the training batch."""
    g = run.cfg.grpo
    local = g.prompts_per_step // dist.world_size()
    seen = None if g.repeat_prompts else set()
    timers = {"time_generate": 0.0, "time_reward": 0.0, "time_score": 0.0}
    rounds: list[_Round] = []
    for round_ in range(1 + (g.max_refills if g.dynamic_sampling else 0)):
        chosen = stream.take(g.prompts_per_step, seen)  # the same global prompts on every rank
        mine = [chosen[i] for i in dist.shard_range(len(chosen))]
        rounds.append(_sample_round(run, mine, step, round_, timers))
        short = max(0, local - sum(int(r.informative.sum()) for r in rounds))
        if not g.dynamic_sampling or dist.all_reduce_sum(torch.tensor(short)).item() == 0:
            break
    rollout, rewards = _gather(run, rounds, _select(rounds, local, g.dynamic_sampling))
    start = time.perf_counter()
    old_log_probs, ref_log_probs = rollout.log_probs, None
    with torch.no_grad():
        if g.mu > 1:  # see the module docstring: re-score so that the first pass has ratio exactly 1
            old_log_probs = score(
                run.inner, rollout.input_ids, rollout.attention_mask, rollout.prompt_len,
                temperature=run.cfg.sampling.temperature,
            )  # fmt: skip
        if run.ref is not None:
            ref_log_probs = score(
                run.ref, rollout.input_ids, rollout.attention_mask, rollout.prompt_len,
                temperature=run.cfg.sampling.temperature,
            )  # fmt: skip
    timers["time_score"] += time.perf_counter() - start
    advantages = group_advantages(rewards, g.group_size, g.adv_eps, scale=g.scale_rewards)
    batch = Batch(
        rollout.input_ids,
        rollout.attention_mask,
        rollout.prompt_len,
        rollout.response_mask,
        old_log_probs,
        advantages,
        ref_log_probs,
    )
    return batch, {**_rollout_metrics(run, rounds), **timers, "refill_rounds": len(rounds) - 1}


def _rollout_metrics(run: Run, rounds: list[_Round]) -> dict[str, float]:
    """Reward, accuracy, zero-std groups and lengths over every response sampled this step."""
    rewards = torch.cat([r.rewards for r in rounds])
    lengths = torch.cat([r.rollout.response_lengths for r in rounds]).float()
    finished = torch.cat([r.rollout.finished for r in rounds])
    informative = torch.cat([r.informative for r in rounds])
    out = {
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "zero_std_fraction": 1.0 - float(informative.float().mean()),
        "completion_length_mean": float(lengths.mean()),
        "completion_length_max": float(lengths.max()),
        "truncated_fraction": 1.0 - float(finished.float().mean()),
        "generated_tokens": float(lengths.sum()),
    }
    for fn in run.fns:
        out[f"reward/{fn.name}"] = float(torch.cat([r.terms[fn.name] for r in rounds]).mean())
    accuracy = [_accuracy(run, r.terms) for r in rounds]
    if accuracy[0] is not None:
        out["accuracy"] = float(torch.cat(accuracy).mean())  # type: ignore[arg-type]
    return out


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
    }
    bad = [message for message, failed in problems.items() if failed]
    if bad:
        raise UserError("; ".join(bad))


def _build_run(cfg: GRPOConfig, info: dist.DistInfo) -> Run:
    from postrl.lm.tokenizer import load_tokenizer

    load = {
        "dtype": resolve_dtype(cfg.dtype),
        "device": info.device,
        "trust_remote_code": cfg.trust_remote_code,
    }
    tokenizer = load_tokenizer(cfg.tokenizer or cfg.model, trust_remote_code=cfg.trust_remote_code)
    policy = load_causal_lm(cfg.model, **load)
    ref = None
    if cfg.grpo.beta != 0:  # β = 0: no reference model is loaded at all
        ref = load_causal_lm(cfg.ref_model or cfg.model, **load).eval().requires_grad_(False)
    specs = list(cfg.rewards)
    if not specs:
        if not cfg.data.startswith("task:"):
            raise UserError(
                f"no reward function: set rewards (e.g. rewards=[my_module:fn]) for data {cfg.data}"
            )
        specs = [cfg.data]
    fns = load_reward_fns(specs, cfg.reward_weights, task_kwargs=cfg.task, device=info.device)
    if cfg.verifier is not None:
        if cfg.verifier not in specs:
            raise UserError(f"verifier {cfg.verifier!r} is not one of the rewards {specs}")
        fns = [replace(f, is_verifier=f.name == cfg.verifier) for f in fns]
    train, heldout = _load_prompts(cfg, tokenizer)
    if len(train.rows) < cfg.grpo.prompts_per_step and not cfg.grpo.repeat_prompts:
        raise UserError(
            f"{cfg.data}: {len(train.rows)} prompts for grpo.prompts_per_step={cfg.grpo.prompts_per_step}; "
            "lower it or set grpo.repeat_prompts=true"
        )
    return Run(cfg, dist.wrap_ddp(policy, info), ref, tokenizer, fns, train, heldout, info.device)


def _save(run_dir: Path, run: Run, optimizer, scheduler, state: GRPOState) -> None:
    if dist.is_main():
        save_checkpoint(
            run_dir / "checkpoints",
            state.step,
            modules={"policy": run.inner},
            optimizers={"opt": optimizer},
            schedulers={"sched": scheduler},
            extra={
                "position": state.position,
                "train_seconds": state.train_seconds,
                "generated_tokens": state.generated_tokens,
                "start_eval": state.start_eval,
            },
            keep_last=run.cfg.keep_last,
        )
    dist.barrier()


def _restore(run_dir: Path, run: Run, optimizer, scheduler, logger: RunLogger) -> GRPOState:
    last = latest_checkpoint(run_dir / "checkpoints")
    if last is None:
        return GRPOState()
    loaded = load_checkpoint(
        last, modules={"policy": run.inner}, optimizers={"opt": optimizer}, schedulers={"sched": scheduler}
    )
    extra = loaded["extra"]
    logger.truncate_after(loaded["step"])
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
                _save(run_dir, run, optimizer, scheduler, state)
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


def run_grpo(cfg: GRPOConfig, run_dir: str | Path, resume: bool = False) -> dict[str, Any]:
    """Train with GRPO, export ``RUN_DIR/model`` (HF format), write the run folder, return the summary."""
    run_dir = Path(run_dir)
    info = dist.init_distributed(cfg.device)
    _check_config(cfg, info.world_size)
    set_threads(cfg.threads)
    seed_everything(cfg.seed, info.rank)
    logger = RunLogger(run_dir, cfg, tensorboard=cfg.tensorboard, enabled=info.is_main, resume=resume)
    run = _build_run(cfg, info)
    optimizer, scheduler = make_optimizer(run.inner, cfg.optim, cfg.max_steps)
    state = _restore(run_dir, run, optimizer, scheduler, logger) if resume else GRPOState()
    result = _loop(run, optimizer, scheduler, state, logger, run_dir)
    if info.is_main:
        export_model(run.inner, run.tokenizer, run_dir / "model")
        plot_run(run_dir)
    return logger.finish(_summary(run, state, result))
