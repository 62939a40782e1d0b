"""GRPO's data: the prompt stream and the sampling and scoring phase of a step (`postrl.lm.grpo`).

`collect` turns B global prompts into this rank's training `postrl.lm.rollout.RolloutBatch`: it samples G
responses per prompt from π_old, rewards them (plus the DAPO overlong penalty), refills zero-variance groups
under dynamic sampling, scores log π_old (μ > 1) and log π_ref (β > 0) teacher-forced, and computes the group
advantages.
`evaluate_grpo_heldout` samples the held-out prompts greedily and at the training temperature and rewards them.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from postrl.core import group_advantages, overlong_penalty, reinforce_pp_advantages, rloo_advantages
from postrl.lm.grpo.config import GRPOConfig, GRPOLossConfig, is_correction
from postrl.lm.grpo.engine import GRPOEngine, Sampled
from postrl.lm.grpo.objective import behaviour_correction
from postrl.lm.rewards import (
    Phase,
    RewardFunction,
    TrainerState,
    columns_of,
    combine,
    completion_ids_of,
    reward_terms,
)
from postrl.lm.rollout import Rollout
from postrl.lm.rollout.batch import RolloutBatch
from postrl.runtime import distributed as dist


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


# ---- sampling and scoring -----------------------------------------------------------------------------------
@dataclass
class Run:
    """What one GRPO run holds: the config, the models, the reward functions, and the policy's side of a step
    (`postrl.lm.grpo.engine`: a causal LM's or a VLM's sampling, scoring and forward, with its prompts)."""

    cfg: GRPOConfig
    policy: torch.nn.Module
    """the policy (DDP-wrapped or FSDP-sharded when distributed)"""
    ref: torch.nn.Module | None
    tokenizer: Any
    fns: list[RewardFunction]
    engine: GRPOEngine
    device: torch.device

    @property
    def inner(self) -> torch.nn.Module:
        return dist.unwrap(self.policy)


def _rewards(run: Run, sampled: Sampled, step: int, phase: Phase) -> dict[str, Tensor]:
    """Checked reward terms of each function (name → [N]) for the sampled completions (`sampled_terms`); those
    the generation lane computed when it sampled them (lanes.rewards), as they are."""
    if sampled.terms is not None:
        return sampled.terms
    return sampled_terms(run.fns, sampled, run.engine.hidden_columns, step, run.cfg.run.steps, phase)


def sampled_terms(
    fns: list[RewardFunction], sampled: Sampled, hidden: Any, step: int, max_steps: int, phase: Phase
) -> dict[str, Tensor]:
    """Each reward function's checked terms (name → [N]) for ``sampled``, called as TRL calls them: prompts,
    completions, completion_ids, trainer_state, columns (less ``hidden``). ``step``: the optimizer steps taken
    (TrainerState.global_step), in training and at evaluation alike, as TRL passes them. The training lane and
    the generation lane (`postrl.lm.grpo.lanes`) both call this."""
    state = TrainerState(global_step=step, max_steps=max_steps)
    rollout, rows = sampled.rollout, sampled.rows
    ids = completion_ids_of(rollout.response_ids, rollout.response_mask)
    prompts = [r["prompt"] for r in rows]
    return reward_terms(
        fns, prompts, sampled.texts, columns_of(rows, hidden), completion_ids=ids, trainer_state=state,
        phase=phase,
    )  # fmt: skip


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
    inputs: Any = None
    """the rows' model inputs besides the tokens (`Sampled.inputs`)"""


