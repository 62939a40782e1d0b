"""Reward model and PPO-RLHF under ``torchrun --nproc_per_node 2`` (gloo): the reward model's steps and one
PPO update on the same global batch equal one process's; a short `run_ppo` runs end to end and its export
(written by rank 0) loads in one process."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from tests.dist.launch import assert_same_weights, load_script, torchrun


@pytest.mark.slow  # one torchrun launch of ~2 min on a loaded 2-core machine
def test_two_processes_match_one(tiny_lm_dir, tmp_path):
    import torch

    from postrl.lm.models import ScalarHeadModel, load_causal_lm

    script = load_script("rlhf_run.py")
    torchrun("rlhf_run.py", [str(tiny_lm_dir), str(tmp_path / "two")], timeout=600)
    one = tmp_path / "one"
    script.run_rm(script.rm_config(tiny_lm_dir), one / "rm")
    rm_one = ScalarHeadModel.from_pretrained(one / "rm" / "model").state_dict()
    rm_two = ScalarHeadModel.from_pretrained(tmp_path / "two" / "rm" / "model").state_dict()
    # the head's bias cancels in r_chosen − r_rejected: its gradient is 0 up to round-off, which Adam scales
    # to ±lr steps whose sign depends on the summation order, with 1 process as with 2
    rm_two.pop("head.bias")
    print(f"rm: max |2 ranks - 1 process| = {assert_same_weights(rm_two, rm_one):.2e}")
    info = script.dist.DistInfo(0, 1, 0, torch.device("cpu"))
    parts = script.ppo_update(tiny_lm_dir, tmp_path / "two" / "rm" / "model", info)
    for name, module in parts.items():
        two = load_file(str(tmp_path / "two" / f"ppo_{name}.safetensors"))
        worst = assert_same_weights(two, dict(module.state_dict()))
        print(f"ppo {name}: max |2 ranks - 1 process| = {worst:.2e}")
    run = tmp_path / "two" / "ppo"
    assert (run / "metrics.jsonl").is_file() and (run / "checkpoints" / "step_00000002").is_dir()
    load_causal_lm(run / "model")
