"""PPO over episodes of a text environment (`postrl ppo --env ID`, issue #35 item 3): the critic evaluated at
the turn boundaries and GAE with the turn as the time step.

    seeds ──sample_episodes(actor)──▶ tokens [B, P+T], action_mask [B, T], turn_rewards r_k [B, K]
          ──reference: log π_ref──▶ r_k − β Σ_{t ∈ turn k} (log π_t − log π_ref,t)        (core.turn_sums)
          ──critic: V [B, T]──▶ V(s_k) = V at turn k's first action token             (core.turn_start_values)
          ──core.turn_gae(γ = env.gamma, λ = gae.lam)──▶ A_k, R̂_k [B, K]
          ──core.turns_to_tokens──▶ A_k on every action token of turn k (whitened over the action tokens of
            all ranks with gae.whiten_advantages), 0 on observation and tool tokens; R̂_k at turn k's first
            action token, where the value loss is taken (`RolloutBatch.value_mask`)

The loss is PPO-RLHF's (`postrl.lm.ppo.algorithm.ppo_loss`): the clipped surrogate and the entropy over action
tokens only (observation tokens are context: no loss, so no gradient), the value loss over the boundaries only.
The KL penalty to the frozen reference is PPO-RLHF's per-token −β(log π − log π_ref), summed over each turn's
tokens into that turn's reward (β from the KL controller, kl.*).

An episode's end is terminal even when a budget or the environment cut it: the policy's state is the whole
conversation, so the turns and tokens used are part of it and no reward follows the end; nothing bootstraps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from postrl.core import (
    kl_estimate,
    kl_shaped_rewards,
    masked_mean,
    masked_sum,
    turn_gae,
    turn_index,
    turn_start_values,
    turn_sums,
    turns_to_tokens,
)
from postrl.lm.agents import check_env, make_env
from postrl.lm.agents.config import HELDOUT_SEED
from postrl.lm.agents.registry import returns_pictures
from postrl.lm.agents.rollout import TurnRollout, sample_episodes
from postrl.lm.evaluation import PromptSet
from postrl.lm.ppo.advantages import (
    GAEConfig,
    explained_variance,
    global_whiten,
    reference_and_values,
    seq_mean,
)
from postrl.lm.ppo.config import PPOConfig
from postrl.lm.roles import Roles
from postrl.lm.rollout import ResponseForward, Rollout, SamplingConfig
from postrl.lm.rollout.batch import RolloutBatch
from postrl.runtime import distributed as dist
from postrl.runtime.errors import UserError


def check_env_ppo(cfg: PPOConfig) -> None:
    """What an episode run refuses before it loads a model: an unknown environment or option (`AgentError`),
    and keys that do not apply to episodes."""
    if returns_pictures(cfg.env.id):
        raise UserError(
            f"env.id={cfg.env.id} observes pictures: postrl ppo trains text policies; train a vision-language"
            " model on it with postrl grpo, or use a text environment"
        )
    check_env(cfg.env.id, cfg.env.options)  # an unknown id or option, a step that raises: one AgentError
    problems = {
        "env.id replaces data and rewards: leave rewards empty (the reward is the environment's)": bool(
            cfg.rewards
        ),
        "env.id with critic=reward_model: the reward is the environment's; set critic=sft (a new value head"
        " on the policy's trunk) or critic=shared": cfg.critic == "reward_model",
        f"env.n_train={cfg.env.n_train} is fewer than batch_size={cfg.batch_size} episodes per step": (
            cfg.env.n_train < cfg.batch_size
        ),
        f"gae.gamma={cfg.gae.gamma} discounts tokens; with env.id the time step is the turn: set env.gamma": (
            cfg.gae.gamma != 1.0
        ),
    }
    bad = [message for message, failed in problems.items() if failed]
    if bad:
        raise UserError("ppo config: " + "; ".join(bad))


def episode_prompts(cfg: PPOConfig) -> tuple[PromptSet, PromptSet]:
    """The (train, held-out) environment seeds as prompt rows."""
    train = PromptSet([{"seed": s} for s in range(cfg.env.n_train)])
    return train, PromptSet([{"seed": HELDOUT_SEED + s} for s in range(cfg.env.n_eval)])


@torch.no_grad()
def play(
    policy: torch.nn.Module,
    tokenizer: Any,
    cfg: PPOConfig,
    seeds: Sequence[int],
    sampling: SamplingConfig,
    generator: torch.Generator,
) -> tuple[Rollout, TurnRollout]:
    """One episode per seed by ``policy`` (in eval mode, put back as it was), as a `Rollout` whose response is
    everything after the first prompt and whose ``response_mask`` marks the action tokens, and as turns."""
    env = cfg.env
    envs = [make_env(env.id, **env.options) for _ in seeds]
    was_training = policy.training
    policy.eval()
    out = sample_episodes(
        policy, tokenizer, envs, sampling, env.budget, generator, list(seeds), kv_cache=env.kv_cache
    )
    policy.train(was_training)
    device = next(policy.parameters()).device
    ids, P = out.input_ids.to(device), out.prompt_len
    rollout = Rollout(
        ids, out.attention_mask.to(device), P, ids[:, P:], out.action_mask.to(device),
        out.log_probs.to(device), out.terminated.to(device),
    )  # fmt: skip
    return rollout, out


def turn_advantages(
    turn_rewards: Tensor,
    turn_mask: Tensor,
    values: Tensor,
    action_mask: Tensor,
    gamma: float,
    gae: GAEConfig,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-turn rewards [B, K] and token values [B, T] → (token advantages [B, T], token returns [B, T],
    value mask [B, T]): `core.turn_gae` on the critic at each turn's first action token, each turn's advantage
    on its action tokens (whitened over all ranks' action tokens when ``gae.whiten_advantages``), each turn's
    return at its first action token, where the value mask is 1. Episodes end terminated (module docstring)."""
    token_turns = turn_index(action_mask)
    turn_values, _ = turn_start_values(values, token_turns, turn_rewards.shape[-1])
    adv, ret = turn_gae(turn_rewards, turn_values, turn_mask, gamma, gae.lam)
    advantages = turns_to_tokens(adv, token_turns)
    if gae.whiten_advantages:
        advantages = global_whiten(advantages, action_mask.to(advantages.dtype))
    starts = first_tokens(action_mask)
    returns = torch.where(starts, turns_to_tokens(ret, token_turns), torch.zeros_like(advantages))
    return advantages, returns, starts.to(action_mask.dtype)


