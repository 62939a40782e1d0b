"""GRPO under ``torchrun --nproc_per_node 2`` (gloo): on the same global batch, 2 ranks each holding whole
groups take the same steps as one process, for every loss aggregation; a short `run_grpo` runs end to end and
its checkpoint and export (written by rank 0) load in one process."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests.dist.launch import assert_same_weights, load_script, torchrun


@pytest.mark.slow  # one torchrun launch of ~1-2 min on a loaded 2-core machine
def test_two_processes_match_one(tiny_lm_dir, tmp_path):
    script = load_script("grpo_run.py")
    torchrun("grpo_run.py", [str(tiny_lm_dir), str(tmp_path)])
    info = script.dist.DistInfo(0, 1, 0, torch.device("cpu"))
    initial = load_file(str(tiny_lm_dir / "model.safetensors"))
    for loss_type in script.LOSS_TYPES:
        reference = dict(script.one_step(tiny_lm_dir, loss_type, info).state_dict())
        two = load_file(str(tmp_path / f"{loss_type}.safetensors"))
        print(f"grpo {loss_type}: max |2 ranks - 1 process| = {assert_same_weights(two, reference):.2e}")
        assert any(not torch.equal(initial[k], two[k]) for k in initial.keys() & two.keys())  # it moved
    results = [load_file(str(tmp_path / f"{t}.safetensors")) for t in script.LOSS_TYPES]
    for a, b in zip(results, results[1:], strict=False):  # the aggregations really differ
        assert any(not torch.equal(a[k], b[k]) for k in a)
    from postrl.lm.models import load_causal_lm

    run = tmp_path / "run"
    assert (run / "metrics.jsonl").is_file() and (run / "checkpoints" / "step_00000002").is_dir()
    exported = load_causal_lm(run / "model")
    ckpt = load_file(str(run / "checkpoints" / "step_00000002" / "policy.safetensors"))
    assert_same_weights(ckpt, dict(exported.state_dict()), atol=0, rtol=0)
