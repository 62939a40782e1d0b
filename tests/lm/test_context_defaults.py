"""First contact with the defaults (#41 item 14): a length key is a ceiling, as TRL's ``max_length`` is.

`postrl sft --model M --data train.jsonl`, with no --config, on a model of 128 positions: the default
train.max_length (1024) used to stop every stage with "exceeds the model's context" although each row is ~10
tokens. Now the ceiling is clipped to the context with one logged line, the run trains, and its config.yaml
records the ceiling the run used; only a row longer than the model can take meets ``train.overlong``
(tests/bad_input/: sft-row-over-context, dpo-pair-over-context).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml

from postrl.cli import main

LM = ["run.steps=1", "run.eval_every=0", "run.device=cpu", "run.threads=1", "optim.warmup_steps=0"]
STAGES = {  # stage → (data rows, the overrides that keep it tiny; none touches a length key)
    "sft": ("sft", ["eval_size=2"]),
    "rm": ("prefs", ["eval_size=2", "norm.samples=0", "plots=false"]),
    "dpo": ("prefs", ["eval_size=2", "eval_samples=0", "plots=false"]),
    "kto": ("prefs", ["eval_size=2", "eval_samples=0", "plots=false"]),
}


def _data(tmp_path: Path, kind: str) -> Path:
    rows = [
        {"prompt": f"What is {i}+{i}?", "completion": f" {2 * i}"}
        if kind == "sft"
        else {"prompt": f"Review {i}:", "chosen": " great food", "rejected": " bad"}
        for i in range(12)
    ]
    path = tmp_path / f"{kind}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("stage", list(STAGES))
def test_the_default_max_length_is_clipped_to_the_context(stage, tiny_lm_dir, tmp_path, caplog, capsys):
    kind, tiny = STAGES[stage]
    out = tmp_path / "run"
    argv = [stage, "--model", str(tiny_lm_dir), "--data", str(_data(tmp_path, kind)), "--out", str(out)]
    with caplog.at_level(logging.WARNING):
        assert main([*argv, *LM, *tiny]) == 0, capsys.readouterr().err
    clipped = [r.getMessage() for r in caplog.records if "is clipped" in r.getMessage()]
    assert clipped == [
        f"train.max_length (1024) is clipped to 128, the model's context (128 positions, "
        f"max_position_embeddings in {tiny_lm_dir}/config.json)"
    ]
    assert yaml.safe_load((out / "config.yaml").read_text())["train"]["max_length"] == 128
    assert (out / "model" / "config.json").is_file()


def test_grpo_clips_the_prompts_ceiling_to_leave_room_for_the_response(tiny_lm_dir, tmp_path, caplog, capsys):
    """The default max_prompt_length (512) + sampling.max_new_tokens (4) on 128 positions: the prompts'
    ceiling becomes 124, said once; with minibatches=2 the ratio leaves 1, so the epochs=1 note is not said."""
    out = tmp_path / "run"
    argv = ["grpo", "--model", str(tiny_lm_dir), "--data", "task:arithmetic", "--out", str(out), *LM]
    tiny = ["grpo.prompts_per_step=2", "grpo.group_size=2", "grpo.minibatches=2", "sampling.max_new_tokens=4"]
    tiny += ["eval_size=2", "eval_at_start=false", "task.n_train=20", "task.n_test=4"]
    with caplog.at_level(logging.INFO):
        assert main([*argv, *tiny]) == 0, capsys.readouterr().err
    messages = [r.getMessage() for r in caplog.records]
    assert [m for m in messages if "is clipped" in m] == [
        f"max_prompt_length (512) is clipped to 124, the model's context (128 positions, "
        f"max_position_embeddings in {tiny_lm_dir}/config.json) less sampling.max_new_tokens (4)"
    ]
    assert yaml.safe_load((out / "config.yaml").read_text())["max_prompt_length"] == 124
    assert not [m for m in messages if "epochs=1" in m]
    assert "epochs=1" not in capsys.readouterr().err
