"""Supervised training of a vision-language model on the LM trainers' spine: the alignment stage of the
built-in tiny VLM (`run_vlm_pretrain`: captions of the shapes pictures) and SFT (`run_vlm_sft`, reached from
`postrl sft` when ``--model`` is a VLM folder), with held-out loss and greedy exact-match accuracy.

The loss is next-token cross-entropy on completion tokens only, as text SFT: the prompt, and therefore every
image placeholder, is outside it (`postrl.lm.vlm.data.sft_batch`).

Under torchrun, as the text trainers (`postrl.lm.trainer.train_step`): each rank takes its share of a step's
rows (`micro_batches`), the loss is normalised by the global count of completion tokens, gradients are
averaged by DDP (`wrap_vlm`) or FSDP2, and the held-out loss and accuracy are computed on shares of the
held-out rows and gathered, so every rank takes the same stop decision; rank 0 writes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from postrl.lm.models import fit_context
from postrl.lm.recipe import Setup, run_recipe
from postrl.lm.spine import LoopState, Parts, RunConfig, accumulate
from postrl.lm.tasks import get_task
from postrl.lm.trainer import (
    OptimConfig,
    TrainConfig,
    clip_grad_norm,
    export_on_main,
    iterate_batches,
    make_optimizer,
    micro_batches,
    model_parts,
)
from postrl.lm.vlm.data import VLMExample, encode_rows, load_vlm_rows, prompt_batch, sft_batch
from postrl.lm.vlm.model import TinyVLMConfig, build_tiny_vlm, build_vlm_tokenizer, image_token_id, load_vlm
from postrl.lm.vlm.rollout import vlm_generate, vlm_response_logits
from postrl.runtime import distributed as dist
from postrl.runtime.errors import UserError

Reward = Callable[..., list[float]]


# ---- the loss and the evaluation ------------------------------------------------------------------------
def completion_nll(model: torch.nn.Module, batch: dict[str, Any]) -> tuple[Tensor, int]:
    """(Σ −log p of the completion tokens, their count) of an `sft_batch`."""
    P = batch["prompt_len"]
    logits = vlm_response_logits(
        model, batch["input_ids"], batch["attention_mask"], P, batch["images"], share=batch["share"]
    )  # (B, T, V)
    mask = batch["attention_mask"][:, P:].float()
    log_p = torch.log_softmax(logits.float(), -1).gather(-1, batch["input_ids"][:, P:, None]).squeeze(-1)
    return -(log_p * mask).sum(), int(mask.sum())


def nested_to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The tensors of ``batch`` (and of the dicts it holds: the processor inputs) on ``device``."""
    return {
        k: v.to(device)
        if isinstance(v, Tensor)
        else nested_to_device(v, device)
        if isinstance(v, dict)
        else v
        for k, v in batch.items()
    }


@torch.no_grad()
def answer_accuracy(
    model: torch.nn.Module,
    processor: Any,
    examples: Sequence[VLMExample],
    reward: Reward,
    *,
    max_new_tokens: int = 8,
    batch_size: int = 128,
) -> dict[str, float]:
    """Greedy completions of ``examples`` rewarded by ``reward`` (TRL's call, with the rows' columns):
    ``heldout_accuracy`` overall and per ``kind`` column when the rows have one. Under torchrun every rank
    calls it (with whole weights: `dist.gathered`), answers its share and gets everyone's result."""
    tok, device = processor.tokenizer, next(model.parameters()).device
    was_training = model.training
    model.eval()
    scores: list[float] = []
    mine = [examples[i] for i in dist.shard_range(len(examples))]
    for start in range(0, len(mine), batch_size):
        part = mine[start : start + batch_size]
        ids, mask, images = prompt_batch(part, tok.pad_token_id)
        rollout = vlm_generate(
            model, ids.to(device), mask.to(device), nested_to_device(images, device),
            max_new_tokens=max_new_tokens, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
            banned=[image_token_id(model, processor)], greedy=True,
        )  # fmt: skip
        texts = decode(tok, rollout.response_ids, rollout.response_lengths)
        columns = {
            k: [e.row.get(k) for e in part] for k in part[0].row if k not in ("prompt", "where", "base")
        }
        scores += reward(prompts=[e.row["prompt"] for e in part], completions=texts, **columns)
    model.train(was_training)
    return accuracy_by_kind(examples, gather_shares(scores))


def accuracy_by_kind(examples: Sequence[VLMExample], scores: Sequence[float]) -> dict[str, float]:
    """``heldout_accuracy`` (the mean score) and ``heldout_accuracy/KIND`` per value of the rows' ``kind``."""
    out = {"heldout_accuracy": sum(scores) / max(1, len(scores))}
    kinds: dict[str, list[float]] = {}
    for e, s in zip(examples, scores, strict=True):
        if e.row.get("kind") is not None:
            kinds.setdefault(str(e.row["kind"]), []).append(s)
    return out | {f"heldout_accuracy/{k}": sum(v) / len(v) for k, v in sorted(kinds.items())}


