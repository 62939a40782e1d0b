"""benchmarks/_record.py: a benchmark's results file holds the result with its command (relative to the
repository), commit, date, machine and load."""

import importlib.util
import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_record_module():
    spec = importlib.util.spec_from_file_location("bench_record", ROOT / "benchmarks" / "_record.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_command_names_no_path_of_this_checkout():
    rec = load_record_module()
    argv = [
        str(ROOT / "benchmarks" / "dpo.py"),
        "--workdir",
        str(ROOT / "runs" / "x"),
        "--model",
        "/elsewhere/m",
    ]
    assert rec.command(argv) == "python benchmarks/dpo.py --workdir runs/x --model /elsewhere/m"
    assert rec.command([str(ROOT / "benchmarks" / "grpo.py"), "--task", '{"digits": 2}']) == (
        "python benchmarks/grpo.py --task '{\"digits\": 2}'"
    )


def test_a_results_file_has_the_result_and_how_it_was_made(tmp_path, monkeypatch):
    rec = load_record_module()
    monkeypatch.setattr(rec, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(rec, "ROOT", ROOT)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "bench.json").write_text("{}")  # an earlier run's file is replaced
    path = rec.record("bench", {"speedup": 2.25}, [str(ROOT / "benchmarks" / "bench.py"), "--steps", "3"])
    assert path == tmp_path / "results" / "bench.json"
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["bench.json"]  # no temp file left
    data = json.loads(path.read_text())
    assert data["benchmark"] == "bench" and data["result"] == {"speedup": 2.25}
    assert data["command"] == "python benchmarks/bench.py --steps 3"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    assert data["commit"] == (head.stdout.strip() if head.returncode == 0 else None)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", data["date"])
    assert len(data["load_average"]) == 3 and data["machine"]["cpu_count"] >= 1
    assert data["machine"]["python"].count(".") == 2


def test_paths_inside_the_checkout_are_written_relative_in_the_result(tmp_path, monkeypatch):
    rec = load_record_module()
    monkeypatch.setattr(rec, "RESULTS", tmp_path / "results")
    result = {
        "sft": str(ROOT / "runs" / "bench" / "model"),
        "runs": [{"settings": {"sft": str(ROOT / "runs" / "m"), "budget": "30"}, "acc": 0.5}],
        "note": f"trained from {ROOT}/runs/base",
        "elsewhere": "/data/model",
        "n": 3,
    }
    data = json.loads(rec.record("bench", result, [str(ROOT / "benchmarks" / "bench.py")]).read_text())
    assert data["result"] == {
        "sft": "runs/bench/model",
        "runs": [{"settings": {"sft": "runs/m", "budget": "30"}, "acc": 0.5}],
        "note": "trained from runs/base",
        "elsewhere": "/data/model",
        "n": 3,
    }
