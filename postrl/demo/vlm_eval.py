"""The demo's vision branch, measured: vlm-eval (every checkpoint's greedy answers to the same held-out scenes,
scored by the verifier), the branch's numbers in summary.json, and its section of the report."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from postrl.demo.report import table_md
from postrl.demo.verdicts import verdicts
from postrl.lm.tasks import get_task
from postrl.lm.tasks.shapes import KINDS, normalise
from postrl.lm.vlm import answer_accuracy, encode_rows, load_vlm
from postrl.runtime.checkpoint import atomic_write_text
from postrl.runtime.logging import read_jsonl
from postrl.runtime.plots import plot_curves

Summaries = dict[str, dict[str, Any]]
CHECKPOINTS = ("vlm-align", "vlm-sft", "vlm-grpo", "vlm-sft-vs-grpo")
LABELS = {
    "vlm-align": "aligned VLM",
    "vlm-sft": "SFT",
    "vlm-grpo": "GRPO",
    "vlm-sft-vs-grpo": "continued SFT",
}


# ---- the evaluation -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EvalConfig:
    """What vlm-eval compares: the checkpoints ``out/NAME/model`` of ``names``, on ``scenes`` held-out scenes."""

    out: str
    names: tuple[str, ...]
    task: dict[str, Any]
    scenes: int
    samples: int
    threads: int | None


def evaluate_vlm_checkpoints(cfg: EvalConfig, run_dir: Path, resume: bool = False) -> dict[str, Any]:
    """Every checkpoint's greedy answers to the same held-out scenes, scored by the verifier: accuracy overall
    and per question kind (with the count behind it), chance and the best image-free guess for these scenes,
    and the sample pictures (``run_dir/samples``) with each checkpoint's answers."""
    started = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    task = get_task("shapes", **cfg.task, n_test=cfg.scenes)
    rows = task.prompt_rows("test")
    rows_by_kind = {k: n for k in KINDS if (n := sum(r["kind"] == k for r in rows))}
    results = {name: answer(Path(cfg.out) / name / "model", task, rows, rows_by_kind) for name in cfg.names}
    samples, grid = save_samples(rows, results, cfg.samples, run_dir / "samples")
    for r in results.values():
        r.pop("answers")
    summary = {
        "evaluation": results,
        "scenes": len(rows),
        "scenes_by_kind": rows_by_kind,
        "chance": task.chance_accuracy("test"),
        "image_free_best_guess": task.prior_accuracy("test"),
        "samples": samples,
        "samples_png": str(grid.relative_to(Path(cfg.out))) if grid else None,
        "wall_seconds": round(time.perf_counter() - started, 3),
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def answer(model_dir: Path, task: Any, rows: list[dict[str, Any]], kinds: dict[str, int]) -> dict[str, Any]:
    """One checkpoint's greedy answers to ``rows``: its accuracy overall and per kind, each scene's reward
    (for paired comparisons) and the answers themselves."""
    model, processor = load_vlm(str(model_dir), "float32", torch.device("cpu"))
    answers: list[str] = []
    rewards: list[float] = []
    examples = encode_rows(processor, rows, "prompts", 64)
    scored = _recording(task.reward_fn, answers, rewards)
    accuracy = answer_accuracy(model.eval(), processor, examples, scored, max_new_tokens=4)
    return {
        "heldout_accuracy": accuracy["heldout_accuracy"],
        "heldout_accuracy_n": len(rows),
        "heldout_rewards": rewards,
        "by_kind": {k: accuracy[f"heldout_accuracy/{k}"] for k in kinds},
        "answers": answers,
    }


def save_samples(
    rows: list[dict[str, Any]], results: dict[str, Any], n: int, folder: Path
) -> tuple[list[dict[str, Any]], Path | None]:
    """``n`` sample scenes with each checkpoint's answer, their pictures as PNGs in ``folder``, and one grid
    of them (None without samples)."""
    picks = sample_scenes(rows, n)
    samples = [
        {
            "question": rows[i]["prompt"][0]["content"][1]["text"],
            "answer": rows[i]["answer"],
            "kind": rows[i]["kind"],
            "answers": {name: r["answers"][i] for name, r in results.items()},
        }
        for i in picks
    ]
    folder.mkdir(parents=True, exist_ok=True)
    for k, i in enumerate(picks):
        rows[i]["images"][0].resize((128, 128), 0).save(folder / f"scene_{k + 1}.png")
    grid = sample_grid([rows[i]["images"][0] for i in picks], samples, folder / "samples.png")
    return samples, grid


def _recording(reward: Any, answers: list[str], rewards: list[float] | None = None) -> Any:
    """``reward`` that also keeps the completions it scores in ``answers`` (the samples come from the same
    evaluation as the accuracy) and their scores in ``rewards`` (per scene, for paired comparisons)."""

    def fn(prompts: Any, completions: list[str], **columns: Any) -> list[float]:
        answers.extend(completions)
        scores = reward(prompts, completions, **columns)
        if rewards is not None:
            rewards.extend(scores)
        return scores

    return fn


def sample_scenes(rows: list[dict[str, Any]], n: int) -> list[int]:
    """Indices of ``n`` held-out scenes: the first of each question kind, then the second of each, ..."""
    by_kind: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_kind.setdefault(r["kind"], []).append(i)
    order = [q[depth] for depth in range(len(rows)) for q in by_kind.values() if depth < len(q)]
    return order[:n]


def sample_grid(images: list[Any], samples: list[dict[str, Any]], path: Path) -> Path | None:
    """One PNG: each picture (enlarged) with its question, the right answer and the SFT and GRPO answers."""
    if not images:
        return None
    import matplotlib  # deferred: the backend is set before pyplot is imported

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(images))
    rows = (len(images) + cols - 1) // cols
    fig, axes = plt.subplots(
        rows, cols, figsize=(2.6 * cols, 3.3 * rows), squeeze=False, layout="constrained"
    )
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in axes.flat[len(images) :]:
        ax.axis("off")
    for ax, image, s in zip(axes.flat, images, samples, strict=False):
        ax.imshow(image, interpolation="nearest")
        ax.set_title(s["question"], fontsize=8)
        lines = [f"right answer: {s['answer']}"]
        for name in ("vlm-sft", "vlm-grpo"):
            if name in s["answers"]:
                said = s["answers"][name].strip() or "(nothing)"
                mark = "✓" if normalise(said) == normalise(s["answer"]) else "✗"
                lines.append(f"{LABELS[name]}: {said} {mark}")
        ax.set_xlabel("\n".join(lines), fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


# ---- summary.json and the report ------------------------------------------------------------------------------
def add_to_summary(summary: dict[str, Any], done: Summaries) -> None:
    """The branch's numbers in the demo's summary.json: each checkpoint's held-out accuracy in ``stages``,
    ``vlm`` (the evaluation, the image-free baselines, the samples) and its verdicts after the text ones."""
    found = done.get("vlm-eval")
    if not found:
        return
    for name, row in found["evaluation"].items():  # the per-scene scores stay in summary["vlm"]["evaluation"]
        summary["stages"].setdefault(name, {}).update(
            {k: v for k, v in row.items() if k != "heldout_rewards"}
        )
    summary["vlm"] = {k: v for k, v in found.items() if k != "wall_seconds"}
    summary["vlm"]["runs"] = {
        n: {k: done[n].get(k) for k in ("steps", "train_seconds", "train_examples")}
        for n in CHECKPOINTS[1:]
        if n in done
    }
    summary["verdicts"] = summary.get("verdicts", []) + verdicts(found["evaluation"], {})


def _steps(runs: dict[str, dict], name: str) -> str:
    run = runs.get(name)
    if not run:
        return "not run"
    return f"{run.get('steps')} steps, {run.get('train_seconds') or 0:.0f} s of training"


def report_md(out: Path, summary: dict[str, Any]) -> list[str]:
    """The report's section on the vision branch (nothing when it did not run)."""
    vlm = summary.get("vlm")
    if not vlm:
        return []
    runs = vlm.get("runs", {})
    lines = [
        "## A policy that sees: the tiny VLM on task:shapes",
        "",
        "The same recipe with pictures: a tiny LLaVA (CLIP vision tower, projector, 2-layer Llama), aligned on "
        "captions of rendered pictures (`postrl vlm-pretrain`; the shipped model unless --from-scratch), then "
        f"SFT on {runs.get('vlm-sft', {}).get('train_examples') or 'a few'} demonstrations stopped at a "
        f"held-out accuracy band ({_steps(runs, 'vlm-sft')}), then GRPO on the task's train pictures with the "
        f"verifier as the only signal ({_steps(runs, 'vlm-grpo')}), beside continued SFT on the same "
        f"demonstrations for GRPO's training time ({_steps(runs, 'vlm-sft-vs-grpo')}). Questions: count the "
        "dots, the colour of a shape, its side, the taller bar, a digit; the answer needs the picture.",
        "",
        *table_md(_accuracy_rows(vlm, summary.get("stages", {}))),
        "",
        f"Greedy answers to the same {vlm['scenes']} held-out scenes, scored by the verifier (the answer's "
        "first word); per-kind columns: accuracy on that kind's scenes "
        f"({', '.join(f'{k} {v}' for k, v in vlm['scenes_by_kind'].items())}). Without the picture: chance "
        f"{vlm['chance']:.3f}, the best image-free guess per question text {vlm['image_free_best_guess']:.3f}. "
        'The aligned model answers every question with a caption ("3 red dots"), whose first word is right '
        "for the count questions only. Continued SFT gets GRPO's training seconds by the wall clock, so on a "
        "busy machine the two may get different CPU time (their steps above).",
        "",
    ]
    lines += _verdict_lines(summary, vlm["evaluation"])
    lines += _curves_md(out)
    return lines + _samples_md(vlm)


def _accuracy_rows(vlm: dict[str, Any], stages: dict[str, Any]) -> list[list[str]]:
    """The branch's table: each checkpoint's stage seconds, accuracy with its standard error, and per kind."""
    kinds = list(vlm["scenes_by_kind"])
    rows = [["checkpoint", "stage seconds", "accuracy", "± SE", *kinds]]
    for name, row in vlm["evaluation"].items():
        p, n = row["heldout_accuracy"], row["heldout_accuracy_n"]
        seconds = stages.get(name, {}).get("wall_seconds")
        rows.append(
            [LABELS[name], f"{seconds:.0f}" if isinstance(seconds, (int, float)) else "–", f"{p:.3f}"]
            + [f"{(p * (1 - p) / n) ** 0.5:.3f}", *(f"{row['by_kind'].get(k, 0):.2f}" for k in kinds)]
        )
    return rows


def _verdict_lines(summary: dict[str, Any], ev: dict[str, Any]) -> list[str]:
    """The branch's verdicts as bullets, and what a missing or lost comparison with continued SFT means."""
    mine = [v for v in summary.get("verdicts", []) if v["stage"].startswith("vlm")]
    lines = [f"- {v['text']}" for v in mine]
    if "vlm-sft-vs-grpo" not in ev:
        lines.append("- vlm-grpo vs the VLM's continued SFT: not run with --quick (the full demo runs it).")
    else:
        versus = next((v for v in mine if v["baseline"] == "vlm-sft-vs-grpo"), None)
        if versus and versus["verdict"] != "clear":
            lines.append(
                "- **GRPO did not beat continued SFT here**: with the demonstrations at hand, more SFT for "
                "the same time did as well or better."
            )
    return [*lines, ""]


def _curves_md(out: Path) -> list[str]:
    """The VLM's SFT and GRPO learning curves, drawn into ``out/plots``."""
    lines: list[str] = []
    for name, keys in (("vlm-sft", ["loss", "heldout_accuracy"]), ("vlm-grpo", ["reward_mean"])):
        path = out / name / "metrics.jsonl"
        png = (
            plot_curves(read_jsonl(path), keys, out / "plots" / f"{name}.png", title=name)
            if path.is_file()
            else None
        )
        if png is not None:
            lines += [f"![{name}]({png.relative_to(out)})", ""]
    return lines


def _samples_md(vlm: dict[str, Any]) -> list[str]:
    """The sample pictures and a table of each checkpoint's answers to them."""
    if not vlm.get("samples"):
        return []
    names = [n for n in ("vlm-sft", "vlm-grpo", "vlm-sft-vs-grpo") if n in vlm["evaluation"]]
    table = [["scene", "question", "right answer", *(LABELS[n] for n in names)]]
    for k, s in enumerate(vlm["samples"]):
        table.append([str(k + 1), s["question"], s["answer"], *(s["answers"].get(n, "") for n in names)])
    lines = ["### Pictures and answers: SFT → GRPO", ""]
    if vlm.get("samples_png"):
        lines += [f"![sample pictures]({vlm['samples_png']})", ""]
    return [*lines, *table_md(table), ""]
