"""GRPO and PPO over episodes with ``run.parallel=fsdp`` (FSDP2) under ``torchrun --nproc_per_node 2`` (gloo): the
sharded policy, gathered, plays the unsharded policy's episodes while the ranks play different numbers of turns;
on the same global batch of episodes the sharded policy (GRPO with per-turn credit) and the sharded actor and critic
(PPO) take the same update as one process; 2-step runs with ``env.id`` (episodes played and scored under
`dist.gathered`) equal the same runs under DDP, step by step in their metrics and in the end weights, resume
exactly from a step-1 checkpoint, and their checkpoints and exports (gathered, written by rank 0) load in one
process."""

from __future__ import annotations

import math

import torch
from safetensors.torch import load_file

from tests.dist.launch import assert_same_weights, load_script, torchrun
from tests.dist.test_agents_dist import assert_updates_match_one_process


def assert_same_metrics(a: list[dict], b: list[dict], rtol: float = 1e-4, atol: float = 1e-5) -> float:
    """The two runs logged the same rows with the same keys and equal numbers, timings aside (a sampled episode
    that differs moves a return or a length by far more than the tolerance); returns the largest absolute
    difference."""
    assert len(a) == len(b) > 0
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key, value in x.items():
            if key.startswith("time") or key.endswith("per_second"):
                continue
            assert math.isclose(value, y[key], rel_tol=rtol, abs_tol=atol), (key, value, y[key])
            worst = max(worst, abs(value - y[key]))
    return worst


def test_fsdp_on_episodes_matches_one_process_and_ddp(tiny_lm_dir, tmp_path):
    from postrl.lm.models import load_causal_lm
    from postrl.runtime.logging import read_jsonl

    script, fsdp_script = load_script("agents_run.py"), load_script("agents_fsdp_run.py")
    torchrun("agents_fsdp_run.py", [str(tiny_lm_dir), str(tmp_path)], timeout=600)
    # sampled with the sharded policy gathered, the ranks playing 1 and 3 turns: the unsharded policy's episodes
    played = [torch.load(tmp_path / f"episodes_{rank}.pt") for rank in (0, 1)]
    assert played[0]["turn_mask"].sum() < played[1]["turn_mask"].sum()
    for seed, episodes in zip(script.SEEDS, played, strict=True):
        alone = fsdp_script.play_countdown(load_causal_lm(tiny_lm_dir), tiny_lm_dir, seed)
        assert torch.equal(episodes["input_ids"], alone["input_ids"])
        torch.testing.assert_close(episodes["log_probs"], alone["log_probs"], atol=1e-5, rtol=1e-5)
        worst = float((episodes["log_probs"] - alone["log_probs"]).abs().max())
        print(
            f"episodes of seed {seed} played sharded and gathered: max |log-prob - unsharded| = {worst:.2e}"
        )
    assert_updates_match_one_process(tiny_lm_dir, tmp_path, " fsdp")
    initial = load_file(str(tiny_lm_dir / "model.safetensors"))
    for algo in ("grpo", "ppo"):
        fsdp, ddp = (tmp_path / f"{algo}_{parallel}" for parallel in ("fsdp", "ddp"))
        weights = {run: dict(load_causal_lm(run / "model").state_dict()) for run in (fsdp, ddp)}
        print(f"run_{algo} --env: max |fsdp - ddp| = {assert_same_weights(weights[fsdp], weights[ddp]):.2e}")
        assert any(
            not torch.equal(initial[k], weights[fsdp][k]) for k in initial.keys() & weights[fsdp].keys()
        )
        rows = {run: read_jsonl(run / "metrics.jsonl") for run in (fsdp, ddp)}
        print(f"run_{algo} --env: metrics max |fsdp - ddp| = {assert_same_metrics(*rows.values()):.2e}")
        assert sum(any("env_return" in k for k in r) for r in rows[fsdp]) == 2  # both steps' episodes logged
        # the checkpoint holds the full weights (as the export); the resume from step 1 continued exactly
        step2 = "checkpoints/step_00000002"
        for part in ("policy",) if algo == "grpo" else ("actor", "critic"):
            straight = load_file(str(fsdp / step2 / f"{part}.safetensors"))
            resumed = load_file(str(tmp_path / f"{algo}_resumed" / step2 / f"{part}.safetensors"))
            if part != "critic":
                assert_same_weights(straight, weights[fsdp], atol=0, rtol=0)
            for name, x in straight.items():
                assert torch.equal(x, resumed[name]), f"{algo} resume: {part} {name}"
