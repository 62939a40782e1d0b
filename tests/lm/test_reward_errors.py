"""Reward functions at run time (#41 items 6 and 10): every call carries the trainer state, held-out evaluation
included (a TRL-style curriculum reward reads ``trainer_state.global_step`` there too), and a function that
raises or returns something unusable stops the run with one line that names the function (spec and
file:function), the step and the sample; the last checkpoint stays intact and a resume finishes the run."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from postrl.lm.grpo import GRPOConfig, GRPOLossConfig, run_grpo
from postrl.lm.ppo import PPOConfig, PPOLossConfig, RewardConfig, run_ppo
from postrl.lm.rewards import RewardError, RewardFunction, TrainerState, compute_rewards, load_reward_fn
from postrl.lm.rollout import SamplingConfig
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig
from postrl.runtime.logging import read_jsonl

PROMPTS = ["What is 1+1?", "What is 2+3?", "What is 4+4?"]
COMPLETIONS = [" 2", " 6", " 8"]
HERE = Path(__file__).resolve()
FAIL_AT: dict[str, int | None] = {"global_step": None}
"""The global_step at which `fails_at_a_step` raises (None: never); the tests set it."""
SEEN: list[tuple[int, int]] = []
"""(global_step, max_steps) of every call of `curriculum` (evaluation calls included)."""


# ---- user functions (imported by spec from this module) -----------------------------------------------------
def raises(completions, **kwargs):
    return [1.0 / (0 if "6" in c else 1) for c in completions]


def wrong_length(completions, **kwargs):
    return [0.0] * (len(completions) - 1)


def nan_value(completions, **kwargs):
    return [math.nan] * len(completions)


def minus_inf(completions, **kwargs):
    return [-math.inf] * len(completions)


def a_string(completions, **kwargs):
    return ["good"] * len(completions)


def curriculum(completions, trainer_state, **kwargs):
    """TRL's curriculum pattern: a weight that ramps up with the step (crashes on trainer_state=None)."""
    SEEN.append((trainer_state.global_step, trainer_state.max_steps))
    ramp = trainer_state.global_step / trainer_state.max_steps
    return [ramp * sum(ch.isdigit() for ch in c) for c in completions]


def fails_at_a_step(completions, trainer_state, **kwargs):
    if trainer_state.global_step == FAIL_AT["global_step"]:
        raise RuntimeError("the judge is down")
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


# ---- the error line -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "what"),
    [
        ("raises", "raised ZeroDivisionError"),
        ("wrong_length", "returned 2 values for 3 completions"),
        ("nan_value", "returned nan for sample 0"),
        ("minus_inf", "returned -inf for sample 0"),
        ("a_string", "returned 'good', not a number, for sample 0"),
    ],
)
@pytest.mark.parametrize(
    ("phase", "when"),
    [("training", "training step 3 of 12"), ("evaluation", "held-out evaluation at step 2")],
)
def test_the_error_names_the_function_file_the_step_and_the_sample(name, what, phase, when):
    fn = load_reward_fn(f"{__name__}:{name}")
    state = TrainerState(global_step=2, max_steps=12)
    with pytest.raises(RewardError) as info:
        compute_rewards([fn], PROMPTS, COMPLETIONS, trainer_state=state, phase=phase)
    text = str(info.value)
    assert what in text and when in text
    assert f"{__name__}:{name}" in text and f"{HERE}:{name}" in text  # the spec and file:function
    assert "sample" in text and "What is" in text and "\n" not in text  # one line


def test_an_exception_names_the_line_that_raised():
    fn = load_reward_fn(f"{__name__}:raises")
    with pytest.raises(RewardError) as info:
        compute_rewards([fn], PROMPTS, COMPLETIONS, trainer_state=TrainerState(0, 4))
    line = raises.__code__.co_firstlineno + 1
    assert f"at {HERE}:{line}" in str(info.value) and "on sample 1:" in str(info.value)


def test_a_multi_line_message_stays_on_one_line():
    def two_lines(completions, **kwargs):
        raise ValueError("first\nsecond")

    with pytest.raises(RewardError) as info:
        compute_rewards([RewardFunction("two_lines", two_lines)], PROMPTS, COMPLETIONS)
    assert "\n" not in str(info.value) and "first\\nsecond" in str(info.value)


