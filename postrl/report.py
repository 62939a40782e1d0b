"""The demo's evaluation of every checkpoint on held-out prompts, its plots, and report.md / report.html."""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from postrl.lm.data import tokenize_sft
from postrl.lm.models import load_causal_lm
from postrl.lm.rewards import load_reward_fn
from postrl.lm.rollout.evaluation import evaluate_preference_policy, evaluate_task
from postrl.lm.tasks import get_task
from postrl.lm.tokenizer import load_tokenizer
from postrl.lm.trainer import heldout_loss, make_batches
from postrl.runtime.checkpoint import atomic_write_text
from postrl.runtime.logging import read_jsonl
from postrl.runtime.plots import plot_curves

CHECKPOINTS = ("pretrain", "sft", "ppo", "grpo", "sft-vs-ppo", "sft-vs-grpo")
COLUMNS = ("heldout_loss", "heldout_accuracy", "gold_reward", "rm_score", "kl_to_ref", "kl_to_ref_arithmetic")


@dataclass
class HeldOut:
    """What every checkpoint is evaluated against: the tasks, the SFT tokenizer, the reference (the SFT
    policy), the reward model's scores and the held-out demonstrations as batches."""

    arithmetic: Any
    reviews: Any
    tokenizer: Any
    reference: torch.nn.Module
    rm: Any
    batches: list[dict[str, torch.Tensor]]

    @classmethod
    def load(cls, cfg: Any, out: Path) -> HeldOut:
        """The held-out world of the demo in ``out`` (its SFT model and reward model), from config ``cfg``."""
        arithmetic = get_task("arithmetic", **cfg.grpo.task)
        reviews = get_task("reviews", **cfg.ppo.task)
        tokenizer = load_tokenizer(out / "sft" / "model")
        reference = load_causal_lm(out / "sft" / "model").eval()
        rm = load_reward_fn(f"rm:{out / 'rm' / 'model'}").fn
        demos = arithmetic.sft_rows("test")[:256] + reviews.sft_rows("test")[:256]
        examples = tokenize_sft(demos, tokenizer, 64, "truncate")
        batches = [
            make_batches(examples[i : i + 64], tokenizer.pad_token_id) for i in range(0, len(examples), 64)
        ]
        return cls(arithmetic, reviews, tokenizer, reference, rm, batches)


def evaluate_checkpoint(model: torch.nn.Module, held: HeldOut, cfg: Any) -> dict[str, Any]:
    """One checkpoint's row of `COLUMNS`, plus a few samples of each task."""
    arith = evaluate_task(
        model,
        held.tokenizer,
        held.arithmetic,
        n=cfg.eval_prompts,
        max_new_tokens=cfg.grpo.sampling.max_new_tokens,
    )
    prefs = evaluate_preference_policy(
        model,
        held.tokenizer,
        held.reviews,
        reference=held.reference,
        reward_model=held.rm,
        n=cfg.eval_samples,
        max_new_tokens=cfg.ppo.sampling.max_new_tokens,
        seed=cfg.seed,
    )
    arith_kl = evaluate_preference_policy(
        model,
        held.tokenizer,
        held.arithmetic,
        reference=held.reference,
        n=min(cfg.eval_samples, cfg.eval_prompts),
        max_new_tokens=cfg.grpo.sampling.max_new_tokens,
        seed=cfg.seed,
    )
    return {
        "heldout_loss": heldout_loss(model, held.batches),
        "heldout_accuracy": arith["reward"],
        "gold_reward": prefs["gold_reward"],
        "rm_score": prefs["rm_score"],
        "kl_to_ref": prefs["kl_to_ref"],
        "kl_to_ref_arithmetic": arith_kl["kl_to_ref"],
        "samples": {"arithmetic": arith["samples"], "reviews": prefs["samples"]},
    }


