"""The docs' tables of measured numbers come from results files (``docs/hooks/results.py``): every results block
renders from a file that exists, no page holds a hand-typed table of measurements, and the renderer reads
the values a hand-made record holds (cells checked against the numbers typed here)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _hook():
    spec = importlib.util.spec_from_file_location("docs_results_hook", DOCS / "hooks" / "results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


results = _hook()
PAGES = sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.parts)


def test_no_page_quotes_a_measured_table_without_a_results_file() -> None:
    found = [
        f"{p.relative_to(ROOT)}:{line}: {row[:80]}"
        for p in PAGES
        for line, row in results.hand_tables(p.read_text())
    ]
    assert not found, (
        "hand-typed tables of measured numbers (render them from benchmarks/results/<name>.json with a "
        "<!-- results: NAME ... --> block, or mark a table of defaults <!-- not-measured -->):\n"
        + "\n".join(found)
    )


@pytest.mark.parametrize("page", [p for p in PAGES if "<!-- results" in p.read_text()], ids=lambda p: p.name)
def test_every_results_block_renders_from_its_file(page: Path) -> None:
    text = page.read_text()
    out = results.render(text, str(page))
    assert "<!-- results" not in out
    for pattern, _ in results.BLOCK.findall(text):
        files = sorted(results.RESULTS.glob(f"{pattern}.json"))
        # each file's source line under its table; without a file, the note of the spec's missing: text
        expected = [f"`benchmarks/results/{f.name}`" for f in files] or [
            "Not measured into a results file yet"
        ]
        assert all(e in out for e in expected), (pattern, expected)


def test_the_all_files_page_lists_every_results_file() -> None:
    out = results.render(results.ALL, "files")
    names = [p.stem for p in (ROOT / "benchmarks" / "results").glob("*.json")]
    assert names and all(f"## {n}\n" in out for n in names)


@pytest.fixture
def record_dir(tmp_path, monkeypatch) -> Path:
    record = {
        "benchmark": "toy",
        "command": "python benchmarks/toy.py --steps 3",
        "commit": "0123456789abcdef",
        "dirty": True,
        "date": "2026-12-05T06:00:00Z",
        "machine": {"cpu": "Toy CPU", "cpu_count": 2},
        "load_average": [1.5, 2.0, 2.25],
        "result": {
            "speed": {"postrl": 12.5, "trl": 5.0},
            "per_seed": [0.5, 0.25],
            "runs": [{"who": "a", "steps_per_s": 1234.5}, {"who": "b", "steps_per_s": 10.0}],
            "tasks": {"x": {"v": 1}, "y": {"v": 2}},
            "noise": {"noise_0.0": {"v": [3, 4]}, "a:b": 5},
        },
    }
    (tmp_path / "toy.json").write_text(json.dumps(record))
    (tmp_path / "toy-2.json").write_text(json.dumps({**record, "result": {"speed": {"postrl": 1.0}}}))
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    return tmp_path


def test_a_spec_renders_the_records_values(record_dir) -> None:
    page = """<!-- results: toy
rows:
  - {who: postrl, "steps/s": "{speed.postrl:.1f}", ratio: "{speed.postrl / speed.trl:.2f}×", seeds: "{per_seed:.2f}"}
  - {who: missing, "steps/s": "{speed.sbx?}", ratio: "", seeds: "{^per_seed.-1}"}
-->"""
    lines = results.render(page).splitlines()
    assert lines[:4] == [
        "| who | steps/s | ratio | seeds |",
        "| --- | --- | --- | --- |",
        "| postrl | 12.5 | 2.50× | 0.50 / 0.25 |",
        "| missing | — |  | 0.25 |",
    ]
    assert lines[5] == (
        "`benchmarks/results/toy.json`: `python benchmarks/toy.py --steps 3`, commit `0123456` with uncommitted "
        "changes, 2026-12-05 06:00:00 UTC, load average 1.5 / 2 / 2.25 (1/5/15 min), Toy CPU, 2 CPUs."
    )


def test_rows_from_a_list_a_mapping_and_a_pattern(record_dir) -> None:
    listed = results.render(
        '<!-- results: toy\nrows: runs\nwhere: {who: a}\ncolumns: {v: "{steps_per_s:,.0f}"}\n-->'
    )
    assert listed.splitlines()[2] == "| 1,234 |" and "| 10 |" not in listed
    mapped = results.render('<!-- results: toy\nrows: tasks\ncolumns: {task: "{_key}", v: "{v}"}\n-->')
    assert mapped.splitlines()[2:4] == ["| x | 1 |", "| y | 2 |"]
    many = results.render('<!-- results: toy*\ncolumns: {file: "{_key}", postrl: "{speed.postrl}"}\n-->')
    assert many.splitlines()[2:4] == ["| toy | 12.5 |", "| toy-2 | 1 |"]
    assert "`benchmarks/results/toy-2.json`" in many


def test_a_block_without_its_file_or_value_fails_naming_it(record_dir) -> None:
    with pytest.raises(
        results.ResultsError, match=r"guide\.md: .*benchmarks/results/nope\.json does not exist"
    ):
        results.render("<!-- results: nope -->", "guide.md")
    with pytest.raises(results.ResultsError, match="no value at 'speed.sbx'"):
        results.render('<!-- results: toy\nrows:\n  - {a: "{speed.sbx}"}\n-->')


def test_the_generic_rendering_shows_every_value(record_dir) -> None:
    out = results.render("<!-- results: toy -->")
    assert "| `speed.postrl` | 12.5 |" in out and "| `per_seed` | 0.5 / 0.25 |" in out
    assert "| `who` | `steps_per_s` |" in out and "| a | 1234 |" in out


def test_the_checker_finds_a_hand_typed_table() -> None:
    page = "x\n\n| a | b |\n| --- | --- |\n| postrl | 2.36× |\n\n<!-- not-measured -->\n| k | d |\n|---|---|\n| lr | 0.1 |\n"
    page += "\n```\n| c | 1.5 |\n|---|---|\n| d | 2.5 |\n```\n"
    assert results.hand_tables(page) == [(3, "| a | b |")]


def test_keys_with_dots_or_colons_and_a_pattern_not_measured_yet(record_dir) -> None:
    out = results.render(
        '<!-- results: toy\nrows:\n  - {a: "{noise.noise_0.0.v.-1}", b: "{noise.[a:b]}"}\n-->'
    )
    assert out.splitlines()[2] == "| 4 | 5 |"
    note = results.render('<!-- results: none-*\nmissing: "run it"\ncolumns: {a: "{x}"}\n-->')
    assert note == '!!! note "Not measured into a results file yet"\n    run it'