def first_tokens(action_mask: Tensor) -> Tensor:
    """[B, T] bool: the first action token of each turn (where the critic is evaluated)."""
    on = action_mask != 0
    before = torch.cat([torch.zeros_like(on[:, :1]), on[:, :-1]], dim=1)
    return on & ~before


@torch.no_grad()
def make_turn_batch(
    roles: Roles,
    rollout: Rollout,
    turns: TurnRollout,
    *,
    temperature: float,
    beta: float,
    gamma: float,
    advantage: GAEConfig,
    reference: ResponseForward | None = None,
) -> tuple[RolloutBatch, dict[str, float]]:
    """Reference log-probs, values at the turn boundaries, KL-shaped turn rewards and GAE over turns for played
    episodes → (batch, metrics)."""
    action_mask = rollout.response_mask
    ref_log_probs, values = reference_and_values(roles, rollout, temperature, reference=reference)
    turn_rewards, turn_mask = turns.turn_rewards.to(values.device), turns.turn_mask.to(values.device)
    zero = torch.zeros(action_mask.shape[0], device=values.device)
    # −β k1 on every action token (no score: the environment's rewards come per turn)
    kl_penalty = kl_shaped_rewards(zero, rollout.log_probs, ref_log_probs, action_mask, beta)
    token_turns = turn_index(action_mask)
    rewards = turn_rewards + turn_sums(kl_penalty, token_turns, turn_rewards.shape[-1]) * turn_mask
    advantages, returns, value_mask = turn_advantages(
        rewards, turn_mask, values, action_mask, gamma, advantage
    )
    batch = RolloutBatch(
        rollout.input_ids, rollout.attention_mask, rollout.prompt_len, action_mask, rollout.log_probs,
        advantages, values=values, returns=returns, value_mask=value_mask,
    )  # fmt: skip
    return batch, turn_metrics(turns, rollout, ref_log_probs, values, returns, value_mask, beta)


def turn_metrics(
    turns: TurnRollout,
    rollout: Rollout,
    ref_log_probs: Tensor,
    values: Tensor,
    returns: Tensor,
    value_mask: Tensor,
    beta: float,
) -> dict[str, float]:
    """A step's episode metrics (means over all ranks' episodes): return, success, turns, action tokens, KL to
    the reference; the critic's mean and explained variance at the boundaries (this rank's)."""
    m = rollout.response_mask.float()
    k1 = masked_sum(kl_estimate(rollout.log_probs, ref_log_probs, "k1"), m, dim=-1)  # (B,) per episode
    k3 = masked_sum(kl_estimate(rollout.log_probs, ref_log_probs, "k3"), m, dim=-1)
    v = value_mask.float()
    return {
        "env_return": seq_mean(turns.turn_rewards.sum(-1)),
        "success": seq_mean(solved(turns)),
        "turns": seq_mean(turns.turn_mask.sum(-1).float()),
        "kl_to_ref": seq_mean(k1.cpu()),
        "kl_k3": seq_mean(k3.cpu()),
        "beta": beta,
        "response_length": seq_mean(m.sum(-1).cpu()),
        "value_mean": float(masked_mean(values, v)),
        "explained_variance": explained_variance(values, returns, v),
    }


def solved(turns: TurnRollout) -> Tensor:
    """[B] float: 1 for an episode the environment ended with a positive last reward (the goal reached)."""
    n = turns.turn_mask.sum(-1)
    last = turns.turn_rewards.gather(-1, (n - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (turns.terminated.to(last.device) & (last > 0)).float()


@torch.no_grad()
def evaluate_episodes(
    policy: torch.nn.Module, tokenizer: Any, cfg: PPOConfig, seeds: Sequence[int], seed: int
) -> dict[str, float]:
    """Greedy episodes on the held-out seeds (every rank plays them all; rank 0 logs): mean return, success
    rate and turns."""
    if not seeds:
        return {}
    greedy = replace(cfg.sampling, greedy=True)
    generator = torch.Generator(device=next(policy.parameters()).device).manual_seed(seed)
    _, turns = play(policy, tokenizer, cfg, seeds, greedy, generator)
    return {
        "heldout_return": float(turns.turn_rewards.sum(-1).mean()),
        "heldout_success": float(solved(turns).mean()),
        "heldout_turns": float(turns.turn_mask.sum(-1).float().mean()),
    }


def summarize_episodes(history: list[dict[str, float]]) -> dict[str, Any]:
    """The summary's held-out numbers of an episode run: the last and the first evaluation's."""
    last, first = (history[-1], history[0]) if history else ({}, {})
    keys = ("heldout_return", "heldout_success", "heldout_turns")
    return {**{k: last.get(k) for k in keys}, **{f"start_{k}": first.get(k) for k in keys}}


def dist_seeds(rows: Sequence[dict[str, Any]], indices: Sequence[int]) -> list[int]:
    """This rank's share of a step's episode seeds."""
    return [int(rows[indices[i]]["seed"]) for i in dist.shard_range(len(indices))]