def gather_shares(values: list[Any]) -> list[Any]:
    """Every rank's list (each rank's share of some items, `dist.shard_range`) joined in rank order: the
    whole list, in item order, on every rank."""
    return [v for part in dist.all_gather_object(values) for v in part]


def decode(tokenizer: Any, response_ids: Tensor, lengths: Tensor) -> list[str]:
    """Each row's response text without EOS and padding."""
    rows = [ids[:n] for ids, n in zip(response_ids.tolist(), lengths.tolist(), strict=True)]
    rows = [r[:-1] if r and r[-1] == tokenizer.eos_token_id else r for r in rows]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)


# ---- the algorithm the spine runs -------------------------------------------------------------------------
class VLMSupervised:
    """Next-token training on completions with pictures, as a `postrl.lm.spine` algorithm."""

    def __init__(
        self,
        model: torch.nn.Module,
        processor: Any,
        examples: list[VLMExample],
        eval_examples: list[VLMExample],
        cfg: TrainConfig,
        optim: OptimConfig,
        run: RunConfig,
        *,
        name: str = "sft",
        evaluate: Callable[[torch.nn.Module], dict[str, float]] | None = None,
        stop_accuracy: float | None = None,
    ) -> None:
        self.name, self.model, self.processor, self.examples = name, model, processor, examples
        self.eval_examples = eval_examples[: cfg.eval_examples]
        self.cfg, self.optim, self.run, self._evaluate = cfg, optim, run, evaluate
        self.stop_accuracy = stop_accuracy
        self.device = next(model.parameters()).device
        self.optimizer, self.scheduler = make_optimizer(dist.unwrap(model), optim, run.steps)
        self.position, self.tokens = 0, 0
        self.batches = iterate_batches(len(examples), cfg.batch_size, run.seed)
        model.train()

    def step(self, step: int) -> dict[str, float]:
        """One optimiser step on the global batch ``indices``: this rank's share in micro-batches (weight 0:
        a rank with no rows left runs one row for nothing, see `micro_batches`), the loss Σ NLL / the global
        count of completion tokens, so N ranks take the step one process takes."""
        self.position, indices = next(self.batches)
        self.position += 1
        pad = self.processor.tokenizer.pad_token_id
        batches = [
            (nested_to_device(sft_batch([self.examples[i] for i in m], pad), self.device), w)
            for m, w in micro_batches(indices, self.cfg.grad_accum)
        ]
        local = sum(int(b["attention_mask"][:, b["prompt_len"] :].sum()) * w for b, w in batches)
        count = int(dist.all_reduce_sum(torch.tensor(local)).item())
        scale = dist.world_size()  # DDP and FSDP average gradients over ranks; the loss is a global sum

        def share(batch: tuple[dict[str, Any], float]) -> Tensor:
            return completion_nll(self.model, batch[0])[0] * (scale * batch[1] / count)

        loss = float(dist.all_reduce_sum(torch.tensor(accumulate([self.model], batches, share) / scale)))
        grad_norm = clip_grad_norm(self.model, self.optim.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        self.tokens += count
        return {"loss": loss, "grad_norm": grad_norm, "lr": lr}

    def bar(self, metrics: dict[str, float]) -> dict[str, float]:
        return {"loss": metrics["loss"]}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Held-out loss over this rank's share of the rows, summed over ranks (and ``evaluate``'s metrics);
        the same on every rank. The forwards read whole weights (`dist.gathered`), so the ranks may run
        different numbers of them."""
        pad, model = self.processor.tokenizer.pad_token_id, dist.unwrap(self.model)
        mine = [self.eval_examples[i] for i in dist.shard_range(len(self.eval_examples))]
        sums = torch.zeros(2, dtype=torch.float64)  # Σ NLL, token count
        with dist.gathered(self.model):
            for start in range(0, len(mine), 64):
                batch = nested_to_device(sft_batch(mine[start : start + 64], pad), self.device)
                nll, n = completion_nll(model, batch)
                sums += torch.tensor([float(nll), n], dtype=torch.float64)
            extra = self._evaluate(model) if self._evaluate is not None else {}
        total, count = dist.all_reduce_sum(sums).tolist()
        return {"heldout_loss": total / max(1, count)} | extra

    def should_stop(self, evals: dict[str, float]) -> bool:
        return self.stop_accuracy is not None and evals.get("heldout_accuracy", 0.0) >= self.stop_accuracy

    def parts(self) -> Parts:  # each checkpoint is also a folder from_pretrained loads (config + processor)
        parts = model_parts(self.model, self.optimizer, self.scheduler, self.processor, self.position)
        parts.extra["tokens"] = self.tokens  # the summary's tokens per second
        return parts

    def load_extra(self, extra: dict[str, Any]) -> None:
        self.position, self.tokens = int(extra["position"]), int(extra.get("tokens", 0))
        self.batches = iterate_batches(len(self.examples), self.cfg.batch_size, self.run.seed, self.position)


def check_parallel(run: RunConfig, world_size: int, trains_vision: bool) -> None:
    """``run.parallel=fsdp`` shards a VLM only when its vision parts are frozen (`run_vlm_grpo`'s
    ``freeze_vision``): a vision tower has parameters no loss reaches (CLIP's ``post_layernorm``), which get
    no optimiser state, and a sharded resume refuses a checkpoint without it."""
    if world_size > 1 and run.parallel == "fsdp" and trains_vision:
        raise UserError(
            "run.parallel=fsdp is not supported for a vision-language model whose vision tower trains "
            "(SFT, alignment, GRPO by default): use run.parallel=ddp"
        )


def wrap_vlm(model: torch.nn.Module, info: dist.DistInfo, parallel: str) -> torch.nn.Module:
    """``model`` for data-parallel training (`dist.wrap_model`); the model itself in one process. DDP is
    told to look for unused parameters: a VLM's forward leaves some out of every loss (the tiny VLM's CLIP
    tower has a ``post_layernorm`` for a pooled output LLaVA never reads); DDP leaves their gradients None,
    as one process does, so AdamW skips them in both. Freeze parameters before this call."""
    if info.world_size <= 1 or parallel != "ddp":
        return dist.wrap_model(model, info, parallel)
    ids = [info.device.index] if info.device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, find_unused_parameters=True)


class VLMSupervisedRecipe:
    """The end every supervised VLM stage shares (`postrl.lm.recipe.Recipe`): the model and its processor
    exported to ``RUN_DIR/model``, and the summary."""

    def check(self, cfg: Any) -> None:
        """Nothing beyond the value ranges; the world-size check runs in `load` (it needs the set-up)."""

    def finish(self, setup: Setup, algo: VLMSupervised, state: LoopState) -> dict[str, Any]:
        export_on_main(algo.model, algo.processor, setup.run_dir / "model")
        rate = algo.tokens / max(state.train_seconds, 1e-9)
        summary = {**state.last_eval, "steps": state.step, "train_seconds": round(state.train_seconds, 3)}
        return summary | {"train_tokens_per_second": rate, "train_examples": len(algo.examples)}


# ---- postrl sft on a VLM ---------------------------------------------------------------------------------
def sft_data(
    cfg: Any, processor: Any, model: Any
) -> tuple[list[VLMExample], list[VLMExample], Reward | None]:
    """(train, held-out, the verifier or None) of an `SFTConfig` whose model is a VLM: one source (a file in
    TRL's vision format, or task:shapes); held-out: eval_data, a task's test split, else the last 5%. Rows
    longer than ``train.max_length``, clipped to ``model``'s positions as a text model's SFT clips it (a longer
    row would train past them), meet ``train.overlong`` (drop or error)."""
    if "," in cfg.data:
        raise UserError(f"data: a vision-language model takes one source, got {cfg.data!r}")
    task = get_task(cfg.data[len("task:") :], **cfg.task) if cfg.data.startswith("task:") else None
    rows = load_vlm_rows(cfg.data, "train", cfg.task)
    if cfg.eval_data is not None:
        heldout = load_vlm_rows(cfg.eval_data, "test", cfg.task)
    elif task is not None:
        heldout = load_vlm_rows(cfg.data, "test", cfg.task)
    else:
        cut = max(1, len(rows) // 20)
        rows, heldout = rows[:-cut], rows[-cut:]
    max_length, overlong = fit_context(model, cfg.train.max_length, "train.max_length"), cfg.train.overlong
    train = encode_rows(processor, rows, "sft", max_length, overlong)
    evals = encode_rows(processor, heldout, "sft", max_length, overlong)
    verifier = task.reward_fn if task is not None and "answer" in heldout[0] else None
    return train, evals, verifier


class VLMSFTRecipe(VLMSupervisedRecipe):
    """`postrl sft` on a vision-language model: its rows (pictures in the prompts) and `VLMSupervised`."""

    def load(self, setup: Setup) -> None:
        cfg, info = setup.cfg, setup.info
        check_parallel(cfg.run, info.world_size, trains_vision=True)
        model, processor = load_vlm(cfg.model, cfg.run.dtype, info.device, cfg.trust_remote_code)
        train, evals, verifier = sft_data(cfg, processor, model)
        evaluate = None
        if verifier is not None and cfg.eval_size > 0:

            def evaluate(m: torch.nn.Module) -> dict[str, float]:
                return answer_accuracy(
                    m, processor, evals[: cfg.eval_size], verifier, max_new_tokens=cfg.eval_max_new_tokens
                )

        setup.policy, setup.tokenizer = model, processor
        setup.extra.update(train=train, evals=evals, evaluate=evaluate)

    def build(self, setup: Setup, resumed: bool) -> VLMSupervised:
        cfg, x = setup.cfg, setup.extra
        return VLMSupervised(
            wrap_vlm(setup.policy, setup.info, cfg.run.parallel), setup.tokenizer, x["train"], x["evals"],
            cfg.train, cfg.optim, cfg.run, name="sft", evaluate=x["evaluate"], stop_accuracy=cfg.stop_accuracy,
        )  # fmt: skip


def run_vlm_sft(
    cfg: Any, run_dir: str | Path, resume: bool = False, overwrite: bool = False
) -> dict[str, Any]:
    """`postrl sft` for a vision-language model (`postrl.lm.sft.SFTConfig`; the hook in `run_sft`)."""
    return run_recipe(VLMSFTRecipe(), cfg, run_dir, resume=resume, overwrite=overwrite)


# ---- the built-in tiny VLM and its alignment stage ----------------------------------------------------------
@dataclass(frozen=True)
class VLMPretrainConfig:
    """`postrl vlm-pretrain --out RUN_DIR`: build the tiny VLM and align it on captions of the shapes pictures
    ("Describe the picture." → "3 red dots"), LLaVA's first stage done from scratch."""

    model: TinyVLMConfig = field(default_factory=TinyVLMConfig)
    """Shape of the tiny VLM (vision tower, projector, Llama) and its tokenizer's vocabulary."""
    task: dict[str, Any] = field(default_factory=lambda: {"n_train": 4000, "n_test": 200})
    """Options of task:shapes, whose pictures are captioned (e.g. {difficulty: 2})."""
    tokenizer_lines: int = 4000
    """Lines of the shapes corpus (questions, answers, captions) the BPE tokenizer is trained on."""
    train: TrainConfig = field(default_factory=lambda: TrainConfig(batch_size=32, max_length=128))
    """Batches: examples per step, micro-batches, length limit."""
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=3e-4, warmup_steps=20, min_lr_ratio=0.1)
    )
    """AdamW and its schedule."""
    run: RunConfig = field(default_factory=lambda: RunConfig(steps=600, eval_every=200, save_every=200))
    """Steps, seed, logging, evaluation and checkpoint cadence, device, dtype, threads."""

    CHECKS = {"tokenizer_lines": ">= 1"}


