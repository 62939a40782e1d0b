"""PPO-RLHF set-up and bookkeeping: the four roles, prompts, the ptx data, the reward scorer, the export, the
summary and the plots. The held-out evaluation (RM score, gold reward, KL to the reference), which makes
over-optimisation visible, is the LM stages' shared one (`postrl.lm.evaluation.evaluate_heldout`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from postrl.core import AdaptiveKLController, FixedKLController
from postrl.lm.data import (
    DataError,
    load_rows,
    load_train_heldout,
    render_rows,
    tokenize_prompts,
    tokenize_sft,
)
from postrl.lm.evaluation import PromptSet
from postrl.lm.models import (
    PolicyWithValueHead,
    ScalarHeadModel,
    adapter_free_reference,
    apply_lora,
    check_vocab,
    fit_context,
    load_causal_lm,
    resolve_dtype,
)
from postrl.lm.ppo.advantages import reward_model_scores
from postrl.lm.ppo.config import PPOConfig
from postrl.lm.ppo.episodes import episode_prompts
from postrl.lm.reward_model.evaluation import NORM_FILE, read_reward_norm
from postrl.lm.rewards import (
    Phase,
    TrainerState,
    columns_of,
    completion_ids_of,
    compute_rewards,
    load_reward_fns,
)
from postrl.lm.roles import Roles
from postrl.lm.rollout import Rollout
from postrl.lm.rollout.decoders import check_backend
from postrl.lm.tasks import get_task
from postrl.lm.tasks.base import stable_hash
from postrl.lm.tokenizer import load_tokenizer
from postrl.lm.trainer import export_on_main, make_optimizer
from postrl.runtime import distributed as dist
from postrl.runtime.checkpoint import write_dir_atomically
from postrl.runtime.errors import UserError
from postrl.runtime.logging import read_jsonl
from postrl.runtime.plots import CURVES, plot_curves

Scorer = Callable[[Rollout, Sequence[dict[str, Any]], TrainerState, Phase], Tensor]
"""rollout, its prompt rows, the trainer state (the reward functions' ``trainer_state``), training or
evaluation → raw sequence scores [B]."""


# ---- roles -----------------------------------------------------------------------------------------------
def _frozen(model: torch.nn.Module) -> torch.nn.Module:
    return model.eval().requires_grad_(False)


def build_roles(cfg: PPOConfig, device: torch.device) -> Roles:
    """Actor (SFT), critic (per ``cfg.critic``), frozen reward model, frozen reference; dropout off in all
    (`load_causal_lm` and `ScalarHeadModel.from_pretrained` zero it)."""
    load = {
        "dtype": resolve_dtype(cfg.run.dtype, "run.dtype"),
        "device": device,
        "trust_remote_code": cfg.trust_remote_code,
    }
    actor = apply_lora(load_causal_lm(cfg.model, **load), cfg.run, rl=True)
    if cfg.run.lora.enabled and not cfg.ref_model:  # the base model: the actor with its adapters disabled
        reference = adapter_free_reference(actor)
    else:
        reference = _frozen(load_causal_lm(cfg.ref_model or cfg.model, **load))
    reward_model = None
    if cfg.reward_model is not None and not cfg.rewards and cfg.env.id is None:
        reward_model = _frozen(ScalarHeadModel.from_pretrained(cfg.reward_model, **load))
    critic: torch.nn.Module | None
    if cfg.critic == "reward_model":  # N+ details: the value model starts as the reward model
        critic = apply_lora(ScalarHeadModel.from_pretrained(cfg.reward_model, **load), cfg.run, rl=True)
    elif cfg.critic == "sft":
        critic = ScalarHeadModel.from_pretrained(cfg.model, new_head=True, seed=cfg.run.seed, **load)
        critic = apply_lora(critic, cfg.run, rl=True)
    else:
        actor, critic = PolicyWithValueHead(actor, seed=cfg.run.seed), None
    return Roles(actor=actor, critic=critic, reference=reference, reward_model=reward_model)


def trainable_parts(roles: Roles) -> dict[str, torch.nn.Module]:
    """The modules each optimiser owns: the actor's LM, and the critic (or the shared value head)."""
    return {"actor": roles.policy, "critic": roles.critic if roles.critic is not None else roles.actor.head}


# ---- data ------------------------------------------------------------------------------------------------
def _load_prompts(cfg: PPOConfig, tokenizer: Any) -> tuple[PromptSet, PromptSet]:
    """(train, held-out) prompts, rendered (chat template where conversational), overlong ones dropped."""
    rows, heldout = load_train_heldout(cfg.data, "prompts", cfg.eval_data, cfg.task, empty=cfg.empty_rows)
    out = []
    for part in (rows, heldout):
        kept, _ = tokenize_prompts(render_rows(part, "prompts", tokenizer), tokenizer, cfg.max_prompt_length)
        out.append(PromptSet(kept))
    if not out[0].rows:
        raise DataError(f"{cfg.data}: no prompt fits max_prompt_length={cfg.max_prompt_length}")
    return out[0], out[1]


def load_task(cfg: PPOConfig) -> Any:
    """The built-in task of ``cfg.data`` (for its gold reward), or None."""
    return get_task(cfg.data[len("task:") :], **cfg.task) if cfg.data.startswith("task:") else None


def load_ptx_examples(cfg: PPOConfig, tokenizer: Any) -> list[dict[str, list[int]]]:
    """Tokenised SFT examples for the ptx loss (empty when ``ptx.coef`` is 0)."""
    if cfg.ptx.coef == 0:
        return []
    source = cfg.ptx.data or (cfg.data if cfg.data.startswith("task:") else None)
    if source is None:
        raise UserError("ptx.coef > 0 needs ptx.data (SFT rows) when data is not a built-in task")
    rows = render_rows(load_rows(source, "sft", "train", task_kwargs=cfg.task), "sft", tokenizer)
    examples = tokenize_sft(rows, tokenizer, cfg.ptx.max_length, "drop")
    if not examples:
        raise UserError(f"{source}: no SFT example fits ptx.max_length={cfg.ptx.max_length}")
    return examples


# ---- rewards ---------------------------------------------------------------------------------------------
def make_scorer(cfg: PPOConfig, roles: Roles, device: torch.device) -> Scorer:
    """The `Scorer`: the frozen RM on the rollout's own tokens, or the weighted sum of the reward functions on
    the decoded texts, called as TRL calls them (completion_ids and trainer_state, evaluation included)."""
    if not cfg.rewards:
        return lambda rollout, rows, state, phase: reward_model_scores(roles.reward_model, rollout)
    fns = load_reward_fns(cfg.rewards, cfg.reward_weights, task_kwargs=cfg.task, device=device)

    def reward_sum(rollout: Rollout, rows: list[dict[str, Any]], state: TrainerState, phase: Phase) -> Tensor:
        ids = completion_ids_of(rollout.response_ids, rollout.response_mask)
        return compute_rewards(
            fns, rollout.prompts, rollout.texts, columns_of(rows),
            completion_ids=ids, trainer_state=state, phase=phase,
        )  # fmt: skip

    return reward_sum


def read_norm_stats(cfg: PPOConfig) -> dict[str, float] | None:
    """The reward model's score statistics on SFT samples (needed for reward.normalize=rm_stats)."""
    if cfg.reward.normalize != "rm_stats":
        return None
    stats = read_reward_norm(cfg.reward_model) if cfg.reward_model else None
    if stats is None:
        raise UserError(
            f"reward.normalize=rm_stats but {cfg.reward_model}/{NORM_FILE} is missing (train the RM with "
            "norm.samples > 0, or set reward.normalize to none or batch)"
        )
    return {"mean": float(stats["mean"]), "std": float(stats["std"])}


# ---- the run ---------------------------------------------------------------------------------------------
def seeded_generator(device: torch.device, *parts: object) -> torch.Generator:
    """A generator seeded from ``parts`` (seed, purpose, step, rank): resumed runs draw the same numbers."""
    return torch.Generator(device=device).manual_seed(stable_hash(":".join(map(str, parts))) % 2**63)


@dataclass
class PPORun:
    """Everything one PPO run holds."""

    cfg: PPOConfig
    roles: Roles
    """the unwrapped models (generation, scoring, saving)"""
    train_roles: Roles
    """actor and critic DDP-wrapped when distributed (the update); the sharded roles themselves under fsdp"""
    parts: dict[str, torch.nn.Module]
    """the trained modules, by optimiser: the actor's LM and the critic (or the shared value head)"""
    optimizers: dict[str, torch.optim.Optimizer]
    schedulers: dict[str, Any]
    kl_ctl: AdaptiveKLController | FixedKLController
    norm_stats: dict[str, float] | None
    tokenizer: Any
    prompts: PromptSet
    heldout: PromptSet
    task: Any
    scorer: Scorer
    ptx_examples: list[dict[str, list[int]]]
    device: torch.device


def build_models(cfg: PPOConfig, info: dist.DistInfo) -> tuple[Roles, Any]:
    """(roles, tokenizer): the four models, sharded in place under fsdp (before the optimisers are built on
    their parameters)."""
    if info.world_size > 1 and cfg.ptx.coef and cfg.critic == "shared":
        raise UserError("ptx with critic=shared is single-process only; use critic=reward_model or sft")
    roles = build_roles(cfg, info.device)
    tokenizer = load_tokenizer(cfg.tokenizer or cfg.model, trust_remote_code=cfg.trust_remote_code)
    check_vocab(roles.actor, tokenizer, "tokenizer" if cfg.tokenizer else "model")
    if cfg.run.parallel == "fsdp":
        for model in (roles.actor, roles.critic, roles.reference, roles.reward_model):
            if model is not None:  # (the reward model's score runs it too)
                methods = ("score",) if hasattr(model, "score") else ()
                dist.wrap_model(model, info, "fsdp", forward_methods=methods)
    return roles, tokenizer


def build_ppo_run(cfg: PPOConfig, info: dist.DistInfo) -> PPORun:
    """Load and check everything a run needs (models, tokenizer, prompts, reward functions, ptx data) before
    the run folder is touched."""
    roles, tokenizer = build_models(cfg, info)
    check_backend(roles.policy, cfg.sampling.backend)
    cfg = fit_lengths(cfg, roles.actor)
    parts = trainable_parts(roles)
    optimizers, schedulers = {}, {}
    for name, optim in (("actor", cfg.optim), ("critic", cfg.critic_optim)):
        optimizers[name], schedulers[name] = make_optimizer(parts[name], optim, cfg.run.steps)
    train_roles = roles  # fsdp: the sharded roles themselves
    if cfg.run.parallel == "ddp":
        critic = None if roles.critic is None else dist.wrap_ddp(roles.critic, info)
        train_roles = Roles(dist.wrap_ddp(roles.actor, info), critic, roles.reference, roles.reward_model)
    if cfg.kl.target is not None:
        kl_ctl: AdaptiveKLController | FixedKLController
        kl_ctl = AdaptiveKLController(cfg.kl.beta, cfg.kl.target, cfg.kl.horizon)
    else:
        kl_ctl = FixedKLController(cfg.kl.beta)
    norm_stats, task = None, None
    if cfg.env.id is not None:  # episodes: seeds for prompts, the environment's rewards
        prompts, heldout = episode_prompts(cfg)
    else:
        prompts, heldout = _load_prompts(cfg, tokenizer)
        norm_stats, task = read_norm_stats(cfg), load_task(cfg)
    return PPORun(
        cfg, roles, train_roles, parts, optimizers, schedulers, kl_ctl, norm_stats, tokenizer,
        prompts, heldout, task, make_scorer(cfg, roles, info.device),
        load_ptx_examples(cfg, tokenizer), info.device,
    )  # fmt: skip


def fit_lengths(cfg: PPOConfig, actor: Any) -> PPOConfig:
    """``cfg`` with its length ceilings clipped to the actor's context (each clip logged): max_prompt_length
    to the context less sampling.max_new_tokens, so that prompt + response fit, and ptx.max_length to it."""
    t = cfg.sampling.max_new_tokens
    p = fit_context(actor, cfg.max_prompt_length, "max_prompt_length", t, f"sampling.max_new_tokens ({t})")
    ptx = cfg.ptx
    if ptx.coef:
        ptx = replace(ptx, max_length=fit_context(actor, ptx.max_length, "ptx.max_length"))
    return replace(cfg, max_prompt_length=p, ptx=ptx)


def export_models(run: PPORun, run_dir: Path) -> None:
    """Called by every rank: rank 0 writes the policy to ``RUN_DIR/model`` and a separate critic to
    ``RUN_DIR/critic`` (their weights gathered first under fsdp)."""
    export_on_main(run.roles.policy, run.tokenizer, run_dir / "model")
    critic, cfg = run.roles.critic, run.cfg
    if critic is None:
        return
    if dist.is_sharded(critic):  # rank 0 loads the gathered weights into an unsharded copy
        weights = dist.model_state_dict(critic)  # a collective: the full tensors on rank 0, {} elsewhere
        if dist.is_main():
            source = cfg.reward_model if cfg.critic == "reward_model" else cfg.model
            dtype = resolve_dtype(cfg.run.dtype, "run.dtype")
            critic = ScalarHeadModel.from_pretrained(source, dtype=dtype, new_head=True, seed=cfg.run.seed)
            critic.load_state_dict(weights)
    if dist.is_main():  # atomically, like every export: a kill leaves the old folder or the new one
        pad = run.tokenizer.pad_token_id
        write_dir_atomically(run_dir / "critic", lambda tmp: critic.save_pretrained(tmp, "value", pad))
    dist.barrier()


def summarize(history: list[dict[str, float]], totals: dict[str, float], steps: int, beta: float) -> dict:
    """The run's summary: the last and first held-out evaluation, throughput and time per phase."""
    last, first = (history[-1], history[0]) if history else ({}, {})
    names = {"heldout_gold_reward": "gold_reward", "heldout_rm_score": "rm_score", "heldout_kl": "kl_to_ref"}
    names |= {"heldout_kl_k3": "kl_k3", "heldout_length": "response_length"}
    t = totals
    return {
        **{new: last.get(old) for old, new in names.items()},
        **{f"start_{new}": first.get(old) for old, new in names.items()},
        "steps": steps,
        "beta": beta,
        "seconds_per_step": (t.get("generate", 0) + t.get("score", 0) + t.get("train", 0)) / max(1, steps),
        "time_generate": t.get("generate", 0.0),
        "time_score": t.get("score", 0.0),
        "time_train": t.get("train", 0.0),
        "tokens_per_second": t.get("tokens", 0.0)
        / max(t.get("tokens_seconds", t.get("generate", 0.0)), 1e-9),
        "heldout": history,
    }


def plot_run(run_dir: Path) -> None:
    """``curves.png`` (per-step training metrics) and ``heldout.png`` (RM score, gold reward, KL over training:
    over-optimisation shows as the RM score rising while the gold reward falls)."""
    rows = read_jsonl(run_dir / "metrics.jsonl")
    heldout = ["heldout_rm_score", "heldout_gold_reward", "heldout_kl", "heldout_length"]
    heldout += ["heldout_return", "heldout_success", "heldout_turns"]  # episodes (env.id)
    plot_curves(
        [r for r in rows if any(k in r for k in heldout)], heldout, run_dir / "heldout.png", title="held-out"
    )
    train = ["rm_score", "gold_reward", "env_return", "success", "kl_to_ref", "entropy", "clip_fraction"]
    train += ["approx_kl", "explained_variance"]
    plot_curves([r for r in rows if "kl_to_ref" in r], train, run_dir / CURVES, title="PPO training batches")
