"""`postrl rm`: a reward model learned from preference pairs (Bradley–Terry), the second stage of RLHF.

Model: a causal LM's trunk plus a scalar head (`postrl.lm.models.ScalarHeadModel`, head ~ N(0, 1/(d+1)),
bias 0), scored on the last real token of prompt + response. The pairs, their scores and the two losses
(``soft``: σ(r_1 − r_2) against the label, ties at 0.5; ``pairwise``: −log σ(r_w − r_l − m)) are in
`pairs.py`.

Training runs on the loop every LM trainer shares (`postrl.lm.spine`): :class:`RewardModelling` is this
file's algorithm for it. The loss of a step is the mean over its pairs, whatever the micro-batches and ranks
(each micro-batch's summed pair loss over the step's global pair count), so ``train.grad_accum`` and the
number of processes never change the gradient.

After training, the model scores samples of the SFT policy; their mean and std go next to the exported
model (``reward_norm.json``) so PPO can normalise rewards to mean 0, std 1 on SFT samples. The held-out
metrics, those statistics and the export are in `evaluation.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch

from postrl.lm.recipe import Setup, run_recipe
from postrl.lm.reward_model.evaluation import (
    NormConfig,
    evaluate_pairs,
    export_reward_model,
    score_policy_samples,
)
from postrl.lm.reward_model.pairs import (
    choose_loss,
    collate_pairs,
    drop_ties,
    gold_pairs,
    load_pair_rows,
    rm_loss,
    tokenize_pairs,
)
from postrl.lm.spine import LoopState, Parts, RunConfig, accumulate
from postrl.lm.trainer import (
    TRAIN_RENAMED,
    OptimConfig,
    TrainConfig,
    clip_grad_norm,
    fit_train_length,
    iterate_batches,
    make_optimizer,
    micro_batches,
    to_device,
)
from postrl.runtime import distributed as dist
from postrl.runtime.errors import UserError
from postrl.runtime.logging import read_jsonl
from postrl.runtime.plots import plot_curves


@dataclass(frozen=True)
class RMConfig:
    """`postrl rm --model SFT_DIR --data FILE_OR_TASK --out RUN_DIR`."""

    model: str = "runs/sft/model"
    """Initial model: an SFT checkpoint or any HF causal LM (its trunk gets a new scalar head)."""
    tokenizer: str | None = None
    """Tokenizer folder or name (default: the model's)."""
    data: str = "task:reviews"
    """Preference rows prompt/chosen/rejected (+ target, margin): a file, task:NAME, or a `datasets` name."""
    task: dict[str, Any] = field(default_factory=dict)
    """Options of a built-in task (e.g. {label_noise: 0.2})."""
    eval_data: str | None = None
    """Held-out pairs (default: the test split of a built-in task, else the last 5% of the data)."""
    empty_rows: Literal["error", "skip"] = "error"
    """Rows whose prompt or completion (chosen, rejected) is empty or whitespace-only: error (the default:
    names the first one's file:line:field and the count) or skip (dropped, the count logged)."""
    loss: str = "auto"
    """soft (σ(r1−r2) against the label, ties at 0.5), pairwise (−log σ(r_w−r_l−margin), ties dropped), or
    auto (pairwise when the data has a margin column, else soft)."""
    train: TrainConfig = field(default_factory=lambda: TrainConfig(batch_size=8, max_length=1024))
    """Batches: pairs per step (over micro-batches and ranks), micro-batches, and the length limit of prompt
    + the longer response (TRL's RewardConfig defaults)."""
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=1e-5, warmup_steps=0, min_lr_ratio=0.0, betas=(0.9, 0.999))
    )
    """AdamW and its schedule (TRL's full fine-tuning recipe for reward models; the built-in tiny models use
    configs/rm-reviews.yaml)."""
    run: RunConfig = field(default_factory=lambda: RunConfig(steps=1000, eval_every=500, save_every=500))
    """Steps, seed, logging, evaluation and checkpoint cadence, device, dtype (the head stays float32),
    threads, parallelism."""
    eval_size: int = 500
    """Held-out pairs for accuracy, margin, calibration and gold agreement."""
    ece_bins: int = 10
    """Bins of the expected calibration error."""
    norm: NormConfig = field(default_factory=NormConfig)
    """Score statistics on SFT samples."""
    trust_remote_code: bool = False
    """Run the model repository's own code (only for models you trust)."""
    plots: bool = True
    """Write curves.png at the end."""

    CHECKS = {"eval_size": ">= 0", "ece_bins": ">= 1"}  # valid ranges
    RENAMED = TRAIN_RENAMED | {"eval_pairs": "eval_size"}