def evaluate_checkpoints(cfg: Any, out: Path) -> dict[str, dict[str, Any]]:
    """Held-out loss, arithmetic exact match (greedy), and on review prompts the gold reward, RM score and
    KL to the SFT policy (sampled), for every checkpoint the demo wrote; the same prompts for all."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    held = HeldOut.load(cfg, out)
    results: dict[str, dict[str, Any]] = {}
    for name in CHECKPOINTS:
        path = out / name / "model"
        if not path.is_dir():
            continue
        results[name] = evaluate_checkpoint(load_causal_lm(path).eval(), held, cfg)
    return results


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


def make_plots(out: Path) -> dict[str, Path]:
    """Learning curves of each stage and PPO's RM score vs gold reward vs KL, as PNGs in ``out/plots``."""
    plots = out / "plots"
    wanted = {
        "pretrain": ["loss", "heldout_loss"],
        "sft": ["loss", "heldout_loss", "heldout_accuracy"],
        "rm": ["loss", "heldout_accuracy"],
        "ppo": ["heldout_rm_score", "heldout_gold_reward", "heldout_kl"],
        "grpo": ["reward_mean", "heldout_accuracy", "kl"],
    }
    made: dict[str, Path] = {}
    for stage, keys in wanted.items():
        path = out / stage / "metrics.jsonl"
        if path.is_file():
            png = plot_curves(read_jsonl(path), keys, plots / f"{stage}.png", title=stage)
            if png is not None:
                made[stage] = png
    return made


def _cell_md(text: str) -> str:
    """A table cell's Markdown: one line, ``|`` escaped so it stays one cell, backticks escaped so a model's
    text shows as written."""
    return text.replace("\n", " ").replace("|", "\\|").replace("`", "\\`")


def _table_md(rows: list[list[str]]) -> list[str]:
    """A Markdown table, one line per row: the header, the separator, the data rows."""
    lines = ["| " + " | ".join(_cell_md(c) for c in rows[0]) + " |", "|" + "---|" * len(rows[0])]
    return lines + ["| " + " | ".join(_cell_md(c) for c in r) + " |" for r in rows[1:]]


STAGE_TEXT = {
    "pretrain": "Next-token prediction from scratch on the generated corpus: the tiny Llama learns the "
    "world's language (the notes' starting point: a pretrained LM).",
    "sft": "Supervised fine-tuning on demonstrations, loss on completion tokens only; stopped at a held-out "
    "accuracy band so RL has room (the notes' SFT stage, π_SFT).",
    "rm": "A Bradley–Terry reward model, r_φ on the last token, trained on the synthetic labeller's "
    "preferences with ties at 0.5 (the notes' reward-model section).",
    "ppo": "PPO-RLHF: actor, critic, frozen reward model and frozen reference; KL-shaped token rewards and "
    "GAE (the notes' PPO section). Gold reward is the hidden 'true preference'.",
    "grpo": "GRPO: G samples per prompt, group-normalised rewards from the arithmetic verifier as the "
    "baseline, no critic, k3 KL to the reference (the notes' GRPO section).",
}


def write_report(
    out: Path, cfg: Any, stages: dict[str, dict], evaluation: dict[str, dict], summary: dict[str, Any]
) -> None:
    """report.md (images beside it) and report.html (images inline)."""
    plots = make_plots(out)
    table = metrics_table(evaluation, stages)
    md = [
        "# postrl demo report",
        "",
        f"Total {summary['wall_seconds']:.0f} s, peak memory {summary['peak_rss_mb']:.0f} MB.",
        "",
        "## Held-out metrics per checkpoint",
        "",
        *_table_md(table),
        "",
        "`heldout_accuracy`: arithmetic exact match (greedy); `gold_reward`, `rm_score`, `kl_to_ref`: "
        "review prompts, sampled at temperature 1, KL to the SFT policy; `sft-vs-*`: continued SFT for "
        "the same wall time as that RL stage.",
        "",
        *_comparison(evaluation),
        "",
        "## Stages",
        "",
    ]
    for stage, text in STAGE_TEXT.items():
        md += [f"### {stage}", "", text, ""]
        if stage in plots:
            md += [f"![{stage}]({plots[stage].relative_to(out)})", ""]
    md += ["## Samples before and after RL", "", *_samples_md(evaluation)]
    atomic_write_text(out / "report.md", "\n".join(md) + "\n")
    atomic_write_text(out / "report.html", _html(md, out))


