"""`postrl dpo` and `postrl kto` under ``torchrun --nproc_per_node 2`` (gloo; ddp and fsdp): the same steps as
one process on the same global batch (uneven shares of 5 pairs or rows, 2 micro-batches each; KTO's z0 the mean
over both ranks' mismatched pairs), the reference log-probs bit for bit, and a resume at 2 processes that ends
on the straight 2-process run's weights. This file is also the script torchrun runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from postrl.lm.dpo import DPOConfig, DPOLossConfig, run_dpo
from postrl.lm.kto import KTOConfig, KTOLossConfig, run_kto
from postrl.lm.reference import REF_FILE
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig, TrainConfig

RUN = {"dpo": run_dpo, "kto": run_kto}
# AdamW hides a constant factor on the gradient: the logged loss and the held-out metrics catch one (not DPO's
# accuracies: at step 0 every h is 0 up to the rounding of another batching, so h > 0 is a coin)
KEYS = {
    "dpo": ("loss", "reward_margin", "heldout_loss", "heldout_reward_margin", "heldout_chosen_rewards"),
    "kto": ("loss", "kl", "heldout_loss", "heldout_reward_margin", "heldout_z0"),
}


def config(model: str, parallel: str = "ddp", stage: str = "dpo") -> DPOConfig | KTOConfig:
    loss = {"dpo": DPOLossConfig(beta=0.2, ref_batch_size=4)}
    if stage == "kto":
        loss = {"kto": KTOLossConfig(beta=0.2, ref_batch_size=4)}
    return (DPOConfig if stage == "dpo" else KTOConfig)(
        model=model,
        data="task:reviews",
        task={"n_pairs_train": 20, "n_pairs_test": 6, "n_sft_train": 4, "n_sft_test": 4},
        **loss,
        train=TrainConfig(batch_size=5, grad_accum=2, max_length=64),
        optim=OptimConfig(lr=1e-3, warmup_steps=0, min_lr_ratio=1.0),
        run=RunConfig(
            steps=4,
            eval_every=2,
            save_every=2,
            keep_last=0,
            log_every=1,
            device="cpu",
            threads=1,
            parallel=parallel,
        ),
        eval_size=6,
        eval_samples=4,
        plots=False,
    )


def main(model: str, out: str, parallel: str, stage: str) -> None:
    """The torchrun side: a straight run, and the same run resumed from its step-2 checkpoint."""
    from postrl.runtime import distributed as dist

    cfg, run = config(model, parallel, stage), RUN[stage]
    run(cfg, Path(out) / "straight")
    if dist.is_main():
        shutil.copytree(Path(out) / "straight", Path(out) / "resumed")
        shutil.rmtree(Path(out) / "resumed" / "checkpoints" / "step_00000004")
        shutil.rmtree(Path(out) / "resumed" / "model")
        (Path(out) / "resumed" / "summary.json").unlink()
    dist.barrier()
    run(cfg, Path(out) / "resumed", resume=True)


@pytest.mark.slow  # a torchrun launch of ~1 min on a loaded 2-core machine
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
@pytest.mark.parametrize("stage", ["dpo", "kto"])
def test_two_processes_match_one(stage: str, parallel: str, tiny_lm_dir: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    RUN[stage](config(str(tiny_lm_dir), stage=stage), tmp_path / "one")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__]
    proc = subprocess.run(
        [*cmd, str(tiny_lm_dir), str(tmp_path), parallel, stage],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    one, two = load_file(str(tmp_path / "one" / REF_FILE)), load_file(str(tmp_path / "straight" / REF_FILE))
    for name in ("train", "heldout"):
        assert torch.equal(one[name], two[name]), name
    for step in (2, 4):
        a = load_file(str(tmp_path / "one" / "checkpoints" / f"step_{step:08d}" / "model.safetensors"))
        b = load_file(str(tmp_path / "straight" / "checkpoints" / f"step_{step:08d}" / "model.safetensors"))
        for name, x in a.items():
            torch.testing.assert_close(x, b[name], atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    keys = KEYS[stage]
    rows = [
        [json.loads(x) for x in (tmp_path / r / "metrics.jsonl").read_text().splitlines()]
        for r in ("one", "straight")
    ]
    assert len(rows[0]) == len(rows[1])
    for a, b in zip(*rows, strict=True):
        for key in keys:
            assert (key in a) == (key in b) and abs(a.get(key, 0.0) - b.get(key, 0.0)) < 1e-5, (key, a, b)
    straight = load_file(str(tmp_path / "straight" / "model" / "model.safetensors"))
    resumed = load_file(str(tmp_path / "resumed" / "model" / "model.safetensors"))
    for name, x in straight.items():
        assert torch.equal(x, resumed[name]), name


if __name__ == "__main__":
    main(*sys.argv[1:5])
    from postrl.runtime import distributed as dist

    dist.cleanup()
