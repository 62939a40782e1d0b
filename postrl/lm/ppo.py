"""`postrl ppo`: PPO-based RLHF with the four roles of the notes' section 5 (Ouyang et al. 2022; Ziegler et al.
2019; defaults of "The N+ implementation details of RLHF with PPO", Huang et al. 2024).

    actor      the policy π_θ, initialised from the SFT model, trained
    critic     V_φ: a copy of the reward model (default), a new head on the SFT trunk, or a value head
               sharing the actor's trunk; trained
    reward     the frozen reward model (its score on the last response token), or rule-based reward
               functions with GRPO's interface (`postrl.lm.rewards`)
    reference  a frozen copy of the SFT policy: the KL penalty −β(log π − log π_ref) on every token

One step: (1) generate with the rollout engine and keep the sampling log-probs; (2) score, shape rewards
with the KL penalty, compute values and GAE (`postrl.lm.ppo_batch`); (3) several epochs over minibatches of
the clipped policy loss, the (clipped) value loss, an entropy bonus and an optional pretraining (ptx)
loss. All four models run with dropout off and positions from the attention mask; log-probs of the actor
and the reference both use the sampling temperature.

Under torchrun each rank samples its share of a step's prompts with its own generator; scores and advantages
are whitened and losses normalised over all ranks, so an update equals one process's on the same global batch
when ppo.minibatches = 1 (minibatches are shuffled within each rank); under torchrun an epoch's short last batch is skipped
(each rank needs a full share); one process trains on it, in fewer minibatches if it has fewer rows.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from postrl.core import entropy_from_logits, masked_mean, ppo_clip_loss, value_loss
from postrl.lm.models import position_ids_from_mask
from postrl.lm.ppo_batch import GAEConfig, KLConfig, PPOBatch, RewardConfig, Roles
from postrl.lm.ppo_setup import PPORun, PPOState, seeded_generator
from postrl.lm.rollout import SamplingConfig, token_log_probs
from postrl.lm.trainer import OptimConfig
from postrl.runtime import distributed as dist
from postrl.runtime.config import validate
from postrl.runtime.errors import UserError

CRITICS = ("reward_model", "sft", "shared")


@dataclass(frozen=True)
class PPOLossConfig:
    """The PPO update."""

    epochs: int = 4
    """Passes over each step's rollouts."""
    minibatches: int = 4
    """Optimiser steps per epoch (the batch is cut into this many minibatches)."""
    grad_accum: int = 1
    """Micro-batches per minibatch (token-weighted, so the gradient is the minibatch's)."""
    clip_eps: float = 0.2
    """ε of the clipped policy ratio."""
    vf_clip: float | None = 0.2
    """ε of the clipped value loss (PPO2); null: unclipped."""
    vf_coef: float = 0.1
    """Weight of the value loss."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""

    CHECKS = {  # valid ranges (postrl.runtime.config.validate)
        "epochs": ">= 1",
        "minibatches": ">= 1",
        "grad_accum": ">= 1",
        "clip_eps": "> 0",
        "vf_clip": "> 0",
        "vf_coef": ">= 0",
        "ent_coef": ">= 0",
    }


@dataclass(frozen=True)
class PtxConfig:
    """The pretraining-mix loss of InstructGPT (PPO-ptx): next-token NLL on SFT data, weighted."""

    coef: float = 0.0
    """γ_ptx; 0 turns it off."""
    data: str | None = None
    """SFT rows (prompt/completion); default: the SFT split of `data` when it is a built-in task."""
    batch_size: int = 16
    """Examples per minibatch."""
    max_length: int = 64
    """Longest example in tokens (longer ones are dropped)."""

    CHECKS = {"coef": ">= 0", "batch_size": ">= 1", "max_length": ">= 2"}  # valid ranges


@dataclass(frozen=True)
class PPOConfig:
    """`postrl ppo --model SFT_DIR --reward-model RM_DIR --out RUN_DIR`."""

    model: str = "runs/sft/model"
    """The SFT policy: the actor's initialisation (and the reference unless `ref_model` is set)."""
    reward_model: str | None = "runs/rm/model"
    """Reward-model folder written by `postrl rm` (frozen)."""
    reward_fns: list[str] = field(default_factory=list)
    """Rule-based rewards instead of the reward model (task:NAME, module:function, rm:PATH), summed."""
    reward_weights: list[float] | None = None
    """Weights of `reward_fns` (default 1 each)."""
    ref_model: str | None = None
    """Reference policy (default: `model`)."""
    critic: str = "reward_model"
    """reward_model (a trainable copy of the RM, N+ details), sft (a new head on the SFT trunk), or shared
    (a value head on the actor's trunk)."""
    tokenizer: str | None = None
    """Tokenizer (default: the model's)."""
    data: str = "task:reviews"
    """Prompts: a JSONL/JSON/Parquet file with a 'prompt' column, task:NAME, or a `datasets` name."""
    task: dict[str, Any] = field(default_factory=dict)
    """Options of a built-in task."""
    eval_data: str | None = None
    """Held-out prompts (default: the test split of a built-in task, else the last 5% of the prompts)."""
    empty_rows: Literal["error", "skip"] = "error"
    """Rows whose prompt or completion (chosen, rejected) is empty or whitespace-only: error (the default:
    names the first one's file:line:field and the count) or skip (dropped, the count logged)."""
    max_prompt_length: int = 32
    """Longer prompts are dropped (and reported)."""
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(max_new_tokens=24))
    """How responses are sampled (the temperature also divides the training logits)."""
    steps: int = 100
    """PPO steps (generate → score → update)."""
    batch_size: int = 64
    """Prompts per step, over all ranks (one response each)."""
    ppo: PPOLossConfig = field(default_factory=PPOLossConfig)
    """The PPO update."""
    gae: GAEConfig = field(default_factory=GAEConfig)
    """Advantages and returns."""
    kl: KLConfig = field(default_factory=KLConfig)
    """KL penalty to the reference."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Reward normalisation, clipping and the no-EOS penalty."""
    ptx: PtxConfig = field(default_factory=PtxConfig)
    """Optional pretraining loss."""
    actor_optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=3e-5, warmup_steps=0, min_lr_ratio=1.0)
    )
    """Actor optimiser (its schedule counts PPO steps)."""
    critic_optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=3e-4, warmup_steps=0, min_lr_ratio=1.0)
    )
    """Critic optimiser."""
    eval_every: int = 10
    """Steps between held-out evaluations (RM score, gold reward, KL); 0: only at start and end."""
    eval_samples: int = 256
    """Held-out responses per evaluation (cycling through the held-out prompts)."""
    save_every: int = 50
    """Steps between checkpoints (0: only at the end)."""
    keep_last: int = 2
    """Checkpoints kept."""
    log_every: int = 1
    """Steps between metrics.jsonl rows."""
    seed: int = 0
    """Seed of the prompt order, sampling and minibatch order."""
    device: str = "auto"
    """cpu, cuda, cuda:1, mps, or auto."""
    dtype: str = "float32"
    """Weights dtype: float32, bfloat16 or float16."""
    threads: int | None = None
    """torch intra-op threads (null: torch's default)."""
    parallel: str = "ddp"
    """Under torchrun: ddp (replicate the models) or fsdp (FSDP2: shard actor, critic, reference and reward
    model, and the actor's and critic's gradients and optimiser state). Under fsdp every rank gathers the
    whole models for sampling and scoring, so they must fit one device then; critic=shared is refused (README,
    Scaling out)."""
    trust_remote_code: bool = False
    """Run the model repository's own code (only for models you trust)."""
    tensorboard: bool = False
    """Also write TensorBoard event files."""
    plots: bool = True
    """Write heldout.png and train.png at the end."""

    CHECKS = {  # valid ranges (postrl.runtime.config.validate)
        "max_prompt_length": ">= 1",
        "steps": ">= 1",
        "batch_size": ">= 1",
        "eval_every": ">= 0",
        "eval_samples": ">= 1",
        "save_every": ">= 0",
        "keep_last": ">= 0",
        "log_every": ">= 1",
        "seed": ">= 0",
        "threads": ">= 1",
    }


