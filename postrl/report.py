"""The demo's evaluation of every checkpoint on held-out prompts, its plots, and report.md / report.html."""

from __future__ import annotations

from collections.abc import Sequence
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
from postrl.report_html import to_html
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
        "heldout_accuracy_n": arith["n"],
        "gold_reward": prefs["gold_reward"],
        "gold_reward_sd": prefs.get("gold_reward_sd"),
        "gold_reward_n": cfg.eval_samples,
        "heldout_rewards": arith["rewards"],  # per prompt, and per response below: for paired comparisons
        "gold_rewards": prefs["gold_rewards"],
        "rm_score": prefs["rm_score"],
        "kl_to_ref": prefs["kl_to_ref"],
        "kl_to_ref_arithmetic": arith_kl["kl_to_ref"],
        "samples": {"arithmetic": arith["samples"], "reviews": prefs["samples"]},
    }


def evaluate_checkpoints(
    cfg: Any, out: Path, names: Sequence[str] = CHECKPOINTS
) -> dict[str, dict[str, Any]]:
    """Held-out loss, arithmetic exact match (greedy), and on review prompts the gold reward, RM score and
    KL to the SFT policy (sampled), for every checkpoint ``out/NAME/model`` of ``names`` that exists; the
    same prompts for all."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    held = HeldOut.load(cfg, out)
    results: dict[str, dict[str, Any]] = {}
    for name in names:
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


# (stage, metric, baseline): what each stage must beat. A baseline is a checkpoint of the evaluation, or
# "chance" (a coin's pair accuracy, for the reward model). A new stage adds its rows here.
COMPARISONS = (
    ("sft", "heldout_accuracy", "pretrain"),
    ("rm", "heldout_accuracy", "chance"),
    ("ppo", "gold_reward", "sft"),
    ("ppo", "gold_reward", "sft-vs-ppo"),
    ("dpo", "gold_reward", "sft"),
    ("grpo", "heldout_accuracy", "sft"),
    ("grpo", "heldout_accuracy", "sft-vs-grpo"),
    ("vlm-sft", "heldout_accuracy", "vlm-align"),  # the vision branch (postrl.demo_vlm)
    ("vlm-grpo", "heldout_accuracy", "vlm-sft"),
    ("vlm-grpo", "heldout_accuracy", "vlm-sft-vs-grpo"),
)
BASELINE_TEXT = {
    "pretrain": "the pretrained model",
    "sft": "SFT",
    "chance": "chance",
    "sft-vs-ppo": "continued SFT for PPO's training time",
    "sft-vs-grpo": "continued SFT for GRPO's training time",
    "vlm-align": "the aligned VLM",
    "vlm-sft": "the VLM's SFT",
    "vlm-sft-vs-grpo": "the VLM's continued SFT for GRPO's training time",
}


PER_ITEM = {"heldout_accuracy": "heldout_rewards", "gold_reward": "gold_rewards"}
"""Where a row keeps a metric's per-prompt values (the same held-out prompts, in the same order, for every
checkpoint), so that two checkpoints compare prompt by prompt."""


def _paired_standard_error(metric: str, row: dict[str, Any], base_row: dict[str, Any]) -> float | None:
    """The standard error of the mean per-prompt difference between two checkpoints (a paired comparison:
    prompts that are hard for both do not count as noise), or None without per-prompt values of both."""
    xs, ys = row.get(PER_ITEM.get(metric, "")), base_row.get(PER_ITEM.get(metric, ""))
    if not isinstance(xs, list) or not isinstance(ys, list) or len(xs) != len(ys) or len(xs) < 2:
        return None
    d = [x - y for x, y in zip(xs, ys, strict=True)]
    mean = sum(d) / len(d)
    return (sum((v - mean) ** 2 for v in d) / (len(d) - 1) / len(d)) ** 0.5


def _standard_error(metric: str, row: dict[str, Any], value: float) -> float | None:
    """The standard error of one checkpoint's mean: binomial for an accuracy, sd/√n for the gold reward."""
    if metric == "heldout_accuracy" and row.get("heldout_accuracy_n"):
        return (value * (1 - value) / row["heldout_accuracy_n"]) ** 0.5
    if metric == "gold_reward" and row.get("gold_reward_sd") is not None and row.get("gold_reward_n"):
        return row["gold_reward_sd"] / row["gold_reward_n"] ** 0.5
    return None


def _rm_row(stages: dict[str, dict]) -> dict[str, Any]:
    rm = stages.get("rm", {})
    return {"heldout_accuracy": rm.get("heldout_accuracy"), "heldout_accuracy_n": rm.get("heldout_pairs")}


