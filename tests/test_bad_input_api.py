"""Bad input from Python (issue #41): every bad argument of `postrl.sft`, `postrl.dpo`, `postrl.kto` and
`postrl.control.train` (config values, rows in memory, ``on_iteration``, ``out=``), a resume whose data changed
and bad observations given to ``postrl.control.load(run).predict`` is one `postrl.UserError` naming what is at
fault, raised before the run folder is made, every file byte-identical (README: "What postrl promises when
things go wrong"; from Python "a `postrl.UserError`" where the command prints one line).

Covered elsewhere, not repeated here: ``on_iteration`` without its argument against a finished run with
``overwrite=True``, a callback that raises, and a resume that runs code its run folder names
(tests/lm/test_resume_safety.py); predict on nine bad observations of an agent returned by `train`
(tests/control/test_api.py); the Python errors equal the command's (tests/test_api.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import postrl
import postrl.control as control
from tests.bad_input.checks import changes, snapshot
from tests.bad_input.workspace import build_workspace

SFT_ROWS = [{"prompt": f"What is {i}+{i}?", "completion": f" {2 * i}"} for i in range(8)]
PAIRS = [{"prompt": f"Review {i}:", "chosen": " great food", "rejected": " bad"} for i in range(8)]
KTO_ROWS = [{"prompt": f"Review {i}:", "completion": " great" if i % 2 else " bad", "label": i % 2 == 1} for i in range(8)]  # fmt: skip
LM = {"run": {"steps": 1, "eval_every": 0, "device": "cpu", "threads": 1}, "eval_size": 2}
TRAIN = {"batch_size": 2, "max_length": 48}
CONTROL = {"total_steps": 64, "n_envs": 1, "ppo": {"n_steps": 64, "batch_size": 64, "epochs": 1}}


def _sft(model: Path, **kw: Any) -> dict[str, Any]:
    return {"model": str(model), "data": SFT_ROWS, "train": TRAIN, **LM, **kw}


def _row(rows: list[dict[str, Any]], i: int, **change: Any) -> list[dict[str, Any]]:
    return [*rows[:i], {**rows[i], **change}, *rows[i + 1 :]]


def two_args(info, extra):  # noqa: ANN001
    return None


CASES: list[tuple[str, str, dict[str, Any], tuple[str, ...]]] = [
    # (id, function, arguments beyond the tiny valid call, substrings of the error)
    ("sft-lr-nan", "sft", {"optim": {"lr": math.nan}}, ("optim.lr",)),
    ("sft-unknown-key", "sft", {"train": {**TRAIN, "batch_sise": 2}}, ("train.batch_sise", "train.batch_size")),
    ("sft-wrong-type", "sft", {"run": {**LM["run"], "steps": "ten"}}, ("run.steps", "ten")),
    ("sft-row-missing-completion", "sft", {"data": [*SFT_ROWS[:3], {"prompt": "q"}]}, ("completion",)),
    ("sft-row-empty-prompt", "sft", {"data": _row(SFT_ROWS, 2, prompt="")}, ("prompt",)),
    ("sft-rows-not-mappings", "sft", {"data": ["What is 1+1?", "2"]}, ("data",)),
    ("sft-rows-an-empty-list", "sft", {"data": []}, ("data: no rows",)),
    ("sft-on-iteration-no-argument", "sft", {"on_iteration": lambda: None}, ("on_iteration",)),
    ("sft-on-iteration-two-arguments", "sft", {"on_iteration": two_args}, ("on_iteration", "two_args")),
    ("sft-on-iteration-not-callable", "sft", {"on_iteration": 3}, ("on_iteration",)),
    ("sft-out-an-int", "sft", {"out": 3}, ("out=", "int")),
    ("dpo-beta-0", "dpo", {"data": PAIRS, "dpo": {"beta": 0}}, ("dpo.beta",)),
    ("dpo-pair-same-answer", "dpo", {"data": _row(PAIRS, 2, rejected=" great food")}, ("same answer",)),
    ("dpo-pair-target-2", "dpo", {"data": _row(PAIRS, 3, target=2.0)}, ("target",)),
    ("dpo-sft-rows", "dpo", {"data": SFT_ROWS}, ("chosen",)),
    ("kto-label-a-string", "kto", {"data": _row(KTO_ROWS, 1, label="yes")}, ("label",)),
    ("kto-one-kind-only", "kto", {"data": [{**r, "label": True} for r in KTO_ROWS]}, ("every row is desirable",)),
    ("kto-batch-size-1", "kto", {"data": KTO_ROWS, "train": {**TRAIN, "batch_size": 1}}, ("train.batch_size",)),
    ("kto-beta-negative", "kto", {"data": KTO_ROWS, "kto": {"beta": -1}}, ("kto.beta",)),
]  # fmt: skip
CONTROL_CASES: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("n-envs-0", {"n_envs": 0}, ("env.n_envs",)),
    ("lr-nan", {"ppo": {"lr": math.nan}}, ("ppo.lr",)),
    ("total-steps-negative", {"total_steps": -64}, ("run.steps",)),
    ("unknown-key", {"ppo": {"clip_epss": 0.1}}, ("ppo.clip_epss", "ppo.clip_eps")),
    ("on-iteration-no-argument", {"on_iteration": lambda: None}, ("on_iteration",)),
    ("on-iteration-not-callable", {"on_iteration": "print"}, ("on_iteration",)),
    ("out-a-list", {"out": ["runs", "a"]}, ("out",)),
]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_workspace(tmp_path_factory.mktemp("bad_input_api"))


def _refused(call: Any, out: Path, workspace: Path, expect: tuple[str, ...]) -> None:
    before, inputs = snapshot(out), snapshot(workspace)
    with pytest.raises(postrl.UserError) as info:
        call()
    text = str(info.value)
    missing = [want for want in expect if want not in text]
    assert not missing and "\n" not in text, f"{text!r} does not name {missing}"
    assert not changes(before, snapshot(out)), changes(before, snapshot(out))
    assert not changes(inputs, snapshot(workspace))


@pytest.mark.parametrize(("fn", "kwargs", "expect"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_argument_is_one_user_error_and_nothing_is_written(fn, kwargs, expect, workspace, tmp_path):
    args = {**_sft(workspace / "model"), "out": tmp_path / "run", **kwargs}
    out = args["out"] if isinstance(args["out"], Path) else tmp_path / "run"
    _refused(lambda: getattr(postrl, fn)(**args), out, workspace, expect)


@pytest.mark.parametrize(
    ("kwargs", "expect"), [c[1:] for c in CONTROL_CASES], ids=[c[0] for c in CONTROL_CASES]
)
def test_control_train_refuses_a_bad_argument_before_the_run_folder(kwargs, expect, workspace, tmp_path):
    args = {**CONTROL, "out": tmp_path / "run", **kwargs}
    _refused(lambda: control.train("ppo", "CartPole-v1", **args), tmp_path / "run", workspace, expect)


def test_a_resume_after_the_data_file_changed_is_refused_and_the_run_is_untouched(workspace, tmp_path):
    data, out = tmp_path / "sft.jsonl", tmp_path / "run"
    data.write_text("".join(json.dumps(r) + "\n" for r in SFT_ROWS))
    postrl.sft(**_sft(workspace / "model", data=str(data)), out=out)
    data.write_text("".join(json.dumps({**r, "completion": " 0"}) + "\n" for r in SFT_ROWS))
    args = _sft(workspace / "model", data=str(data), run={**LM["run"], "steps": 2})
    _refused(
        lambda: postrl.sft(**args, out=out, resume=True), out, workspace, (f"data={data} changed since",)
    )


@pytest.fixture(scope="module")
def control_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("control") / "run"
    control.train("ppo", "CartPole-v1", seed=0, out=out, **{**CONTROL, "total_steps": 64})
    return out


@pytest.mark.parametrize(
    ("observation", "expect"),
    [
        ("abcd", "dtype <U4"),
        (np.array([0.0, None, 0.0, 0.0], dtype=object), "element (1,) is None"),
        ([0.0, math.nan, 0.0, 0.0], "element (1,) is nan"),
        (np.zeros((3, 2)), "shape (3, 2)"),
    ],
    ids=["string", "none", "nan", "shape"],
)
def test_predict_of_a_loaded_run_refuses_what_the_space_does_not_hold(control_run, observation, expect):
    """The agent of ``postrl.control.load(run)`` (tests/control/test_api.py checks the one train returns)."""
    agent = control.load(control_run)
    before = snapshot(control_run)
    with pytest.raises(postrl.UserError, match="predict") as info:
        agent.predict(observation, deterministic=True)
    assert expect in str(info.value) and "Box(" in str(info.value)
    assert not changes(before, snapshot(control_run))