# ---- tiny runs --------------------------------------------------------------------------------------------------
def _grpo(tiny_lm_dir, rewards, **run) -> GRPOConfig:
    """2 prompts × G = 4 responses of ≤ 4 tokens, 4 steps, evaluation at start and every 2 steps."""
    return GRPOConfig(
        model=str(tiny_lm_dir),
        task={"n_train": 40, "n_test": 4},
        max_prompt_length=64,
        rewards=[f"{__name__}:{r}" for r in rewards],
        sampling=SamplingConfig(max_new_tokens=4),
        grpo=GRPOLossConfig(group_size=4, prompts_per_step=2, beta=0.0, epochs=2),
        optim=OptimConfig(lr=2e-4, warmup_steps=0, min_lr_ratio=1.0),
        run=RunConfig(
            **{"steps": 4, "eval_every": 2, "save_every": 2, "log_every": 1, "device": "cpu", "threads": 1}
            | run
        ),
        eval_size=4,
        eval_at_start=True,
    )


def test_grpo_evaluation_passes_the_trainer_state(tiny_lm_dir, tmp_path):
    SEEN.clear()
    summary = run_grpo(_grpo(tiny_lm_dir, ["curriculum"]), tmp_path / "run")
    assert summary["steps"] == 4
    # training calls at global_step 0..3, evaluations (greedy and sampled) at 0, 2 and 4 steps taken
    assert sorted(set(SEEN)) == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]
    assert SEEN[:2] == [(0, 4), (0, 4)]  # the evaluation at start: greedy, sampled
    assert SEEN[-2:] == [(4, 4), (4, 4)]  # the last evaluation


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_a_failing_reward_names_the_step_and_the_resume_finishes(tiny_lm_dir, tmp_path):
    cfg = _grpo(tiny_lm_dir, ["fails_at_a_step"])
    FAIL_AT["global_step"] = None
    run_grpo(cfg, tmp_path / "straight")
    FAIL_AT["global_step"] = 3  # the last training step (the evaluations see 0, 2 and 4 steps taken)
    try:
        with pytest.raises(RewardError) as info:
            run_grpo(cfg, tmp_path / "run")
    finally:
        FAIL_AT["global_step"] = None
    text = str(info.value)
    assert "raised RuntimeError: the judge is down" in text and "training step 4 of 4" in text
    assert f"{HERE}:fails_at_a_step" in text and "\n" not in text
    checkpoint = tmp_path / "run" / "checkpoints" / "step_00000002"
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == ["step_00000002"]
    before = _digest(checkpoint)
    summary = run_grpo(cfg, tmp_path / "run", resume=True)
    assert summary["steps"] == 4 and _digest(checkpoint) == before
    a = load_file(str(tmp_path / "straight" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "run" / "model" / "model.safetensors"))
    for key in a:  # the resume after the failure is the straight run, exactly
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]


def test_ppo_reward_functions_get_the_trainer_state_in_training_and_evaluation(tiny_lm_dir, tmp_path):
    SEEN.clear()
    cfg = PPOConfig(
        model=str(tiny_lm_dir),
        reward_model=None,
        critic="shared",
        data="task:arithmetic",
        task={"n_train": 8, "n_test": 2},
        rewards=[f"{__name__}:curriculum"],
        batch_size=2,
        max_prompt_length=32,
        sampling=SamplingConfig(max_new_tokens=4),
        ppo=PPOLossConfig(epochs=1),
        reward=RewardConfig("batch"),
        optim=OptimConfig(lr=1e-3, warmup_steps=0),
        critic_optim=OptimConfig(lr=1e-3, warmup_steps=0),
        eval_size=2,
        plots=False,
        run=RunConfig(steps=2, eval_every=1, save_every=0, log_every=1, device="cpu", threads=1),
    )
    run_ppo(cfg, tmp_path / "run")
    assert sorted(set(SEEN)) == [(0, 2), (1, 2), (2, 2)]  # training at 0, 1; evaluations after 1, 2 steps
