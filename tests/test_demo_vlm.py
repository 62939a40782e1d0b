"""The demo's vision branch (postrl.demo.vlm): the shipped aligned VLM, the branch end to end at a tiny size,
its verdicts and its report section with the sample pictures."""

from __future__ import annotations

import dataclasses
import fnmatch
import json
from pathlib import Path

import pytest

from postrl.demo import DemoConfig, demo_stages, quick, vlm_eval
from postrl.demo import vlm as demo_vlm
from postrl.demo.report_html import to_html
from postrl.lm import base_model
from postrl.lm.tasks.shapes import KINDS
from postrl.lm.vlm import base_model as vlm_base
from postrl.runtime.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def demo_config(**kw):
    return dataclasses.replace(DemoConfig(), **kw)


def test_the_shipped_vlm_loads_with_auto_classes_and_was_made_by_the_recipe():
    from transformers import AutoModelForImageTextToText, AutoProcessor

    folder = vlm_base.path()
    assert vlm_base.is_available(folder)
    record = vlm_base.provenance(folder)
    assert (
        record["command"]
        == vlm_base.command(vlm_base.recipe())
        == "postrl vlm-pretrain --out RUN_DIR run.threads=1"
    )
    assert record["sha256"] == base_model.sha256(folder / vlm_base.WEIGHTS)
    assert record["steps"] == vlm_base.recipe().run.steps and record["heldout_loss"] < 0.5
    size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    assert size < 5e6, f"{size / 1e6:.1f} MB"
    model = AutoModelForImageTextToText.from_pretrained(folder)
    processor = AutoProcessor.from_pretrained(folder)
    assert model.config.model_type == "llava" and "<image>" in processor.tokenizer.get_vocab()


def test_every_shipped_vlm_file_is_package_data():
    tomllib = pytest.importorskip("tomllib")
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    folder = ROOT / "postrl" / "lm" / "vlm" / "base_model"
    data = [f for f in folder.iterdir() if f.is_file() and f.suffix not in (".py", ".pyc")]
    names = [f"lm/vlm/base_model/{f.name}" for f in data]
    assert len(data) >= 6 and all(any(fnmatch.fnmatch(n, p) for p in patterns["postrl"]) for n in names)


def test_the_branch_checks_the_shipped_model_against_its_recipe():
    demo_vlm.check(demo_config())
    align = dataclasses.replace(vlm_base.recipe(), tokenizer_lines=100)
    changed = demo_config(vlm=demo_vlm.VLMDemo(align=align))
    with pytest.raises(UserError, match="--from-scratch"):
        demo_vlm.check(changed)
    demo_vlm.check(demo_config(vlm=changed.vlm, from_scratch=True))
    assert demo_vlm.vlm_demo_stages(demo_config(vlm=demo_vlm.VLMDemo(enabled=False))) == []
    names = [s.name for s in demo_vlm.vlm_demo_stages(demo_config(from_scratch=True))]
    assert names == ["vlm-align", "vlm-sft", "vlm-grpo", "vlm-sft-vs-grpo", "vlm-eval"]
    assert demo_vlm.vlm_demo_stages(demo_config(from_scratch=True))[0].run.__name__ == "_run_align"
    in_demo = {
        s.name: s for s in demo_stages(quick(DemoConfig()))
    }  # the demo's rows, --quick: no continued SFT
    assert {"vlm-align", "vlm-sft", "vlm-grpo", "vlm-eval"} <= set(
        in_demo
    ) and "vlm-sft-vs-grpo" not in in_demo
    assert in_demo["vlm-eval"].after == ("vlm-align", "vlm-sft", "vlm-grpo")


def tiny() -> demo_vlm.VLMDemo:
    r, v = dataclasses.replace, demo_vlm.VLMDemo()
    return r(
        v,
        sft=r(v.sft, task={**v.sft.task, "n_test": 8}, eval_size=8, run=r(v.sft.run, steps=3, eval_every=3)),
        grpo=r(
            v.grpo,
            task={**v.grpo.task, "n_train": 16, "n_test": 8},
            eval_size=8,
            grpo=r(v.grpo.grpo, prompts_per_step=4, group_size=2),
            run=r(v.grpo.run, steps=2),
        ),
        eval_scenes=12,
        samples=3,
    )


def test_the_branch_end_to_end_with_verdicts_and_sample_pictures(tmp_path):
    cfg = demo_config(vlm=tiny(), seed=0, threads=1)
    done: dict = {}
    for stage in demo_vlm.vlm_demo_stages(cfg):
        assert set(stage.after) <= set(done)
        done[stage.name] = stage.run(stage.config(cfg, tmp_path, done), tmp_path / stage.name)
    assert done["vlm-sft-vs-grpo"]["train_seconds"] <= done["vlm-grpo"]["train_seconds"] + 5
    summary = {
        "stages": {n: {"wall_seconds": s.get("wall_seconds")} for n, s in done.items()},
        "verdicts": [],
    }
    vlm_eval.add_to_summary(summary, done)
    assert set(summary["vlm"]["evaluation"]) == set(vlm_eval.CHECKPOINTS)
    row = summary["stages"]["vlm-grpo"]
    assert row["heldout_accuracy_n"] == 12 and set(row["by_kind"]) <= set(KINDS)
    assert [(v["stage"], v["baseline"]) for v in summary["verdicts"]] == [
        ("vlm-sft", "vlm-align"),
        ("vlm-grpo", "vlm-sft"),
        ("vlm-grpo", "vlm-sft-vs-grpo"),
    ]
    assert 0.2 < summary["vlm"]["chance"] < 0.5
    samples = summary["vlm"]["samples"]
    assert len(samples) == 3 and len({s["kind"] for s in samples}) == 3
    assert all(set(s["answers"]) == set(vlm_eval.CHECKPOINTS) for s in samples)
    json.dumps(summary)  # summary.json takes it as it is
    lines = vlm_eval.report_md(tmp_path, summary)
    text = "\n".join(lines)
    assert "![sample pictures](vlm-eval/samples/samples.png)" in text
    assert (tmp_path / "vlm-eval" / "samples" / "samples.png").stat().st_size > 1000
    assert samples[0]["question"] in text and "vlm-grpo: heldout_accuracy" in text
    page = to_html(lines, tmp_path)
    assert page.count('<img src="data:image/png;base64,') >= 2  # the curves and the pictures, inline
