"""Everything a `postrl grpo` run loads and checks before it writes anything (`postrl.lm.grpo`): the config's
consistency, the policy (and reference) model, the tokenizer, the train and held-out prompts, and the reward
functions, signature-checked against the data's columns. The order is the order of the errors a user meets:
the model before its tokenizer, the prompts before the reward functions, the reference last."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from postrl.lm.data import DataError, apply_length_limit, encode_prompts, load_train_heldout, render_rows
from postrl.lm.grpo.config import LANE_UNSENDABLE, GRPOConfig, reward_specs, sampling_engine
from postrl.lm.grpo.engine import Prompts, TextEngine, VLLMEngine, make_vllm_sampler, vllm_options
from postrl.lm.grpo.episodes import EpisodeEngine, check_env_config, episode_prompts
from postrl.lm.grpo.rollouts import Run
from postrl.lm.memory import configure_memory
from postrl.lm.models import (
    adapter_free_reference,
    apply_lora,
    check_vocab,
    fit_context,
    load_causal_lm,
    resolve_dtype,
)
from postrl.lm.rewards import RewardFunction, load_reward_fns
from postrl.lm.rollout.decoders import check_backend
from postrl.lm.rollout.vllm_engine import vllm_available
from postrl.lm.tokenizer import load_tokenizer
from postrl.runtime import distributed as dist
from postrl.runtime.errors import UserError


def check_grpo_config(cfg: GRPOConfig, world: int) -> None:
    """What the value ranges cannot say: relations between keys, and the number of ranks."""
    g = cfg.grpo
    unsendable = [s for s in reward_specs(cfg) if s.startswith(LANE_UNSENDABLE)]
    problems = {
        f"grpo.group_size must be >= 2 (a group of {g.group_size} has no baseline)": g.group_size < 2,
        f"grpo.prompts_per_step={g.prompts_per_step} must be a positive multiple of the {world} ranks": (
            g.prompts_per_step < world or g.prompts_per_step % world != 0
        ),
        "grpo.epochs and grpo.minibatches must be >= 1": g.epochs < 1 or g.minibatches < 1,
        "sampling.greedy must be false for training (a group would be G copies)": cfg.sampling.greedy,
        "grpo.overlong_buffer must be within [0, sampling.max_new_tokens]": not (
            0 <= g.overlong_buffer <= cfg.sampling.max_new_tokens
        ),
        f"run.parallel must be one of {dist.PARALLEL}, got '{cfg.run.parallel}'": (
            cfg.run.parallel not in dist.PARALLEL
        ),
        "lanes.enabled does not sample dynamic_sampling's refill rounds: set grpo.dynamic_sampling=false": (
            cfg.lanes.enabled and g.dynamic_sampling
        ),
        "lanes.rewards=generation loads every reward in the generation lane, and it cannot load "
        f"{', '.join(unsendable)}: set lanes.rewards=training (or auto)": (
            cfg.lanes.enabled and cfg.lanes.rewards == "generation" and bool(unsendable)
        ),
        "lanes.enabled sends whole weights to the generation lane: use run.parallel=ddp or none, not fsdp": (
            cfg.lanes.enabled and cfg.run.parallel == "fsdp"
        ),
        **vllm_problems(cfg, world),
    }
    bad = [message for message, failed in problems.items() if failed]
    if bad:
        raise UserError("; ".join(bad))


def vllm_problems(cfg: GRPOConfig, world: int) -> dict[str, bool]:
    """What sampling.engine=vllm does not run (yet): message → whether this config asks for it."""
    if sampling_engine(cfg) != "vllm":
        return {}
    return {
        "sampling.engine=vllm runs one process: run it without torchrun": world > 1,
        "sampling.engine=vllm samples prompts, not env episodes: unset env.id": cfg.env.id is not None,
        "sampling.engine=vllm pushes whole weights: set run.lora.enabled=false": cfg.run.lora.enabled,
        "sampling.engine=vllm needs vLLM: pip install '.[vllm]' (on CPU: make vllm-venv)": (
            cfg.sampling.vllm_url is None and not vllm_available()  # a server's URL: vLLM runs elsewhere
        ),
        "sampling.vllm_url is a server's: set sampling.vllm_mode=server": (
            cfg.sampling.vllm_url is not None and cfg.sampling.vllm_mode != "server"
        ),
    }


def load_prompts(cfg: GRPOConfig, tokenizer: Any) -> tuple[Prompts, Prompts]:
    """(train, held-out) prompts, rendered with the chat template where conversational, length-limited."""
    rows, heldout = load_train_heldout(cfg.data, "prompts", cfg.eval_data, cfg.task, empty=cfg.empty_rows)
    out = []
    for part in (rows, heldout[: cfg.eval_size]):
        rendered = render_rows(part, "prompts", tokenizer)
        ids = encode_prompts(tokenizer, [r["prompt"] for r in rendered])
        ids, keep = apply_length_limit(ids, cfg.max_prompt_length, cfg.overlong_prompts)
        out.append(Prompts([part[i] for i in keep], ids))
    if not out[0].rows:
        raise DataError(f"{cfg.data}: no prompt fits max_prompt_length={cfg.max_prompt_length}")
    return out[0], out[1]


def reward_fns(cfg: GRPOConfig, rows: list[dict[str, Any]], device: torch.device) -> list[RewardFunction]:
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


def build_grpo_run(cfg: GRPOConfig, info: dist.DistInfo) -> Run:
    """Load and check everything a run needs (models, tokenizer, prompts, reward functions)."""
    if cfg.env.id is not None:  # the environment first: an unknown id is refused before a model loads
        check_env_config(cfg)  # (a picture environment: a text model is refused here)
    load = {
        "dtype": resolve_dtype(cfg.run.dtype, "run.dtype"),
        "device": info.device,
        "trust_remote_code": cfg.trust_remote_code,
    }
    policy = configure_memory(apply_lora(load_causal_lm(cfg.model, **load), cfg.run, rl=True), cfg.run.memory)
    check_backend(policy, cfg.sampling.backend)
    t = (
        cfg.sampling.max_new_tokens
    )  # prompt + response must fit: the prompts' ceiling is clipped to make room
    p = fit_context(policy, cfg.max_prompt_length, "max_prompt_length", t, f"sampling.max_new_tokens ({t})")
    cfg = replace(cfg, max_prompt_length=p)
    tokenizer = load_tokenizer(cfg.tokenizer or cfg.model, trust_remote_code=cfg.trust_remote_code)
    check_vocab(policy, tokenizer, "tokenizer" if cfg.tokenizer else "model")
    if cfg.env.id is not None:  # episodes in a text environment: seeds for prompts, its reward
        train, heldout, fns = episode_prompts(cfg)
    else:
        train, heldout = load_prompts(cfg, tokenizer)
        if len(train.rows) < cfg.grpo.prompts_per_step and not cfg.grpo.repeat_prompts:
            raise UserError(
                f"{cfg.data}: {len(train.rows)} prompts for grpo.prompts_per_step={cfg.grpo.prompts_per_step}; "
                "lower it or set grpo.repeat_prompts=true"
            )
        fns = reward_fns(cfg, train.rows, info.device)
    ref = None
    if cfg.grpo.beta != 0 and cfg.run.lora.enabled and not cfg.ref_model:
        ref = adapter_free_reference(policy)  # the base model: the policy with its adapters disabled
    elif cfg.grpo.beta != 0:  # β = 0: no reference model is loaded at all
        what = "ref_model" if cfg.ref_model else "model"
        ref = load_causal_lm(cfg.ref_model or cfg.model, **load, what=what).eval().requires_grad_(False)
        configure_memory(ref, cfg.run.memory, trained=False)
        if cfg.run.parallel == "fsdp":  # sharded at rest too; scoring gathers it (rollouts.collect)
            ref = dist.wrap_model(ref, info, "fsdp")
    policy = dist.wrap_model(policy, info, cfg.run.parallel)
    args = (cfg, policy, ref, tokenizer, train, heldout, info.device)
    if sampling_engine(cfg) == "vllm":
        if cfg.lanes.enabled:  # the generation lane makes its own vLLM engine
            engine = TextEngine(*args)
        else:
            options = vllm_options(cfg, next(policy.parameters()).dtype)
            engine = VLLMEngine(*args, sampler=make_vllm_sampler(tokenizer, options))
    else:
        engine = (EpisodeEngine if cfg.env.id is not None else TextEngine)(*args)
    return Run(cfg, policy, ref, tokenizer, fns, engine, info.device)
