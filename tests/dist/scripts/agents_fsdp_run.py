"""GRPO and PPO over episodes of a text environment with FSDP2 (``run.parallel=fsdp``) under torchrun, run by the
tests with 2 processes.

``python -m torch.distributed.run --standalone --nproc_per_node 2 agents_fsdp_run.py MODEL_DIR OUT_DIR``:

0. each rank plays 4 countdown episodes with the sharded policy under `dist.gathered` (rank 0: one turn each,
   rank 1: three, so the ranks decode different numbers of steps); rank r saves them to
   ``OUT_DIR/episodes_<r>.pt``;
1. `agents_run.grpo_update`'s and `agents_run.ppo_update`'s global batch of episodes and updates with the policy
   (GRPO) or actor and critic (PPO) sharded; rank 0 saves the gathered weights to ``OUT_DIR/grpo.safetensors``
   and ``OUT_DIR/ppo_{actor,critic}.safetensors``;
2. for GRPO (per-turn credit, β > 0: the sharded reference scores) and PPO (actor, critic and reference
   sharded): a 2-step run with ``env.id`` guess_number and ``parallel=fsdp`` into ``OUT_DIR/<algo>_fsdp``
   (episodes played under `dist.gathered`, checkpoints at steps 1 and 2), the same with ``parallel=ddp`` into
   ``OUT_DIR/<algo>_ddp``, and a resume of the fsdp run from its step-1 checkpoint into
   ``OUT_DIR/<algo>_resumed``.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from postrl.lm.agents import EpisodeBudget
from postrl.lm.agents.rollout import sample_episodes
from postrl.lm.grpo import run_grpo
from postrl.lm.models import load_causal_lm
from postrl.lm.ppo import run_ppo
from postrl.lm.tokenizer import load_tokenizer
from postrl.runtime import distributed as dist
from tests.dist.scripts.agents_run import (
    SAMPLING,
    SEEDS,
    Countdown,
    grpo_config,
    grpo_update,
    ppo_config,
    ppo_update,
)

RUNS = {"grpo": (grpo_config, run_grpo), "ppo": (ppo_config, run_ppo)}


def play_countdown(model: torch.nn.Module, model_dir: Path, seed: int) -> dict[str, torch.Tensor]:
    """4 countdown episodes from ``seed`` (3: one turn, 5: three) by ``model``, with one fixed generator."""
    budget = EpisodeBudget(max_turns=3, max_tokens=10)
    generator = torch.Generator().manual_seed(0)
    out = sample_episodes(
        model.eval(), load_tokenizer(model_dir), [Countdown() for _ in range(4)], SAMPLING, budget, generator,
        [seed] * 4,
    )  # fmt: skip
    return {"input_ids": out.input_ids, "log_probs": out.log_probs, "turn_mask": out.turn_mask}


def fsdp_run_config(algo: str, model_dir: Path, parallel: str):
    """`agents_run`'s 2-step run config of ``algo`` with ``run.parallel`` and a checkpoint after every step."""
    cfg = RUNS[algo][0](model_dir)
    return replace(cfg, run=replace(cfg.run, parallel=parallel, save_every=1, keep_last=3))


def main(model_dir: Path, out: Path) -> None:
    info = dist.init_distributed("cpu")
    policy = dist.wrap_model(load_causal_lm(model_dir), info, "fsdp")
    with dist.gathered(policy):  # whole weights on every rank: no collective while the ranks decode
        torch.save(play_countdown(policy, model_dir, SEEDS[info.rank]), out / f"episodes_{info.rank}.pt")
    state = dist.model_state_dict(grpo_update(model_dir, info, "fsdp"))  # gathered on rank 0
    if info.is_main:
        save_file(state, str(out / "grpo.safetensors"))
    for name, module in ppo_update(model_dir, info, "fsdp").items():
        state = dist.model_state_dict(module)
        if info.is_main:
            save_file(state, str(out / f"ppo_{name}.safetensors"))
    for algo, (_, run) in RUNS.items():
        for parallel in ("fsdp", "ddp"):
            run(fsdp_run_config(algo, model_dir, parallel), out / f"{algo}_{parallel}")
        if info.is_main:  # the resumed run starts from the step-1 checkpoint of the straight one
            shutil.copytree(out / f"{algo}_fsdp" / "checkpoints" / "step_00000001",
                            out / f"{algo}_resumed" / "checkpoints" / "step_00000001")  # fmt: skip
        dist.barrier()
        run(fsdp_run_config(algo, model_dir, "fsdp"), out / f"{algo}_resumed", resume=True)
    dist.cleanup()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
