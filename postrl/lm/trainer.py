"""Supervised fine-tuning (and pretraining): next-token cross-entropy on the completion tokens.

Pretraining is the same loop on plain text with every token in the loss. The loss is a token mean over
the whole optimiser step: each micro-batch's summed loss is divided by the step's total count of target
tokens, so gradient accumulation (and sharding across ranks) gives the gradient of one big batch.

Schedule: linear warmup then cosine decay to ``min_lr_ratio·lr`` (as in nanoGPT / Chinchilla).
The loop itself is the spine every LM trainer shares (`postrl.lm.spine`): :class:`Supervised` is this
file's algorithm for it. Checkpoints hold the model, optimiser, scheduler, data position and every RNG
state, so a resumed run continues bit-for-bit; the final model is written with ``save_pretrained``.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch

from postrl.core import masked_sum
from postrl.lm.data import pack_examples, pad
from postrl.lm.master_adamw import MasterAdamW, allocate_adamw_state, needs_master
from postrl.lm.packed_sft import packed_next_token_log_probs, sft_padding_free
from postrl.lm.rollout.forwards import next_token_log_probs
from postrl.lm.spine import LoopState, Parts, RunConfig, accumulate, train_loop
from postrl.lm.step_in_backward import StepInBackward, step_in_backward_of
from postrl.runtime import distributed as dist
from postrl.runtime.checkpoint import latest_checkpoint, write_dir_atomically
from postrl.runtime.logging import RunLogger
from postrl.runtime.plots import write_curves

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-3
    """Peak learning rate (AdamW)."""
    min_lr_ratio: float = 0.1
    """The cosine schedule ends at min_lr_ratio · lr."""
    warmup_steps: int = 50
    """Linear warmup steps from 0 to lr."""
    weight_decay: float = 0.0
    """AdamW weight decay (matrices only; norms and biases are not decayed)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    max_grad_norm: float | None = 1.0
    """Global gradient-norm clip; null turns it off."""
    master_weights: bool = True
    """Trained bfloat16/float16 weights (``run.dtype=bfloat16``, full fine-tuning) are stepped through float32
    master copies with float32 AdamW moments (`MasterAdamW`: 16 bytes per parameter with the weight and its
    gradient). false: torch's AdamW on the low-precision weights themselves, moments in their dtype (8 bytes per
    parameter, what transformers' Trainer does with a model loaded in bfloat16): half the memory, but a step
    smaller than about 1/256 of a weight rounds away (at lr 1e-6, most of a 0.02-sized weight's steps)."""
    step_in_backward: bool = False
    """Step each weight inside the backward as soon as its gradient is complete, and free the gradient there
    (`postrl.lm.step_in_backward`; torchtune's optimizer_in_bwd): no moment holds every gradient (2 bytes per
    bfloat16 parameter, 4 per float32). Needs max_grad_norm=null (the norm is still logged), one backward per
    step (grad_accum=1) and one process; sft, dpo, kto, rm and grpo run it."""

    CHECKS = {  # valid ranges (postrl.runtime.config.validate)
        "lr": "> 0",
        "min_lr_ratio": "[0, 1]",
        "warmup_steps": ">= 0",
        "weight_decay": ">= 0",
        "betas": "[0, 1)",
        "max_grad_norm": "> 0",
    }


def cosine_schedule(warmup_steps: int, total_steps: int, min_lr_ratio: float) -> Callable[[int], float]:
    """LR multiplier at optimiser step s: s/warmup during warmup, then cosine from 1 to min_lr_ratio."""

    def factor(step: int) -> float:
        if warmup_steps > 0 and step < warmup_steps:
            return (step + 1) / warmup_steps
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def adamw_kernel(params: Sequence[torch.Tensor]) -> dict[str, bool]:
    """``fused=True`` (one kernel for every tensor's update instead of one per op: the same update to float32
    rounding, faster on small models) where torch has it: plain float tensors on CPU or CUDA; else
    ``foreach=True`` (e.g. FSDP's sharded DTensor parameters)."""
    floats = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
    plain = dist.whole_tensors(params) and all(
        p.device.type in ("cpu", "cuda") and p.dtype in floats for p in params
    )
    return {"fused": True} if plain else {"foreach": True}


