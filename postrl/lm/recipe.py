"""One recipe for every LM stage: the set-up and tear-down every ``postrl <stage>`` run shares, written once.

A stage brings only its algorithm and its data, as a `Recipe`; `run_recipe` does the rest, in the order that
keeps `postrl.runtime.rundir`'s promise (everything is loaded and checked before the run folder is touched):

    validate(cfg); recipe.check(cfg)                    the config alone
    distributed init, threads, seed                     every rank
    recipe.load(setup)                                  models, tokenizer, data: checked, nothing written
    open_run(run_dir, setup.cfg, resume, overwrite)     the run folder; on resume its last intact checkpoint
    recipe.build(setup, resumed) -> Algorithm           what needs the folder (e.g. stored reference log-probs)
    train_loop(algo, ...)                               the spine (`postrl.lm.spine`)
    recipe.finish(setup, algo, state) -> summary        export, plots, the summary's numbers
    logger.finish(summary)                              summary.json: the run is finished

`Setup` carries what the steps share and loads what most stages load the same way: the policy (a Hugging Face
causal LM, with LoRA adapters when ``run.lora`` asks), its tokenizer, a frozen reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Protocol

import torch

from postrl.lm.spine import Algorithm, LoopState, train_loop
from postrl.lm.trainer import OptimConfig, fit_train_length, set_threads
from postrl.runtime import distributed as dist
from postrl.runtime.config import validate
from postrl.runtime.errors import UserError
from postrl.runtime.rundir import open_run
from postrl.runtime.seeding import seed_everything


@dataclass
class Setup:
    """What a stage's steps share: the config (a step may replace it, e.g. with a length clipped to the
    model's context: the run folder records the replaced one), the run folder, this rank, and what was loaded."""

    cfg: Any
    run_dir: Path
    info: dist.DistInfo
    policy: torch.nn.Module | None = None
    tokenizer: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Whatever else a stage loads before the folder and builds from after it (data, task, reference)."""

    @property
    def load_options(self) -> dict[str, Any]:
        """dtype, device and trust_remote_code, as every model of the run is loaded."""
        from postrl.lm.models import resolve_dtype  # deferred: transformers (seconds)

        return {
            "dtype": resolve_dtype(self.cfg.run.dtype, "run.dtype"),
            "device": self.info.device,
            "trust_remote_code": self.cfg.trust_remote_code,
        }

    def load_policy(self) -> torch.nn.Module:
        """``cfg.model`` as the trained policy (LoRA adapters when ``run.lora`` asks, the base frozen) and its
        tokenizer (``cfg.tokenizer`` or the model's), checked against each other; ``train.max_length``, where
        the config has one, is clipped to the model's context (a ceiling, as TRL's)."""
        from postrl.lm.memory import configure_memory
        from postrl.lm.models import apply_lora, check_vocab, load_causal_lm  # deferred: transformers
        from postrl.lm.tokenizer import load_tokenizer

        cfg = self.cfg
        self.policy = apply_lora(load_causal_lm(cfg.model, **self.load_options), cfg.run)
        configure_memory(self.policy, cfg.run.memory)
        self.tokenizer = load_tokenizer(cfg.tokenizer or cfg.model, trust_remote_code=cfg.trust_remote_code)
        check_vocab(self.policy, self.tokenizer, "tokenizer" if cfg.tokenizer else "model")
        if hasattr(cfg, "train"):
            self.cfg = replace(cfg, train=fit_train_length(self.policy, cfg.train))
        return self.policy

    def load_reference(self) -> torch.nn.Module:
        """The frozen reference π_ref: ``cfg.ref_model``, else the policy's own weights (with LoRA, the policy
        itself with its adapters disabled: no second copy)."""
        from postrl.lm.memory import configure_memory
        from postrl.lm.models import adapter_free_reference, load_causal_lm  # deferred: transformers

        ref_model = getattr(self.cfg, "ref_model", None)
        if self.cfg.run.lora.enabled and not ref_model:
            return adapter_free_reference(self.policy)
        what = "ref_model" if ref_model else "model"
        model = load_causal_lm(ref_model or self.cfg.model, **self.load_options, what=what)
        configure_memory(model, self.cfg.run.memory, trained=False)
        return model.eval().requires_grad_(False)


class Recipe(Protocol):
    """What a stage brings to `run_recipe`: its checks, its loading, its algorithm and its ending. The first
    evaluation is before step 1 when the config's ``eval_at_start`` (or else the recipe's) says so."""

    def check(self, cfg: Any) -> None:
        """Refuse what the config's value ranges cannot say (raises `postrl.UserError`)."""
        ...

    def load(self, setup: Setup) -> None:
        """Load and check models, tokenizer and data into ``setup``; writes nothing."""
        ...

    def build(self, setup: Setup, resumed: bool) -> Algorithm:
        """The algorithm, once the run folder is open (``resumed``: from a checkpoint of this run)."""
        ...

    def finish(self, setup: Setup, algo: Algorithm, state: LoopState) -> dict[str, Any]:
        """Export (every rank calls it), plots (rank 0), and the summary's numbers."""
        ...


def run_recipe(
    recipe: Recipe, cfg: Any, run_dir: str | Path, resume: bool = False, overwrite: bool = False
) -> dict[str, Any]:
    """Run one LM stage: set-up, the spine's loop, export, ``summary.json``; returns the summary."""
    validate(cfg)
    recipe.check(cfg)
    run = cfg.run
    info = dist.init_distributed(run.device)
    check_step_in_backward(recipe, cfg, info.world_size)
    set_threads(run.threads)
    seed_everything(run.seed, info.rank)
    setup = Setup(cfg, Path(run_dir), info)
    recipe.load(setup)
    logger, ckpt = open_run(
        setup.run_dir, setup.cfg, resume=resume, overwrite=overwrite, tensorboard=run.tensorboard
    )
    algo = recipe.build(setup, ckpt is not None)
    eval_at_start = bool(getattr(setup.cfg, "eval_at_start", getattr(recipe, "eval_at_start", False)))
    state = train_loop(algo, setup.cfg.run, setup.run_dir, logger, ckpt, eval_at_start=eval_at_start)
    return logger.finish(recipe.finish(setup, algo, state))


def check_step_in_backward(recipe: Any, cfg: Any, world: int) -> None:
    """Refuse ``optim.step_in_backward`` (`postrl.lm.step_in_backward`) where it cannot run: a stage without a
    ``one_backward(cfg)`` (its problems with one backward per optimiser step), a gradient clip, several ranks."""
    keys = [f.name for f in fields(cfg) if isinstance(getattr(cfg, f.name), OptimConfig)]
    asked = [k for k in keys if getattr(cfg, k).step_in_backward]
    if not asked:
        return
    one_backward = getattr(recipe, "one_backward", None)
    problems = (
        [] if one_backward is not None else ["this stage does not run it (sft, dpo, kto, rm and grpo do)"]
    )
    problems += one_backward(cfg) if one_backward is not None else []
    for key in asked:
        if getattr(cfg, key).max_grad_norm is not None:
            problems.append(
                f"it needs {key}.max_grad_norm=null: each weight steps before the step's gradient norm is known "
                "(the norm is still logged)"
            )
    if world > 1:
        problems.append(f"it runs one process, not {world}: DDP and FSDP reduce gradients after the backward")
    if problems:
        raise UserError(f"{asked[0]}.step_in_backward=true: " + "; ".join(problems))
