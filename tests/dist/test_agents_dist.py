"""GRPO and PPO over episodes under ``torchrun --nproc_per_node 2`` (gloo): on the same global batch of episodes,
2 ranks each holding half the episodes (whole groups for GRPO) take the same update as one process (GRPO with
per-turn credit; PPO with its advantages whitened and its value loss averaged over every rank's turn
boundaries); a 2-step `run_grpo` and `run_ppo` with ``env.id`` run end to end, episodes split across ranks,
and their checkpoint and export (written by rank 0) load in one process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.dist.launch import assert_same_weights, load_script, torchrun


def assert_updates_match_one_process(model_dir: Path, out: Path, label: str) -> None:
    """What `agents_run`'s updates saved in ``out`` (2 ranks) equals the same updates in this process, and
    the policy moved."""
    script = load_script("agents_run.py")
    info = script.dist.DistInfo(0, 1, 0, torch.device("cpu"))
    initial = load_file(str(model_dir / "model.safetensors"))
    two = load_file(str(out / "grpo.safetensors"))
    one = dict(script.grpo_update(model_dir, info).state_dict())
    print(f"grpo episodes{label}: max |2 ranks - 1 process| = {assert_same_weights(two, one):.2e}")
    assert any(not torch.equal(initial[k], two[k]) for k in initial.keys() & two.keys())  # it moved
    for name, module in script.ppo_update(model_dir, info).items():
        two = load_file(str(out / f"ppo_{name}.safetensors"))
        worst = assert_same_weights(two, dict(module.state_dict()))
        print(f"ppo episodes{label} {name}: max |2 ranks - 1 process| = {worst:.2e}")
        if name == "actor":
            assert any(not torch.equal(initial[k], two[k]) for k in initial.keys() & two.keys())


@pytest.mark.slow  # one torchrun launch of ~1-2 min on a loaded 2-core machine
def test_two_processes_match_one_on_episodes(tiny_lm_dir, tmp_path):
    from postrl.lm.models import load_causal_lm
    from postrl.runtime.logging import read_jsonl

    torchrun("agents_run.py", [str(tiny_lm_dir), str(tmp_path)], timeout=600)
    assert_updates_match_one_process(tiny_lm_dir, tmp_path, "")
    for run in ("grpo_run", "ppo_run"):
        folder = tmp_path / run
        assert (folder / "checkpoints" / "step_00000002").is_dir()
        assert len([r for r in read_jsonl(folder / "metrics.jsonl") if "loss" in r or "env_return" in r]) == 2
        load_causal_lm(folder / "model")
