"""SFT under ``torchrun --nproc_per_node 2`` (gloo) takes the same steps as one process on the same global
batch, resumes exactly at the same world size, and writes checkpoints and an export that load on 1 process."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests.dist.launch import assert_same_weights, load_script, torchrun


@pytest.fixture(scope="module")
def reference(tiny_lm_dir, tmp_path_factory):
    """The single-process run of the same script (checkpoints at steps 2 and 4)."""
    run_dir = tmp_path_factory.mktemp("sft_1proc")
    load_script("sft_run.py").train(tiny_lm_dir, run_dir)
    return run_dir


def _weights(run_dir, step):
    return load_file(str(run_dir / "checkpoints" / f"step_{step:08d}" / "model.safetensors"))


@pytest.mark.slow  # two torchrun launches of ~1 min each on a loaded 2-core machine
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_processes_match_one(tiny_lm_dir, reference, tmp_path, parallel):
    torchrun("sft_run.py", [str(tiny_lm_dir), str(tmp_path), parallel])
    for step in (2, 4):
        worst = assert_same_weights(_weights(reference, step), _weights(tmp_path / "straight", step))
        print(f"sft {parallel} step {step}: max |2 ranks - 1 process| = {worst:.2e}")
    # the resume at world size 2 continues exactly where the straight 2-process run went
    straight, resumed = _weights(tmp_path / "straight", 4), _weights(tmp_path / "resumed", 4)
    for name, x in straight.items():
        assert torch.equal(x, resumed[name]), name
    # a checkpoint and an export written by 2 ranks load in this single process
    from safetensors.torch import load_model

    from postrl.lm.models import load_causal_lm

    fresh = load_causal_lm(tiny_lm_dir)
    load_model(fresh, str(tmp_path / "straight" / "checkpoints" / "step_00000004" / "model.safetensors"))
    exported = load_causal_lm(tmp_path / "model")
    ref = _weights(reference, 4)
    assert_same_weights(ref, dict(fresh.state_dict()))
    assert_same_weights(ref, dict(exported.state_dict()))
    # the export holds the names a one-process save_pretrained writes: a tied lm_head is not written twice
    from postrl.lm.tokenizer import load_tokenizer
    from postrl.lm.trainer import export_model

    export_model(fresh, load_tokenizer(tiny_lm_dir), tmp_path / "one_process")
    names = set(load_file(str(tmp_path / "model" / "model.safetensors")))
    assert names == set(load_file(str(tmp_path / "one_process" / "model.safetensors"))), parallel
