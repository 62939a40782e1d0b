"""`postrl sft`: supervised fine-tuning of any HF causal LM on prompt/completion data (loss on completion
tokens only), with held-out loss and — for tasks with a verifier — greedy exact-match accuracy, and an
optional stop once the accuracy reaches a band (to leave room for RL, as the notes' pipeline wants)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from postrl.lm.data import load_rows, render_rows, tokenize_sft
from postrl.lm.recipe import Setup, run_recipe
from postrl.lm.spine import LoopState, RunConfig
from postrl.lm.tasks import get_task, list_tasks
from postrl.lm.trainer import (
    TRAIN_RENAMED,
    OptimConfig,
    Supervised,
    TrainConfig,
    export_on_main,
    prepare_examples,
    supervised_summary,
)
from postrl.runtime import distributed as dist
from postrl.runtime.errors import ConfigError, UserError


@dataclass(frozen=True)
class SFTConfig:
    """`postrl sft --model PATH --data FILE_OR_TASK --out RUN_DIR`."""

    model: str = "runs/pretrain/model"
    """Hugging Face causal LM: a local folder, or a hub name when online."""
    tokenizer: str | None = None
    """Tokenizer folder or name (default: the model's)."""
    data: str = "task:arithmetic"
    """Training rows: a JSONL/JSON/Parquet file, task:NAME (built-in), or a `datasets` name; several
    sources separated by commas are concatenated (e.g. task:arithmetic,task:reviews)."""
    task: dict[str, Any] = field(default_factory=dict)
    """Options of the built-in tasks, by task name (e.g. {arithmetic: {digits: 3}}), or of the one task
    named in data (e.g. {digits: 3})."""
    eval_data: str | None = None
    """Held-out rows (default: the test split of a built-in task, else the last 5% of the data)."""
    empty_rows: Literal["error", "skip"] = "error"
    """Rows whose prompt or completion (chosen, rejected) is empty or whitespace-only: error (the default:
    names the first one's file:line:field and the count) or skip (dropped, the count logged)."""
    train: TrainConfig = field(default_factory=lambda: TrainConfig(batch_size=8, max_length=1024))
    """Batches: examples per step, micro-batches, length limit, packing (TRL's SFT defaults)."""
    padding_free: Literal["auto", "off"] = "auto"
    """auto: the loss's forward runs its products on the real tokens only, each row's tokens before its first
    target (the prompt) once per distinct prompt (postrl.lm.packed_sft, as TRL's padding_free) where it can: a
    whole Llama-family model in float32 without activation checkpointing, and run.memory.log_probs not chunked;
    the choice, or why it was refused, is logged. off: the padded forward (the same loss and gradients to
    float32 rounding)."""
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=2e-5, warmup_steps=0, min_lr_ratio=0.0, betas=(0.9, 0.999))
    )
    """AdamW and its schedule (TRL's SFT defaults; the built-in tiny models use configs/sft-arithmetic.yaml)."""
    run: RunConfig = field(default_factory=lambda: RunConfig(steps=1000, eval_every=500, save_every=500))
    """Steps, seed, logging, evaluation and checkpoint cadence, device, dtype, threads, parallelism."""
    eval_size: int = 200
    """Held-out prompts for greedy exact-match accuracy (built-in tasks with a verifier)."""
    eval_max_new_tokens: int = 8
    """Tokens generated per prompt for the accuracy check."""
    stop_accuracy: float | None = None
    """Stop once held-out accuracy reaches this (e.g. 0.3 to leave room for RL); null: never."""
    trust_remote_code: bool = False
    """Run the model repository's own code (only for models you trust)."""

    CHECKS = {"eval_size": ">= 0", "eval_max_new_tokens": ">= 1", "stop_accuracy": "[0, 1]"}
    RENAMED = TRAIN_RENAMED | {"eval_prompts": "eval_size"}


def task_options(cfg_task: dict[str, Any], name: str, n_tasks: int) -> dict[str, Any]:
    """The options of built-in task ``name``: ``cfg_task[name]`` when keyed by task, else all of it."""
    if any(k in list_tasks() for k in cfg_task):
        options = cfg_task.get(name) or {}
        if not isinstance(options, dict):
            raise ConfigError(f"'task.{name}' must be a mapping of the task's options, got {options!r}")
        return dict(options)
    return dict(cfg_task) if n_tasks == 1 else {}


