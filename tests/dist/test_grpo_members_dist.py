"""The policy-gradient family under ``torchrun --nproc_per_node 2`` (gloo): for Dr. GRPO, RLOO, REINFORCE++,
GSPO and DAPO (GRPO itself: test_grpo_dist.py), 2 ranks that each compute the advantages of their own whole
groups and optimise their share take the same update as one process on the same global batch; a 2-step DAPO
run with dynamic sampling and REINFORCE++ advantages runs end to end under torchrun."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests.dist.launch import assert_same_weights, load_script, torchrun


@pytest.fixture(scope="module")
def two_ranks(tiny_lm_dir, tmp_path_factory):
    """One torchrun launch for every member (a launch costs ~1 min on a loaded 2-core machine)."""
    out = tmp_path_factory.mktemp("members")
    torchrun("grpo_members_run.py", [str(tiny_lm_dir), str(out)])
    return out


@pytest.mark.slow  # the torchrun launch: ~1-2 min on a loaded 2-core machine
@pytest.mark.parametrize("member", ["dr_grpo", "rloo", "reinforce_pp", "gspo", "dapo"])
def test_two_processes_match_one(member, two_ranks, tiny_lm_dir):
    script = load_script("grpo_members_run.py")
    info = script.dist.DistInfo(0, 1, 0, torch.device("cpu"))
    reference = dict(script.one_step(tiny_lm_dir, member, info).state_dict())
    two = load_file(str(two_ranks / f"{member}.safetensors"))
    print(f"{member}: max |2 ranks - 1 process| = {assert_same_weights(two, reference):.2e}")
    initial = load_file(str(tiny_lm_dir / "model.safetensors"))
    assert any(not torch.equal(initial[k], two[k]) for k in initial.keys() & two.keys())  # it moved


@pytest.mark.slow
def test_a_dapo_run_with_reinforce_pp_runs_under_torchrun(two_ranks):
    from postrl.lm.models import load_causal_lm
    from postrl.runtime.logging import read_jsonl

    run = two_ranks / "run"
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2] and all(r["kl"] == 0.0 for r in rows)  # β = 0: no reference
    exported = load_causal_lm(run / "model")
    ckpt = load_file(str(run / "checkpoints" / "step_00000002" / "policy.safetensors"))
    assert_same_weights(ckpt, dict(exported.state_dict()), atol=0, rtol=0)


@pytest.mark.slow
def test_the_members_take_different_steps(two_ranks):
    results = {
        m: load_file(str(two_ranks / f"{m}.safetensors"))
        for m in ["dr_grpo", "rloo", "reinforce_pp", "gspo", "dapo"]
    }
    names = list(results)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert any(not torch.equal(results[a][k], results[b][k]) for k in results[a]), (a, b)
