"""`postrl demo --quick` end to end: every stage runs, the report and summary are complete."""

import dataclasses
import json
import math
import shutil

import pytest

from postrl.demo import DemoConfig, demo_stages, quick, run_demo
from postrl.demo.runner import run_demo_stage

REQUIRED = {
    "pretrain": ["heldout_loss"],
    "sft": ["heldout_accuracy", "gold_reward"],
    "rm": ["heldout_accuracy"],
    "ppo": ["gold_reward", "rm_score", "kl_to_ref"],
    "grpo": ["heldout_accuracy", "kl_to_ref"],
}


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    cfg = quick(DemoConfig(threads=1))
    run_demo(cfg, out)
    return out


def test_summary_is_complete(demo_dir):
    summary = json.loads((demo_dir / "summary.json").read_text())
    assert summary["wall_seconds"] > 0 and summary["peak_rss_mb"] > 0 and summary["cpu_seconds"] > 0
    assert summary["workers"] >= 1 and summary["job_seconds"]["ppo"]["cpu_seconds"] > 0
    for stage, keys in REQUIRED.items():
        for key in keys:
            assert isinstance(summary["stages"][stage][key], float), (stage, key)
        assert summary["stages"][stage]["wall_seconds"] > 0
    assert 0.0 <= summary["stages"]["sft"]["heldout_accuracy"] <= 1.0


def test_report_has_table_plots_and_samples(demo_dir):
    report = (demo_dir / "report.md").read_text()
    assert "| checkpoint |" in report and "| grpo |" in report and "| sft-vs-ppo |" not in report
    assert "## Samples before and after RL" in report and "not run with --quick" in report
    for stage in ("sft", "rm", "ppo", "dpo", "grpo", "frontier"):  # pretrain: the base model, copied
        assert (demo_dir / "plots" / f"{stage}.png").stat().st_size > 1000
    for stage in ("pretrain", "sft", "rm", "ppo", "grpo"):
        assert (demo_dir / stage / "model" / "config.json").is_file()
    page = (demo_dir / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 6 + 3 and "<table>" in page  # + the VLM branch's 3
    assert "## The gold-reward frontier (reviews)" in report


def test_frontier_points_in_the_summary(demo_dir):
    """The frontier has the SFT point from the common evaluation, PPO's and DPO's held-out checks along
    training, and best-of-n at n = 1, 2, 4, 8 (the quick demo) with the analytic KL log n - (n - 1)/n."""
    summary = json.loads((demo_dir / "summary.json").read_text())
    points = summary["frontier"]
    sft = [p for p in points if p["method"] == "sft"]
    assert sft and sft[0]["gold"] == summary["stages"]["sft"]["gold_reward"] and sft[0]["kl"] == 0.0
    assert any(p["method"].startswith("PPO") for p in points) and any(
        p["method"].startswith("DPO") for p in points
    )
    bon = {p["n"]: p["kl"] for p in points if p["method"] == "best-of-n"}
    assert sorted(bon) == [1, 2, 4, 8]
    assert bon[4] == pytest.approx(math.log(4) - 3 / 4)
    assert any(v["stage"] == "dpo" and v["baseline"] == "sft" for v in summary["verdicts"])


def test_summary_and_report_table_are_one_evaluation(demo_dir):
    """Every number of a checkpoint in summary.json is the report table's cell (to its 3 decimals)."""
    summary = json.loads((demo_dir / "summary.json").read_text())
    report = (demo_dir / "report.md").read_text()
    header = next(line for line in report.splitlines() if line.startswith("| checkpoint |"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and cells[0] in summary["evaluation"] and cells[0] != "checkpoint":
            for column, cell in zip(columns[2:], cells[2:], strict=True):
                value = summary["stages"][cells[0]].get(column)
                assert cell == ("–" if value is None else f"{value:.3f}"), (cells[0], column)


def test_quick_demo_shows_every_stage_learning(demo_dir):
    """The quick demo's point: each stage moves its number clearly past its baseline (more than two standard
    errors; seeds 0, 1 and 2 in benchmarks/demo.py), and the report says so."""
    summary = json.loads((demo_dir / "summary.json").read_text())
    found = {(v["stage"], v["baseline"]): v for v in summary["verdicts"]}
    for key in (("sft", "pretrain"), ("rm", "chance"), ("ppo", "sft"), ("grpo", "sft")):
        assert found[key]["verdict"] == "clear", found[key]["text"]
    assert found[("vlm-grpo", "vlm-sft")]["margin"] > 0, found[("vlm-grpo", "vlm-sft")]["text"]
    assert "## Did each stage earn its place?" in (demo_dir / "report.md").read_text()


def test_a_resumed_demo_says_which_stages_finished_before_it(demo_dir, tmp_path):
    """The report's total is this invocation's time: a resume names the stages an earlier one finished and
    their own time, which the total leaves out; a demo run in one go says nothing of the kind."""
    assert "resumed the demo" not in (demo_dir / "report.md").read_text()
    assert json.loads((demo_dir / "summary.json").read_text())["finished_before"] == {}
    copy = tmp_path / "demo"
    shutil.copytree(demo_dir, copy)
    cfg = quick(DemoConfig(threads=1))
    summary = run_demo(cfg, copy, resume=True)  # every stage finished before: all skipped
    names = [s.name for s in demo_stages(cfg)]
    assert list(summary["finished_before"]) == names
    own = sum(json.loads((copy / n / "summary.json").read_text())["wall_seconds"] for n in names)
    assert sum(summary["finished_before"].values()) == pytest.approx(own) and own > 10
    header = (copy / "report.md").read_text().split("## Did each stage")[0]
    assert (
        f"This invocation resumed the demo: {len(names)} of {len(names)} stages (pretrain, sft, rm" in header
    )
    assert f"in {own:.0f} s of their own" in header


def test_finished_stages_are_skipped_and_unfinished_ones_resume(tmp_path):
    calls = []

    def stage(cfg, run_dir, resume):
        calls.append(resume)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "summary.json").write_text(json.dumps({"wall_seconds": 1.0}))
        return {"wall_seconds": 1.0}

    (tmp_path / "x" / "checkpoints").mkdir(parents=True)  # an interrupted run
    run_demo_stage("x", tmp_path, stage, None)
    run_demo_stage("x", tmp_path, stage, None)  # finished: skipped
    assert calls == [True]


def test_a_demo_resumes_only_with_the_config_it_started_with(tmp_path):
    """Its finished stages are skipped on resume, so another config would leave stages and report at odds:
    refused (naming the keys) before anything is written; another `workers` or a moved folder is fine."""
    from postrl.demo import check_same_config, wire
    from postrl.runtime.config import save_config
    from postrl.runtime.errors import UserError

    cfg = DemoConfig()
    save_config(wire(cfg, tmp_path / "before"), tmp_path / "config.yaml")  # then moved to tmp_path
    check_same_config(cfg, tmp_path)
    check_same_config(dataclasses.replace(cfg, workers=1), tmp_path)
    with pytest.raises(UserError, match=r"compare_sft, .* --quick"):
        check_same_config(quick(cfg), tmp_path)
    steps = dataclasses.replace(cfg.grpo.run, steps=70)
    with pytest.raises(UserError, match=r"\(grpo\.run\.steps differs from"):
        check_same_config(dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, run=steps)), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]