def load_sft_rows(cfg: SFTConfig, tokenizer: Any) -> tuple[list[dict], list[dict], list[Any]]:
    """(train rows, held-out rows, the built-in tasks), rendered to plain prompt/completion text."""
    sources = [s.strip() for s in cfg.data.split(",") if s.strip()]
    names = [s[len("task:") :] for s in sources if s.startswith("task:")]
    tasks = [get_task(n, **task_options(cfg.task, n, len(names))) for n in names]
    rows: list[dict] = []
    heldout: list[dict] = []
    for source in sources:
        name = source[len("task:") :] if source.startswith("task:") else None
        options = task_options(cfg.task, name, len(names)) if name else {}
        part = load_rows(source, "sft", "train", task_kwargs=options, empty=cfg.empty_rows)
        if cfg.eval_data is None and name is not None:
            heldout += get_task(name, **options).sft_rows("test")
        elif cfg.eval_data is None:
            cut = max(1, len(part) // 20)
            part, heldout = part[:-cut], heldout + part[-cut:]
        rows += part
    if cfg.eval_data is not None:
        heldout = load_rows(cfg.eval_data, "sft", "test", empty=cfg.empty_rows)
    return render_rows(rows, "sft", tokenizer), render_rows(heldout, "sft", tokenizer), tasks


def accuracy_callback(tasks: list[Any], tokenizer: Any, cfg: SFTConfig):
    """``evaluate(model) -> {"heldout_accuracy"}`` for the first built-in task with a verifier, else None."""
    verified = [t for t in tasks if "answer" in (t.prompt_rows("test")[:1] or [{}])[0]]
    if not verified:
        return None
    task = verified[0]
    from postrl.lm.evaluation import evaluate_task  # deferred: transformers (see run_sft)

    def evaluate(model: Any) -> dict[str, float]:
        result = evaluate_task(
            model, tokenizer, task, n=cfg.eval_size, max_new_tokens=cfg.eval_max_new_tokens
        )
        return {"heldout_accuracy": result["reward"]}

    return evaluate


class SFTRecipe:
    """SFT as a `postrl.lm.recipe.Recipe`: the policy and its rows, `Supervised` on them, the export."""

    def check(self, cfg: SFTConfig) -> None:
        """Nothing beyond the value ranges."""

    def one_backward(self, cfg: SFTConfig) -> list[str]:
        """What stops ``optim.step_in_backward``: several backwards per optimiser step."""
        return (
            [f"it needs train.grad_accum=1, not {cfg.train.grad_accum}"] if cfg.train.grad_accum != 1 else []
        )

    def load(self, setup: Setup) -> None:
        setup.load_policy()
        cfg, tokenizer = setup.cfg, setup.tokenizer
        rows, heldout, tasks = load_sft_rows(cfg, tokenizer)
        if not rows:
            held = (
                f" ({len(heldout)} held out for evaluation: give eval_data= to keep them all)"
                if heldout
                else ""
            )
            raise UserError(f"data={cfg.data!r}: no training rows{held}")
        train = prepare_examples(
            tokenize_sft(rows, tokenizer, cfg.train.max_length, cfg.train.overlong), cfg.train
        )
        if not train:
            raise UserError(f"{cfg.data}: no SFT example fits train.max_length={cfg.train.max_length}")
        evals = tokenize_sft(heldout, tokenizer, cfg.train.max_length, "truncate")
        setup.extra.update(train=train, evals=evals, evaluate=accuracy_callback(tasks, tokenizer, cfg))

    def build(self, setup: Setup, resumed: bool) -> Supervised:
        cfg, run, evaluate = setup.cfg, setup.cfg.run, setup.extra["evaluate"]
        stop = None
        if cfg.stop_accuracy is not None and evaluate is not None:

            def stop(metrics: dict[str, float]) -> bool:
                return metrics.get("heldout_accuracy", 0.0) >= cfg.stop_accuracy

        return Supervised(
            dist.wrap_model(setup.policy, setup.info, run.parallel), setup.tokenizer, setup.extra["train"],
            setup.extra["evals"], cfg.train, cfg.optim, run, device=setup.info.device, name="sft",
            evaluate=evaluate, should_stop=stop, padding_free=cfg.padding_free,
        )  # fmt: skip

    def finish(self, setup: Setup, algo: Supervised, state: LoopState) -> dict[str, Any]:
        result = supervised_summary(algo, state, setup.run_dir)
        export_on_main(algo.model, setup.tokenizer, setup.run_dir / "model")
        return {**result, "train_examples": len(setup.extra["train"])}


def run_sft(
    cfg: SFTConfig, run_dir: str | Path, resume: bool = False, overwrite: bool = False
) -> dict[str, Any]:
    """Fine-tune, export ``RUN_DIR/model`` (HF format), write the run folder, return the summary.

    Everything is loaded and checked before the run folder is touched (`postrl.lm.recipe`). A vision-language
    model (pictures in the prompts) runs `postrl.lm.vlm.run_vlm_sft`."""
    from postrl.lm.vlm import is_vlm, run_vlm_sft  # deferred: transformers (seconds)

    if is_vlm(cfg.model):
        return run_vlm_sft(cfg, run_dir, resume=resume, overwrite=overwrite)
    return run_recipe(SFTRecipe(), cfg, run_dir, resume=resume, overwrite=overwrite)