def make_optimizer(model: torch.nn.Module, cfg: OptimConfig, total_steps: int):
    """AdamW with decay on ≥2-D weights only, and the warmup-cosine LambdaLR. Trained bfloat16 weights
    (``run.dtype=bfloat16``, full fine-tuning) take `MasterAdamW`: float32 master weights and moments, unless
    ``cfg.master_weights`` is false. torch's AdamW gets its state now (`allocate_adamw_state`)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    trained = decay + no_decay
    low_precision = any(needs_master(p) for p in trained)
    if low_precision and not cfg.master_weights:
        log.info(
            "optim.master_weights=false: AdamW steps the bfloat16 weights and keeps bfloat16 moments (8 bytes per "
            "parameter); a step below about 1/256 of a weight rounds away"
        )
    adamw = MasterAdamW if low_precision and cfg.master_weights else torch.optim.AdamW
    opt = adamw(groups, lr=cfg.lr, betas=cfg.betas, **adamw_kernel(trained))
    if adamw is torch.optim.AdamW:  # (MasterAdamW's masters are copies of the weights at the first step)
        allocate_adamw_state(opt)
    if cfg.step_in_backward:
        StepInBackward(opt, model)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, cosine_schedule(cfg.warmup_steps, total_steps, cfg.min_lr_ratio)
    )
    return opt, sched


@dataclass(frozen=True)
class TrainConfig:
    """The batches of supervised training (pretraining, SFT, the reward model's pairs)."""

    batch_size: int = 64
    """Examples per optimiser step (over all micro-batches and ranks)."""
    grad_accum: int = 1
    """Micro-batches per optimiser step (the loss is normalised by the step's whole count of tokens, or of
    pairs for a reward model, so this never changes the gradient)."""
    max_length: int = 64
    """Longest example in tokens (prompt + completion + EOS); see `overlong`."""
    overlong: Literal["drop", "truncate", "error"] = "drop"
    """What to do with longer examples: drop, truncate or error (always reported)."""
    packing: bool = False
    """Concatenate whole examples into blocks of max_length tokens."""
    eval_examples: int = 256
    """Held-out examples for the held-out loss (pretraining and SFT; the reward model's held-out pairs are
    its eval_size)."""

    CHECKS = {"batch_size": ">= 1", "grad_accum": ">= 1", "max_length": ">= 2", "eval_examples": ">= 0"}


# The run keys that left the `train` section for `run` (and `train.optim` for `optim`): their new names.
TRAIN_RENAMED = {"train.max_steps": "run.steps", "train.optim": "optim"}
TRAIN_RENAMED |= {f"train.{k}": f"run.{k}" for k in ("eval_every", "save_every", "keep_last", "seed")}
TRAIN_RENAMED |= {f"train.{k}": f"run.{k}" for k in ("log_every", "max_seconds", "parallel")}
TRAIN_RENAMED |= {k: f"run.{k}" for k in ("device", "dtype", "threads", "tensorboard")}


def token_losses(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], packed: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token next-token NLL and its mask, both [B, L−1]: position t predicts token t+1. ``packed``: through
    the padding-free forward (`postrl.lm.packed_sft`, for a model `sft_padding_free` accepted)."""
    targets = batch["labels"][:, 1:]  # (B, L-1)
    mask = targets != -100
    if packed:
        nll = -packed_next_token_log_probs(
            model, batch["input_ids"], batch["attention_mask"], batch["labels"]
        )
        return nll, mask
    # −log softmax(logits)[target]: the whole logits' cross-entropy, or the output layer in chunks (run.memory)
    nll = -next_token_log_probs(model, batch["input_ids"], batch["attention_mask"], targets.clamp_min(0))
    return nll, mask


def sft_step_loss(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], n_tokens: int, packed: bool = False
) -> torch.Tensor:
    """Σ NLL over this micro-batch's target tokens / ``n_tokens`` (the whole step's count)."""
    nll, mask = token_losses(model, batch, packed)
    return masked_sum(nll, mask) / max(1, n_tokens)


@torch.no_grad()
def heldout_loss(
    model: torch.nn.Module, batches: Sequence[dict[str, torch.Tensor]], packed: bool = False
) -> float:
    """Token-mean NLL over held-out batches (dropout off); ``packed`` as `token_losses`."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for batch in batches:
        nll, mask = token_losses(model, batch, packed)
        total += float(masked_sum(nll, mask))
        count += int(mask.sum())
    model.train(was_training)
    return total / max(1, count)


