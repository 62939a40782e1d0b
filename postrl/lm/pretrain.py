"""Pretraining the built-in tiny LM from scratch on the generated corpus (the world of `postrl.lm.tasks`).

Builds the tokenizer on the corpus, a tiny Llama from config, and trains next-token prediction on every
token (packed blocks). The result, ``RUN_DIR/model``, is a standard Hugging Face folder (safetensors +
tokenizer) that SFT, the reward model and every HF tool load like any other causal LM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from postrl.lm.data import tokenize_sft
from postrl.lm.models import TinyLMConfig, build_tiny_lm
from postrl.lm.recipe import Setup, run_recipe
from postrl.lm.spine import LoopState, RunConfig
from postrl.lm.tasks import build_corpus, get_task
from postrl.lm.tokenizer import build_tokenizer
from postrl.lm.trainer import (
    TRAIN_RENAMED,
    OptimConfig,
    Supervised,
    TrainConfig,
    check_train_length,
    export_on_main,
    prepare_examples,
    supervised_summary,
)
from postrl.runtime import distributed as dist
from postrl.runtime.errors import UserError


@dataclass(frozen=True)
class PretrainConfig:
    """`postrl pretrain`: tokenizer + tiny Llama + next-token training on the generated corpus."""

    model: TinyLMConfig = field(default_factory=TinyLMConfig)
    """Shape of the tiny Llama."""
    vocab_size: int = 512
    """BPE vocabulary size of the built tokenizer."""
    corpus_lines: int = 20000
    """Lines of generated text (arithmetic, reviews, generic)."""
    corpus_mix: tuple[float, float, float] = (0.4, 0.4, 0.2)
    """Shares of the corpus lines (arithmetic equations, review text, generic sentences), normalised by their
    sum."""
    equations: Literal["draws", "rounds"] = "draws"
    """How the corpus writes the sums: "draws" draws train problems with repeats, "47+38=85"; "rounds" (the
    built-in base model's, with carries=false) writes each train problem once per round, "47+38= 85" with
    "=", ":" or ";" at random, after which the demo's SFT lands at 0.66 - 0.94 on pretraining seeds 0 - 4
    where "draws" gives 0.08 - 0.77 (postrl.lm.tasks.corpus)."""
    carries: bool = True
    """false: the corpus leaves out the sums that carry from their units digits (47+38=85), so pretraining
    learns to add without carrying and the task's questions that need a carry are left for SFT and RL (the
    built-in base model's recipe; postrl.lm.tasks.corpus)."""
    arithmetic: dict[str, Any] = field(default_factory=dict)
    """Options of the arithmetic task whose train split feeds the corpus (e.g. {digits: 3})."""
    reviews: dict[str, Any] = field(default_factory=dict)
    """Options of the reviews task whose train split feeds the corpus."""
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(batch_size=32, max_length=128, packing=True)
    )
    """Batches (packed blocks of max_length tokens)."""
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=3e-3, warmup_steps=50, weight_decay=0.1)
    )
    """AdamW and its schedule."""
    run: RunConfig = field(default_factory=lambda: RunConfig(steps=600, eval_every=200, save_every=200))
    """Steps, seed, logging, evaluation and checkpoint cadence, device, threads, parallelism."""

    CHECKS = {"vocab_size": ">= 1", "corpus_lines": ">= 1", "corpus_mix": ">= 0"}
    RENAMED = TRAIN_RENAMED


def corpus_and_heldout(cfg: PretrainConfig) -> tuple[list[str], list[str]]:
    """Train text (the corpus) and held-out text (the tasks' test-split demonstrations)."""
    arith, reviews = get_task("arithmetic", **cfg.arithmetic), get_task("reviews", **cfg.reviews)
    corpus = build_corpus(
        cfg.corpus_lines,
        cfg.run.seed,
        cfg.corpus_mix,
        arithmetic=arith.config,
        reviews=reviews.config,
        equations=cfg.equations,
        carries=cfg.carries,
    )
    heldout = [r["prompt"] + r["completion"] for t in (arith, reviews) for r in t.sft_rows("test")]
    return corpus, heldout


class PretrainRecipe:
    """Pretraining as a `postrl.lm.recipe.Recipe`: the corpus, its tokenizer and a new tiny Llama, trained by
    `Supervised` on every token."""

    def check(self, cfg: PretrainConfig) -> None:
        if cfg.run.lora.enabled:
            raise UserError("run.lora.enabled: pretraining builds a new model; LoRA adapts an existing one")
        if len(cfg.corpus_mix) != 3 or sum(cfg.corpus_mix) <= 0:
            shares = list(cfg.corpus_mix)
            raise UserError(
                f"corpus_mix: three shares (arithmetic, reviews, generic), not all 0; got {shares}"
            )

    def load(self, setup: Setup) -> None:
        cfg = setup.cfg
        corpus, heldout = corpus_and_heldout(cfg)
        tokenizer = build_tokenizer(
            corpus, vocab_size=cfg.vocab_size, model_max_length=cfg.model.max_position_embeddings
        )
        rows = [{"prompt": "", "completion": line} for line in corpus]
        train = prepare_examples(tokenize_sft(rows, tokenizer, cfg.train.max_length, "truncate"), cfg.train)
        heldout_rows = [{"prompt": "", "completion": line} for line in heldout]
        evals = tokenize_sft(heldout_rows, tokenizer, cfg.train.max_length, "truncate")
        ids = {f"{k}_id": getattr(tokenizer, f"{k}_id") for k in ("pad_token", "eos_token", "bos_token")}
        model = build_tiny_lm(len(tokenizer), cfg.model, seed=cfg.run.seed, **ids).to(setup.info.device)
        check_train_length(model, cfg.train)  # both lengths are this config's own keys: refused, not clipped
        setup.policy, setup.tokenizer = model, tokenizer
        setup.extra.update(train=train, evals=evals)

    def build(self, setup: Setup, resumed: bool) -> Supervised:
        cfg, run = setup.cfg, setup.cfg.run
        return Supervised(
            dist.wrap_model(setup.policy, setup.info, run.parallel), setup.tokenizer, setup.extra["train"],
            setup.extra["evals"], cfg.train, cfg.optim, run, device=setup.info.device, name="pretrain",
        )  # fmt: skip

    def finish(self, setup: Setup, algo: Supervised, state: LoopState) -> dict[str, Any]:
        result = supervised_summary(algo, state, setup.run_dir)
        export_on_main(algo.model, setup.tokenizer, setup.run_dir / "model")
        n_params = sum(p.numel() for p in setup.policy.parameters())
        n_tokens = sum(len(e["input_ids"]) for e in setup.extra["train"])
        return {**result, "n_params": n_params, "corpus_tokens": n_tokens}


def run_pretrain(
    cfg: PretrainConfig, run_dir: str | Path, resume: bool = False, overwrite: bool = False
) -> dict[str, Any]:
    """Train and export ``RUN_DIR/model``; writes the run folder and returns the summary. The corpus,
    tokenizer and model are built and checked before the run folder is touched (`postrl.lm.recipe`)."""
    return run_recipe(PretrainRecipe(), cfg, run_dir, resume=resume, overwrite=overwrite)