def _sample_round(run: Run, indices: list[int], step: int, round_: int, timers: dict[str, float]) -> _Round:
    g, sampling = run.cfg.grpo, run.cfg.sampling
    start = time.perf_counter()
    sampled = run.engine.sample(
        "train", indices, g.group_size, sampling, ("train", step, dist.rank(), round_)
    )
    rollout = sampled.rollout
    middle = time.perf_counter()
    terms = _rewards(run, sampled, step, "training")
    # an episode's response is all its turns: its budget is env.max_tokens, not one reply's max_new_tokens
    max_len = run.cfg.env.max_tokens if run.cfg.env.id is not None else sampling.max_new_tokens
    rewards = combine(run.fns, terms) + overlong_penalty(
        rollout.response_lengths, max_len, g.overlong_buffer, g.overlong_penalty
    )
    groups = rewards.view(-1, g.group_size)  # (n/G, G)
    informative = ~(groups == groups[:, :1]).all(-1)
    timers["time_generate"] += middle - start
    timers["time_reward"] += time.perf_counter() - middle
    return _Round(rollout, rewards, terms, informative, sampled.inputs)


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
    if len(rounds) == 1 and chosen == [(0, k) for k in range(rounds[0].informative.numel())]:
        # every row of the only round, in order: nothing to gather
        return rounds[0].rollout, rounds[0].rewards
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
    tokenizer = getattr(run.tokenizer, "tokenizer", run.tokenizer)  # a VLM's processor holds its tokenizer
    return _merge(parts, tokenizer.pad_token_id), torch.cat(rewards)


# ---- advantages (grpo.advantage): each maps rewards [n·G], the G responses of a prompt contiguous, to [n·G] --
def _grpo(rewards: Tensor, g: GRPOLossConfig) -> Tensor:
    """(r − mean_g) / (std_g + adv_eps), the std only with scale_rewards (DeepSeekMath, Shao et al. 2024)."""
    return group_advantages(rewards, g.group_size, g.adv_eps, scale=g.scale_rewards)


def _dr_grpo(rewards: Tensor, g: GRPOLossConfig) -> Tensor:
    """r − mean_g, never divided by the std (Dr. GRPO, Liu et al. 2025)."""
    return group_advantages(rewards, g.group_size, g.adv_eps, scale=False)


def _rloo(rewards: Tensor, g: GRPOLossConfig) -> Tensor:
    """r_i − mean of the other G − 1 rewards of the group (RLOO, Ahmadian et al. 2024)."""
    return rloo_advantages(rewards, g.group_size)


def _reinforce_pp(rewards: Tensor, g: GRPOLossConfig) -> Tensor:
    """r − mean_g, whitened over the whole step's batch (REINFORCE++-baseline, Hu 2025). With several ranks
    the whitening's mean and variance are those of every rank's rows: the ranks' rewards (each rank holds the
    same number of whole groups, rank r the global rows r·n … r·n + n − 1) are gathered into the global
    vector, its advantages computed as one process would, and this rank's share returned."""
    n, world, rank = rewards.numel(), dist.world_size(), dist.rank()
    everything = torch.zeros(world * n, dtype=rewards.dtype, device=rewards.device)
    everything[rank * n : (rank + 1) * n] = rewards  # zeros elsewhere: the sum over ranks is exact
    everything = dist.all_reduce_sum(everything)
    return reinforce_pp_advantages(everything, g.group_size)[rank * n : (rank + 1) * n]


ADVANTAGES = {"grpo": _grpo, "dr_grpo": _dr_grpo, "rloo": _rloo, "reinforce_pp": _reinforce_pp}


def compute_advantages(rewards: Tensor, g: GRPOLossConfig) -> Tensor:
    """[n·G] advantages of [n·G] rewards by the estimator ``g.advantage`` (`ADVANTAGES`); detached."""
    return ADVANTAGES[g.advantage](rewards, g)


