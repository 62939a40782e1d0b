"""Asynchronous GRPO (`postrl.lm.grpo.lanes`): with max_staleness 0 the generation lane gives the synchronous
run exactly; with k = 1 the samples are one step stale (the mismatch is measured and corrected) and a resumed
run is the straight run; a lane that dies or hangs stops the run with one error; bad combinations are refused."""

from __future__ import annotations

import os
import pickle
import signal

import pytest
import torch

from postrl.lm.grpo import run_grpo
from postrl.lm.grpo.config import LanesConfig
from postrl.lm.grpo.lanes import LaneError, WeightSlots, pack, unpack
from postrl.lm.memory import MemoryConfig
from postrl.runtime.errors import UserError
from tests.lm.resume_check import assert_same_weights, interrupt_after, rows_without_times
from tests.lm.test_grpo import _config


def test_staleness_zero_is_the_synchronous_run_bit_for_bit(tiny_lm_dir, tmp_path):
    run_grpo(_config(tiny_lm_dir, run={"steps": 3}), tmp_path / "sync")
    run_grpo(_config(tiny_lm_dir, run={"steps": 3}, lanes=LanesConfig(True, 0)), tmp_path / "lane")
    assert rows_without_times(tmp_path / "sync") == rows_without_times(tmp_path / "lane")
    assert_same_weights(tmp_path / "sync", tmp_path / "lane")


def test_the_lane_samples_for_a_policy_trained_with_activation_checkpointing(tiny_lm_dir, tmp_path):
    """The lane gets a copy without checkpointing or transformers' input-gradient hook (a local function that
    could not be sent to the spawned process: the run died with a pickling traceback); k = 0 stays the
    synchronous run with checkpointing on."""
    memory = {"memory": MemoryConfig(gradient_checkpointing=True)}
    run_grpo(_config(tiny_lm_dir, run={"steps": 2, **memory}), tmp_path / "sync")
    run_grpo(_config(tiny_lm_dir, run={"steps": 2, **memory}, lanes=LanesConfig(True, 0)), tmp_path / "lane")
    assert rows_without_times(tmp_path / "sync") == rows_without_times(tmp_path / "lane")
    assert_same_weights(tmp_path / "sync", tmp_path / "lane")


def test_one_step_stale_samples_are_measured_corrected_and_resume_exactly(tiny_lm_dir, tmp_path):
    grpo = {"is_correction": "tis", "is_level": "token"}  # β 0.04: the lane scores log π_ref too
    cfg = _config(tiny_lm_dir, run={"keep_last": 5}, grpo=grpo, lanes=LanesConfig(True, 1))
    run_grpo(cfg, tmp_path / "a")
    rows = [r for r in rows_without_times(tmp_path / "a") if "loss" in r]
    assert rows[0]["behaviour_kl"] < 1e-6  # steps 0 and 1 are both sampled by the starting weights
    assert all(r["behaviour_kl"] > 1e-6 for r in rows[2:])  # later ones by the weights one step back
    # interrupt a copy after its step-2 checkpoint (step 3's responses, by step 1's weights, are in it)
    run_grpo(cfg, tmp_path / "b")
    interrupt_after(tmp_path / "b", 2)
    run_grpo(cfg, tmp_path / "b", resume=True)
    assert rows_without_times(tmp_path / "a") == rows_without_times(tmp_path / "b")
    assert_same_weights(tmp_path / "a", tmp_path / "b")


def test_sampled_batches_travel_as_bytes_and_come_back_equal():
    tensors = {
        "ids": torch.tensor([[5, 0, 7], [1, 2, 3]]),
        "mask": torch.tensor([[True, False, True], [True, True, True]]),
        "half": torch.tensor([[0.5, -1.25], [3.0, 1e-3]], dtype=torch.bfloat16),
        "strided": torch.arange(12.0).reshape(3, 4)[:, 1:3],  # not contiguous
        "empty": torch.empty(0, 4),
        "scalar": torch.tensor(2.5),
    }
    packed = pack(tensors)
    assert all(isinstance(raw, bytes) for _, _, raw in packed.values())  # no shared-memory handles
    back = unpack(pickle.loads(pickle.dumps(packed)))
    for name, t in tensors.items():
        assert (back[name].dtype, back[name].shape) == (t.dtype, t.shape), name
        assert torch.equal(back[name], t), name


def test_weight_slots_keep_the_last_k_versions_while_the_next_is_written():
    """k = 2: three slots; after writing version v, versions v − 1 and v − 2 (which the lane may still be
    loading) are intact in their slots."""
    k, shape = 2, (3, 2)
    slots = WeightSlots({"w": torch.zeros(shape)}, k + 1)
    assert all(slot["w"].is_shared() for slot in slots.slots)
    for v in range(1, 8):
        slot = slots.write(v, {"w": torch.full(shape, float(v))})
        assert slot == v % (k + 1)
        for back in range(min(v, k + 1)):
            assert torch.equal(slots.slots[(v - back) % (k + 1)]["w"], torch.full(shape, float(v - back)))


