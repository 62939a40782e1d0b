"""PPO-RLHF with FSDP2 (``run.parallel=fsdp``, a separate critic) under torchrun, run by the tests with 2
processes.

``python -m torch.distributed.run --standalone --nproc_per_node 2 rlhf_fsdp_run.py MODEL_DIR OUT_DIR``:

1. `run_rm` for 3 steps into ``OUT_DIR/rm`` (the reward model of what follows);
2. `rlhf_run.ppo_update`'s global batch and update with actor and critic sharded; rank 0 saves the gathered
   weights to ``OUT_DIR/ppo_{actor,critic}.safetensors``;
3. a 2-step `run_ppo` with ``run.parallel=fsdp`` (actor, critic, reference and reward model sharded, gathered
   for sampling and scoring) into ``OUT_DIR/fsdp`` (checkpoints at steps 1 and 2), the same with
   ``run.parallel=ddp`` into ``OUT_DIR/ddp``, and a resume of the fsdp run from its step-1 checkpoint into
   ``OUT_DIR/resumed``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from safetensors.torch import save_file

from postrl.lm.ppo import run_ppo
from postrl.lm.reward_model import run_rm
from postrl.runtime import distributed as dist
from tests.dist.scripts.rlhf_run import ppo_config, ppo_update, rm_config


def main(model_dir: Path, out: Path) -> None:
    info = dist.init_distributed("cpu")
    run_rm(rm_config(model_dir), out / "rm")
    dist.barrier()
    rm_dir = out / "rm" / "model"
    for name, module in ppo_update(model_dir, rm_dir, info, "fsdp").items():
        state = dist.model_state_dict(module)  # gathered on rank 0
        if info.is_main:
            save_file(state, str(out / f"ppo_{name}.safetensors"))
    for parallel in ("fsdp", "ddp"):
        run_ppo(ppo_config(model_dir, rm_dir, parallel=parallel, save_every=1), out / parallel)
    if info.is_main:  # the resumed run starts from the step-1 checkpoint of the straight one
        shutil.copytree(out / "fsdp" / "checkpoints" / "step_00000001",
                        out / "resumed" / "checkpoints" / "step_00000001")  # fmt: skip
    dist.barrier()
    run_ppo(ppo_config(model_dir, rm_dir, parallel="fsdp", save_every=1), out / "resumed", resume=True)
    dist.cleanup()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
