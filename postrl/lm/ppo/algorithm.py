"""`postrl ppo`: PPO-based RLHF with the four roles of the notes' section 5 (Ouyang et al. 2022; Ziegler et al.
2019; defaults of "The N+ implementation details of RLHF with PPO", Huang et al. 2024).

    actor      the policy π_θ, initialised from the SFT model, trained
    critic     V_φ: a copy of the reward model (default), a new head on the SFT trunk, or a value head
               sharing the actor's trunk; trained
    reward     the frozen reward model (its score on the last response token), or rule-based reward
               functions with GRPO's interface (`postrl.lm.rewards`)
    reference  a frozen copy of the SFT policy: the KL penalty −β(log π − log π_ref) on every token

One step: (1) generate with the rollout engine and keep the sampling log-probs; (2) score, shape rewards
with the KL penalty, compute values and GAE (`advantages.py`); (3) several epochs over minibatches of
the clipped policy loss, the (clipped) value loss, an entropy bonus and an optional pretraining (ptx)
loss. All four models run with dropout off and positions from the attention mask; log-probs of actor
and reference both use the sampling temperature. :class:`PPO` is this step as an algorithm of the loop every
LM trainer shares (`postrl.lm.spine`: logging, evaluation, checkpoints, exact resume); the configs are in
`config.py`, the set-up, held-out evaluation and export in `build.py`.

Under torchrun each rank samples its share of a step's prompts with its own generator; scores and advantages
are whitened and losses normalised over all ranks, so an update equals one process's on the same global batch
when ppo.minibatches = 1 (minibatches are shuffled within each rank); under torchrun an epoch's short last
batch is skipped (each rank needs a full share); one process trains on it, in fewer minibatches if it has
fewer rows.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import postrl.lm.ppo.episodes as episodes
from postrl.core import entropy_from_logits, masked_mean, ppo_clip_loss, value_loss
from postrl.lm import onpolicy
from postrl.lm.evaluation import evaluate_heldout
from postrl.lm.models import position_ids_from_mask
from postrl.lm.onpolicy import Term
from postrl.lm.ppo.advantages import make_batch
from postrl.lm.ppo.build import (
    PPORun,
    build_ppo_run,
    export_models,
    plot_run,
    seeded_generator,
    summarize,
)
from postrl.lm.ppo.config import PPOConfig, PPOLossConfig, check_ppo_config
from postrl.lm.ppo.lanes import PPOLane, PromptOrder, mine
from postrl.lm.recipe import Setup, run_recipe
from postrl.lm.rewards import TrainerState
from postrl.lm.roles import Roles
from postrl.lm.rollout import Rollout, RolloutEngine, response_forward, token_log_probs
from postrl.lm.rollout.batch import RolloutBatch
from postrl.lm.spine import LoopState, Parts
from postrl.lm.trainer import iterate_batches, make_batches, sft_step_loss, to_device
from postrl.runtime import distributed as dist


# ---- the loss --------------------------------------------------------------------------------------------
def policy_forward(
    roles: Roles, mb: RolloutBatch, temperature: float, with_entropy_grad: bool
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
    roles: Roles, mb: RolloutBatch, cfg: PPOLossConfig, temperature: float, value_weight: float = 1.0
) -> tuple[Tensor, dict[str, Tensor]]:
    """A minibatch → (loss, stats): clipped policy loss + value_weight · vf_coef · value loss − ent_coef ·
    entropy, each a mean over the response tokens (the value loss over ``mb.value_mask`` when it is set: the
    turn boundaries of episodes). ``value_weight`` rescales the value term when its positions are not the
    response tokens (`PPOObjective`: a micro-batch's share of the boundaries over its share of the tokens)."""
    mask = mb.response_mask
    value_mask = mask if mb.value_mask is None else mb.value_mask
    log_probs, entropy, values = policy_forward(roles, mb, temperature, cfg.ent_coef != 0)
    pg_loss, stats = ppo_clip_loss(log_probs, mb.old_log_probs, mb.advantages, cfg.clip_eps, mask)
    clipped = {"old_values": mb.values, "clip_eps": cfg.vf_clip} if cfg.vf_clip is not None else {}
    vf_loss = value_loss(values, mb.returns, value_mask, **clipped)
    entropy_mean = masked_mean(entropy, mask)
    loss = pg_loss + value_weight * cfg.vf_coef * vf_loss - cfg.ent_coef * entropy_mean
    return loss, {
        "policy_loss": pg_loss.detach(),
        "value_loss": vf_loss.detach(),
        "entropy": entropy_mean.detach(),
        **stats,
    }


# ---- the update ------------------------------------------------------------------------------------------
class PPOObjective:
    """PPO's part of the on-policy update (`postrl.lm.onpolicy.Objective`): each micro-batch's `ppo_loss`
    weighted by its share of the minibatch's (all ranks') response tokens, so the sum is the minibatch's token
    mean; then the ptx loss, when given. Stats averaged over ranks; actor and critic gradients clipped per role
    (over every rank's shard under FSDP; max_grad_norm None: only measured)."""

    def __init__(
        self,
        roles: Roles,
        cfg: PPOLossConfig,
        temperature: float,
        ptx_loss: Callable[[], Tensor] | None = None,
        params: dict[str, list[torch.nn.Parameter]] | None = None,
        max_grad_norms: dict[str, float | None] | None = None,
    ) -> None:
        self.roles, self.cfg, self.temperature, self.ptx_loss = roles, cfg, temperature, ptx_loss
        self.params, self.max_grad_norms = params or {}, max_grad_norms or {}
        self.models = [m for m in (roles.actor, roles.critic) if m is not None]
        self.totals: dict[str, Tensor] = {}

    def terms(self, minibatch: RolloutBatch, micro_batches: Sequence[RolloutBatch]) -> list[Term]:
        tokens = float(dist.all_reduce_sum(minibatch.response_mask.sum().double()))
        # every micro-batch's share of the tokens in one host sync; the stats sum on the device in float64 (the
        # same values as Python floats), read once at the end
        counts = torch.stack([micro.response_mask.sum() for micro in micro_batches]).tolist()
        shares = [float(count) / max(tokens, 1.0) for count in counts]
        weights = [1.0] * len(shares)
        if minibatch.value_mask is not None:  # the value loss's mean is over the boundaries, all ranks'
            boundaries = float(dist.all_reduce_sum(minibatch.value_mask.sum().double()))
            counts = torch.stack([micro.value_mask.sum() for micro in micro_batches]).tolist()
            weights = [
                float(c) / max(boundaries, 1.0) / s if s else 0.0 for c, s in zip(counts, shares, strict=True)
            ]
        self.totals = {}
        terms: list[Term] = [
            functools.partial(self.ppo_part, micro, share, weight)
            for micro, share, weight in zip(micro_batches, shares, weights, strict=True)
        ]
        if self.ptx_loss is not None:
            terms.append(functools.partial(self.ptx_part, self.ptx_loss))
        return terms

    def ppo_part(self, micro: RolloutBatch, share: float, value_weight: float = 1.0) -> Tensor:
        loss, stats = ppo_loss(self.roles, micro, self.cfg, self.temperature, value_weight)
        for key, value in {"loss": loss.detach(), **stats}.items():
            weighted = torch.as_tensor(value, device=loss.device).detach().double() * share
            self.totals[key] = self.totals[key] + weighted if key in self.totals else weighted
        return loss * share * dist.world_size()  # DDP averages over ranks

    def ptx_part(self, ptx_loss: Callable[[], Tensor]) -> Tensor:
        value = ptx_loss()
        self.totals["ptx_loss"] = value.detach().double()
        return value

    def stats(self, total: float) -> dict[str, float]:
        world = dist.world_size()
        return dist.reduce_metrics(
            {k: float(v) * world if k != "ptx_loss" else float(v) for k, v in self.totals.items()}
        )

    def clip(self) -> dict[str, float]:
        return {
            f"{role}_grad_norm": dist.grad_norm(self.params[role], self.max_grad_norms.get(role))
            for role in ("actor", "critic")
        }


def backward_ppo_minibatch(
    roles: Roles,
    mb: RolloutBatch,
    cfg: PPOLossConfig,
    temperature: float,
    ptx_loss: Callable[[], Tensor] | None = None,
) -> dict[str, float]:
    """Accumulate one minibatch's gradient over ``grad_accum`` micro-batches (`postrl.lm.onpolicy`), each
    weighted by its share of the minibatch's (all ranks') response tokens, so the sum is the minibatch's token
    mean; then the ptx loss, when given. Returns the minibatch's stats, averaged over ranks."""
    objective = PPOObjective(roles, cfg, temperature, ptx_loss)
    return onpolicy.backward_minibatch(objective, mb, cfg.grad_accum)


def optimise_ppo(
    roles: Roles,
    batch: RolloutBatch,
    cfg: PPOConfig,
    optimizers: dict[str, torch.optim.Optimizer],
    params: dict[str, list[torch.nn.Parameter]],
    generator: torch.Generator,
    ptx_loss: Callable[[], Tensor] | None = None,
) -> dict[str, float]:
    """``epochs`` passes over ``batch`` in a fresh random row order each (`onpolicy.shuffled_minibatches`),
    ``minibatches`` optimiser steps per pass; gradients clipped per role; returns the stats averaged over the
    optimiser steps."""
    norms = {"actor": cfg.optim.max_grad_norm, "critic": cfg.critic_optim.max_grad_norm}
    objective = PPOObjective(roles, cfg.ppo, cfg.sampling.temperature, ptx_loss, params, norms)
    split = functools.partial(onpolicy.shuffled_minibatches, n=cfg.ppo.minibatches, generator=generator)
    return onpolicy.update(
        objective, list(optimizers.values()), batch, cfg.ppo.epochs, split, cfg.ppo.grad_accum
    )


# ---- the algorithm ---------------------------------------------------------------------------------------
class PPO:
    """PPO-RLHF as an algorithm of `postrl.lm.spine`: a step generates, scores and updates on the next batch of
    prompts; an evaluation samples the held-out prompts. Its checkpointed state: the prompt and ptx positions,
    β of the KL controller, the reward model's score statistics, the held-out history and the time totals."""

    name = "ppo"

    def __init__(self, run: PPORun) -> None:
        self.run = run
        self.position = 0  # batches drawn from the prompt order (skipped ones included)
        self.ptx_position = 0
        self.history: list[dict[str, float]] = []  # held-out evaluations, for the summary
        self.totals: dict[str, float] = {}  # seconds per phase and generated tokens, summed over steps
        self.steps_done = 0  # the step an evaluation reports (it follows a step, or is the one at step 0)
        self.order = PromptOrder(len(run.prompts.rows), run.cfg.batch_size, run.cfg.run.seed)
        self.lane = PPOLane(run) if run.cfg.lanes.enabled else None  # started at the first step
        # the reference's forward, chosen once: it scores every rollout inside `dist.gathered`
        use_fast = run.cfg.sampling.use_fast
        self.reference = response_forward(run.roles.reference, use_fast, gradients=False, gathered=True)

    def next_prompts(self) -> list[int]:
        """The next batch's prompt indices (all ranks'). Under torchrun an epoch's short last batch is skipped:
        each rank needs a full share (`PromptOrder`)."""
        indices = self.order.next()
        self.position = self.order.position
        return indices

    def experience(
        self, step: int, indices: list[int]
    ) -> tuple[RolloutBatch, dict[str, float], Rollout, float]:
        """Generate for this rank's share of ``indices``, score, shape rewards, GAE → (batch, metrics, rollout,
        seconds spent generating)."""
        run, cfg, roles = self.run, self.run.cfg, self.run.roles
        if cfg.env.id is not None:
            return self.episode_experience(step, indices)
        rows = [run.prompts.rows[i] for i in mine(indices)]
        tic = time.perf_counter()
        with dist.gathered(roles.actor, roles.critic, roles.reference, roles.reward_model):  # whole weights
            if self.lane is not None:  # sampled ahead by the generation lane (`postrl.lm.ppo.lanes`)
                rollout = self.lane.take(step, mine(indices)).rollout
                rollout.prompts = [r["prompt"] for r in rows]
            else:
                engine = RolloutEngine(roles.policy, run.tokenizer, cfg.sampling)
                generator = seeded_generator(run.device, cfg.run.seed, "rollout", step, dist.rank())
                rollout = engine.generate([r["prompt"] for r in rows], generator)
            seconds = time.perf_counter() - tic
            batch, metrics = make_batch(
                roles, rollout, run.scorer(rollout, rows, self.trainer_state(step), "training"),
                temperature=cfg.sampling.temperature,
                beta=run.kl_ctl.value, reward=cfg.reward, advantage=cfg.gae, norm_stats=run.norm_stats,
                reference=self.reference,
            )  # fmt: skip
        if run.task is not None:
            gold = torch.tensor(run.task.gold_reward(rollout.prompts, rollout.texts), dtype=torch.float64)
            metrics["gold_reward"] = float(dist.all_reduce_mean(gold.mean()))
        return batch, metrics, rollout, seconds

    def episode_experience(
        self, step: int, indices: list[int]
    ) -> tuple[RolloutBatch, dict[str, float], Rollout, float]:
        """`experience` for env.id: this rank's share of the step's episodes, played by the actor, credited per
        turn (`postrl.lm.ppo.episodes`)."""
        run, cfg, roles = self.run, self.run.cfg, self.run.roles
        seeds = episodes.dist_seeds(run.prompts.rows, indices)
        tic = time.perf_counter()
        with dist.gathered(roles.actor, roles.critic, roles.reference):  # whole weights
            generator = seeded_generator(run.device, cfg.run.seed, "rollout", step, dist.rank())
            rollout, turns = episodes.play(roles.policy, run.tokenizer, cfg, seeds, cfg.sampling, generator)
            seconds = time.perf_counter() - tic
            batch, metrics = episodes.make_turn_batch(
                roles, rollout, turns, temperature=cfg.sampling.temperature, beta=run.kl_ctl.value,
                gamma=cfg.env.gamma, advantage=cfg.gae, reference=self.reference,
            )  # fmt: skip
        return batch, metrics, rollout, seconds

    def trainer_state(self, step: int) -> TrainerState:
        """What the reward functions read as ``trainer_state`` after ``step`` steps (as TRL passes it)."""
        return TrainerState(global_step=step, max_steps=self.run.cfg.run.steps)

    def step(self, step: int) -> dict[str, float]:
        """Generate → score → update on the next batch of prompts; returns the step's metrics."""
        run, cfg = self.run, self.run.cfg
        if self.lane is not None and self.lane.process is None:
            self.lane.start(step, self.position)  # here, not at build: a resumed run starts at its own step
        indices = self.next_prompts()
        t0 = time.perf_counter()
        batch, metrics, rollout, t_generate = self.experience(step, indices)
        t1 = time.perf_counter()
        params = {k: [p for p in m.parameters() if p.requires_grad] for k, m in run.parts.items()}
        order = seeded_generator(torch.device("cpu"), cfg.run.seed, "minibatches", step, dist.rank())
        ptx = self.ptx_loss if run.ptx_examples else None
        metrics.update(optimise_ppo(run.train_roles, batch, cfg, run.optimizers, params, order, ptx))
        if self.lane is not None:  # the new actor to the generation lane: part of the step's training time
            self.lane.published(step + 1)
        t2 = time.perf_counter()
        for sched in run.schedulers.values():
            sched.step()
        tokens = float(dist.all_reduce_sum(rollout.response_mask.sum().double()))
        run.kl_ctl.update(metrics["kl_to_ref"], n_steps=len(indices))
        seconds = {"generate": t_generate, "score": t1 - t0 - t_generate, "train": t2 - t1}
        # tokens per second of sampling; with lanes the sampling is the lane's, unseen here: per second of step
        per = t_generate if self.lane is None else t2 - t0
        for key, value in {**seconds, "tokens": tokens, "tokens_seconds": per}.items():
            self.totals[key] = self.totals.get(key, 0.0) + value
        metrics.update({f"time_{key}": value for key, value in seconds.items()})
        metrics["tokens_per_second"] = tokens / max(per, 1e-9)
        metrics["actor_lr"] = run.schedulers["actor"].get_last_lr()[0]
        self.steps_done = step + 1
        return metrics

    def ptx_loss(self) -> Tensor:
        """The next ptx batch's weighted SFT loss (the pretraining mix of InstructGPT's PPO-ptx)."""
        run, cfg = self.run, self.run.cfg
        batches = iterate_batches(len(run.ptx_examples), cfg.ptx.batch_size, cfg.run.seed, self.ptx_position)
        _, indices = next(batches)
        self.ptx_position += 1
        mine = [run.ptx_examples[indices[i]] for i in dist.shard_range(len(indices))]
        batch = to_device(make_batches(mine, run.tokenizer.pad_token_id), run.device)
        n_tokens = int(dist.all_reduce_sum((batch["labels"][:, 1:] != -100).sum()).item())
        model = run.train_roles.policy if run.train_roles.critic is not None else run.roles.policy
        return cfg.ptx.coef * sft_step_loss(model, batch, n_tokens) * dist.world_size()

    def evaluate(self) -> dict[str, float]:
        """Held-out RM score, gold reward, KL to the reference and length (`evaluate_heldout`, all ranks)."""
        run, cfg, r = self.run, self.run.cfg, self.run.roles
        if cfg.env.id is not None:  # greedy held-out episodes: return, success, turns
            with dist.gathered(r.actor):
                seeds = [int(row["seed"]) for row in run.heldout.rows]
                out = episodes.evaluate_episodes(r.policy, run.tokenizer, cfg, seeds, cfg.run.seed + 1)
            self.history.append({"step": self.steps_done, **out})
            return out
        state = self.trainer_state(self.steps_done)

        def scorer(rollout: Rollout, rows: Sequence[dict[str, Any]]) -> Tensor:
            return run.scorer(rollout, rows, state, "evaluation")

        with dist.gathered(r.actor, r.reference, r.reward_model):
            out = evaluate_heldout(
                r, run.tokenizer, run.heldout, cfg.sampling, scorer, run.task,
                n=cfg.eval_size, seed=cfg.run.seed + 1,
            )  # fmt: skip
        self.history.append({"step": self.steps_done, **out})
        return out

    def bar(self, metrics: dict[str, float]) -> dict[str, float]:
        return {"score": metrics.get("rm_score", metrics.get("env_return")), "kl": metrics["kl_to_ref"]}

    def parts(self) -> Parts:
        run = self.run
        extra = {"position": self.position, "ptx_position": self.ptx_position, "kl": run.kl_ctl.state_dict()}
        extra |= {"reward_norm": run.norm_stats or {}, "history": self.history, "totals": self.totals}
        if self.lane is not None:
            extra["lane"] = self.lane.state()
        return Parts(dict(run.parts), run.optimizers, run.schedulers, extra)

    def load_extra(self, extra: dict[str, Any]) -> None:
        run = self.run
        self.position, self.ptx_position = int(extra["position"]), int(extra["ptx_position"])
        self.history, self.totals = list(extra["history"]), dict(extra["totals"])
        run.kl_ctl.load_state_dict(extra["kl"])
        run.norm_stats = dict(extra["reward_norm"]) or None  # the statistics the run started with
        self.order = PromptOrder(len(run.prompts.rows), run.cfg.batch_size, run.cfg.run.seed, self.position)
        if self.lane is not None and "lane" in extra:
            self.lane.load(extra["lane"])


class PPORecipe:
    """PPO-RLHF as a `postrl.lm.recipe.Recipe`: the four roles, prompts and rewards (`build.build_run`), `PPO`,
    the actor's and critic's export; the policy is evaluated before the first step too."""

    eval_at_start = True

    def check(self, cfg: PPOConfig) -> None:
        check_ppo_config(cfg)
        if cfg.env.id is not None:  # the environment before any model: an unknown id is one error
            episodes.check_env_ppo(cfg)

    def load(self, setup: Setup) -> None:
        run = build_ppo_run(setup.cfg, setup.info)
        setup.cfg = run.cfg  # its length ceilings clipped to the model's context (build.fit_lengths)
        setup.extra["run"] = run

    def build(self, setup: Setup, resumed: bool) -> PPO:
        return PPO(setup.extra["run"])

    def finish(self, setup: Setup, algo: PPO, state: LoopState) -> dict[str, Any]:
        run = algo.run
        if algo.lane is not None:
            algo.lane.stop()
        export_models(run, setup.run_dir)
        if setup.info.is_main and setup.cfg.plots:
            plot_run(setup.run_dir)
        summary = summarize(algo.history, algo.totals, state.step, run.kl_ctl.value)
        if setup.cfg.env.id is not None:  # the held-out episodes' numbers instead of the reward model's
            summary = {k: v for k, v in summary.items() if v is not None}
            summary |= episodes.summarize_episodes(algo.history)
        return summary


def run_ppo(
    cfg: PPOConfig, run_dir: str | Path, resume: bool = False, overwrite: bool = False
) -> dict[str, Any]:
    """Train with PPO-RLHF; writes the run folder (metrics, plots, checkpoints) and ``RUN_DIR/model``;
    returns the summary. Every model, the prompts and the reward functions are loaded and checked before
    the run folder is touched (`postrl.lm.recipe`)."""
    return run_recipe(PPORecipe(), cfg, run_dir, resume=resume, overwrite=overwrite)
