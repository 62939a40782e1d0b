"""Classic-control PPO under ``torchrun --nproc_per_node 2`` (gloo): one update on a global rollout split by
env between the ranks equals one process's update on all of it; a short `train` writes one run folder (rank 0),
counts every rank's env steps, resumes exactly at the same world size, and its checkpoint loads in one
process for `postrl control eval`."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from postrl.control.loop import evaluate_policy_episodes, load_agent
from postrl.runtime.logging import read_jsonl
from tests.dist.launch import assert_same_weights, load_script, torchrun


@pytest.mark.slow  # one torchrun launch of ~1 min on a loaded 2-core machine
def test_two_processes_match_one(tmp_path):
    script = load_script("control_ppo_run.py")
    torchrun("control_ppo_run.py", [str(tmp_path)])
    reference = script.one_update(script.dist.DistInfo(0, 1, 0, torch.device("cpu")))
    for name, module in reference.modules.items():
        worst = assert_same_weights(
            dict(module.state_dict()), load_file(str(tmp_path / f"update_{name}.safetensors"))
        )
        print(f"control ppo {name}: max |2 ranks - 1 process| = {worst:.2e}")

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    total = script.run_config().run.steps
    summary = json.loads((straight / "summary.json").read_text())
    assert summary["env_steps"] == total  # both ranks' steps: 4 iterations × 2 ranks × 4 envs × 16 steps
    rows = read_jsonl(straight / "metrics.jsonl")
    assert [r["step"] for r in rows] == [128, 256, 384, 512]  # one row per iteration: only rank 0 logs
    assert (straight / "checkpoints" / "step_00000512" / "env_state.rank1.npz").is_file()
    for name in ("actor", "critic"):
        a = load_file(str(straight / "checkpoints" / "step_00000512" / f"{name}.safetensors"))
        b = load_file(str(resumed / "checkpoints" / "step_00000512" / f"{name}.safetensors"))
        for key, x in a.items():
            assert torch.equal(x, b[key]), f"{name}.{key}"
    # the 2-rank checkpoint in one process, as `postrl control eval` loads it
    cfg, agent, env = load_agent(straight)
    assert len(evaluate_policy_episodes(agent.actor, env, cfg, episodes=2)) == 2