def collect(run: Run, stream: PromptStream, step: int) -> tuple[RolloutBatch, dict[str, float], Any]:
    """Sample this rank's groups (with dynamic-sampling refills), reward them, and build the training batch;
    returns it, the step's sampling metrics and the rows' model inputs besides the tokens (`Sampled.inputs`)."""
    g = run.cfg.grpo
    local = g.prompts_per_step // dist.world_size()
    seen = None if g.repeat_prompts else set()
    timers = {"time_generate": 0.0, "time_reward": 0.0, "time_score": 0.0}
    rounds: list[_Round] = []
    for round_ in range(1 + (g.max_refills if g.dynamic_sampling else 0)):
        chosen = stream.take(g.prompts_per_step, seen)  # the same global prompts on every rank
        mine = [chosen[i] for i in dist.shard_range(len(chosen))]  # as `lanes.step_prompts` draws them
        rounds.append(_sample_round(run, mine, step, round_, timers))
        short = max(0, local - sum(int(r.informative.sum()) for r in rounds))
        if not g.dynamic_sampling or dist.all_reduce_sum(torch.tensor(short)).item() == 0:
            break
    rollout, rewards = _gather(run, rounds, _select(rounds, local, g.dynamic_sampling))
    inputs = rounds[0].inputs
    if inputs is not None and g.dynamic_sampling:  # the rows' inputs follow round 0's rows in order
        raise RuntimeError("dynamic sampling with per-row model inputs (a VLM's pictures) is not supported")
    start = time.perf_counter()
    old_log_probs, ref_log_probs, is_weights, behaviour = rollout.log_probs, None, None, {}
    correction = is_correction(run.cfg)
    # one update per batch: the loss's own forward gives π_old, and the weights π_old/μ (`objective.loss_of`)
    on_the_fly = correction != "none" and g.epochs == 1 and g.minibatches == 1
    with torch.no_grad():
        if (g.epochs > 1 or correction != "none") and not on_the_fly:
            # re-score: the first pass has ratio exactly 1 ("Old log-probs", algorithm.py); the sampler's
            # log-probs stay the behaviour policy's
            old_log_probs = run.engine.log_probs("old", rollout, inputs)
            is_weights, behaviour = behaviour_correction(
                replace(g, is_correction=correction), old_log_probs, rollout.log_probs, rollout.response_mask
            )
            behaviour = {k: float(v) for k, v in behaviour.items()}
        if run.ref is not None:
            ref_log_probs = run.engine.log_probs("ref", rollout, inputs)
    timers["time_score"] += time.perf_counter() - start
    advantages = compute_advantages(rewards, g).to(rollout.input_ids.device)
    if hasattr(run.engine, "credit"):  # an engine that credits tokens itself (episodes: per turn)
        advantages = run.engine.credit(rollout, advantages, inputs)
    n = rollout.input_ids.shape[0]
    batch = RolloutBatch(
        rollout.input_ids, rollout.attention_mask, rollout.prompt_len, rollout.response_mask, old_log_probs,
        advantages, ref_log_probs, row_ids=None if inputs is None else torch.arange(n, device=advantages.device),
        is_weights=is_weights, behaviour_log_probs=rollout.log_probs if on_the_fly else None,
    )  # fmt: skip
    metrics = {**_rollout_metrics(run, rounds), **behaviour, **timers, "refill_rounds": len(rounds) - 1}
    return batch, metrics, inputs


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
        out[f"reward/{fn.name}"] = float(torch.cat([r.terms[fn.name] for r in rounds]).nanmean())  # None: NaN
    accuracy = [_accuracy(run, r.terms) for r in rounds]
    if accuracy[0] is not None:
        out["accuracy"] = float(torch.cat(accuracy).mean())  # type: ignore[arg-type]
    return out


# ---- evaluation ---------------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate_grpo_heldout(run: Run, step: int, batch_size: int = 256) -> dict[str, float]:
    """Held-out greedy and sampled (pass@1, one sample per prompt at the training temperature) reward, and
    accuracy where a verifier exists, after ``step`` optimizer steps (the reward functions' trainer_state).
    Every rank evaluates the same prompts (only rank 0 logs)."""
    n = run.engine.prompt_count("heldout")
    out: dict[str, float] = {}
    if n == 0:
        return out
    modes = {"": replace(run.cfg.sampling, greedy=True), "_sampled": replace(run.cfg.sampling, greedy=False)}
    for suffix, sampling in modes.items():
        rewards, accuracy = [], []
        for start in range(0, n, batch_size):
            indices = list(range(start, min(n, start + batch_size)))
            sampled = run.engine.sample("heldout", indices, 1, sampling, ("eval", start))
            terms = _rewards(run, sampled, step, "evaluation")
            rewards.append(combine(run.fns, terms))
            acc = _accuracy(run, terms)
            if acc is not None:
                accuracy.append(acc)
        out[f"heldout_reward{suffix}"] = float(torch.cat(rewards).mean())
        if accuracy:
            out[f"heldout_accuracy{suffix}"] = float(torch.cat(accuracy).mean())
            if not suffix:
                out |= run.engine.accuracy_breakdown(torch.cat(accuracy))
    return out