# ---- one optimiser step --------------------------------------------------------------------------------
def rm_train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    pairs: Sequence[dict[str, Any]],
    indices: list[int],
    train: TrainConfig,
    optim: OptimConfig,
    loss: str,
    pad_id: int,
    device: torch.device,
) -> dict[str, float]:
    """One optimiser step over ``indices`` (all ranks' pairs); returns loss, accuracy and gradient norm.

    The step's loss is Σ_i ℓ_i / N over its N = len(indices) pairs on every micro-batch and rank: a
    micro-batch of b pairs whose mean loss is ℓ̄ contributes ℓ̄·b/N (its summed pair loss / N), so
    accumulation and sharding give the gradient of one big batch."""
    micro = [
        (to_device(collate_pairs([pairs[i] for i in c], pad_id), device), w)
        for c, w in micro_batches(indices, train.grad_accum)
    ]
    scale = dist.world_size()  # DDP and FSDP average gradients over ranks; the loss is a global pair sum
    sums = {"loss": 0.0, "accuracy": 0.0}

    def micro_loss(mb: tuple[dict[str, torch.Tensor], float]) -> torch.Tensor:
        batch, weight = mb
        share = weight * batch["target"].shape[0] / len(indices)  # b/N; 0 for a rank whose share ran out
        value, metrics = rm_loss(model, batch, loss)
        sums["loss"] += float(value.detach()) * share
        sums["accuracy"] += metrics["accuracy"] * share
        return value * share * scale

    accumulate([model], micro, micro_loss)
    norm = clip_grad_norm(model, optim.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    out = dist.reduce_metrics(sums)  # the mean over ranks of each rank's share: × world size is the sum
    return {k: v * scale for k, v in out.items()} | {"grad_norm": norm}


# ---- the algorithm on the spine ------------------------------------------------------------------------
class RewardModelling:
    """Bradley–Terry training of a scalar-head model on preference pairs, as a `postrl.lm.spine` algorithm.

    ``evaluate()`` gives the held-out metrics (every rank calls it: an FSDP-sharded model needs all of them
    in each forward, and DDP replicas compute the same numbers)."""

    name = "rm"

    def __init__(
        self,
        model: torch.nn.Module,
        pairs: list[dict[str, Any]],
        evaluate: Callable[[], dict[str, float]],
        train: TrainConfig,
        optim: OptimConfig,
        run: RunConfig,
        *,
        loss: str,
        pad_id: int,
        device: torch.device,
    ) -> None:
        if not pairs:
            raise ValueError("no preference pairs left after tokenisation and the length limit")
        self.model, self.pairs, self._evaluate = model, pairs, evaluate
        self.train, self.optim, self.run = train, optim, run
        self.loss, self.pad_id, self.device = loss, pad_id, device
        self.optimizer, self.scheduler = make_optimizer(dist.unwrap(model), optim, run.steps)
        self.position = 0  # batches drawn since step 0 (the data order's place, saved with checkpoints)
        self.batches = iterate_batches(len(pairs), train.batch_size, run.seed)
        model.train()

    def step(self, step: int) -> dict[str, float]:
        self.position, indices = next(self.batches)
        self.position += 1
        out = rm_train_step(
            self.model, self.optimizer, self.pairs, indices, self.train, self.optim, self.loss,
            self.pad_id, self.device,
        )  # fmt: skip
        self.scheduler.step()
        return {**out, "lr": self.scheduler.get_last_lr()[0]}

    def bar(self, metrics: dict[str, float]) -> dict[str, float]:
        return {"loss": metrics["loss"]}

    def evaluate(self) -> dict[str, float]:
        return self._evaluate()

    def parts(self) -> Parts:
        # no config or tokenizer beside the weights: a checkpoint is not a causal-LM folder
        return Parts(
            {"model": self.model},
            {"model": self.optimizer},
            {"sched": self.scheduler},
            {"position": self.position},
        )

    def load_extra(self, extra: dict[str, Any]) -> None:
        self.position = int(extra["position"])
        self.batches = iterate_batches(len(self.pairs), self.train.batch_size, self.run.seed, self.position)


# ---- the command ---------------------------------------------------------------------------------------
class RewardModelRecipe:
    """The reward model as a `postrl.lm.recipe.Recipe`: a scalar head on ``cfg.model``'s trunk, its pairs,
    `RewardModelling` on them; at the end the score statistics of SFT samples and the export."""

    def check(self, cfg: RMConfig) -> None:
        if cfg.train.packing:
            raise UserError("train.packing does not apply to a reward model (pairs are scored whole)")

    def one_backward(self, cfg: RMConfig) -> list[str]:
        """What stops ``optim.step_in_backward``: several backwards per optimiser step (a step's chosen and
        rejected rows are scored in one forward)."""
        return (
            [f"it needs train.grad_accum=1, not {cfg.train.grad_accum}"] if cfg.train.grad_accum != 1 else []
        )

    def load(self, setup: Setup) -> None:
        from postrl.lm.models import ScalarHeadModel, apply_lora, check_vocab  # deferred: transformers
        from postrl.lm.tokenizer import load_tokenizer

        cfg, info = setup.cfg, setup.info
        options = setup.load_options
        rm = ScalarHeadModel.from_pretrained(cfg.model, **options, new_head=True, seed=cfg.run.seed)
        rm = apply_lora(rm, cfg.run)  # (run.lora: adapters on the trunk, the head trained in full)
        cfg = setup.cfg = replace(cfg, train=fit_train_length(rm, cfg.train))  # a ceiling: clipped
        tokenizer = load_tokenizer(cfg.tokenizer or cfg.model, trust_remote_code=cfg.trust_remote_code)
        check_vocab(rm, tokenizer, "tokenizer" if cfg.tokenizer else "model")
        train, evals, loss, task = _load_pairs(cfg, tokenizer)
        evaluate = heldout_evaluation(
            rm, evals, task, loss, tokenizer.pad_token_id, info.device, cfg.ece_bins
        )
        setup.policy, setup.tokenizer = rm, tokenizer
        setup.extra.update(train=train, evals=evals, loss=loss, task=task, evaluate=evaluate)

    def build(self, setup: Setup, resumed: bool) -> RewardModelling:
        cfg, x = setup.cfg, setup.extra
        model = dist.wrap_model(setup.policy, setup.info, cfg.run.parallel, forward_methods=("score",))
        return RewardModelling(
            model, x["train"], x["evaluate"], cfg.train, cfg.optim, cfg.run,
            loss=x["loss"], pad_id=setup.tokenizer.pad_token_id, device=setup.info.device,
        )  # fmt: skip

    def finish(self, setup: Setup, algo: RewardModelling, state: LoopState) -> dict[str, Any]:
        cfg, x, norm = setup.cfg, setup.extra, None
        if cfg.norm.samples > 0:
            prompts = sorted({e["row"]["prompt"] for e in x["train"]})
            norm = score_policy_samples(
                setup.policy, setup.tokenizer, prompts, cfg.norm, policy=cfg.norm.policy or cfg.model,
                seed=cfg.run.seed, device=setup.info.device, task=x["task"], trust_remote_code=cfg.trust_remote_code,
            )  # fmt: skip
        export_reward_model_on_main(algo.model, cfg, setup.tokenizer, setup.run_dir / "model", norm)
        if setup.info.is_main and cfg.plots:
            plot_rm(setup.run_dir)
        summary = {
            **state.last_eval,
            "steps": state.step,
            "train_pairs": len(x["train"]),
            "loss_type": x["loss"],
        }
        summary["heldout_pairs"] = len(x["evals"])  # behind heldout_accuracy: its standard error
        if norm is not None:
            summary.update({f"sft_score_{k}": v for k, v in norm.items() if k in ("mean", "std")})
            summary.update({f"sft_{k}": v for k, v in norm.items() if k.startswith("gold")})
        return summary


def run_rm(
    cfg: RMConfig, run_dir: str | Path, resume: bool = False, overwrite: bool = False
) -> dict[str, Any]:
    """Train the reward model, export ``RUN_DIR/model`` (+ ``reward_norm.json``), return the summary.
    The model and the pairs are loaded and checked before the run folder is touched (`postrl.lm.recipe`)."""
    return run_recipe(RewardModelRecipe(), cfg, run_dir, resume=resume, overwrite=overwrite)


def _load_pairs(cfg: RMConfig, tokenizer: Any) -> tuple[list[dict], list[dict], str, Any]:
    """(train pairs, held-out pairs, the loss, the built-in task or None), tokenised and checked."""
    rows, heldout, task = load_pair_rows(cfg.data, cfg.eval_data, cfg.task, cfg.empty_rows, tokenizer)
    train = tokenize_pairs(rows, tokenizer, cfg.train.max_length, cfg.train.overlong)
    evals = tokenize_pairs(heldout, tokenizer, cfg.train.max_length, "drop")[: cfg.eval_size]
    loss = choose_loss(cfg.loss, train)
    if loss == "pairwise":
        train, evals = drop_ties(train), drop_ties(evals)
    if not train:
        raise UserError(f"{cfg.data}: no preference pair fits train.max_length={cfg.train.max_length}")
    return train, evals, loss, task


def heldout_evaluation(
    rm: torch.nn.Module,
    evals: list[dict[str, Any]],
    task: Any,
    loss: str,
    pad_id: int,
    device: torch.device,
    bins: int = 10,
) -> Callable[[], dict[str, float]]:
    """``evaluate() -> metrics`` on the held-out pairs (with gold agreement for a built-in task, and the ECE
    over ``bins`` bins); {} when there are none."""
    gold = gold_pairs(task, evals)
    gold_tie = float(getattr(getattr(task, "config", None), "tie_tolerance", 0.0))

    def evaluate() -> dict[str, float]:
        if not evals:
            return {}
        return evaluate_pairs(rm, evals, pad_id, device, loss, gold=gold, gold_tie=gold_tie, bins=bins)

    return evaluate


def export_reward_model_on_main(
    model: torch.nn.Module, cfg: RMConfig, tokenizer: Any, path: Path, norm: dict[str, float] | None
) -> None:
    """Called by every rank: rank 0 writes the RM (gathered into an unsharded copy when FSDP shards it), the
    tokenizer and the normalisation statistics to ``path``; all wait for it."""
    from postrl.lm.models import ScalarHeadModel, resolve_dtype  # deferred, as in run_rm

    rm = dist.unwrap(model)
    if dist.is_sharded(model):
        weights = dist.model_state_dict(model)  # a collective: the full tensors on rank 0, {} elsewhere
        if dist.is_main():
            rm = ScalarHeadModel.from_pretrained(
                cfg.model, dtype=resolve_dtype(cfg.run.dtype, "run.dtype"), trust_remote_code=cfg.trust_remote_code,
                new_head=True,
            )  # fmt: skip
            rm.load_state_dict(weights)
    if dist.is_main():
        export_reward_model(rm, tokenizer, path, norm)
    dist.barrier()


def plot_rm(run_dir: Path) -> None:
    """curves.png: training loss and accuracy, the held-out metrics and the gold agreement."""
    rows = read_jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    keys = ["loss", "accuracy", "heldout_loss", "heldout_accuracy", "heldout_ece", "gold_accuracy"]
    plot_curves(rows, keys, run_dir / "curves.png", title="reward model")
