"""GRPO and PPO over episodes of a text environment under torchrun, run by the tests with 1 process or 2.

``python -m torch.distributed.run --standalone --nproc_per_node 2 agents_run.py MODEL_DIR OUT_DIR``:

1. the same global batch of 8 episodes of a countdown of 1 or 3 turns on every rank (2 seeds × 4, played with
   one fixed generator); each rank keeps its share of rows (whole groups for GRPO) and
   - GRPO with per-turn credit: its groups' `turn_group_advantages`, μ = 2 passes of `optimise_grpo` with 2
     micro-batches, β 0.04; rank 0 saves the policy to ``OUT_DIR/grpo.safetensors``;
   - PPO: `make_turn_batch` (values at the turn boundaries, GAE over turns, advantages whitened over all ranks)
     and 2 epochs of `optimise_ppo` with 2 micro-batches (the value loss's mean over all ranks' boundaries);
     rank 0 saves actor and critic to ``OUT_DIR/ppo_{actor,critic}.safetensors``;
2. a 2-step ``run_grpo`` and a 2-step ``run_ppo`` with ``env.id`` guess_number into ``OUT_DIR/{grpo,ppo}_run`` (episodes split
   across ranks, checkpoint and export by rank 0).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import save_model

from postrl.core import turn_group_advantages, turns_to_tokens
from postrl.lm.agents import EpisodeBudget, TextEnv
from postrl.lm.agents.config import EnvConfig
from postrl.lm.agents.rollout import TurnRollout, sample_episodes
from postrl.lm.grpo import GRPOConfig, GRPOLossConfig, optimise_grpo, run_grpo
from postrl.lm.models import load_causal_lm
from postrl.lm.ppo import PPOConfig, PPOLossConfig, optimise_ppo, run_ppo
from postrl.lm.ppo.advantages import KLConfig
from postrl.lm.ppo.build import build_roles, trainable_parts
from postrl.lm.ppo.episodes import make_turn_batch
from postrl.lm.roles import Roles
from postrl.lm.rollout import Rollout, SamplingConfig, score
from postrl.lm.rollout.batch import RolloutBatch
from postrl.lm.spine import RunConfig
from postrl.lm.tokenizer import load_tokenizer
from postrl.lm.trainer import OptimConfig
from postrl.runtime import distributed as dist

G, SEEDS = 4, (3, 5)
ENV = EnvConfig("guess_number", {"high": 8}, n_train=8, n_eval=2, max_turns=3, max_tokens=12)
SAMPLING = SamplingConfig(max_new_tokens=4, temperature=1.0)
OPTIM = OptimConfig(lr=2e-4, warmup_steps=0, min_lr_ratio=1.0)
RUN = RunConfig(steps=2, eval_every=2, save_every=2, log_every=1, device="cpu", threads=1)


class Countdown(TextEnv):
    """1 + seed mod 3 turns (seed 3: one, seed 5: three, the last cut by the token budget), so the ranks hold
    different numbers of turns per token; a turn's reward is its reply's length in characters mod 3."""

    def reset(self, seed=None, options=None):
        self.left = 1 + seed % 3
        return [{"role": "user", "content": "count down"}], {}

    def step(self, action):
        self.left -= 1
        return f"{self.left} to go", float(len(action) % 3), self.left == 0, False, {}


def global_episodes(model: torch.nn.Module, tokenizer) -> TurnRollout:
    """The step's 8 episodes (G contiguous per seed), identical on every rank."""
    seeds = [s for s in SEEDS for _ in range(G)]
    envs = [Countdown() for _ in seeds]
    budget = EpisodeBudget(max_turns=3, max_tokens=10)
    out = sample_episodes(
        model.eval(), tokenizer, envs, SAMPLING, budget, torch.Generator().manual_seed(0), seeds
    )
    model.train()
    return out


def share(out: TurnRollout, rows: list[int]) -> tuple[Rollout, TurnRollout]:
    """This rank's rows of the global episodes, as a `Rollout` (response: all after the prompt) and as turns."""
    i, P = torch.tensor(rows), out.prompt_len
    turns = TurnRollout(
        out.input_ids[i], out.attention_mask[i], P, out.action_mask[i], out.log_probs[i], out.token_turns[i],
        out.turn_rewards[i], out.turn_mask[i], out.terminated[i], [out.episodes[r] for r in rows],
    )  # fmt: skip
    ids = turns.input_ids
    rollout = Rollout(
        ids, turns.attention_mask, P, ids[:, P:], turns.action_mask, turns.log_probs, turns.terminated
    )
    return rollout, turns