# ---- the loss --------------------------------------------------------------------------------------------
def policy_forward(
    roles: Roles, mb: PPOBatch, temperature: float, with_entropy_grad: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """Teacher-forced forward of actor (and critic) on a minibatch → (log π_τ [b, T], entropy of π_τ [b, T],
    values [b, T]); positions from the mask, logits divided by the sampling temperature τ."""
    ids, mask, P = mb.input_ids, mb.attention_mask, mb.prompt_len
    T = ids.shape[1] - P
    positions = position_ids_from_mask(mask)
    if roles.critic is None:  # shared trunk: one forward gives both
        logits, values = roles.actor(ids, mask, positions, logits_to_keep=T + 1)
        values = values[:, P - 1 : -1]  # (b, T): V of the state before each response token
    else:
        out = roles.actor(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False, logits_to_keep=T + 1
        )
        logits = out.logits
        values = roles.critic(ids, mask, positions)[:, P - 1 : -1]  # (b, T)
    logits = logits[:, :-1].float() / temperature  # (b, T, V): position P−1+t predicts response token t
    log_probs = token_log_probs(logits, ids[:, P:])
    with torch.set_grad_enabled(with_entropy_grad and torch.is_grad_enabled()):
        entropy = entropy_from_logits(logits)
    return log_probs, entropy, values.float()


def ppo_loss(
    roles: Roles, mb: PPOBatch, cfg: PPOLossConfig, temperature: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """A minibatch → (loss, stats): clipped policy loss + vf_coef · value loss − ent_coef · entropy, each a
    mean over the response tokens."""
    mask = mb.response_mask
    log_probs, entropy, values = policy_forward(roles, mb, temperature, cfg.ent_coef != 0)
    pg_loss, stats = ppo_clip_loss(log_probs, mb.log_probs, mb.advantages, cfg.clip_eps, mask)
    clipped = {"old_values": mb.values, "clip_eps": cfg.vf_clip} if cfg.vf_clip is not None else {}
    vf_loss = value_loss(values, mb.returns, mask, **clipped)
    entropy_mean = masked_mean(entropy, mask)
    loss = pg_loss + cfg.vf_coef * vf_loss - cfg.ent_coef * entropy_mean
    return loss, {
        "policy_loss": pg_loss.detach(),
        "value_loss": vf_loss.detach(),
        "entropy": entropy_mean.detach(),
        **stats,
    }


# ---- the update ------------------------------------------------------------------------------------------
def _no_sync(modules: list[torch.nn.Module], sync: bool):
    stack = contextlib.ExitStack()
    if not sync:
        for m in modules:
            stack.enter_context(dist.no_grad_sync(m))  # DDP no_sync, FSDP no reduce-scatter
    return stack


def backward_minibatch(
    roles: Roles, mb: PPOBatch, cfg: PPOLossConfig, temperature: float, ptx_loss: Any = None
) -> dict[str, float]:
    """Accumulate one minibatch's gradient over ``grad_accum`` micro-batches, each weighted by its share of
    the minibatch's (all ranks') response tokens, so the sum is the minibatch's token mean."""
    n = mb.input_ids.shape[0]
    size = math.ceil(n / cfg.grad_accum)
    tokens = float(dist.all_reduce_sum(mb.response_mask.sum().double()))
    modules = [m for m in (roles.actor, roles.critic) if m is not None]
    starts = list(range(0, n, size))
    totals: dict[str, float] = {}
    for k, start in enumerate(starts):
        micro = mb.rows(slice(start, start + size))
        share = float(micro.response_mask.sum()) / max(tokens, 1.0)
        with _no_sync(modules, k == len(starts) - 1 and ptx_loss is None):
            loss, stats = ppo_loss(roles, micro, cfg, temperature)
            (loss * share * dist.world_size()).backward()  # DDP averages over ranks
        for key, value in {"loss": loss.detach(), **stats}.items():
            totals[key] = totals.get(key, 0.0) + float(value) * share
    if ptx_loss is not None:
        with _no_sync(modules, True):
            value = ptx_loss()
            value.backward()
        totals["ptx_loss"] = float(value.detach())
    return dist.reduce_metrics(
        {k: v * dist.world_size() if k != "ptx_loss" else v for k, v in totals.items()}
    )


def optimise(
    roles: Roles,
    batch: PPOBatch,
    cfg: PPOConfig,
    optimizers: dict[str, torch.optim.Optimizer],
    params: dict[str, list[torch.nn.Parameter]],
    generator: torch.Generator,
    ptx_loss: Any = None,
) -> dict[str, float]:
    """``epochs`` passes over ``batch`` in a fresh random row order each, ``minibatches`` optimiser steps per
    pass; gradients clipped per role; returns the stats averaged over the optimiser steps."""
    n = batch.input_ids.shape[0]
    history: list[dict[str, float]] = []
    for _ in range(cfg.ppo.epochs):
        order = torch.randperm(n, generator=generator)
        # `minibatches` steps (fewer for a short batch in one process), sizes within one of each other
        for mb in batch.minibatches(order, cfg.ppo.minibatches):
            stats = backward_minibatch(roles, mb, cfg.ppo, cfg.sampling.temperature, ptx_loss)
            stats["actor_grad_norm"] = _clip_params(params["actor"], cfg.actor_optim.max_grad_norm)
            stats["critic_grad_norm"] = _clip_params(params["critic"], cfg.critic_optim.max_grad_norm)
            for opt in optimizers.values():
                opt.step()
                opt.zero_grad(set_to_none=True)
            history.append(stats)
    return {k: sum(h[k] for h in history) / len(history) for k in history[0]}


def _clip_params(params: list[torch.nn.Parameter], max_norm: float | None) -> float:
    """Clip one role's gradients to ``max_norm`` (None: only measure); returns the norm before clipping."""
    return dist.grad_norm(params, max_norm)  # over every rank's shard under FSDP


SHARED_FSDP = (
    "the value head lives in the actor's FSDP root unit, but the actor's LM and the head are trained and "
    "checkpointed as separate parts, which FSDP cannot gather on their own; use critic=sft or "
    "critic=reward_model (a separate critic model) with fsdp"
)


def check_config(cfg: PPOConfig) -> None:
    """Refuse settings that cannot work, naming the key."""
    p = cfg.ppo
    problems = {
        f"critic must be one of {CRITICS}, got {cfg.critic!r}": cfg.critic not in CRITICS,
        "critic=reward_model needs reward_model (or choose critic=sft / shared)": (
            cfg.critic == "reward_model" and cfg.reward_model is None
        ),
        "give reward_model or reward_fns": cfg.reward_model is None and not cfg.reward_fns,
        "reward.normalize=rm_stats needs a reward model (use none or batch with reward_fns)": (
            cfg.reward.normalize == "rm_stats" and bool(cfg.reward_fns)
        ),
        "ppo.epochs, ppo.minibatches and ppo.grad_accum must be >= 1": min(
            p.epochs, p.minibatches, p.grad_accum
        )
        < 1,
        f"batch_size={cfg.batch_size} must be >= ppo.minibatches·ppo.grad_accum per rank": (
            cfg.batch_size // dist.world_size() < p.minibatches * p.grad_accum
        ),
        "sampling.greedy must be false and sampling.temperature > 0 for training": (
            cfg.sampling.greedy or cfg.sampling.temperature <= 0
        ),
        "kl.beta must be >= 0": cfg.kl.beta < 0,
        f"parallel must be one of {dist.PARALLEL}, got {cfg.parallel!r}": cfg.parallel not in dist.PARALLEL,
        f"parallel=fsdp with critic=shared: {SHARED_FSDP}": cfg.parallel == "fsdp" and cfg.critic == "shared",
    }
    bad = [message for message, failed in problems.items() if failed]
    if bad:
        raise UserError("ppo config: " + "; ".join(bad))


def ppo_step(run: PPORun, state: PPOState, indices: list[int]) -> dict[str, float]:
    """Generate → score → update for the prompts ``indices`` (all ranks'); returns the step's metrics."""
    from postrl.lm.ppo_batch import make_batch
    from postrl.lm.rollout import RolloutEngine

    cfg, rank = run.cfg, dist.rank()
    rows = [run.prompts.rows[indices[i]] for i in dist.shard_range(len(indices))]
    t0 = time.perf_counter()
    roles = run.roles
    with dist.gathered(roles.actor, roles.critic, roles.reference, roles.reward_model):  # whole weights
        engine = RolloutEngine(roles.policy, run.tokenizer, cfg.sampling)
        rollout = engine.generate(
            [r["prompt"] for r in rows], seeded_generator(run.device, cfg.seed, "rollout", state.step, rank)
        )
        t1 = time.perf_counter()
        raw = run.scorer(rollout, rows)
        batch, metrics = make_batch(
            roles,
            rollout,
            raw,
            temperature=cfg.sampling.temperature,
            beta=run.kl_ctl.value,
            reward=cfg.reward,
            advantage=cfg.gae,
            norm_stats=run.norm_stats,
        )
    if run.task is not None:
        gold = torch.tensor(run.task.gold_reward(rollout.prompts, rollout.texts), dtype=torch.float64)
        metrics["gold_reward"] = float(dist.all_reduce_mean(gold.mean()))
    t2 = time.perf_counter()
    ptx = _ptx_loss(run, state) if run.ptx_examples else None
    params = {k: [p for p in m.parameters() if p.requires_grad] for k, m in run.parts.items()}
    gen = seeded_generator(torch.device("cpu"), cfg.seed, "minibatches", state.step, rank)
    metrics.update(optimise(run.train_roles, batch, cfg, run.optimizers, params, gen, ptx))
    t3 = time.perf_counter()
    for sched in run.schedulers.values():
        sched.step()
    tokens = float(dist.all_reduce_sum(rollout.response_mask.sum().double()))
    run.kl_ctl.update(metrics["kl_to_ref"], n_steps=len(indices))
    for key, value in {"generate": t1 - t0, "score": t2 - t1, "train": t3 - t2, "tokens": tokens}.items():
        state.totals[key] = state.totals.get(key, 0.0) + value
    metrics.update(
        {
            "time_generate": t1 - t0,
            "time_score": t2 - t1,
            "time_train": t3 - t2,
            "tokens_per_second": tokens / max(t1 - t0, 1e-9),
            "actor_lr": run.schedulers["actor"].get_last_lr()[0],
        }
    )
    return metrics


def _ptx_loss(run: PPORun, state: PPOState):
    """A closure: the next ptx batch's weighted SFT loss (the pretraining mix of InstructGPT's PPO-ptx)."""
    from postrl.lm.trainer import iterate_batches, make_batches, sft_step_loss, to_device

    def loss() -> Tensor:
        c = run.cfg
        _, indices = next(
            iterate_batches(len(run.ptx_examples), c.ptx.batch_size, c.seed, state.ptx_position)
        )
        state.ptx_position += 1
        mine = [run.ptx_examples[indices[i]] for i in dist.shard_range(len(indices))]
        batch = to_device(make_batches(mine, run.tokenizer.pad_token_id), run.device)
        n_tokens = int(dist.all_reduce_sum((batch["labels"][:, 1:] != -100).sum()).item())
        model = run.train_roles.policy if run.train_roles.critic is not None else run.roles.policy
        return c.ptx.coef * sft_step_loss(model, batch, n_tokens) * dist.world_size()

    return loss


def run_ppo(
    cfg: PPOConfig, run_dir: str | Path, resume: bool = False, overwrite: bool = False
) -> dict[str, Any]:
    """Train with PPO-RLHF; writes the run folder (metrics, plots, checkpoints) and ``RUN_DIR/model``;
    returns the summary. Every model, the prompts and the reward functions are loaded and checked before
    the run folder is touched."""
    from postrl.lm import ppo_setup as setup
    from postrl.lm.trainer import iterate_batches, set_threads
    from postrl.runtime.progress import Progress
    from postrl.runtime.rundir import open_run
    from postrl.runtime.seeding import seed_everything

    validate(cfg)
    check_config(cfg)
    run_dir = Path(run_dir)
    info = dist.init_distributed(cfg.device)
    set_threads(cfg.threads)
    seed_everything(cfg.seed, info.rank)
    run = setup.build_run(cfg, info)
    logger, ckpt = open_run(run_dir, cfg, resume=resume, overwrite=overwrite, tensorboard=cfg.tensorboard)
    state = PPOState() if ckpt is None else setup.restore_state(ckpt, run, logger)

    def heldout_eval() -> dict[str, float]:
        r = run.roles
        with dist.gathered(r.actor, r.reference, r.reward_model):
            out = setup.evaluate(
                r, run.tokenizer, run.heldout, cfg.sampling, run.scorer, run.task,
                n=cfg.eval_samples, seed=cfg.seed + 1,
            )  # fmt: skip
        state.history.append({"step": state.step, **out})
        logger.log(state.step, out)
        return out

    if not state.history:
        heldout_eval()
    batches = iterate_batches(len(run.prompts.rows), cfg.batch_size, cfg.seed, start=state.position)
    with Progress(cfg.steps, "ppo", initial=state.step, disable=None if info.is_main else True) as bar:
        while state.step < cfg.steps:
            state.position, indices = next(batches)
            state.position += 1
            if info.world_size > 1 and len(indices) < cfg.batch_size:  # an epoch's short last batch
                bar.write(f"ppo: skipped {len(indices)} prompts (< batch_size; each rank needs a full share)")
                continue
            metrics = ppo_step(run, state, indices)
            state.step += 1
            bar.update(1, score=metrics["rm_score"], kl=metrics["kl_to_ref"])
            if state.step % cfg.log_every == 0:
                logger.log(state.step, metrics)
            done = state.step == cfg.steps
            if done or (cfg.eval_every and state.step % cfg.eval_every == 0):
                out = heldout_eval()
                bar.write(f"ppo step {state.step}: " + ", ".join(f"{k} {v:.4g}" for k, v in out.items()))
            if done or (cfg.save_every and state.step % cfg.save_every == 0):
                setup.save_state(run_dir, run, state, logger.rows)
    setup.export_models(run, run_dir)
    if info.is_main and cfg.plots:
        setup.plot_run(run_dir)
    return logger.finish(setup.summarize(state, run.kl_ctl.value))
