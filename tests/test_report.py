"""report.md / report.html from a small fake demo result: the HTML is parsed back and its tables checked
cell by cell against the Markdown's rows (no demo run needed)."""

from __future__ import annotations

import json
from html.parser import HTMLParser

from postrl.demo.evaluation import CHECKPOINTS, COLUMNS
from postrl.demo.report import metrics_table, plot_stage, write_report
from postrl.demo.verdicts import verdicts

SAMPLES = {
    "arithmetic": [("What is 2+3?", " 5"), ("What is 7*8?", " 56")],
    "reviews": [("Review: the tea", " was warm | cold ."), ("Review: the `soup`", " was great .")],
}


def _evaluation() -> dict[str, dict]:
    ev = {}
    for k, name in enumerate(CHECKPOINTS):
        ev[name] = {c: 0.1 * k + 0.01 * j for j, c in enumerate(COLUMNS)}
        ev[name]["samples"] = {t: [(p, f"{c} ({name})") for p, c in rows] for t, rows in SAMPLES.items()}
    ev["pretrain"]["rm_score"] = None  # a metric a checkpoint lacks shows as "–"
    return ev


VOID = {"meta", "img", "br", "hr"}


class Page(HTMLParser):
    """Tables as lists of rows of (tag, text) cells; list items; text inside <code>; all text."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[tuple[str, str]]]] = []
        self.items: list[str] = []
        self.code: list[str] = []
        self.text: list[str] = []
        self.open: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in VOID:
            return
        self.open.append(tag)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.tables[-1][-1].append((tag, ""))
        elif tag == "li":
            self.items.append("")

    def handle_endtag(self, tag):
        assert self.open.pop() == tag, f"</{tag}> closes <{self.open[-1] if self.open else None}>"

    def handle_data(self, data):
        self.text.append(data)
        inside = [t for t in self.open if t in ("td", "th", "li")]
        if inside and inside[-1] in ("td", "th"):
            tag, text = self.tables[-1][-1][-1]
            self.tables[-1][-1][-1] = (tag, text + data)
        elif inside:
            self.items[-1] += data
        if self.open and self.open[-1] == "code":
            self.code.append(data)


def _report(tmp_path):
    stages = {name: {"wall_seconds": 10.0 + k} for k, name in enumerate(CHECKPOINTS)}
    evaluation = _evaluation()
    (tmp_path / "sft").mkdir()
    rows = [{"step": s, "loss": 1.0 / s, "heldout_accuracy": 0.1 * s} for s in range(1, 6)]
    (tmp_path / "sft" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_report(tmp_path, None, stages, evaluation, {"wall_seconds": 61.0, "peak_rss_mb": 900.0})
    page = Page()
    page.feed((tmp_path / "report.html").read_text())
    page.close()
    return page, metrics_table(evaluation, stages), evaluation


def test_the_main_table_is_an_html_table_of_rows_by_columns(tmp_path):
    page, table, evaluation = _report(tmp_path)
    assert page.open == []  # every tag closed, in order
    main = page.tables[0]
    assert len(main) == 1 + len(evaluation) and all(len(r) == 2 + len(COLUMNS) for r in main)
    assert [tag for tag, _ in main[0]] == ["th"] * len(main[0])
    assert all(tag == "td" for row in main[1:] for tag, _ in row)
    assert [[text for _, text in row] for row in main] == table  # the summary's cells, in order
    assert main[1][COLUMNS.index("rm_score") + 2][1] == "–" and main[-1][0][1] == CHECKPOINTS[-1]


def test_sample_tables_keep_a_bar_inside_one_cell(tmp_path):
    page, _, _ = _report(tmp_path)
    assert len(page.tables) == 3  # the main table, reviews SFT → ppo, arithmetic SFT → grpo
    reviews = page.tables[1]
    assert [text for _, text in reviews[0]] == ["prompt", "SFT", "ppo"]
    assert all(len(row) == 3 for row in reviews) and len(reviews) == 1 + len(SAMPLES["reviews"])
    assert [text for _, text in reviews[1]] == [
        "Review: the tea",
        "was warm | cold . (sft)",
        "was warm | cold . (ppo)",
    ]
    assert reviews[2][0][1] == "Review: the `soup`"  # a sample's backticks are its text, not code


def test_code_spans_and_bullets_are_rendered_not_literal(tmp_path):
    page, _, _ = _report(tmp_path)
    text = "".join(page.text)
    assert text.count("`") == 2 and "|---" not in text and "\n- " not in text  # the 2: a sample's `soup`
    assert {"heldout_accuracy", "gold_reward", "rm_score", "kl_to_ref", "sft-vs-*"} <= set(page.code)
    assert len(page.items) == 5 and page.items[0].startswith("sft: heldout_accuracy")  # the verdicts
    html = (tmp_path / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 1  # the one stage with metrics


def _row(accuracy=None, gold=None, n=500, sd=1.0):
    return {
        "heldout_accuracy": accuracy,
        "heldout_accuracy_n": n,
        "gold_reward": gold,
        "gold_reward_sd": sd,
        "gold_reward_n": 256,
    }


def test_verdicts_say_plainly_when_a_stage_did_not_beat_its_baseline():
    evaluation = {
        "pretrain": _row(accuracy=0.0),
        "sft": _row(accuracy=0.5, gold=0.0),
        "ppo": _row(gold=0.5),  # 2 SE of the difference: 2·√(2/256) = 0.177
        "sft-vs-ppo": _row(gold=0.4),  # 0.1 above: within noise
        "grpo": _row(accuracy=0.6),
        "sft-vs-grpo": _row(accuracy=0.65),  # continued SFT ahead: no
    }
    stages = {"rm": {"heldout_accuracy": 0.52, "heldout_pairs": 100}}  # 2 SE = 0.1 around a coin
    found = {(v["stage"], v["baseline"]): v for v in verdicts(evaluation, stages)}
    assert {k: v["verdict"] for k, v in found.items()} == {
        ("sft", "pretrain"): "clear",
        ("rm", "chance"): "within noise",
        ("ppo", "sft"): "clear",
        ("ppo", "sft-vs-ppo"): "within noise",
        ("grpo", "sft"): "clear",
        ("grpo", "sft-vs-grpo"): "no",
    }
    assert abs(found["ppo", "sft-vs-ppo"]["two_se"] - 2 * (2 / 256) ** 0.5) < 1e-12
    text = found["grpo", "sft-vs-grpo"]["text"]
    assert text.startswith("grpo: heldout_accuracy 0.600 vs 0.650 for continued SFT")
    assert "DID NOT IMPROVE (-0.050" in text


def test_the_report_leads_with_the_failed_comparisons(tmp_path):
    samples = {"reviews": [], "arithmetic": []}
    evaluation = {name: {**_row(accuracy=0.5, gold=0.1), "samples": samples} for name in CHECKPOINTS}
    evaluation["grpo"]["heldout_accuracy"] = 0.4
    write_report(tmp_path, None, {}, evaluation, {"wall_seconds": 1.0, "peak_rss_mb": 1.0})
    report = (tmp_path / "report.md").read_text()
    lead = report.split("## Did each stage earn its place?")[1].split("##")[0]
    assert "**5 of 5 comparisons did not show a clear gain**" in lead and "DID NOT IMPROVE" in lead


def test_bold_is_bold_in_html_and_a_samples_stars_stay_literal(tmp_path):
    samples = {"reviews": [("Review: **great**", "it was **so** good")], "arithmetic": []}
    evaluation = {name: {**_row(accuracy=0.5, gold=0.1), "samples": samples} for name in CHECKPOINTS}
    evaluation["grpo"]["heldout_accuracy"] = 0.4
    write_report(tmp_path, None, {}, evaluation, {"wall_seconds": 1.0, "peak_rss_mb": 1.0})
    page = (tmp_path / "report.html").read_text()
    assert "<strong>" in page and "comparisons did not show a clear gain</strong>" in page
    assert "it was **so** good" in page and "<strong>so</strong>" not in page  # the model's text as written


def test_checkpoints_with_per_prompt_scores_are_compared_prompt_by_prompt():
    """Paired: the SE of the mean per-prompt difference. By hand: d = (0, 0, 1, 0), mean 0.25, sample
    variance 0.25, SE √(0.25/4) = 0.25, 2 SE 0.5 (unpaired: 2·√(0.75·0.25/4 + 0.5·0.5/4) = 0.661)."""
    grpo = {**_row(accuracy=0.75, n=4), "heldout_rewards": [1.0, 0.0, 1.0, 1.0]}
    base = {**_row(accuracy=0.5, n=4), "heldout_rewards": [1.0, 0.0, 0.0, 1.0]}
    found = {(v["stage"], v["baseline"]): v for v in verdicts({"grpo": grpo, "sft": base}, {})}
    assert found["grpo", "sft"]["paired"] and abs(found["grpo", "sft"]["two_se"] - 0.5) < 1e-12
    assert "2 SE 0.500, paired" in found["grpo", "sft"]["text"]
    # gold reward: the same responses' rewards shifted by 0.1 differ by exactly 0.1 on every prompt: no noise
    gold = [0.3, -1.2, 2.0, 0.5]
    ev = {
        "ppo": {**_row(gold=0.5), "gold_rewards": [g + 0.1 for g in gold]},
        "sft": {**_row(gold=0.4), "gold_rewards": gold},
    }
    assert verdicts(ev, {})[0]["two_se"] < 1e-12 and verdicts(ev, {})[0]["verdict"] == "clear"
    del base["heldout_rewards"][0]  # lengths differ (not the same prompts): unpaired
    v = verdicts({"grpo": grpo, "sft": base}, {})[0]
    assert not v["paired"] and abs(v["two_se"] - 2 * (0.75 * 0.25 / 4 + 0.25 / 4) ** 0.5) < 1e-12


def test_a_stage_plot_drawn_beside_the_training_is_kept_until_its_metrics_change(tmp_path):
    """The demo draws each stage's curves once the stage is done; the report keeps that PNG, and draws it
    again only when the stage's metrics are newer (a resumed stage)."""
    import os

    metrics = tmp_path / "sft" / "metrics.jsonl"
    metrics.parent.mkdir()
    metrics.write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, 6)))
    png = plot_stage(tmp_path, "sft")
    assert png == tmp_path / "plots" / "sft.png" and png.stat().st_size > 1000
    os.utime(png, (1e9, 1e9))
    os.utime(metrics, (1e9 - 10, 1e9 - 10))
    assert plot_stage(tmp_path, "sft").stat().st_mtime == 1e9  # kept
    os.utime(metrics, (1e9 + 10, 1e9 + 10))
    assert plot_stage(tmp_path, "sft").stat().st_mtime > 1e9 + 10  # the metrics changed: drawn again
    assert plot_stage(tmp_path, "ppo") is None  # no metrics, no plot