def verdicts(evaluation: dict[str, dict[str, Any]], stages: dict[str, dict]) -> list[dict[str, Any]]:
    """For each row of `COMPARISONS` whose numbers exist: the two values, the margin, two standard errors of
    the difference (paired, prompt by prompt, where both rows keep per-prompt values; else unpaired, from each
    mean's own standard error) and a verdict — ``clear`` (margin above 2 SE), ``within noise`` (above 0, not
    above 2 SE) or ``no`` (not above 0) — with a sentence that says it plainly."""
    out = []
    for stage, metric, base in COMPARISONS:
        row = _rm_row(stages) if stage == "rm" else evaluation.get(stage, {})
        value = row.get(metric)
        if base == "chance":
            base_row, base_value = {}, 0.5
        else:
            base_row = evaluation.get(base, {})
            base_value = base_row.get(metric)
        if not isinstance(value, (int, float)) or not isinstance(base_value, (int, float)):
            continue
        margin = value - base_value
        paired = _paired_standard_error(metric, row, base_row)
        ses = [_standard_error(metric, row, value), _standard_error(metric, base_row, base_value)]
        two_se = 2 * sum(se**2 for se in ses if se is not None) ** 0.5 if ses[0] is not None else None
        if paired is not None:
            two_se = 2 * paired
        if margin <= 0:
            verdict = "no"
        elif two_se is not None and margin <= two_se:
            verdict = "within noise"
        else:
            verdict = "clear"
        what = "held-out pair accuracy" if stage == "rm" else metric
        noise = (
            f"2 SE {two_se:.3f}{', paired' * (paired is not None)}"
            if two_se is not None
            else "no standard error"
        )
        plain = {
            "clear": f"better by {margin:+.3f} ({noise})",
            "within noise": f"ahead by {margin:+.3f}, within the noise ({noise}): not a clear gain",
            "no": f"DID NOT IMPROVE ({margin:+.3f}; {noise})",
        }[verdict]
        text = f"{stage}: {what} {value:.3f} vs {base_value:.3f} for {BASELINE_TEXT[base]}: {plain}"
        out.append(
            {
                "stage": stage,
                "metric": metric,
                "baseline": base,
                "value": value,
                "baseline_value": base_value,
                "margin": margin,
                "two_se": two_se,
                "paired": paired is not None,
                "verdict": verdict,
                "text": text,
            }
        )
    return out


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
    vision branch's, `postrl.demo_vlm.report_md`) go before the samples."""
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
def frontier(cfg: Any, out: Path, evaluation: dict[str, dict]) -> list[dict[str, Any]]:
    """Points ``{"method", "kl", "gold", "proxy", "step" or "n"}`` on review prompts: the SFT policy (the common
    evaluation, KL 0), every held-out check PPO and DPO logged while training (their trainer's evaluator, the
    same on both: sampled responses, KL to the SFT policy summed over each response), and best-of-n from
    the SFT policy ranked by the reward model (n = 1, 2, 4 … ``cfg.frontier_max_n``; KL log n − (n − 1)/n)."""
    from postrl.lm.dpo.frontier import best_of_n

    points: list[dict[str, Any]] = []
    if "sft" in evaluation:
        sft = evaluation["sft"]
        points.append(
            {"method": "sft", "step": 0, "kl": 0.0, "gold": sft["gold_reward"], "proxy": sft["rm_score"]}
        )
    keys = ("heldout_kl", "heldout_gold_reward", "heldout_rm_score")
    for name, label in (("ppo", f"PPO (β {cfg.ppo.kl.beta:g})"), ("dpo", f"DPO (β {cfg.dpo.dpo.beta:g})")):
        path = out / name / "metrics.jsonl"
        for row in read_jsonl(path) if path.is_file() else []:
            if all(isinstance(row.get(k), (int, float)) for k in keys):
                kl, gold, proxy = (row[k] for k in keys)
                points.append({"method": label, "step": row["step"], "kl": kl, "gold": gold, "proxy": proxy})
    sft_model, rm_model = out / "sft" / "model", out / "rm" / "model"
    if cfg.frontier_max_n and sft_model.is_dir() and rm_model.is_dir():
        ns = [2**i for i in range(cfg.frontier_max_n.bit_length()) if 2**i <= cfg.frontier_max_n]
        points += best_of_n(
            sft_model,
            rm_model,
            get_task("reviews", **cfg.ppo.task),
            ns=ns,
            prompts=cfg.frontier_prompts,
            max_new_tokens=cfg.ppo.sampling.max_new_tokens,
            seed=cfg.seed,
        )
    return points


def _frontier_md(out: Path, points: list[dict[str, Any]]) -> list[str]:
    """The chart and what to read in it; nothing when the demo ran no review stage."""
    if not any(p["method"] != "sft" for p in points):
        return []
    from postrl.lm.dpo.frontier import plot_frontier

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