class VLMPretrainRecipe(VLMSupervisedRecipe):
    """`postrl vlm-pretrain`: the tiny VLM built from its config and aligned on captions of the shapes pictures."""

    def check(self, cfg: VLMPretrainConfig) -> None:
        if cfg.train.max_length > cfg.model.max_position_embeddings:
            raise UserError(
                f"train.max_length={cfg.train.max_length} exceeds model.max_position_embeddings="
                f"{cfg.model.max_position_embeddings}"
            )

    def load(self, setup: Setup) -> None:
        cfg, info = setup.cfg, setup.info
        check_parallel(cfg.run, info.world_size, trains_vision=True)
        task = get_task("shapes", **cfg.task)
        tokenizer = build_vlm_tokenizer(task.corpus_lines(cfg.tokenizer_lines), cfg.model.vocab_size)
        model, processor = build_tiny_vlm(tokenizer, cfg.model, seed=cfg.run.seed)
        size = cfg.train.max_length
        setup.policy, setup.tokenizer = model.to(info.device), processor
        setup.extra.update(
            train=encode_rows(processor, task.caption_rows("train"), "sft", size),
            evals=encode_rows(processor, task.caption_rows("test"), "sft", size),
        )

    def build(self, setup: Setup, resumed: bool) -> VLMSupervised:
        cfg, x = setup.cfg, setup.extra
        model = wrap_vlm(setup.policy, setup.info, cfg.run.parallel)
        return VLMSupervised(
            model, setup.tokenizer, x["train"], x["evals"], cfg.train, cfg.optim, cfg.run, name="align"
        )


def run_vlm_pretrain(
    cfg: VLMPretrainConfig, run_dir: str | Path, resume: bool = False, overwrite: bool = False
) -> dict[str, Any]:
    """Build the tiny VLM (weights fixed by run.seed), align it on captions, export ``RUN_DIR/model``."""
    return run_recipe(VLMPretrainRecipe(), cfg, run_dir, resume=resume, overwrite=overwrite)
