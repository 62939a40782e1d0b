"""Stages that train on fixed data against a frozen reference (DPO, KTO): their shared `Recipe`.

The reference π_ref never changes, so its log-probs of every training and held-out example are computed once,
batched and without gradients, before the first step (TRL's ``precompute_ref_log_probs``), and written to the
run folder: a resumed run reads them back and trains on the numbers the interrupted one used. The reference
model itself is kept only to score held-out samples (its KL to the policy), when ``eval_samples`` > 0.

A stage subclasses `ReferenceRecipe` with its data, its reference pass, its algorithm and its summary.
"""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save
from torch import Tensor

from postrl.lm.recipe import Setup
from postrl.lm.rollout.forwards import ResponseForward, response_forward
from postrl.lm.spine import Algorithm, LoopState, Parts
from postrl.lm.trainer import export_on_main, iterate_batches, make_optimizer, model_parts
from postrl.runtime import distributed as dist
from postrl.runtime.checkpoint import atomic_write_bytes
from postrl.runtime.errors import UserError

log = logging.getLogger(__name__)

REF_FILE = "reference_logps.safetensors"
"""The reference's summed log-probs of every train and held-out example, in the run folder."""


def load_or_compute_reference(
    run_dir: Path, resumed: bool, compute: Callable[[], dict[str, Tensor]], counts: dict[str, int]
) -> dict[str, Tensor]:
    """The reference log-probs ``{"train": [N, k], "heldout": [M, k]}``: read back from ``RUN_DIR/REF_FILE``
    when resuming a run that wrote them (and they match the examples' counts), else computed and written
    there (rank 0, atomically)."""
    path = run_dir / REF_FILE
    if resumed and path.is_file():
        saved = load_file(str(path))
        if {k: saved[k].shape[0] for k in counts if k in saved} == counts:
            return {k: saved[k] for k in counts}
        log.warning("%s does not match the data (counts %s); computing it again", path, counts)
    refs = compute()
    if dist.is_main():
        atomic_write_bytes(path, save({k: v.contiguous() for k, v in refs.items()}))
    dist.barrier()
    return refs


class ReferenceAlgorithm(abc.ABC):
    """The `postrl.lm.spine` algorithm of a stage trained on fixed data against stored reference log-probs: a
    step is one AdamW step on a batch of examples drawn in a seeded order (``train_step``); an evaluation is
    the stage's held-out metrics (``heldout_metrics``) and, when given, sampled-response metrics; a checkpoint
    holds the policy (a folder `from_pretrained` loads), AdamW, the schedule and the data position.

    The policy's forwards are chosen here, once (`postrl.lm.rollout.forwards.response_forward`): ``forward``
    for the loss (gradients), ``scoring_forward`` for passes of the training step without gradients (KTO's
    reference point) and ``eval_forward`` for held-out metrics (unwrapped, whole weights)."""

    name = ""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        examples: list[dict[str, Any]],
        refs: dict[str, Tensor],
        cfg: Any,
        *,
        evals: list[dict[str, Any]],
        evaluate_samples: Any = None,
        device: torch.device,
    ) -> None:
        self.model, self.tokenizer, self.examples, self.evals, self.cfg = (
            model,
            tokenizer,
            examples,
            evals,
            cfg,
        )
        self.ref, self.eval_ref, self.device = refs["train"], refs["heldout"], device
        self.evaluate_samples = evaluate_samples
        self.optimizer, self.scheduler = make_optimizer(dist.unwrap(model), cfg.optim, cfg.run.steps)
        self.position, self.seconds = 0, 0.0  # batches drawn since step 0; step seconds of this invocation
        self.batches = iterate_batches(len(examples), cfg.train.batch_size, cfg.run.seed)
        use_fast = cfg.sampling.use_fast
        self.forward = response_forward(model, use_fast)
        self.scoring_forward = response_forward(model, use_fast, gradients=False)
        self.eval_forward = response_forward(dist.unwrap(model), use_fast, gradients=False, gathered=True)
        model.train()

    @abc.abstractmethod
    def train_step(self, indices: list[int]) -> dict[str, float]:
        """One optimiser step on the examples ``indices`` (all ranks'): the step's metrics."""

    @abc.abstractmethod
    def heldout_metrics(self) -> dict[str, float]:
        """The stage's metrics of the held-out examples under the policy (``eval_forward``)."""

    def step(self, step: int) -> dict[str, float]:
        self.position, indices = next(self.batches)
        self.position += 1
        tic = time.perf_counter()
        out = self.train_step(indices)
        out["time_step"] = time.perf_counter() - tic
        self.seconds += out["time_step"]
        out["lr"] = self.scheduler.get_last_lr()[0]  # the lr this step used
        self.scheduler.step()
        return out

    def evaluate(self) -> dict[str, float]:
        """Held-out metrics and (``eval_samples`` > 0) sampled-response metrics; every rank calls it (an
        FSDP-sharded model needs every rank in each forward) and computes its share."""
        inner = dist.unwrap(self.model)
        was_training = inner.training
        inner.eval()
        with dist.gathered(self.model):  # sampling reads whole weights
            out = self.heldout_metrics()
            if self.evaluate_samples is not None:
                out.update(self.evaluate_samples(inner))
        inner.train(was_training)
        return out

    def parts(self) -> Parts:
        return model_parts(self.model, self.optimizer, self.scheduler, self.tokenizer, self.position)

    def load_extra(self, extra: dict[str, Any]) -> None:
        self.position = int(extra["position"])
        self.batches = iterate_batches(
            len(self.examples), self.cfg.train.batch_size, self.cfg.run.seed, self.position
        )


