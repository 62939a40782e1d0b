"""The reward model with FSDP2 under torchrun, run by the tests with 2 processes.

``python -m torch.distributed.run --standalone --nproc_per_node 2 rm_fsdp_run.py MODEL_DIR OUT_DIR``: the
3-step `run_rm` of ``rlhf_run.py`` (a batch of 5 pairs: an uneven share, accumulation) with
``train.parallel=fsdp`` into ``OUT_DIR/straight`` (checkpoints at steps 2 and 3), then a resume from its
step-2 checkpoint into ``OUT_DIR/resumed``.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path

from postrl.lm.reward_model import RMConfig, run_rm
from postrl.runtime import distributed as dist
from tests.dist.scripts.rlhf_run import rm_config


def fsdp_config(model_dir: Path) -> RMConfig:
    cfg = rm_config(model_dir)
    return replace(cfg, train=replace(cfg.train, parallel="fsdp", save_every=2, keep_last=3))


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
