"""GRPO with FSDP2 (``parallel=fsdp``) under torchrun, run by the tests with 2 processes.

``python -m torch.distributed.run --standalone --nproc_per_node 2 grpo_fsdp_run.py MODEL_DIR OUT_DIR``:

1. `grpo_run.one_step`'s global batch and updates (μ = 2, 2 minibatches, 2 micro-batches each) with the
   policy sharded, for each loss type; rank 0 saves the gathered weights to ``OUT_DIR/<loss_type>.safetensors``;
2. a 2-step `run_grpo` (μ = 2 and β > 0: the policy and the sharded reference are scored under
   `dist.gathered`) with ``parallel=fsdp`` into ``OUT_DIR/fsdp`` (checkpoints at steps 1 and 2), the same with
   ``parallel=ddp`` into ``OUT_DIR/ddp``, and a resume of the fsdp run from its step-1 checkpoint into
   ``OUT_DIR/resumed``.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path

from safetensors.torch import save_file

from postrl.lm.grpo import GRPOConfig, run_grpo
from postrl.runtime import distributed as dist
from tests.dist.scripts.grpo_run import LOSS_TYPES, one_step, run_config


def text_length(prompts: list[str], completions: list[str], **columns) -> list[float]:
    """A reward that differs within groups (the untrained model never answers a sum correctly)."""
    return [float(len(text)) for text in completions]


def fsdp_run_config(model_dir: Path, parallel: str) -> GRPOConfig:
    cfg = run_config(model_dir)
    grpo = replace(cfg.grpo, epochs=2, beta=0.04)
    run = replace(cfg.run, parallel=parallel, save_every=1, keep_last=3)
    return replace(cfg, run=run, grpo=grpo, rewards=["tests.dist.scripts.grpo_fsdp_run:text_length"])


def main(model_dir: Path, out: Path) -> None:
    info = dist.init_distributed("cpu")
    for loss_type in LOSS_TYPES:
        state = dist.model_state_dict(one_step(model_dir, loss_type, info, "fsdp"))  # gathered on rank 0
        if info.is_main:
            save_file(state, str(out / f"{loss_type}.safetensors"))
    run_grpo(fsdp_run_config(model_dir, "fsdp"), out / "fsdp")
    run_grpo(fsdp_run_config(model_dir, "ddp"), out / "ddp")
    if info.is_main:  # the resumed run starts from the step-1 checkpoint of the straight one
        shutil.copytree(out / "fsdp" / "checkpoints" / "step_00000001",
                        out / "resumed" / "checkpoints" / "step_00000001")  # fmt: skip
    dist.barrier()
    run_grpo(fsdp_run_config(model_dir, "fsdp"), out / "resumed", resume=True)
    dist.cleanup()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