def reference_is_policy(cfg: Any) -> bool:
    """Whether the precompute may read the policy itself instead of a loaded copy of its weights: no
    ``ref_model``, full fine-tuning (with LoRA the reference is already the policy with its adapters off), no
    sampled held-out metrics (the only other reader of the reference) and no activation checkpointing (the
    forward picked for the policy is then the one a frozen copy gets: the same log-probs, bit for bit). The
    build runs before the first step and before a checkpoint is loaded, so the policy's weights are the
    reference's. At 0.5B that is 2 GB and half a minute of loading saved (TRL's precompute_ref_log_probs
    does the same)."""
    return not (
        getattr(cfg, "ref_model", None)
        or cfg.eval_samples
        or cfg.run.lora.enabled
        or cfg.run.memory.gradient_checkpointing
    )


class ReferenceRecipe(abc.ABC):
    """The `postrl.lm.recipe.Recipe` of a stage trained against a frozen reference on fixed data. A subclass
    sets ``section`` (its loss's config section, which holds ``ref_batch_size``) and ``algorithm_class``, and
    brings the abstract methods: its examples, its reference pass, its summary and its plot."""

    section = ""
    algorithm_class: type[ReferenceAlgorithm]

    # ---- what a stage brings ----------------------------------------------------------------------------
    @abc.abstractmethod
    def load_examples(self, cfg: Any, tokenizer: Any) -> tuple[list[dict], list[dict], Any]:
        """(train examples, held-out examples, the built-in task or None), tokenised and checked."""

    @abc.abstractmethod
    def reference_log_probs(
        self, reference: ResponseForward, examples: list[dict], setup: Setup, batch_size: int
    ) -> Tensor:
        """The reference's log-probs of ``examples`` (``[N, k]``) through its forward without gradients."""

    def algorithm(self, setup: Setup, refs: dict[str, Tensor], evaluate_samples: Any) -> ReferenceAlgorithm:
        """The stage's ``algorithm_class`` on the wrapped policy."""
        cfg, info = setup.cfg, setup.info
        return self.algorithm_class(
            dist.wrap_model(setup.policy, info, cfg.run.parallel), setup.tokenizer, setup.extra["train"], refs,
            cfg, evals=setup.extra["evals"], device=info.device, evaluate_samples=evaluate_samples,
        )  # fmt: skip

    @abc.abstractmethod
    def summarize(self, setup: Setup, algo: Algorithm, state: LoopState) -> dict[str, Any]:
        """The summary's numbers."""

    @abc.abstractmethod
    def plot(self, run_dir: Path) -> None:
        """``RUN_DIR/curves.png`` (rank 0, when ``plots``)."""

    # ---- the recipe -------------------------------------------------------------------------------------
    def check(self, cfg: Any) -> None:
        if cfg.train.packing:
            raise UserError(
                f"train.packing does not apply to {self.section.upper()} (examples are scored whole)"
            )
        if cfg.run.parallel not in dist.PARALLEL:
            raise UserError(f"run.parallel must be one of {dist.PARALLEL}, got {cfg.run.parallel!r}")
        if cfg.eval_samples and (cfg.sampling.greedy or cfg.sampling.temperature <= 0):
            raise UserError(
                "sampling.greedy must be false for the held-out KL (it is an estimate over samples)"
            )

    def load(self, setup: Setup) -> None:
        """The policy, its examples, the reference, the held-out scorer and prompts; all checked."""
        from postrl.lm.evaluation import heldout_prompts, reward_model_scorer  # deferred: transformers
        from postrl.lm.models import check_context  # deferred: transformers
        from postrl.lm.rollout.decoders import check_backend

        policy = setup.load_policy()
        cfg = setup.cfg
        check_backend(policy, cfg.sampling.backend)
        train, evals, task = self.load_examples(cfg, setup.tokenizer)
        # None: the precompute reads the policy itself, before its first step (no second copy loaded)
        reference = None if reference_is_policy(cfg) else setup.load_reference()
        scorer = reward_model_scorer(cfg, setup.info.device)
        prompts = heldout_prompts(task, evals)
        if cfg.eval_samples and prompts.rows:
            longest = max(len(p) for p in setup.tokenizer([r["prompt"] for r in prompts.rows])["input_ids"])
            t = cfg.sampling.max_new_tokens
            where = f"the longest held-out prompt ({longest}) + sampling.max_new_tokens ({t})"
            check_context(policy, longest + t, where)
        setup.extra.update(
            train=train, evals=evals, task=task, reference=reference, scorer=scorer, prompts=prompts
        )

    def build(self, setup: Setup, resumed: bool) -> Algorithm:
        """The reference's log-probs (read back on resume), the held-out sampling, the algorithm."""
        from postrl.lm.evaluation import sample_metrics  # deferred: transformers

        cfg, x = setup.cfg, setup.extra
        size = getattr(cfg, self.section).ref_batch_size

        def compute() -> dict[str, Tensor]:
            model = setup.policy if x["reference"] is None else x["reference"]
            reference = response_forward(model, cfg.sampling.use_fast, gradients=False)
            was_training = model.training
            model.eval()  # as a loaded reference is (dropout off)
            try:
                return {
                    "train": self.reference_log_probs(reference, x["train"], setup, size),
                    "heldout": self.reference_log_probs(reference, x["evals"], setup, size),
                }
            finally:
                model.train(was_training)

        counts = {"train": len(x["train"]), "heldout": len(x["evals"])}
        refs = load_or_compute_reference(setup.run_dir, resumed, compute, counts)
        if not cfg.eval_samples:
            x["reference"] = None  # its log-probs are all training needs

        def evaluate_samples(inner: torch.nn.Module) -> dict[str, float]:
            return sample_metrics(
                inner, x["reference"], setup.tokenizer, x["prompts"], cfg, x["task"], x["scorer"]
            )

        return self.algorithm(setup, refs, evaluate_samples if x["reference"] is not None else None)

    def finish(self, setup: Setup, algo: Algorithm, state: LoopState) -> dict[str, Any]:
        export_on_main(algo.model, setup.tokenizer, setup.run_dir / "model")
        if setup.info.is_main and setup.cfg.plots:
            self.plot(setup.run_dir)
        return self.summarize(setup, algo, state)
