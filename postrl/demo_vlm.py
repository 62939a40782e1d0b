"""The demo's vision branch: the tiny VLM on task:shapes, SFT → GRPO with the verifier → continued SFT.

    vlm-align        the built-in aligned VLM that postrl ships (`postrl.lm.vlm.base_model`), or with
                     ``--from-scratch`` its alignment on captions run here (`postrl vlm-pretrain`, its recipe)
    vlm-sft          SFT on `VLMDemo.demos` demonstrations of task:shapes, stopped at a held-out accuracy band
                     (preset sft-shapes, at the demo's budget)
    vlm-grpo         GRPO from the SFT checkpoint on the task's train pictures, the verifier as the only
                     signal (preset grpo-shapes, at the demo's budget)
    vlm-sft-vs-grpo  continued SFT on the same demonstrations for GRPO's training seconds (the full demo)
    vlm-eval         every checkpoint above, greedy, on the same held-out scenes: accuracy per question kind,
                     the image-free baselines, a few pictures with the SFT and GRPO answers

The branch needs none of the text stages, so the demo runs it beside them. `stages` gives its `Stage` rows,
`add_to_summary` its numbers and verdicts in summary.json, `report_md` its section of the report.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from postrl.demo_runner import Stage, Summaries
from postrl.lm import base_model as text_base_model
from postrl.lm.grpo import GRPOConfig, GRPOLossConfig
from postrl.lm.rollout import SamplingConfig
from postrl.lm.sft import SFTConfig
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig, TrainConfig
from postrl.lm.vlm import base_model as vlm_base
from postrl.lm.vlm.train import VLMPretrainConfig
from postrl.runtime.checkpoint import atomic_write_text
from postrl.runtime.errors import UserError

SHAPES = {"difficulty": 1}
"""task:shapes as the presets have it (five kinds of question, difficulty 1)."""
DEMOS = 100
"""Demonstrations SFT sees (the first train scenes); GRPO's verifier checks answers to ten times as many
pictures. Writing answers is the expensive part, checking them is cheap: the situation RL is for."""
CHECKPOINTS = ("vlm-align", "vlm-sft", "vlm-grpo", "vlm-sft-vs-grpo")
LABELS = {
    "vlm-align": "aligned VLM",
    "vlm-sft": "SFT",
    "vlm-grpo": "GRPO",
    "vlm-sft-vs-grpo": "continued SFT",
}


@dataclass(frozen=True)
class VLMDemo:
    """The vision branch of `postrl demo` (override e.g. vlm.grpo.run.steps=60, vlm.enabled=false)."""

    enabled: bool = True
    """Run the branch (the tiny VLM on task:shapes) beside the text stages."""
    align: VLMPretrainConfig = field(default_factory=vlm_base.recipe)
    """With from_scratch: the alignment of the tiny VLM on captions (the shipped model's recipe)."""
    sft: SFTConfig = field(
        default_factory=lambda: SFTConfig(
            data="task:shapes",
            task={**SHAPES, "n_train": DEMOS, "n_test": 100},
            train=TrainConfig(batch_size=32, max_length=128, eval_examples=64),
            optim=OptimConfig(lr=3e-4, warmup_steps=0, min_lr_ratio=1.0),
            run=RunConfig(steps=300, eval_every=10, save_every=0, log_every=5),
            eval_size=100,
            eval_max_new_tokens=4,
            stop_accuracy=0.45,
        )
    )
    """SFT on `DEMOS` demonstrations (the first train scenes), stopped once greedy accuracy on 100 held-out
    scenes (checked every 10 steps) reaches the band: preset sft-shapes with fewer demonstrations and a
    cheaper check."""
    grpo: GRPOConfig = field(
        default_factory=lambda: GRPOConfig(
            data="task:shapes",
            task={**SHAPES, "n_train": 1000, "n_test": 100},
            max_prompt_length=64,
            sampling=SamplingConfig(max_new_tokens=4, temperature=1.0, top_k=5),
            grpo=GRPOLossConfig(group_size=8, prompts_per_step=16, beta=0.0, loss_type="grpo"),
            optim=OptimConfig(lr=1e-4, warmup_steps=5, min_lr_ratio=1.0, betas=(0.9, 0.999)),
            run=RunConfig(steps=240, eval_every=0, save_every=0, log_every=5),
            eval_size=100,
            eval_at_start=False,
        )
    )
    """GRPO on 1,000 train pictures (ten times the demonstrations; no answers shown), 16 prompts x G = 8
    answers per step, the verifier as the only signal: preset grpo-shapes for 240
    steps, warmup 5 (at 120 its lead over continued SFT was clear on 1 of 3 seeds: +0.03 to +0.14)."""
    eval_scenes: int = 600
    """Held-out scenes every checkpoint answers (greedy; the same for all)."""
    samples: int = 6
    """Held-out pictures shown in the report with the question and the SFT and GRPO answers."""
    compare_sft: bool = True
    """Run vlm-sft-vs-grpo (with the demo's compare_sft; --quick leaves it out)."""

    CHECKS = {"eval_scenes": ">= 1", "samples": ">= 0"}


def quick(v: VLMDemo) -> VLMDemo:
    """The branch at `postrl demo --quick`'s budget."""
    r = dataclasses.replace
    return r(v, grpo=r(v.grpo, run=r(v.grpo.run, steps=40)), eval_scenes=400, compare_sft=False)


def check(cfg: Any) -> None:
    """Before any run folder: the shipped aligned VLM must be there (unless from_scratch) and be its recipe's."""
    if not cfg.vlm.enabled or cfg.from_scratch:
        return
    if not vlm_base.is_available():
        raise UserError(
            f"the built-in aligned VLM is missing from this install ({vlm_base.path()}); run `postrl demo "
            "--from-scratch` or `python -m postrl.lm.vlm.base_model` (makes it), or set vlm.enabled=false"
        )
    if vlm_base.provenance().get("command") != vlm_base.command(cfg.vlm.align):
        raise UserError(
            "vlm.align.*: the built-in aligned VLM was made with another alignment config "
            f"({vlm_base.path() / vlm_base.PROVENANCE}); add --from-scratch to align with yours"
        )


# ---- the stages ---------------------------------------------------------------------------------------------
def stages(cfg: Any) -> list[Stage]:
    """The branch's `Stage` rows (none when ``vlm.enabled`` is false); ``cfg`` is the demo's config."""
    from postrl.lm.grpo import run_grpo
    from postrl.lm.sft import run_sft

    if not cfg.vlm.enabled:
        return []
    v = cfg.vlm
    align = Stage("vlm-align", copy_aligned_vlm, lambda c, out, done: None, lambda c: 1.0)
    if cfg.from_scratch:
        steps = v.align.run.steps
        align = Stage("vlm-align", _run_align, lambda c, out, done: _align(c), lambda c: 3 + 0.17 * steps)
    rows = [
        align,
        Stage("vlm-sft", run_sft, _sft, lambda c: 9.0, ("vlm-align",)),
        Stage("vlm-grpo", run_grpo, _grpo, lambda c: 2 + 0.135 * c.vlm.grpo.run.steps, ("vlm-sft",)),
    ]
    if cfg.compare_sft and v.compare_sft:
        rows.append(
            Stage(
                "vlm-sft-vs-grpo",
                run_sft,
                lambda c, out, done: continued_sft(c, out, done["vlm-grpo"]),
                lambda c: 1 + 0.135 * c.vlm.grpo.run.steps,
                ("vlm-grpo",),
            )
        )
    names = tuple(s.name for s in rows)
    rows.append(
        Stage("vlm-eval", evaluate, _eval, lambda c: 1 + 0.0017 * c.vlm.eval_scenes * len(names), names)
    )
    return rows


def _run(c: Any, stage_run: RunConfig) -> RunConfig:
    return dataclasses.replace(stage_run, seed=c.seed, threads=c.threads)


def _align(c: Any) -> VLMPretrainConfig:
    return dataclasses.replace(c.vlm.align, run=_run(c, c.vlm.align.run))


def _run_align(cfg: VLMPretrainConfig, run_dir: Path, resume: bool = False) -> dict[str, Any]:
    from postrl.lm.vlm.train import run_vlm_pretrain

    return run_vlm_pretrain(cfg, run_dir, resume=resume)


def _sft(c: Any, out: Path, done: Summaries) -> SFTConfig:
    s = c.vlm.sft
    return dataclasses.replace(s, model=str(out / "vlm-align" / "model"), run=_run(c, s.run))


def _grpo(c: Any, out: Path, done: Summaries) -> GRPOConfig:
    g = c.vlm.grpo
    return dataclasses.replace(g, model=str(out / "vlm-sft" / "model"), run=_run(c, g.run))


def continued_sft(c: Any, out: Path, grpo: dict[str, Any]) -> SFTConfig:
    """SFT from the SFT checkpoint on the same demonstrations for GRPO's training seconds (no band)."""
    s = _sft(c, out, {})
    seconds = float(grpo.get("train_seconds") or grpo["wall_seconds"])
    run = dataclasses.replace(s.run, steps=100_000, max_seconds=seconds, eval_every=0, save_every=0)
    return dataclasses.replace(s, model=str(out / "vlm-sft" / "model"), stop_accuracy=None, run=run)


def copy_aligned_vlm(cfg: None, run_dir: Path, resume: bool = False) -> dict[str, Any]:
    """vlm-align without aligning: the shipped aligned VLM copied to ``run_dir/model``, and a summary.json
    with its provenance (the `postrl vlm-pretrain` command, its held-out caption loss)."""
    started = time.perf_counter()
    record = vlm_base.provenance()
    text_base_model.install(vlm_base.path(), run_dir)
    keys = ("command", "heldout_loss", "steps", "sha256")
    summary = {"source": str(vlm_base.path()), **{k: record.get(k) for k in keys}}
    summary |= {
        "align_seconds": record.get("seconds"),
        "wall_seconds": round(time.perf_counter() - started, 3),
    }
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


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


def _eval(c: Any, out: Path, done: Summaries) -> EvalConfig:
    names = tuple(n for n in CHECKPOINTS if n in done)
    return EvalConfig(str(out), names, dict(SHAPES), c.vlm.eval_scenes, c.vlm.samples, c.threads)


def evaluate(cfg: EvalConfig, run_dir: Path, resume: bool = False) -> dict[str, Any]:
    """Every checkpoint's greedy answers to the same held-out scenes, scored by the verifier: accuracy overall
    and per question kind (with the count behind it), chance and the best image-free guess for these scenes,
    and the sample pictures (``run_dir/samples``) with each checkpoint's answers."""
    import torch

    from postrl.lm.tasks import get_task
    from postrl.lm.tasks.shapes import KINDS
    from postrl.lm.vlm import answer_accuracy, encode_rows, load_vlm

    started = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    task = get_task("shapes", **cfg.task, n_test=cfg.scenes)
    rows = task.prompt_rows("test")
    rows_by_kind = {k: n for k in KINDS if (n := sum(r["kind"] == k for r in rows))}
    results: dict[str, Any] = {}
    for name in cfg.names:
        model, processor = load_vlm(str(Path(cfg.out) / name / "model"), "float32", torch.device("cpu"))
        answers: list[str] = []
        rewards: list[float] = []
        examples = encode_rows(processor, rows, "prompts", 64)
        scored = _recording(task.reward_fn, answers, rewards)
        accuracy = answer_accuracy(model.eval(), processor, examples, scored, max_new_tokens=4)
        results[name] = {
            "heldout_accuracy": accuracy["heldout_accuracy"],
            "heldout_accuracy_n": len(rows),
            "heldout_rewards": rewards,
            "by_kind": {k: accuracy[f"heldout_accuracy/{k}"] for k in rows_by_kind},
            "answers": answers,
        }
    picks = sample_scenes(rows, cfg.samples)
    samples = [
        {
            "question": rows[i]["prompt"][0]["content"][1]["text"],
            "answer": rows[i]["answer"],
            "kind": rows[i]["kind"],
            "answers": {n: r["answers"][i] for n, r in results.items()},
        }
        for i in picks
    ]
    folder = run_dir / "samples"
    folder.mkdir(parents=True, exist_ok=True)
    for k, i in enumerate(picks):
        rows[i]["images"][0].resize((128, 128), 0).save(folder / f"scene_{k + 1}.png")
    grid = sample_grid([rows[i]["images"][0] for i in picks], samples, folder / "samples.png")
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from postrl.lm.tasks.shapes import normalise

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
    from postrl.report import verdicts

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
    from postrl.runtime.logging import read_jsonl
    from postrl.runtime.plots import plot_curves

    vlm = summary.get("vlm")
    if not vlm:
        return []
    ev, stages, runs = vlm["evaluation"], summary.get("stages", {}), vlm.get("runs", {})
    kinds = list(vlm["scenes_by_kind"])
    rows = [["checkpoint", "stage seconds", "accuracy", "± SE", *kinds]]
    for name, row in ev.items():
        p, n = row["heldout_accuracy"], row["heldout_accuracy_n"]
        seconds = stages.get(name, {}).get("wall_seconds")
        rows.append(
            [LABELS[name], f"{seconds:.0f}" if isinstance(seconds, (int, float)) else "–", f"{p:.3f}"]
            + [f"{(p * (1 - p) / n) ** 0.5:.3f}", *(f"{row['by_kind'].get(k, 0):.2f}" for k in kinds)]
        )
    from postrl.report import table_md  # the report's own table writer

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
        *table_md(rows),
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
    mine = [v for v in summary.get("verdicts", []) if v["stage"].startswith("vlm")]
    lines += [f"- {v['text']}" for v in mine]
    if "vlm-sft-vs-grpo" not in ev:
        lines.append("- vlm-grpo vs the VLM's continued SFT: not run with --quick (the full demo runs it).")
    else:
        versus = next((v for v in mine if v["baseline"] == "vlm-sft-vs-grpo"), None)
        if versus and versus["verdict"] != "clear":
            lines.append(
                "- **GRPO did not beat continued SFT here**: with the demonstrations at hand, more SFT for "
                "the same time did as well or better."
            )
    lines.append("")
    for name, keys in (("vlm-sft", ["loss", "heldout_accuracy"]), ("vlm-grpo", ["reward_mean"])):
        path = out / name / "metrics.jsonl"
        png = (
            plot_curves(read_jsonl(path), keys, out / "plots" / f"{name}.png", title=name)
            if path.is_file()
            else None
        )
        if png is not None:
            lines += [f"![{name}]({png.relative_to(out)})", ""]
    if vlm.get("samples"):
        names = [n for n in ("vlm-sft", "vlm-grpo", "vlm-sft-vs-grpo") if n in ev]
        table = [["scene", "question", "right answer", *(LABELS[n] for n in names)]]
        for k, s in enumerate(vlm["samples"]):
            table.append([str(k + 1), s["question"], s["answer"], *(s["answers"].get(n, "") for n in names)])
        lines += ["### Pictures and answers: SFT → GRPO", ""]
        if vlm.get("samples_png"):
            lines += [f"![sample pictures]({vlm['samples_png']})", ""]
        lines += [*table_md(table), ""]
    return lines
