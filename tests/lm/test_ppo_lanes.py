"""Asynchronous PPO-RLHF (`postrl.lm.ppo.lanes`): with max_staleness 0 the generation lane gives the synchronous
run exactly (the same responses, scores and weights); with k = 1 a resumed run is the straight run; episodes and
fsdp are refused before the run folder."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest
import torch

from postrl.lm.agents.config import EnvConfig
from postrl.lm.models import load_causal_lm
from postrl.lm.ppo import run_ppo
from postrl.lm.ppo.config import PPOLanesConfig
from postrl.runtime.errors import UserError
from tests.lm.resume_check import rows_without_times
from tests.lm.test_ppo import RUN, _cfg, tiny_rm_dir  # noqa: F401 - its module fixture


def _same_actor(a, b) -> None:
    wa, wb = load_causal_lm(a / "model"), load_causal_lm(b / "model")
    for (name, p), q in zip(wa.state_dict().items(), wb.state_dict().values(), strict=True):
        assert torch.equal(p, q), name


def test_staleness_zero_is_the_synchronous_run_bit_for_bit(tiny_lm_dir, tiny_rm_dir, tmp_path):  # noqa: F811
    cfg = _cfg(tiny_lm_dir, tiny_rm_dir, plots=False)
    run_ppo(cfg, tmp_path / "sync")
    run_ppo(replace(cfg, lanes=PPOLanesConfig(True, 0)), tmp_path / "lane")
    assert rows_without_times(tmp_path / "sync") == rows_without_times(tmp_path / "lane")
    _same_actor(tmp_path / "sync", tmp_path / "lane")


def test_one_step_stale_samples_train_and_resume_exactly(tiny_lm_dir, tiny_rm_dir, tmp_path):  # noqa: F811
    """k = 1 over 3 steps, the shared-trunk critic (the lane samples with a copy of the actor and its value
    head); steps 0 and 1 both come from the starting actor, so step 1 differs from the synchronous run's; a copy
    interrupted after its step-2 checkpoint (which holds step 3's responses) resumes to the same run."""
    run = replace(RUN, steps=3, keep_last=5)
    cfg = _cfg(tiny_lm_dir, tiny_rm_dir, critic="shared", run=run, plots=False)
    run_ppo(cfg, tmp_path / "sync")
    lanes = replace(cfg, lanes=PPOLanesConfig(True, 1))
    run_ppo(lanes, tmp_path / "a")
    sync, stale = rows_without_times(tmp_path / "sync"), rows_without_times(tmp_path / "a")
    steps = [r for r in sync if "rm_score" in r], [r for r in stale if "rm_score" in r]
    assert steps[0][0] == steps[1][0]  # step 0: the same responses, the same update
    assert steps[0][1]["rm_score"] != steps[1][1]["rm_score"]  # step 1: sampled by the starting actor
    run_ppo(lanes, tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "step_00000003")
    shutil.rmtree(tmp_path / "b" / "model")
    run_ppo(lanes, tmp_path / "b", resume=True)
    assert rows_without_times(tmp_path / "a") == rows_without_times(tmp_path / "b")
    _same_actor(tmp_path / "a", tmp_path / "b")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"env": EnvConfig(id="guess-number")}, "lanes.enabled samples prompts, not env episodes"),
        ({"run": replace(RUN, parallel="fsdp")}, "not fsdp"),
    ],
)
def test_what_the_lane_cannot_serve_is_refused_before_the_run_folder(
    tiny_lm_dir,
    tiny_rm_dir,  # noqa: F811 - test_ppo's module fixture
    tmp_path,
    changes,
    message,
):
    cfg = _cfg(tiny_lm_dir, tiny_rm_dir, lanes=PPOLanesConfig(True, 1), **changes)
    with pytest.raises(UserError, match=message):
        run_ppo(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
