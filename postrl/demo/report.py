"""The demo's report: report.md (images beside it) and report.html (images inline) from the common evaluation,
the verdicts and summary.json; each stage's learning curves as PNGs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from postrl.demo.evaluation import COLUMNS
from postrl.demo.report_html import to_html
from postrl.demo.verdicts import verdicts
from postrl.lm.dpo.frontier import plot_frontier
from postrl.runtime.checkpoint import atomic_write_text
from postrl.runtime.logging import read_jsonl
from postrl.runtime.plots import plot_curves


def _fmt(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) else "–"


def _seconds(x: Any) -> str:
    return f"{x:.0f}" if isinstance(x, (int, float)) else "–"


def metrics_table(evaluation: dict[str, dict[str, Any]], stages: dict[str, dict]) -> list[list[str]]:
    """Rows of the held-out table: checkpoint, its stage's wall time, then COLUMNS."""
    rows = [["checkpoint", "stage seconds", *COLUMNS]]
    for name, ev in evaluation.items():
        rows.append(
            [name, _seconds(stages.get(name, {}).get("wall_seconds")), *(_fmt(ev.get(c)) for c in COLUMNS)]
        )
    return rows


PLOTTED = {
    "pretrain": ["loss", "heldout_loss"],
    "sft": ["loss", "heldout_loss", "heldout_accuracy"],
    "rm": ["loss", "heldout_accuracy"],
    "ppo": ["heldout_rm_score", "heldout_gold_reward", "heldout_kl"],
    "dpo": ["loss", "heldout_reward_accuracy", "heldout_gold_reward", "heldout_kl"],
    "grpo": ["reward_mean", "heldout_accuracy", "kl"],
}
"""The learning curves the report shows per stage: the metrics drawn, one panel each."""


def plot_stage(out: Path, stage: str) -> Path | None:
    """``stage``'s learning curves (`PLOTTED`) as ``out/plots/STAGE.png``; a PNG newer than the stage's
    metrics is kept (the demo draws each stage's curves beside the training, once it is done)."""
    metrics, png = out / stage / "metrics.jsonl", out / "plots" / f"{stage}.png"
    if not metrics.is_file():
        return None
    if png.is_file() and png.stat().st_mtime >= metrics.stat().st_mtime:
        return png
    return plot_curves(read_jsonl(metrics), PLOTTED[stage], png, title=stage)


def make_plots(out: Path) -> dict[str, Path]:
    """Learning curves of each stage and PPO's RM score vs gold reward vs KL, as PNGs in ``out/plots``."""
    return {stage: png for stage in PLOTTED if (png := plot_stage(out, stage)) is not None}


def _cell_md(text: str) -> str:
    """A table cell's Markdown: one line, ``|`` escaped so it stays one cell, backticks and stars escaped so
    a model's text shows as written."""
    return text.replace("\n", " ").replace("|", "\\|").replace("`", "\\`").replace("*", "\\*")


def table_md(rows: list[list[str]]) -> list[str]:
    """A Markdown table, one line per row: the header, the separator, the data rows."""
    lines = ["| " + " | ".join(_cell_md(c) for c in rows[0]) + " |", "|" + "---|" * len(rows[0])]
    return lines + ["| " + " | ".join(_cell_md(c) for c in r) + " |" for r in rows[1:]]


