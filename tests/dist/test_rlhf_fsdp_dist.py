"""PPO-RLHF with ``run.parallel=fsdp`` (FSDP2, a separate critic) under ``torchrun --nproc_per_node 2`` (gloo):
one update on the same global batch with actor and critic sharded equals one process's; a `run_ppo` with every
role sharded (gathered for sampling and scoring) equals the same run under DDP, resumes exactly, and its
checkpoint and export (gathered, written by rank 0) load in one process."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests.dist.launch import assert_same_weights, load_script, torchrun


@pytest.mark.slow  # one torchrun launch of ~2-3 min on a loaded 2-core machine
def test_fsdp_two_processes_match_one(tiny_lm_dir, tmp_path):
    from postrl.lm.models import ScalarHeadModel, load_causal_lm

    script = load_script("rlhf_run.py")
    torchrun("rlhf_fsdp_run.py", [str(tiny_lm_dir), str(tmp_path)], timeout=900)
    info = script.dist.DistInfo(0, 1, 0, torch.device("cpu"))
    parts = script.ppo_update(tiny_lm_dir, tmp_path / "rm" / "model", info)
    for name, module in parts.items():
        two = load_file(str(tmp_path / f"ppo_{name}.safetensors"))
        worst = assert_same_weights(two, dict(module.state_dict()))
        print(f"ppo fsdp {name}: max |2 ranks - 1 process| = {worst:.2e}")
    # the whole loop: every role sharded, sampling and scoring gathered, as under DDP
    fsdp, ddp = (dict(load_causal_lm(tmp_path / run / "model").state_dict()) for run in ("fsdp", "ddp"))
    print(f"run_ppo actor: max |fsdp - ddp| = {assert_same_weights(fsdp, ddp):.2e}")
    initial = load_file(str(tiny_lm_dir / "model.safetensors"))
    assert any(not torch.equal(initial[k], fsdp[k]) for k in initial.keys() & fsdp.keys())  # it moved
    critics = [
        ScalarHeadModel.from_pretrained(tmp_path / run / "critic").state_dict() for run in ("fsdp", "ddp")
    ]
    print(f"run_ppo critic: max |fsdp - ddp| = {assert_same_weights(*critics):.2e}")
    # the checkpoint holds the full weights (as the export); the resume from step 1 continued exactly
    assert_same_weights(
        load_file(str(tmp_path / "fsdp/checkpoints/step_00000002/actor.safetensors")), fsdp, 0, 0
    )
    for part in ("actor", "critic"):
        ckpt = f"checkpoints/step_00000002/{part}.safetensors"
        straight, resumed = (load_file(str(tmp_path / run / ckpt)) for run in ("fsdp", "resumed"))
        for name, x in straight.items():
            assert torch.equal(x, resumed[name]), f"{part} {name}"
