"""The reward model with FSDP2 under torchrun, run by the tests with 2 processes.

``python -m torch.distributed.run --standalone --nproc_per_node 2 rm_fsdp_run.py MODEL_DIR OUT_DIR``: the
3-step `run_rm` of :func:`rm_config` (a batch of 5 pairs: an uneven share, accumulation) with
``run.parallel=fsdp`` into ``OUT_DIR/straight`` (checkpoints at steps 2 and 3), then a resume from its
step-2 checkpoint into ``OUT_DIR/resumed``.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path

from postrl.lm.reward_model import NormConfig, RMConfig, run_rm
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig, TrainConfig
from postrl.runtime import distributed as dist


def rm_config(model_dir: Path) -> RMConfig:
    """3 steps of 5 pairs (an uneven share of 2 ranks) in 2 micro-batches; evaluation and checkpoint at the
    end only."""
    return RMConfig(
        model=str(model_dir),
        data="task:reviews",
        task={"n_pairs_train": 24, "n_pairs_test": 8},
        train=TrainConfig(batch_size=5, grad_accum=2, max_length=48),
        optim=OptimConfig(lr=1e-3, warmup_steps=50),
        run=RunConfig(steps=3, eval_every=0, save_every=0, log_every=1, device="cpu"),
        norm=NormConfig(samples=4, max_new_tokens=4),
        plots=False,
    )


def fsdp_config(model_dir: Path) -> RMConfig:
    cfg = rm_config(model_dir)
    return replace(cfg, run=replace(cfg.run, parallel="fsdp", save_every=2, keep_last=3))


def main(model_dir: Path, out: Path) -> None:
    dist.init_distributed("cpu")
    run_rm(fsdp_config(model_dir), out / "straight")
    if dist.is_main():  # the resumed run starts from the step-2 checkpoint of the straight one
        shutil.copytree(out / "straight" / "checkpoints" / "step_00000002",
                        out / "resumed" / "checkpoints" / "step_00000002")  # fmt: skip
    dist.barrier()
    run_rm(fsdp_config(model_dir), out / "resumed", resume=True)
    dist.cleanup()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
