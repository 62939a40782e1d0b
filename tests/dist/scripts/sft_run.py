"""A few SFT steps through `run_training`, run by the tests with 1 process or under torchrun.

``python -m torch.distributed.run --standalone --nproc_per_node 2 sft_run.py MODEL_DIR RUN_DIR [ddp|fsdp]``:
4 steps (checkpoints at 2 and 4) with a batch of 5 from 11 examples, so one step's share is uneven and the
epoch's last batch leaves rank 1 with no example; then a resume from step 2 into RUN_DIR/resumed; then the
export of the model. Every rank must run all of it (collectives), rank 0 writes.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch

from postrl.lm.data import tokenize_sft
from postrl.lm.models import load_causal_lm
from postrl.lm.spine import RunConfig
from postrl.lm.tokenizer import load_tokenizer
from postrl.lm.trainer import OptimConfig, Supervised, TrainConfig, export_on_main, run_training
from postrl.runtime import distributed as dist
from postrl.runtime.logging import RunLogger

ROWS = [
    {"prompt": "What is 12+30?", "completion": " 42"},
    {"prompt": "What is 1+1?", "completion": " 2"},
    {"prompt": "What is 7+8?", "completion": " 15"},
    {"prompt": "Review: the pasta", "completion": " was great and fresh ."},
    {"prompt": "Review: the soup", "completion": " was cold ."},
    {"prompt": "What is 3+4?", "completion": " 7"},
    {"prompt": "Review: service", "completion": " slow but kind and the bread was warm ."},
    {"prompt": "What is 20+22?", "completion": " 42"},
    {"prompt": "What is 9+9?", "completion": " 18"},
    {"prompt": "Review: dessert", "completion": " too sweet ."},
    {"prompt": "What is 5+6?", "completion": " 11"},
]


def config(parallel: str = "ddp", max_steps: int = 4) -> tuple[TrainConfig, OptimConfig, RunConfig]:
    run = RunConfig(
        steps=max_steps, eval_every=0, save_every=2, keep_last=3, log_every=1, device="cpu", parallel=parallel
    )
    # lr 1e-3: Adam maps an element whose gradient is ~round-off to a step of ±lr, whatever the ranks
    return (
        TrainConfig(batch_size=5, grad_accum=2),
        OptimConfig(lr=1e-3, warmup_steps=1, weight_decay=0.1),
        run,
    )


def train(model_dir: Path, run_dir: Path, parallel: str = "ddp", resume: bool = False) -> torch.nn.Module:
    """Train (or resume) the model of ``model_dir`` into ``run_dir``; returns the wrapped model."""
    info = dist.init_distributed("cpu")
    tokenizer = load_tokenizer(model_dir)
    model = dist.wrap_model(load_causal_lm(model_dir), info, parallel)
    examples = tokenize_sft(ROWS, tokenizer, max_length=64)
    logger = RunLogger(run_dir, enabled=info.is_main, resume=resume)
    train_cfg, optim, run = config(parallel)
    algo = Supervised(model, tokenizer, examples, examples[:3], train_cfg, optim, run, device=info.device)
    run_training(algo, run_dir, logger, resume=resume)
    return model


def main(model_dir: Path, run_dir: Path, parallel: str) -> None:
    model = train(model_dir, run_dir / "straight", parallel)
    if dist.is_main():  # the resumed run starts from the step-2 checkpoint of the straight one
        shutil.copytree(run_dir / "straight" / "checkpoints" / "step_00000002",
                        run_dir / "resumed" / "checkpoints" / "step_00000002")  # fmt: skip
    dist.barrier()
    train(model_dir, run_dir / "resumed", parallel, resume=True)
    export_on_main(model, load_tokenizer(model_dir), run_dir / "model")
    dist.cleanup()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "ddp")
