"""The demo's evaluation of every checkpoint on held-out prompts, its plots, and report.md / report.html."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from postrl.runtime.logging import read_jsonl
from postrl.runtime.plots import plot_curves

CHECKPOINTS = ("pretrain", "sft", "ppo", "grpo", "sft-vs-ppo", "sft-vs-grpo")
COLUMNS = ("heldout_loss", "heldout_accuracy", "gold_reward", "rm_score", "kl_to_ref", "kl_to_ref_arithmetic")


def evaluate_checkpoints(cfg: Any, out: Path) -> dict[str, dict[str, Any]]:
    """Held-out loss, arithmetic exact match (greedy), and on review prompts the gold reward, RM score and
    KL to the SFT policy (sampled), for every checkpoint the demo wrote; the same prompts for all."""
    import torch

    from postrl.lm.data import tokenize_sft
    from postrl.lm.evaluation import evaluate_preference_policy, evaluate_task
    from postrl.lm.models import load_causal_lm
    from postrl.lm.rewards import load_reward_fn
    from postrl.lm.tasks import get_task
    from postrl.lm.tokenizer import load_tokenizer
    from postrl.lm.trainer import heldout_loss, make_batches

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
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
    results: dict[str, dict[str, Any]] = {}
    for name in CHECKPOINTS:
        path = out / name / "model"
        if not path.is_dir():
            continue
        model = load_causal_lm(path).eval()
        arith = evaluate_task(
            model, tokenizer, arithmetic, n=cfg.eval_prompts, max_new_tokens=cfg.grpo.sampling.max_new_tokens
        )
        prefs = evaluate_preference_policy(
            model,
            tokenizer,
            reviews,
            reference=reference,
            reward_model=rm,
            n=cfg.eval_samples,
            max_new_tokens=cfg.ppo.sampling.max_new_tokens,
            seed=cfg.seed,
        )
        arith_kl = evaluate_preference_policy(
            model,
            tokenizer,
            arithmetic,
            reference=reference,
            n=min(cfg.eval_samples, cfg.eval_prompts),
            max_new_tokens=cfg.grpo.sampling.max_new_tokens,
            seed=cfg.seed,
        )
        results[name] = {
            "heldout_loss": heldout_loss(model, batches),
            "heldout_accuracy": arith["reward"],
            "gold_reward": prefs["gold_reward"],
            "rm_score": prefs["rm_score"],
            "kl_to_ref": prefs["kl_to_ref"],
            "kl_to_ref_arithmetic": arith_kl["kl_to_ref"],
            "samples": {"arithmetic": arith["samples"], "reviews": prefs["samples"]},
        }
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


def _table_md(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(lines)


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
    from postrl.runtime.checkpoint import atomic_write_text

    plots = make_plots(out)
    table = metrics_table(evaluation, stages)
    md = [
        "# postrl demo report",
        "",
        f"Total {summary['wall_seconds']:.0f} s, peak memory {summary['peak_rss_mb']:.0f} MB.",
        "",
        "## Held-out metrics per checkpoint",
        "",
        _table_md(table),
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
        lines += [f"### {task}: SFT → {after}", "", "| prompt | SFT | " + after + " |", "|---|---|---|"]
        before, later = ev["sft"]["samples"][task], ev[after]["samples"][task]
        for (prompt, a), (_, b) in zip(before, later, strict=False):
            lines.append(f"| {prompt} | {a} | {b} |".replace("\n", " "))
        lines.append("")
    return lines


def _html(md_lines: list[str], out: Path) -> str:
    """A small self-contained HTML rendering of the report (tables, headings, inline PNGs)."""
    body: list[str] = []
    table: list[str] = []
    for line in md_lines + [""]:
        if line.startswith("|"):
            if not line.startswith("|---"):
                cells = [html.escape(c.strip()) for c in line.strip("|").split("|")]
                tag = "th" if not table else "td"
                table.append("<tr>" + "".join(f"<{tag}>{c}</{tag}>" for c in cells) + "</tr>")
            continue
        if table:
            body.append("<table>" + "".join(table) + "</table>")
            table = []
        if line.startswith("!["):
            src = line[line.index("(") + 1 : -1]
            data = base64.b64encode((out / src).read_bytes()).decode()
            body.append(f'<img src="data:image/png;base64,{data}" style="max-width:720px">')
        elif line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{html.escape(line.lstrip('#').strip())}</h{level}>")
        elif line.strip():
            body.append(f"<p>{html.escape(line)}</p>")
    style = (
        "body{font-family:sans-serif;max-width:960px;margin:2em auto}td,th{border:1px solid #ccc;padding:4px}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>postrl demo</title><style>{style}</style>"
        f"</head><body>{''.join(body)}</body></html>\n"
    )