def grpo_update(model_dir: Path, info: dist.DistInfo, parallel: str = "ddp") -> torch.nn.Module:
    """This rank's whole groups through per-turn credit and `optimise_grpo` (μ = 2, grad_accum 2, β 0.04); the
    policy replicated (``parallel=ddp``) or sharded in place (``fsdp``)."""
    tokenizer = load_tokenizer(model_dir)
    model, ref = load_causal_lm(model_dir), load_causal_lm(model_dir).eval()
    groups = list(dist.shard_range(len(SEEDS), info))
    rollout, turns = share(global_episodes(model, tokenizer), [g * G + j for g in groups for j in range(G)])
    ids, mask, P = rollout.input_ids, rollout.attention_mask, rollout.prompt_len
    with torch.no_grad():
        old, ref_lp = score(model, ids, mask, P), score(ref, ids, mask, P)
    per_turn = turn_group_advantages(turns.turn_rewards, turns.turn_mask, G, scale=False, leave_one_out=True)
    advantages = turns_to_tokens(per_turn, turns.token_turns)
    batch = RolloutBatch(ids, mask, P, rollout.response_mask, old, advantages, ref_lp)
    cfg = GRPOLossConfig(group_size=G, prompts_per_step=len(SEEDS), epochs=2, grad_accum=2, beta=0.04)
    policy = dist.wrap_model(model, info, parallel)  # fsdp: sharded in place, before the optimiser is built
    # SGD: the weights after the update are linear in the gradients (Adam's first steps are ≈ sign(g))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimise_grpo(policy, optimizer, batch, cfg, 1.0, ENV.max_tokens, 1.0)
    return model


def ppo_config(model_dir: Path) -> PPOConfig:
    return PPOConfig(
        model=str(model_dir), reward_model=None, critic="sft", env=ENV, sampling=SAMPLING, batch_size=4,
        ppo=PPOLossConfig(epochs=2, grad_accum=2), kl=KLConfig(beta=0.1), optim=OPTIM, critic_optim=OPTIM,
        run=RUN, plots=False,
    )  # fmt: skip


def ppo_update(model_dir: Path, info: dist.DistInfo, parallel: str = "ddp") -> dict[str, torch.nn.Module]:
    """This rank's rows through `make_turn_batch` (global whitening) and `optimise_ppo` (2 epochs, grad_accum 2),
    actor and critic replicated (``parallel=ddp``) or sharded in place (``fsdp``)."""
    cfg = ppo_config(model_dir)
    roles = build_roles(cfg, info.device)
    out = global_episodes(roles.actor, load_tokenizer(model_dir))
    rollout, turns = share(out, list(dist.shard_range(len(SEEDS) * G, info)))
    batch, _ = make_turn_batch(roles, rollout, turns, temperature=1.0, beta=0.1, gamma=0.9, advantage=cfg.gae)
    actor, critic = (dist.wrap_model(m, info, parallel) for m in (roles.actor, roles.critic))
    parts = trainable_parts(roles)
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.1) for k, m in parts.items()}
    params = {k: [p for p in m.parameters() if p.requires_grad] for k, m in parts.items()}
    train_roles = Roles(actor, critic, roles.reference, None)
    optimise_ppo(train_roles, batch, cfg, opts, params, torch.Generator().manual_seed(info.rank))
    return parts


def grpo_config(model_dir: Path) -> GRPOConfig:
    return GRPOConfig(
        model=str(model_dir), env=replace(ENV, credit="turn"), sampling=SAMPLING,
        grpo=GRPOLossConfig(group_size=G, prompts_per_step=2, beta=0.04), optim=OPTIM, run=RUN,
    )  # fmt: skip


def main(model_dir: Path, out: Path) -> None:
    info = dist.init_distributed("cpu")
    model = grpo_update(model_dir, info)
    parts = ppo_update(model_dir, info)
    if info.is_main:
        save_model(model, str(out / "grpo.safetensors"))
        for name, module in parts.items():
            save_model(module, str(out / f"ppo_{name}.safetensors"))
    run_grpo(grpo_config(model_dir), out / "grpo_run")
    run_ppo(ppo_config(model_dir), out / "ppo_run")
    dist.cleanup()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
