"""Reward model and PPO-RLHF under torchrun, run by the tests with 1 process or 2.

``python -m torch.distributed.run --standalone --nproc_per_node 2 rlhf_run.py MODEL_DIR OUT_DIR``:

1. `run_rm` for 3 steps (a batch of 5 pairs: an uneven share, accumulation) into ``OUT_DIR/rm``: the training
   order does not depend on the ranks, so its weights must equal one process's;
2. one PPO update (2 epochs, micro-batches) on the same global batch of 8 responses, each rank holding 4:
   rank 0 saves actor and critic to ``OUT_DIR/ppo_{actor,critic}.safetensors``;
3. a 2-step `run_ppo` into ``OUT_DIR/ppo`` with the reward model of 1 (sampling, scoring, checkpoint, export).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import save_model

from postrl.lm.ppo import PPOConfig, PPOLossConfig, optimise_ppo, run_ppo
from postrl.lm.ppo.advantages import KLConfig, make_batch
from postrl.lm.ppo.build import build_roles, trainable_parts
from postrl.lm.reward_model import NormConfig, RMConfig, run_rm
from postrl.lm.roles import Roles
from postrl.lm.rollout import Rollout, RolloutEngine, SamplingConfig
from postrl.lm.spine import RunConfig
from postrl.lm.tokenizer import load_tokenizer
from postrl.lm.trainer import OptimConfig, TrainConfig
from postrl.runtime import distributed as dist

PROMPTS = ["Review: the pasta", "Review: the soup at the diner", "Review: the staff", "Review: the view"] * 2


def rm_config(model_dir: Path) -> RMConfig:
    return RMConfig(
        model=str(model_dir),
        data="task:reviews",
        task={"n_pairs_train": 24, "n_pairs_test": 8},
        train=TrainConfig(batch_size=5, grad_accum=2, max_length=48),
        optim=OptimConfig(),
        run=RunConfig(steps=3, eval_every=0, save_every=0, log_every=1, device="cpu"),
        norm=NormConfig(samples=4, max_new_tokens=4),
        plots=False,
    )


def ppo_config(model_dir: Path, rm_dir: Path, **run: object) -> PPOConfig:
    """A 2-step PPO run on the tiny models; ``run``: other `run:` values (e.g. save_every, parallel)."""
    return PPOConfig(
        model=str(model_dir),
        reward_model=str(rm_dir),
        critic="sft",
        data="task:reviews",
        max_prompt_length=32,
        sampling=SamplingConfig(max_new_tokens=6, temperature=0.7),
        batch_size=8,
        ppo=PPOLossConfig(epochs=2, minibatches=1, grad_accum=2),
        kl=KLConfig(beta=0.1),
        optim=OptimConfig(lr=1e-3, warmup_steps=0, min_lr_ratio=1.0),
        critic_optim=OptimConfig(lr=1e-3, warmup_steps=0, min_lr_ratio=1.0),
        run=RunConfig(
            **{"steps": 2, "log_every": 1, "eval_every": 0, "save_every": 0, "device": "cpu", **run}
        ),
        eval_size=4,
        plots=False,
    )


def _rows(rollout: Rollout, rows: list[int]) -> Rollout:
    index = torch.tensor(rows)
    return Rollout(
        rollout.input_ids[index], rollout.attention_mask[index], rollout.prompt_len,
        rollout.response_ids[index], rollout.response_mask[index], rollout.log_probs[index],
        rollout.finished[index], [rollout.texts[i] for i in rows], [rollout.prompts[i] for i in rows],
    )  # fmt: skip


def ppo_update(
    model_dir: Path, rm_dir: Path, info: dist.DistInfo, parallel: str = "ddp"
) -> dict[str, torch.nn.Module]:
    """This rank's share of one global batch through `make_batch` (global whitening) and `optimise_ppo`, actor and
    critic replicated (``parallel=ddp``) or sharded in place (``fsdp``)."""
    cfg = ppo_config(model_dir, rm_dir)
    tokenizer = load_tokenizer(model_dir)
    roles = build_roles(cfg, info.device)
    engine = RolloutEngine(roles.policy, tokenizer, cfg.sampling)
    rollout = engine.generate(PROMPTS, generator=torch.Generator().manual_seed(0))  # the same on every rank
    rows = list(dist.shard_range(len(PROMPTS), info))
    raw = torch.linspace(-1.0, 1.0, len(PROMPTS))[rows]
    batch, _ = make_batch(
        roles, _rows(rollout, rows), raw, temperature=0.7, beta=0.1, reward=cfg.reward,
        advantage=cfg.gae, norm_stats={"mean": 0.0, "std": 1.0},
    )  # fmt: skip
    actor, critic = (dist.wrap_model(m, info, parallel) for m in (roles.actor, roles.critic))
    parts = trainable_parts(roles)
    # SGD, so the weights after the update are linear in the gradients: Adam's first steps are ≈ sign(g), and
    # for an element whose gradient is ~0 the sign is round-off (in 1 process as in 2)
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.1) for k, m in parts.items()}
    params = {k: [p for p in m.parameters() if p.requires_grad] for k, m in parts.items()}
    train_roles = Roles(actor, critic, roles.reference, roles.reward_model)
    optimise_ppo(train_roles, batch, cfg, opts, params, torch.Generator().manual_seed(info.rank))
    return parts


def main(model_dir: Path, out: Path) -> None:
    info = dist.init_distributed("cpu")
    run_rm(rm_config(model_dir), out / "rm")
    dist.barrier()
    parts = ppo_update(model_dir, out / "rm" / "model", info)
    if info.is_main:
        for name, module in parts.items():
            save_model(module, str(out / f"ppo_{name}.safetensors"))
    run_ppo(ppo_config(model_dir, out / "rm" / "model", save_every=2), out / "ppo")
    dist.cleanup()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
