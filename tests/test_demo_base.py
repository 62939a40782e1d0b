"""The built-in base model the demo starts from: shipped as package data, made by the recorded recipe, and
pretrained on a corpus that holds the arithmetic task's sums that do not carry, but not its question format."""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import re
from pathlib import Path

import pytest

from postrl.demo import DemoConfig, check_base_model, demo_stages
from postrl.lm import base_model
from postrl.lm.tasks import build_corpus, get_task
from postrl.runtime.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def test_the_base_model_is_present_small_and_made_by_the_recipe():
    folder = base_model.path()
    assert base_model.is_available(folder)
    record = base_model.provenance(folder)
    assert record["command"] == base_model.command(
        base_model.recipe()
    )  # the shipped weights come from the demo's own pretraining config
    assert record["sha256"] == base_model.sha256(folder / base_model.WEIGHTS)
    size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    assert size < 5e6, f"{size / 1e6:.1f} MB"


def test_every_base_model_file_is_package_data():
    """pyproject's package-data patterns match every data file of the folder (a wheel would miss any other)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = [p for p in patterns["postrl"] if p.startswith("lm/base_model/")]
    folder = ROOT / "postrl" / "lm" / "base_model"
    data = [f for f in folder.iterdir() if f.is_file() and f.suffix not in (".py", ".pyc")]
    assert data and all(any(fnmatch.fnmatch(f"lm/base_model/{f.name}", p) for p in shipped) for f in data)


def test_the_demo_starts_from_it_unless_from_scratch():
    assert [s.name for s in demo_stages(DemoConfig())][:2] == ["pretrain", "sft"]
    assert demo_stages(DemoConfig())[0].run.__name__ == "copy_base_model"
    assert demo_stages(DemoConfig(from_scratch=True))[0].run.__name__ == "run_pretrain"
    check_base_model(DemoConfig())
    changed = DemoConfig(pretrain=dataclasses.replace(base_model.recipe(), corpus_lines=100))
    with pytest.raises(UserError, match="--from-scratch"):
        check_base_model(changed)
    check_base_model(dataclasses.replace(changed, from_scratch=True))


def test_the_corpus_has_the_sums_but_not_the_question_format_nor_held_out_problems():
    cfg = base_model.recipe()
    corpus = build_corpus(3000, 0, arithmetic=get_task("arithmetic", **cfg.arithmetic).config,
                          equations=cfg.equations, carries=cfg.carries)  # fmt: skip
    task = get_task("arithmetic", **cfg.arithmetic)
    held_out = {(a, b) for a, _, b in task.problems("test")}
    equations = [m for m in map(re.compile(r"(\d+)\+(\d+)[=:;] (\d+)").fullmatch, corpus) if m]
    sums = [(int(m[1]), int(m[2]), int(m[3])) for m in equations]
    assert len(equations) == 1200 and all(a + b == c for a, b, c in sums)
    assert not any((a, b) in held_out for a, b, _ in sums)
    assert not any("What is" in line or "?" in line for line in corpus)
    assert not any(a % 10 + b % 10 >= 10 for a, b, _ in sums)  # the carries are SFT's and RL's to teach


def test_provenance_is_json_with_the_config():
    record = base_model.provenance()
    assert json.loads(json.dumps(record))["config"]["run"]["steps"] == base_model.recipe().run.steps
