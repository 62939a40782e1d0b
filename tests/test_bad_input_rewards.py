"""Reward functions that misbehave mid-run, from the command line (issue #41 item 6): a reward file whose
function raises, returns the wrong number of values, NaN, +inf, -inf or a string at training step 2, or at the
held-out evaluation after step 2, stops ``postrl grpo`` with exit status 2 and one ``postrl: error:`` line that
names the function (file:function), the step and the sample; the checkpoint of step 1 stays and no summary is
written. (An evaluation that fails loses the step it evaluates: the loop evaluates before it checkpoints, so
the checkpoint of step 2 is not written; step 1's is the last one.)

tests/lm/test_reward_errors.py covers the same kinds on `compute_rewards` (the line's wording, a multi-line
message, the line that raised) and a run that fails at a step and resumes to the straight run's weights; this
file is the user's view: a file of their own, through the command.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from postrl.cli import main
from postrl.runtime.checkpoint_recovery import latest_checkpoint
from tests.bad_input.workspace import build_workspace

RETURNS = {
    "raises": "raise RuntimeError('the judge is down')",
    "wrong_length": "return [0.0] * (len(completions) - 1)",
    "nan": "return [float('nan')] * len(completions)",
    "plus_inf": "return [float('inf')] * len(completions)",
    "minus_inf": "return [float('-inf')] * len(completions)",
    "a_string": "return ['good'] * len(completions)",
}
WHAT = {
    "raises": "raised RuntimeError: the judge is down",
    "wrong_length": "values for",
    "nan": "nan",
    "plus_inf": "inf",
    "minus_inf": "-inf",
    "a_string": "not a number",
}
TINY = ["run.device=cpu", "run.threads=1", "run.save_every=1", "run.log_every=1"]
TINY += ["grpo.group_size=2", "grpo.prompts_per_step=2", "sampling.max_new_tokens=4", "max_prompt_length=32"]
TINY += ["eval_size=2", "eval_at_start=false", "optim.warmup_steps=0"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_workspace(tmp_path_factory.mktemp("bad_rewards"))


def _reward_file(folder: Path, kind: str, global_step: int) -> Path:
    """``reward`` misbehaves as ``kind`` says when ``trainer_state.global_step`` is ``global_step`` (training
    step global_step + 1, or the held-out evaluation after step global_step, which comes first)."""
    path = folder / f"{kind}.py"
    path.write_text(
        "def reward(completions, trainer_state, **kwargs):\n"
        f"    if trainer_state.global_step == {global_step}:\n"
        f"        {RETURNS[kind]}\n"
        "    return [0.0] * len(completions)\n"
    )
    return path


@pytest.mark.parametrize(
    ("kind", "phase"),
    [*[(k, "training") for k in RETURNS], ("plus_inf", "evaluation"), ("a_string", "evaluation")],
)
def test_a_reward_that_misbehaves_mid_run_is_one_line_naming_it_the_step_and_the_sample(
    kind, phase, workspace, tmp_path, capsys
):
    training = phase == "training"
    reward, out = _reward_file(tmp_path, kind, 1 if training else 2), tmp_path / "run"
    argv = ["grpo", "--model", str(workspace / "model"), "--data", str(workspace / "data" / "prompts.jsonl")]
    argv += ["--out", str(out), *TINY, f"rewards=[{reward}:reward]"]
    argv += ["run.steps=2", "run.eval_every=0"] if training else ["run.steps=3", "run.eval_every=2"]
    capsys.readouterr()
    code = main(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and lines and lines[-1].startswith("postrl: error:"), lines[-3:]
    errors = [line for line in lines if "error" in line.lower() or "Traceback" in line]
    assert errors == [lines[-1]], errors  # one error line (progress lines of the two steps may precede it)
    line = lines[-1]
    when = "training step 2 of 2" if training else "held-out evaluation at step 2"
    for want in (f"{reward}:reward", when, "sample", WHAT[kind]):
        assert want in line, f"{want!r} not in {line!r}"
    assert latest_checkpoint(out / "checkpoints") == out / "checkpoints" / "step_00000001"  # and intact
    assert not (out / "summary.json").exists()