STAGE_TEXT = {
    "pretrain": "Next-token prediction from scratch on the generated corpus (sums without a carry as bare "
    'equations "41+38: 79", reviews, generic sentences): the tiny Llama learns the world\'s language and '
    "to add without carrying, but never sees the question format nor a carry (the notes' starting point: a "
    "pretrained LM). By default the built-in base model that postrl ships, made by the same config.",
    "sft": "Supervised fine-tuning on a few hundred demonstrations of the question format and on reviews, loss "
    "on completion tokens only, until the demonstrations are used up: held-out accuracy peaks, then the "
    "held-out loss turns up (the notes' SFT stage, π_SFT). Continued SFT from here is the RL stages' "
    "baseline.",
    "rm": "A Bradley–Terry reward model, r_φ on the last token, trained on the synthetic labeller's "
    "preferences with ties at 0.5 (the notes' reward-model section).",
    "ppo": "PPO-RLHF: actor, critic, frozen reward model and frozen reference; KL-shaped token rewards and "
    "GAE (the notes' PPO section). Gold reward is the hidden 'true preference'.",
    "dpo": "DPO on the reward model's own preference pairs (Rafailov et al. 2023): the policy's log-ratio to "
    "the SFT policy is the implicit reward, fitted to the pairs with the Bradley–Terry loss; no reward model "
    "and no sampling in training (the RM only scores its samples for the report).",
    "grpo": "GRPO: G samples per prompt on the task's 5,000 train prompts (SFT saw a few hundred "
    "demonstrations: checking an answer is cheaper than writing one), group-normalised rewards from the "
    "arithmetic verifier as the baseline, no critic, k3 KL to the reference (the notes' GRPO section).",
}


def _load(values: list[float]) -> str:
    """The load averages (1, 5, 15 min) before and after the demo, as one phrase."""
    before, after = ("/".join(f"{x:.1f}" for x in values[k : k + 3]) for k in (0, 3))
    return f", load average {before} before and {after} after (1/5/15 min)"


def _resumed(done: dict[str, float], n: int) -> str:
    """The header's note on a resumed demo: the stages an earlier invocation finished, and their time."""
    if not done:
        return ""
    text = f" This invocation resumed the demo: {len(done)} of {n} stages ({', '.join(done)}) had finished "
    return text + f"before it, in {sum(done.values()):.0f} s of their own, not counted in the total above."


def _verdict_md(found: list[dict[str, Any]]) -> list[str]:
    if not found:
        return ["No stage could be compared with its baseline (their checkpoints are missing)."]
    failed = [v for v in found if v["verdict"] != "clear"]
    head = (
        f"Every stage beat its baseline by more than two standard errors ({len(found)} comparisons)."
        if not failed
        else f"**{len(failed)} of {len(found)} comparisons did not show a clear gain** "
        f"({', '.join(v['stage'] + ' vs ' + v['baseline'] for v in failed)}); see below."
    )
    return [head, "", *(f"- {v['text']}" for v in found)]


def _paired_md(found: list[dict[str, Any]]) -> list[str]:
    if not any(v.get("paired") for v in found):
        return []
    return [
        "",
        "Paired: both checkpoints answered the same held-out prompts, and 2 SE is twice the standard error of "
        "the mean per-prompt difference (prompts hard for both do not count as noise).",
    ]


def _not_run_md(cfg: Any) -> list[str]:
    """The comparisons the demo's config left out, named (the quick demo runs no continued-SFT baselines)."""
    if getattr(cfg, "compare_sft", True):
        return []
    return [
        "- ppo and grpo vs continued SFT for their training time: not run with --quick (`compare_sft: false`); "
        "the full demo runs them."
    ]


