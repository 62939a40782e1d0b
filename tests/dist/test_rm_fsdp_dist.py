"""The reward model with ``run.parallel=fsdp`` (FSDP2 ``fully_shard``) under ``torchrun --nproc_per_node 2``
(gloo): its steps equal one process's, a resume at 2 processes continues exactly, and its checkpoint and
export (gathered, written by rank 0) load in one process."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests.dist.launch import assert_same_weights, load_script, torchrun


@pytest.mark.slow  # one torchrun launch of ~1-2 min on a loaded 2-core machine
def test_fsdp_two_processes_match_one(tiny_lm_dir, tmp_path):
    from postrl.lm.models import ScalarHeadModel

    script = load_script("rm_fsdp_run.py")
    torchrun("rm_fsdp_run.py", [str(tiny_lm_dir), str(tmp_path / "two")], timeout=600)
    script.run_rm(script.rm_config(tiny_lm_dir), tmp_path / "one")
    rm_one = ScalarHeadModel.from_pretrained(tmp_path / "one" / "model").state_dict()
    rm_two = ScalarHeadModel.from_pretrained(tmp_path / "two" / "straight" / "model").state_dict()
    rm_two.pop("head.bias")  # its gradient is 0 up to round-off (see test_rlhf_dist)
    print(f"rm fsdp: max |2 ranks - 1 process| = {assert_same_weights(rm_two, rm_one):.2e}")
    # the checkpoint holds full weights (one process can load them); the resume continued exactly
    ckpt = "checkpoints/step_00000003/model.safetensors"
    straight, resumed = (load_file(str(tmp_path / "two" / run / ckpt)) for run in ("straight", "resumed"))
    assert_same_weights({k: v for k, v in straight.items() if k != "head.bias"}, rm_one)
    for name, x in straight.items():
        assert torch.equal(x, resumed[name]), name