def batch_order(n_examples: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Example indices for each batch of ``epoch``: a permutation that depends only on (seed, epoch)."""
    order = list(range(n_examples))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return [order[i : i + batch_size] for i in range(0, n_examples, batch_size)]


def iterate_batches(
    n_examples: int, batch_size: int, seed: int, start: int = 0
) -> Iterator[tuple[int, list[int]]]:
    """Endless ``(position, indices)``; position counts batches from the start of training, so a resume at
    position p continues with exactly the batch a straight run would have drawn next."""
    per_epoch = math.ceil(n_examples / batch_size)
    position = start
    while True:
        epoch, within = divmod(position, per_epoch)
        yield position, batch_order(n_examples, batch_size, seed, epoch)[within]
        position += 1


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def make_batches(examples: Sequence[dict[str, list[int]]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad tokenised examples: ``input_ids``, ``attention_mask``, ``labels`` (−100 = no loss), [B, L]."""
    ids, mask = pad([e["input_ids"] for e in examples], pad_token_id, side="right")
    labels, _ = pad([e["labels"] for e in examples], -100, side="right")
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def prepare_examples(examples: list[dict[str, list[int]]], cfg: TrainConfig) -> list[dict[str, list[int]]]:
    return pack_examples(examples, cfg.max_length) if cfg.packing else examples


def micro_batches(indices: list[int], grad_accum: int) -> list[tuple[list[int], float]]:
    """This rank's share of a step's examples cut into ``grad_accum`` micro-batches, each with its loss weight.

    Every rank gets the same number of micro-batches (FSDP gathers parameters in every forward, DDP syncs in
    the last backward, so the ranks must stay in step); a rank whose share runs out, e.g. on the last batch
    of an epoch, runs one example with weight 0.
    """
    mine = [indices[i] for i in dist.shard_range(len(indices))]
    largest = math.ceil(len(indices) / dist.world_size())  # the largest share, the same on every rank
    size = max(1, math.ceil(largest / grad_accum))
    count = max(1, math.ceil(largest / size))
    chunks = [mine[k * size : (k + 1) * size] for k in range(count)]
    return [(c, 1.0) if c else ([indices[0]], 0.0) for c in chunks]


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    examples: Sequence[dict[str, list[int]]],
    indices: list[int],
    cfg: TrainConfig,
    optim: OptimConfig,
    pad_token_id: int,
    device: torch.device,
    packed: bool = False,
) -> dict[str, float]:
    """One optimiser step over ``indices`` (all ranks' examples); returns loss and gradient norm.

    The loss is Σ NLL over the global step's target tokens / their global count, so 1 process with the
    whole batch and N processes with a share each take the same step. ``packed`` as `token_losses`.
    """
    cpu = [
        (make_batches([examples[i] for i in m], pad_token_id), w)
        for m, w in micro_batches(indices, cfg.grad_accum)
    ]
    local_tokens = sum(int((b["labels"][:, 1:] != -100).sum()) * w for b, w in cpu)  # counted before the copy
    micro = [(to_device(b, device), w) for b, w in cpu]
    n_tokens = int(dist.all_reduce_sum(torch.tensor(local_tokens)).item())
    scale = dist.world_size()  # DDP and FSDP average gradients over ranks; the loss is a global token sum

    def loss(mb: tuple[dict[str, torch.Tensor], float]) -> torch.Tensor:
        return sft_step_loss(model, mb[0], n_tokens, packed) * (scale * mb[1])

    total = accumulate([model], micro, loss) / scale
    total = float(dist.all_reduce_sum(torch.tensor(total)).item())
    norm = clip_grad_norm(model, optim.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": total, "grad_norm": norm, "tokens": n_tokens}


def clip_grad_norm(model: torch.nn.Module, max_norm: float | None) -> float:
    """Global gradient norm (over all ranks' shards), clipped to ``max_norm`` when it is not None; with
    ``optim.step_in_backward`` the norm of the gradients the backward stepped and freed (never clipped)."""
    stepping = step_in_backward_of(model.parameters())
    if stepping is not None:
        return stepping.grad_norm(model.parameters())
    return dist.grad_norm(model.parameters(), max_norm)


def model_parts(
    model: torch.nn.Module, optimizer: Any, scheduler: Any, tokenizer: Any, position: int
) -> Parts:
    """The checkpoint of a trainer of one model that reads its data in order (SFT, pretraining, RM, DPO): the
    model, its optimiser and schedule, the data position; each checkpoint folder also holds the model's config
    and the tokenizer, so that `from_pretrained` loads it."""
    config = getattr(dist.unwrap(model), "config", None)

    def hf_files(folder: Path) -> None:
        if config is not None:
            config.save_pretrained(str(folder))
        tokenizer.save_pretrained(str(folder))

    return Parts(
        {"model": model}, {"model": optimizer}, {"sched": scheduler}, {"position": position}, hf_files
    )


class Supervised:
    """Next-token training on tokenised examples (pretraining and SFT) as a `postrl.lm.spine` algorithm."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        examples: list[dict[str, list[int]]],
        eval_examples: list[dict[str, list[int]]],
        cfg: TrainConfig,
        optim: OptimConfig,
        run: RunConfig,
        *,
        device: torch.device,
        name: str = "sft",
        evaluate: Callable[[torch.nn.Module], dict[str, float]] | None = None,
        should_stop: Callable[[dict[str, float]], bool] | None = None,
        padding_free: Literal["auto", "off"] = "off",
    ) -> None:
        """``padding_free``: SFT's ``padding_free`` (`postrl.lm.packed_sft.sft_padding_free`; off: pretraining)."""
        if not examples:
            raise ValueError("no training examples left after tokenisation and the length limit")
        self.name, self.model, self.tokenizer, self.examples = name, model, tokenizer, examples
        self.cfg, self.optim, self.run, self.device = cfg, optim, run, device
        self._evaluate, self._should_stop = evaluate, should_stop
        self.optimizer, self.scheduler = make_optimizer(dist.unwrap(model), optim, run.steps)
        batches = [
            make_batches(eval_examples[i : i + 64], tokenizer.pad_token_id)
            for i in range(0, min(len(eval_examples), cfg.eval_examples), 64)
        ]
        self.eval_batches = [to_device(b, device) for b in batches]
        self.position, self.tokens, self.seconds = 0, 0, 0.0  # tokens and seconds trained (checkpointed)
        self.batches = iterate_batches(len(examples), cfg.batch_size, run.seed)
        model.train()
        self.packed = sft_padding_free(model, padding_free)
        self.eval_packed = sft_padding_free(dist.unwrap(model), padding_free, gradients=False)

    def step(self, step: int) -> dict[str, float]:
        self.position, indices = next(self.batches)
        self.position += 1
        tic = time.perf_counter()
        out = train_step(
            self.model, self.optimizer, self.examples, indices, self.cfg, self.optim,
            self.tokenizer.pad_token_id, self.device, self.packed,
        )  # fmt: skip
        self.seconds += time.perf_counter() - tic
        self.tokens += out["tokens"]
        self.scheduler.step()
        return {"loss": out["loss"], "grad_norm": out["grad_norm"], "lr": self.scheduler.get_last_lr()[0]}

    def bar(self, metrics: dict[str, float]) -> dict[str, float]:
        return {"loss": metrics["loss"]}

    def evaluate(self) -> dict[str, float]:
        return _evaluate(self.model, self.eval_batches, self._evaluate, self.eval_packed)

    def should_stop(self, evals: dict[str, float]) -> bool:
        return self._should_stop is not None and self._should_stop(evals)

    def parts(self) -> Parts:
        parts = model_parts(self.model, self.optimizer, self.scheduler, self.tokenizer, self.position)
        parts.extra |= {"tokens": self.tokens, "seconds": self.seconds}  # the summary's tokens per second
        return parts

    def load_extra(self, extra: dict[str, Any]) -> None:
        self.position = int(extra["position"])
        self.tokens, self.seconds = int(extra.get("tokens", 0)), float(extra.get("seconds", 0.0))
        self.batches = iterate_batches(len(self.examples), self.cfg.batch_size, self.run.seed, self.position)


def run_training(
    algo: Supervised, run_dir: Path, logger: RunLogger, resume: bool | Path | None = None
) -> dict:
    """Train ``algo`` with the spine (`postrl.lm.spine.train_loop`) from checkpoint ``resume`` (a folder, or
    True for the newest under ``run_dir/checkpoints``); then as `supervised_summary`. The stages run through
    `postrl.lm.recipe`; this is the loop alone, for a caller that builds its own `Supervised`."""
    ckpt = latest_checkpoint(run_dir / "checkpoints") if resume is True else (resume or None)
    state = train_loop(algo, algo.run, run_dir, logger, ckpt)
    return supervised_summary(algo, state, run_dir)


def supervised_summary(algo: Supervised, state: LoopState, run_dir: Path) -> dict:
    """The end of an SFT or pretraining run: ``run_dir/curves.png`` (rank 0), and the last evaluation, the
    steps and the training tokens per second."""
    if dist.is_main():
        write_curves(run_dir, ["loss", "heldout_loss", "heldout_accuracy", "lr"], title=algo.name)
    rate = algo.tokens / max(algo.seconds, 1e-9)
    return {**state.last_eval, "steps": state.step, "train_tokens_per_second": rate}


def _evaluate(
    model: torch.nn.Module,
    eval_batches: list[dict[str, torch.Tensor]],
    evaluate: Callable[[torch.nn.Module], dict[str, float]] | None,
    packed: bool = False,
) -> dict[str, float]:
    """Held-out loss (and ``evaluate``): on rank 0, sent to the others, so every rank takes the same
    stop decision; an FSDP-sharded model needs every rank in each forward, so there all ranks compute."""
    inner = dist.unwrap(model)
    metrics: dict[str, float] = {}
    if dist.is_main() or dist.is_sharded(model):
        metrics = {
            "heldout_loss": heldout_loss(inner, eval_batches, packed) if eval_batches else float("nan")
        }
        if evaluate is not None:
            with dist.gathered(model):  # generation reads whole weights
                metrics.update(evaluate(inner))
    return dist.broadcast_object(metrics)


def export_model(
    model: torch.nn.Module, tokenizer: Any, path: Path, state_dict: dict[str, torch.Tensor] | None = None
) -> Path:
    """``save_pretrained`` the model (safetensors) and tokenizer into ``path`` atomically
    (`postrl.runtime.checkpoint.write_dir_atomically`).

    ``state_dict``: the full weights when the model is sharded (see :func:`export_on_main`). A model with LoRA
    adapters exports its adapter, or merged weights (`postrl.lm.models.lora.export_adapted`)."""
    from postrl.lm.models import export_adapted, has_lora  # deferred: transformers (see check_train_length)

    if has_lora(dist.unwrap(model)):
        return export_adapted(dist.unwrap(model), tokenizer, path)

    def write(tmp: Path) -> None:
        dist.unwrap(model).save_pretrained(str(tmp), safe_serialization=True, state_dict=state_dict)
        tokenizer.save_pretrained(str(tmp))

    return write_dir_atomically(path, write)


def export_on_main(model: torch.nn.Module, tokenizer: Any, path: Path) -> None:
    """Called by every rank: gather a sharded model's weights, rank 0 writes ``path``, all wait for it.
    The gathered copies of tied parameters are separate tensors, which ``save_pretrained`` would write
    twice (an extra ``lm_head.weight`` of vocabulary × hidden): only the first name is kept, as it does."""
    state = dist.without_tied_copies(model, dist.model_state_dict(model)) if dist.is_sharded(model) else None
    if dist.is_main():
        export_model(model, tokenizer, path, state_dict=state)
    dist.barrier()


def check_train_length(model: Any, cfg: TrainConfig) -> None:
    """``train.max_length`` must fit the model's context: positions past it have no embedding."""
    # deferred: postrl.lm.models imports transformers (seconds), which the trainers' configs do not need
    from postrl.lm.models import check_context

    check_context(model, cfg.max_length, f"train.max_length ({cfg.max_length})")


def fit_train_length(model: Any, cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with ``train.max_length`` clipped to the model's context (logged when it is): a ceiling, as TRL's
    is, so rows that fit the model run and ``train.overlong`` meets only the rows that do not. Pretraining,
    which builds its model from its own keys, keeps `check_train_length`."""
    from postrl.lm.models import fit_context  # deferred: transformers (see check_train_length)

    max_length = fit_context(model, cfg.max_length, "train.max_length")
    return cfg if max_length == cfg.max_length else replace(cfg, max_length=max_length)


def set_threads(threads: int | None) -> None:
    """Use ``threads`` intra-op threads (None: torch's default)."""
    if threads:
        torch.set_num_threads(threads)