def write_report(
    out: Path,
    cfg: Any,
    stages: dict[str, dict],
    evaluation: dict[str, dict],
    summary: dict[str, Any],
    sections: Sequence[str] = (),
) -> None:
    """report.md (images beside it) and report.html (images inline). The table and the verdicts come from
    ``evaluation``, the same numbers as summary.json's ``stages``; ``sections`` (Markdown lines, e.g. the
    vision branch's, `postrl.demo.vlm_eval.report_md`) go before the samples."""
    plots = make_plots(out)
    table = metrics_table(evaluation, stages)
    found = summary.get("verdicts") or verdicts(evaluation, stages)
    cpu = summary.get("cpu_seconds")
    md = [
        "# postrl demo report",
        "",
        f"Total {summary['wall_seconds']:.0f} s"
        + (f" ({cpu:.0f} s of CPU time in this invocation)" if isinstance(cpu, (int, float)) else "")
        + (f" with {summary['workers']} stages at a time" if summary.get("workers", 1) > 1 else "")
        + f", peak memory {summary['peak_rss_mb']:.0f} MB"
        + (" (all its processes together)" if summary.get("workers", 1) > 1 else "")
        + (_load(summary["load_average"]) if summary.get("load_average") else "")
        + "."
        + _resumed(summary.get("finished_before") or {}, len(stages)),
        "",
        "## Did each stage earn its place?",
        "",
        *_verdict_md(found),
        *_not_run_md(cfg),
        *_paired_md(found),
        "",
        "## Held-out metrics per checkpoint",
        "",
        *table_md(table),
        "",
        "`heldout_accuracy`: arithmetic exact match, greedy, on the held-out prompts; `gold_reward`, "
        "`rm_score`, `kl_to_ref`: review prompts, sampled at temperature 1, KL to the SFT policy; "
        "`kl_to_ref_arithmetic`: the same on arithmetic prompts; `sft-vs-*`: continued SFT for the same "
        "training time as that RL stage. These are the numbers of summary.json. The lines a stage prints "
        "while it runs are its trainer's own check (SFT: greedy on `sft.eval_size` prompts; PPO: "
        "`ppo.eval_size` samples; GRPO: `grpo.eval_size` prompts), so they differ from the table's by "
        "sample count. The reward model's pair accuracy is its own held-out check.",
        "",
        "## Stages",
        "",
    ]
    for stage, text in STAGE_TEXT.items():
        md += [f"### {stage}", "", text, ""]
        if stage in plots:
            md += [f"![{stage}]({plots[stage].relative_to(out)})", ""]
    md += _frontier_md(out, summary.get("frontier") or [])
    md += list(sections)
    md += ["## Samples before and after RL", "", *_samples_md(evaluation)]
    atomic_write_text(out / "report.md", "\n".join(md) + "\n")
    atomic_write_text(out / "report.html", to_html(md, out))


# ---- the gold-reward frontier of the review stages ------------------------------------------------------------
def _frontier_md(out: Path, points: list[dict[str, Any]]) -> list[str]:
    """The chart and what to read in it; nothing when the demo ran no review stage."""
    if not any(p["method"] != "sft" for p in points):
        return []
    png = plot_frontier(points, out / "plots" / "frontier.png")
    bon = [p for p in points if p["method"] == "best-of-n"]
    best = max(
        (p for p in points if p["method"] not in ("sft", "best-of-n")), key=lambda p: p["gold"], default=None
    )
    lines = [
        "## The gold-reward frontier (reviews)",
        "",
        "How far can a policy be pushed against a learned reward before it games it? Left: the hidden gold "
        "reward; right: the reward model's score, the proxy the RL stages optimise; both against the KL to "
        "the SFT policy. Where the two panels part, the policy is exploiting the reward model (Gao et al. "
        "2022). PPO's and DPO's points are their trainers' held-out checks along training "
        "(`ppo.eval_size` / `dpo.eval_samples` sampled responses, so noisier than the table above); "
        "best-of-n samples n responses from the SFT policy and keeps the one the reward model likes best.",
        "",
        f"![frontier]({png.relative_to(out)})",
        "",
    ]
    if bon and best is not None:
        near = min(bon, key=lambda p: abs(p["kl"] - best["kl"]))
        lines += [
            f"The best trained point here, {best['method']} at step {best['step']}, reaches gold "
            f"{best['gold']:.3f} at KL {best['kl']:.2f}; best-of-{near['n']} at KL {near['kl']:.2f} reaches "
            f"{near['gold']:.3f}"
            + (
                " — sampling and reranking beats training at this KL." if near["gold"] > best["gold"] else "."
            ),
            "",
        ]
    return lines


def _samples_md(ev: dict[str, dict]) -> list[str]:
    lines: list[str] = []
    for task, after in (("reviews", "ppo"), ("arithmetic", "grpo")):
        if "sft" not in ev or after not in ev:
            continue
        before, later = ev["sft"]["samples"][task], ev[after]["samples"][task]
        rows = [["prompt", "SFT", after]]
        rows += [[prompt, a, b] for (prompt, a), (_, b) in zip(before, later, strict=False)]
        lines += [f"### {task}: SFT → {after}", "", *table_md(rows), ""]
    return lines
