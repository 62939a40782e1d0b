"""DPO and KTO precompute the reference's log-probs with the policy itself when nothing else reads the reference
(no ref_model, full fine-tuning, eval_samples=0): no second copy is loaded, and the numbers are the ones a
loaded copy of the same weights gives, bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from postrl.cli import main
from postrl.lm.recipe import Setup


def _pairs(path: Path) -> Path:
    rows = [
        {"prompt": "Review of the soup:", "chosen": " was warm .", "rejected": " was bland and cold ."},
        {"prompt": "Review of the pie:", "chosen": " was tasty .", "rejected": " was poor ."},
        {"prompt": "Review of the tea:", "chosen": " was rather good .", "rejected": " was awful ."},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run(tiny_lm_dir: Path, data: Path, out: Path, *extra: str) -> dict:
    args = ["dpo", "--model", str(tiny_lm_dir), "--data", str(data), "--out", str(out), "run.device=cpu"]
    args += ["run.steps=1", "train.batch_size=2", "eval_size=0", "eval_samples=0", "plots=false", *extra]
    assert main(args) == 0
    return load_file(str(out / "reference_logps.safetensors"))


def test_the_policy_is_its_own_reference_without_a_second_copy(tiny_lm_dir, tmp_path, monkeypatch) -> None:
    data = _pairs(tmp_path / "pairs.jsonl")
    loaded = _run(tiny_lm_dir, data, tmp_path / "copy", f"ref_model={tiny_lm_dir}")  # a reference is loaded

    def refuse(self):
        raise AssertionError("a second copy of the policy was loaded as the reference")

    monkeypatch.setattr(Setup, "load_reference", refuse)
    own = _run(tiny_lm_dir, data, tmp_path / "own")
    assert own.keys() == loaded.keys() and own["train"].numel() > 0
    for key in own:
        assert own[key].equal(loaded[key]), key
    with pytest.raises(AssertionError, match="second copy"):  # sampled held-out metrics need the reference
        main(["dpo", "--model", str(tiny_lm_dir), "--data", str(data), "--out", str(tmp_path / "samples"),
              "run.device=cpu", "run.steps=1", "eval_size=0", "eval_samples=2", "plots=false"])  # fmt: skip
