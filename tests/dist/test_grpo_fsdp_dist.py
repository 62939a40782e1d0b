"""GRPO with ``parallel=fsdp`` (FSDP2) under ``torchrun --nproc_per_node 2`` (gloo): on the same global batch the
sharded policy takes the same steps as one process, for every loss aggregation; a `run_grpo` with sampling and
scoring under `dist.gathered` equals the same run under DDP, resumes exactly, and its checkpoint and export
(gathered, written by rank 0) load in one process."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests.dist.launch import assert_same_weights, load_script, torchrun


@pytest.mark.slow  # one torchrun launch of ~2 min on a loaded 2-core machine
def test_fsdp_two_processes_match_one(tiny_lm_dir, tmp_path):
    from postrl.lm.models import load_causal_lm

    script = load_script("grpo_run.py")
    torchrun("grpo_fsdp_run.py", [str(tiny_lm_dir), str(tmp_path)], timeout=600)
    info = script.dist.DistInfo(0, 1, 0, torch.device("cpu"))
    initial = load_file(str(tiny_lm_dir / "model.safetensors"))
    for loss_type in script.LOSS_TYPES:
        reference = dict(script.one_step(tiny_lm_dir, loss_type, info).state_dict())
        two = load_file(str(tmp_path / f"{loss_type}.safetensors"))
        print(f"grpo fsdp {loss_type}: max |2 ranks - 1 process| = {assert_same_weights(two, reference):.2e}")
        assert any(not torch.equal(initial[k], two[k]) for k in initial.keys() & two.keys())  # it moved
    # the whole loop (μ = 2, β > 0: gathered sampling and scoring of policy and reference) as under DDP
    fsdp, ddp = (dict(load_causal_lm(tmp_path / run / "model").state_dict()) for run in ("fsdp", "ddp"))
    print(f"run_grpo: max |fsdp - ddp| = {assert_same_weights(fsdp, ddp):.2e}")
    assert any(not torch.equal(initial[k], fsdp[k]) for k in initial.keys() & fsdp.keys())
    # the checkpoint holds the full weights (as the export); the resume from step 1 continued exactly
    ckpt = "checkpoints/step_00000002/policy.safetensors"
    straight, resumed = (load_file(str(tmp_path / run / ckpt)) for run in ("fsdp", "resumed"))
    assert_same_weights(straight, fsdp, atol=0, rtol=0)
    for name, x in straight.items():
        assert torch.equal(x, resumed[name]), name