def _kill_lane_after_first_step(signum, monkeypatch):
    """Send ``signum`` to the generation lane once the first step has trained."""
    from postrl.lm.grpo.lanes import GenerationLane

    real = GenerationLane.published

    def published(self, steps_done):
        real(self, steps_done)
        if steps_done == 1:
            os.kill(self.process.pid, signum)

    monkeypatch.setattr(GenerationLane, "published", published)


def test_a_dead_lane_stops_the_run_with_one_error(tiny_lm_dir, tmp_path, monkeypatch):
    _kill_lane_after_first_step(signal.SIGKILL, monkeypatch)
    cfg = _config(tiny_lm_dir, run={"steps": 4}, lanes=LanesConfig(True, 0, timeout=30))
    with pytest.raises(LaneError, match=r"generation lane exited \(code -9\) before sending step 1"):
        run_grpo(cfg, tmp_path / "run")


def test_a_hung_lane_stops_the_run_within_the_timeout(tiny_lm_dir, tmp_path, monkeypatch):
    _kill_lane_after_first_step(signal.SIGSTOP, monkeypatch)
    cfg = _config(tiny_lm_dir, run={"steps": 4}, lanes=LanesConfig(True, 0, timeout=2))
    with pytest.raises(LaneError, match=r"sent nothing for 2 s waiting for step 1 \(lanes.timeout\)"):
        run_grpo(cfg, tmp_path / "run")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"grpo": {"dynamic_sampling": True}}, "grpo.dynamic_sampling=false"),
        ({"run": {"parallel": "fsdp"}}, "not fsdp"),
    ],
)
def test_combinations_the_lane_cannot_serve_are_refused_before_the_run_folder(
    tiny_lm_dir, tmp_path, overrides, message
):
    cfg = _config(tiny_lm_dir, lanes=LanesConfig(True, 1), **overrides)
    with pytest.raises(UserError, match=message):
        run_grpo(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def pid_reward(completions, **kwargs):
    """A reward of 0 that writes down which process called it (``POSTRL_TEST_PID_FILE``)."""
    with open(os.environ["POSTRL_TEST_PID_FILE"], "a") as f:
        f.write(f"{os.getpid()} {kwargs['trainer_state'].global_step}\n")
    return [0.0] * len(completions)


def failing_reward(completions, trainer_state, **kwargs):
    """Fails from the second training step on."""
    if trainer_state.global_step >= 1:
        raise ValueError("the grader is down")
    return [0.0] * len(completions)


def _calls(path) -> list[tuple[int, int]]:
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines()]


def test_rewards_score_in_the_lane_and_the_run_is_the_same(tiny_lm_dir, tmp_path, monkeypatch):
    """lanes.rewards=generation (auto here): the lane calls the reward functions on the responses it samples
    (the held-out ones are scored here); the run's metrics and weights are those of scoring them here."""
    rewards = ["tests.lm.test_grpo:digits_reward", "task:arithmetic", f"{__name__}:pid_reward"]
    calls = {}
    for where in ("generation", "training"):
        monkeypatch.setenv("POSTRL_TEST_PID_FILE", str(tmp_path / f"{where}.pids"))
        lanes = LanesConfig(True, 1, rewards=where)
        run_grpo(_config(tiny_lm_dir, run={"steps": 3}, rewards=rewards, lanes=lanes), tmp_path / where)
        calls[where] = _calls(tmp_path / f"{where}.pids")
    assert rows_without_times(tmp_path / "generation") == rows_without_times(tmp_path / "training")
    assert_same_weights(tmp_path / "generation", tmp_path / "training")
    here = os.getpid()
    assert {pid for pid, _ in calls["training"]} == {here}
    lane = [(pid, step) for pid, step in calls["generation"] if pid != here]
    # the 3 trained steps', and what the lane sampled ahead after the last (steps 3 and 4, for a resumed run)
    assert [step for _, step in lane] == [0, 1, 2, 3, 4]
    # here, only the held-out evaluations' calls (greedy and sampled, after steps 0, 2 and 3)
    assert [step for pid, step in calls["generation"] if pid == here] == [0, 0, 2, 2, 3, 3]
    assert len(calls["training"]) == 6 + 3


def test_a_reward_that_fails_in_the_lane_says_what_it_says_here(tiny_lm_dir, tmp_path):
    rewards = [f"{__name__}:failing_reward"]
    with pytest.raises(UserError) as here:
        run_grpo(_config(tiny_lm_dir, rewards=rewards), tmp_path / "sync")
    with pytest.raises(UserError) as lane:
        run_grpo(_config(tiny_lm_dir, rewards=rewards, lanes=LanesConfig(True, 0)), tmp_path / "lane")
    assert not isinstance(lane.value, LaneError)
    assert "the grader is down" in str(here.value) and f"{__name__}:failing_reward" in str(here.value)
    assert str(lane.value) == str(here.value)


def test_rewards_the_lane_cannot_load_are_refused_before_the_run_folder(tiny_lm_dir, tmp_path):
    lanes = LanesConfig(True, 1, rewards="generation")
    cfg = _config(tiny_lm_dir, rewards=["task:arithmetic", f"rm:{tmp_path / 'rm'}"], lanes=lanes)
    with pytest.raises(UserError, match=r"cannot load rm:.*set lanes.rewards=training"):
        run_grpo(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