def _comparison(ev: dict[str, dict]) -> list[str]:
    lines = []
    sft = ev.get("sft", {})
    for rl, key in (("ppo", "gold_reward"), ("grpo", "heldout_accuracy")):
        if rl in ev and f"sft-vs-{rl}" in ev and sft.get(key) is not None:
            lines.append(
                f"- {rl}: {key} {_fmt(sft[key])} (SFT) → {_fmt(ev[rl][key])} ({rl}); continued SFT "
                f"for the same time: {_fmt(ev[f'sft-vs-{rl}'][key])}."
            )
    return lines


def _samples_md(ev: dict[str, dict]) -> list[str]:
    lines: list[str] = []
    for task, after in (("reviews", "ppo"), ("arithmetic", "grpo")):
        if "sft" not in ev or after not in ev:
            continue
        before, later = ev["sft"]["samples"][task], ev[after]["samples"][task]
        rows = [["prompt", "SFT", after]]
        rows += [[prompt, a, b] for (prompt, a), (_, b) in zip(before, later, strict=False)]
        lines += [f"### {task}: SFT → {after}", "", *_table_md(rows), ""]
    return lines


# ---- report.html: the Markdown above as HTML (the subset this report writes) ------------------------------
_BLOCKS = {"|": "table", "- ": "list", "![": "image", "#": "heading"}


def _inline(text: str) -> str:
    """Escaped text with `code` spans as <code> (an escaped backtick is a literal one)."""
    code = re.sub(r"(?<!\\)`(.+?)(?<!\\)`", r"<code>\1</code>", html.escape(text))
    return code.replace("\\`", "`")


def _cells(line: str) -> list[str]:
    """The cells of one Markdown table row (``\\|`` is a literal bar inside a cell)."""
    inner = line.strip().removeprefix("|").removesuffix("|")
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def _table_html(lines: list[str]) -> str:
    """A header row of <th>, then one <tr> of <td> per data row (the ``|---|`` separator dropped)."""
    rows = [_cells(line) for line in lines if not re.fullmatch(r"\|?(\s*:?-+:?\s*\|)+\s*", line.strip())]
    head = "<tr>" + "".join(f"<th>{_inline(c)}</th>" for c in rows[0]) + "</tr>"
    body = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rows[1:])
    return f"<table><thead>{head}</thead><tbody>{body}</tbody></table>"


def _kind(line: str) -> str:
    return next(
        (kind for start, kind in _BLOCKS.items() if line.startswith(start)), "text" if line.strip() else ""
    )


def _block_html(kind: str, lines: list[str], out: Path) -> list[str]:
    if kind == "table":
        return [_table_html(lines)]
    if kind == "list":
        return ["<ul>" + "".join(f"<li>{_inline(line[2:])}</li>" for line in lines) + "</ul>"]
    if kind == "image":
        images = []
        for line in lines:
            src = line[line.index("(") + 1 : -1]
            data = base64.b64encode((out / src).read_bytes()).decode()
            images.append(f'<img src="data:image/png;base64,{data}" alt="{html.escape(src)}">')
        return images
    if kind == "heading":  # one line: a heading always starts a block of its own
        level = len(lines[0]) - len(lines[0].lstrip("#"))
        return [f"<h{level}>{_inline(lines[0].lstrip('#').strip())}</h{level}>"]
    return [f"<p>{_inline(' '.join(lines))}</p>"] if kind == "text" else []


def _html(md_lines: list[str], out: Path) -> str:
    """A small self-contained HTML rendering of the report's Markdown: headings, paragraphs, bullet lists,
    tables (a header row, then a row per data row), `code` spans and inline PNGs."""
    lines = "\n".join(md_lines).split("\n")
    body: list[str] = []
    start = 0
    for end in range(1, len(lines) + 1):
        if end == len(lines) or _kind(lines[end]) != _kind(lines[start]) or _kind(lines[end]) == "heading":
            body += _block_html(_kind(lines[start]), lines[start:end], out)
            start = end
    style = (
        "body{font-family:sans-serif;max-width:960px;margin:2em auto;line-height:1.4}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px}"
        "th{background:#f3f3f3}td{font-variant-numeric:tabular-nums}"
        "code{background:#f3f3f3;padding:0 3px;border-radius:3px}img{max-width:720px}"
    )
    head = f"<meta charset='utf-8'><title>postrl demo</title><style>{style}</style>"
    return "\n".join([f"<!doctype html><html><head>{head}</head><body>", *body, "</body></html>"]) + "\n"
