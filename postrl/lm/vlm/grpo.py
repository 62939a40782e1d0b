"""GRPO on a vision-language model (`postrl grpo` when ``--model`` is a VLM folder): the text trainer's config,
advantage estimators (`postrl.lm.grpo.rollouts.ADVANTAGES`), loss (`postrl.core.grpo_loss`) and reward
functions, with sampling and scoring that see the pictures (`postrl.lm.vlm.rollout`).

One step, as `postrl.lm.grpo.algorithm`:

    B prompts + pictures ──generate × G (vision encoder once per prompt)──▶ Rollout [B·G, P+T], log π_old
      ──reward fns (TRL's call; the rows' columns but not the pictures)──▶ r [B·G] ──grpo.advantage──▶ A
      ──μ epochs × minibatches × micro-batches: grpo_loss (clip ε / ε_high, β·k3 to the frozen reference)──▶ AdamW

The update is the text trainer's (`postrl.lm.grpo.GRPOObjective` through `postrl.lm.onpolicy`) with this
policy's forward, which gives each row its own pictures (`VLMGRPO.policy`).

Under torchrun, as the text trainer: every rank draws the same global prompts and samples its share of whole
groups with its own generator, the loss normaliser is the global count, gradients are averaged by DDP (or
FSDP2, sampling and scoring then with whole weights: `dist.gathered`), metrics are averaged over ranks, the
held-out prompts are shared out and the results gathered, and rank 0 writes.

Not here yet: dynamic sampling (a config error).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from postrl.core import overlong_penalty
from postrl.lm.grpo.build import check_grpo_config, reward_fns
from postrl.lm.grpo.config import GRPOConfig
from postrl.lm.grpo.objective import GRPOObjective, PolicyForward, update_grpo
from postrl.lm.grpo.rollouts import PromptStream, compute_advantages
from postrl.lm.recipe import Setup, run_recipe
from postrl.lm.rewards import Phase, TrainerState, columns_of, combine, completion_ids_of, reward_terms
from postrl.lm.rollout import Rollout
from postrl.lm.rollout.batch import RolloutBatch
from postrl.lm.spine import LoopState, Parts
from postrl.lm.trainer import export_on_main, make_optimizer
from postrl.lm.vlm.data import VLMExample, encode_rows, load_vlm_rows, prompt_batch
from postrl.lm.vlm.inputs import select_rows
from postrl.lm.vlm.model import image_token_id, load_vlm
from postrl.lm.vlm.rollout import vlm_generate, vlm_score
from postrl.lm.vlm.train import (
    accuracy_by_kind,
    check_parallel,
    decode,
    gather_shares,
    nested_to_device,
    wrap_vlm,
)
from postrl.runtime import distributed as dist
from postrl.runtime.errors import UserError

log = logging.getLogger(__name__)
HIDDEN_COLUMNS = ("prompt", "where", "base")


class VLMGRPO:
    """GRPO with pictures as a `postrl.lm.spine` algorithm (checkpoint: policy, AdamW, schedule, stream)."""

    name = "grpo"

    def __init__(self, cfg: GRPOConfig, model, ref, processor, fns, train, heldout) -> None:
        self.cfg, self.model, self.ref, self.processor, self.fns = cfg, model, ref, processor, fns
        self.train, self.heldout = train, heldout
        self.device = next(model.parameters()).device
        self.banned = [image_token_id(dist.unwrap(model), processor)]
        self.optimizer, self.scheduler = make_optimizer(dist.unwrap(model), cfg.optim, cfg.run.steps)
        self.stream = PromptStream(len(train), cfg.run.seed)
        self.generated_tokens = 0.0
        self.steps_done = 0  # the step an evaluation reports (it follows a step, or is the one at step 0)

    # ---- sampling ------------------------------------------------------------------------------------------
    def sample(
        self, examples: list[VLMExample], repeat: int, sampling, seed: int
    ) -> tuple[Rollout, list[str]]:
        tok = self.processor.tokenizer
        ids, mask, images = prompt_batch(examples, tok.pad_token_id)
        model = dist.unwrap(self.model)
        was_training = model.training
        model.eval()
        with dist.gathered(self.model):  # whole weights; ranks may decode different numbers of tokens
            rollout = vlm_generate(
                model, ids.to(self.device), mask.to(self.device), nested_to_device(images, self.device),
                max_new_tokens=sampling.max_new_tokens, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id, banned=self.banned, repeat=repeat,
                temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                greedy=sampling.greedy, generator=torch.Generator(device=self.device).manual_seed(seed),
            )  # fmt: skip
        model.train(was_training)
        return rollout, decode(tok, rollout.response_ids, rollout.response_lengths)

    def rewards(self, rollout: Rollout, rows: list[VLMExample], texts: list[str], step: int, phase: Phase):
        """Checked reward terms, called as TRL calls them; ``step``: the optimizer steps taken
        (TrainerState.global_step), in training and at evaluation alike."""
        state = TrainerState(global_step=step, max_steps=self.cfg.run.steps)
        data = [e.row for e in rows]
        return reward_terms(
            self.fns, [r["prompt"] for r in data], texts, columns_of(data, HIDDEN_COLUMNS),
            completion_ids=completion_ids_of(rollout.response_ids, rollout.response_mask), trainer_state=state,
            phase=phase,
        )  # fmt: skip

    def verifier(self, terms: dict[str, Tensor]) -> Tensor | None:
        names = [f.name for f in self.fns if f.is_verifier]
        return terms[names[0]] if names else None

    # ---- one step ------------------------------------------------------------------------------------------
    def step(self, step: int) -> dict[str, float]:
        g, sampling = self.cfg.grpo, self.cfg.sampling
        start = time.perf_counter()
        # the same global prompts on every rank; each samples its share of whole groups with its own seed
        # (rank 0 with one process's)
        chosen = self.stream.take(g.prompts_per_step, None if g.repeat_prompts else set())
        examples = [self.train[chosen[i]] for i in dist.shard_range(len(chosen))]
        rows = [e for e in examples for _ in range(g.group_size)]
        seed = f"{self.cfg.run.seed}:{step}" + (f":{dist.rank()}" if dist.rank() else "")
        rollout, texts = self.sample(examples, g.group_size, sampling, random.Random(seed).getrandbits(62))
        time_generate = time.perf_counter() - start
        terms = self.rewards(rollout, rows, texts, step, "training")
        rewards = combine(self.fns, terms) + overlong_penalty(
            rollout.response_lengths, sampling.max_new_tokens, g.overlong_buffer, g.overlong_penalty
        )
        advantages = compute_advantages(rewards, g).to(self.device)
        _, _, images = prompt_batch(rows, self.processor.tokenizer.pad_token_id)  # each row's own inputs
        images = nested_to_device(images, self.device)
        n = rollout.input_ids.shape[0]
        with torch.no_grad(), dist.gathered(self.model):
            old = rollout.log_probs
            if g.epochs > 1:
                old = self.score(dist.unwrap(self.model), rollout, images)
            ref = None if self.ref is None else self.score(self.ref, rollout, images)
        batch = RolloutBatch(
            rollout.input_ids, rollout.attention_mask, rollout.prompt_len, rollout.response_mask, old,
            advantages, ref, row_ids=torch.arange(n, device=self.device),
        )  # fmt: skip
        middle = time.perf_counter()
        # the loss's max_len (dr_grpo) is the rollout's response width here, the text trainer's max_new_tokens
        objective = GRPOObjective(
            self.model, self.policy(images, n), g, batch.input_ids.shape[1] - batch.prompt_len,
            self.cfg.optim.max_grad_norm,
        )  # fmt: skip
        stats = update_grpo(objective, self.optimizer, batch, g)
        lengths = rollout.response_lengths.float()
        metrics = {
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            "zero_std_fraction": float((rewards.view(-1, g.group_size).std(-1) == 0).float().mean()),
            "completion_length_mean": float(lengths.mean()),
            "generated_tokens": float(lengths.sum()),
            "time_generate": time_generate,
            "time_train": time.perf_counter() - middle,
            **stats,
        }
        if (accuracy := self.verifier(terms)) is not None:
            metrics["accuracy"] = float(accuracy.mean())
        metrics["time_step"] = time.perf_counter() - start
        metrics["tokens_per_second"] = metrics["generated_tokens"] / metrics["time_step"]
        metrics = dist.reduce_metrics(metrics)  # means over ranks (each holds as many rows)
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        self.generated_tokens += metrics["generated_tokens"] * dist.world_size()
        self.steps_done = step + 1
        return metrics

    def score(self, model: torch.nn.Module, rollout: Rollout, images: dict[str, Tensor]) -> Tensor:
        """log π_τ of every row's response under ``model`` (old log-probs, reference log-probs)."""
        return vlm_score(
            model, rollout.input_ids, rollout.attention_mask, rollout.prompt_len, images,
            temperature=self.cfg.sampling.temperature, banned=self.banned,
        )  # fmt: skip

    def policy(self, images: dict[str, Tensor], n: int) -> PolicyForward:
        """The policy's training forward on rows of the step's batch of ``n`` rows (`postrl.lm.grpo`'s
        `PolicyForward`): each row with its own pictures, found by its ``row_ids``."""

        def forward(batch: RolloutBatch) -> tuple[Tensor, Tensor]:
            assert batch.row_ids is not None
            return vlm_score(
                self.model, batch.input_ids, batch.attention_mask, batch.prompt_len,
                select_rows(images, batch.row_ids, n), temperature=self.cfg.sampling.temperature,
                banned=self.banned, with_entropy=True,
            )  # fmt: skip

        return forward

    # ---- the spine's interface ---------------------------------------------------------------------------
    def bar(self, metrics: dict[str, float]) -> dict[str, float]:
        return {"reward": metrics["reward_mean"]}

    @torch.no_grad()
    def evaluate(self, batch_size: int = 128) -> dict[str, float]:
        """Held-out greedy reward (and accuracy where a verifier exists), per ``kind`` column too; each rank
        answers its share of the prompts, every rank gets the whole result."""
        out: dict[str, float] = {}
        if not self.heldout:
            return out
        greedy = replace(self.cfg.sampling, greedy=True)
        mine = [self.heldout[i] for i in dist.shard_range(len(self.heldout))]
        rewards, accuracy = [], []
        for start in range(0, len(mine), batch_size):
            rows = mine[start : start + batch_size]
            rollout, texts = self.sample(rows, 1, greedy, start)
            terms = self.rewards(rollout, rows, texts, self.steps_done, "evaluation")
            rewards += combine(self.fns, terms).tolist()
            if (acc := self.verifier(terms)) is not None:
                accuracy += acc.tolist()
        rewards, accuracy = gather_shares(rewards), gather_shares(accuracy)
        out["heldout_reward"] = sum(rewards) / len(rewards)
        return out | (accuracy_by_kind(self.heldout, accuracy) if accuracy else {})

    def parts(self) -> Parts:
        def hf_files(folder: Path) -> None:  # the checkpoint is also a folder from_pretrained loads
            dist.unwrap(self.model).config.save_pretrained(str(folder))
            self.processor.save_pretrained(str(folder))

        extra = {"position": self.stream.position, "generated_tokens": self.generated_tokens}
        return Parts(
            {"policy": self.model}, {"policy": self.optimizer}, {"sched": self.scheduler}, extra, hf_files
        )

    def load_extra(self, extra: dict[str, Any]) -> None:
        self.stream = PromptStream(len(self.train), self.cfg.run.seed, int(extra["position"]))
        self.generated_tokens = float(extra["generated_tokens"])


def _load_prompts(cfg: GRPOConfig, processor: Any) -> tuple[list[VLMExample], list[VLMExample], list[dict]]:
    """(train, held-out) prompts with pictures, and the train rows (for the reward functions' columns)."""
    rows = load_vlm_rows(cfg.data, "train", cfg.task)
    if cfg.eval_data is not None or cfg.data.startswith("task:"):
        heldout = load_vlm_rows(cfg.eval_data or cfg.data, "test", cfg.task)
    else:
        cut = max(1, len(rows) // 20)
        rows, heldout = rows[:-cut], rows[-cut:]
    limit = cfg.max_prompt_length
    train = encode_rows(processor, rows, "prompts", limit)
    heldout_examples = encode_rows(processor, heldout[: cfg.eval_size], "prompts", limit)
    counts = {e.pixel_values.shape[0] for e in train + heldout_examples}
    if len(counts) > 1:
        raise UserError(
            f"{cfg.data}: rows hold different numbers of pictures ({sorted(counts)}); GRPO needs one"
        )
    return train, heldout_examples, rows


def freeze_vision_parts(model: torch.nn.Module) -> int:
    """Freeze every parameter outside the language model and its head (the vision tower and the projector);
    returns how many tensors were frozen."""
    inner = getattr(model, "model", model)
    keep = {id(p) for p in getattr(inner, "language_model", inner).parameters()}
    keep |= {id(p) for p in model.get_output_embeddings().parameters()}
    frozen = [p for p in model.parameters() if id(p) not in keep]
    for p in frozen:
        p.requires_grad_(False)
    return len(frozen)


class VLMGRPORecipe:
    """GRPO on a vision-language model (`postrl.lm.recipe.Recipe`): its prompts with pictures, the reward
    functions, the reference, `VLMGRPO`; ``freeze_vision`` keeps the vision tower and projector as SFT left them."""

    def __init__(self, freeze_vision: bool = False) -> None:
        self.freeze_vision = freeze_vision

    def check(self, cfg: GRPOConfig) -> None:
        if cfg.grpo.dynamic_sampling:
            raise UserError("grpo.dynamic_sampling is not supported for vision-language models yet")

    def load(self, setup: Setup) -> None:
        cfg, info = setup.cfg, setup.info
        check_parallel(cfg.run, info.world_size, trains_vision=not self.freeze_vision)
        check_grpo_config(cfg, info.world_size)
        model, processor = load_vlm(cfg.model, cfg.run.dtype, info.device, cfg.trust_remote_code)
        train, heldout, rows = _load_prompts(cfg, processor)
        if len(train) < cfg.grpo.prompts_per_step and not cfg.grpo.repeat_prompts:
            raise UserError(
                f"{cfg.data}: {len(train)} prompts for grpo.prompts_per_step={cfg.grpo.prompts_per_step}; "
                "lower it or set grpo.repeat_prompts=true"
            )
        columns = [{k: v for k, v in r.items() if k not in ("images", "image")} for r in rows]
        fns = reward_fns(cfg, columns, info.device)
        ref = None
        if cfg.grpo.beta != 0:
            what = "ref_model" if cfg.ref_model else "model"
            ref, _ = load_vlm(
                cfg.ref_model or cfg.model, cfg.run.dtype, info.device, cfg.trust_remote_code, what=what
            )
            ref.eval().requires_grad_(False)
        if self.freeze_vision:
            frozen = freeze_vision_parts(model)
            log.info(
                "grpo: %d vision parameters frozen (the vision tower and projector); RL trains the language model",
                frozen,
            )
        setup.policy, setup.tokenizer = model, processor
        setup.extra.update(ref=ref, fns=fns, train=train, heldout=heldout)

    def build(self, setup: Setup, resumed: bool) -> VLMGRPO:
        cfg, x = setup.cfg, setup.extra
        model = wrap_vlm(setup.policy, setup.info, cfg.run.parallel)
        return VLMGRPO(cfg, model, x["ref"], setup.tokenizer, x["fns"], x["train"], x["heldout"])

    def finish(self, setup: Setup, algo: VLMGRPO, state: LoopState) -> dict[str, Any]:
        export_on_main(algo.model, setup.tokenizer, setup.run_dir / "model")
        start = {f"{k}_start": v for k, v in state.start_eval.items()}
        summary = {**state.last_eval, **start, "reward_mean": state.last_metrics.get("reward_mean")}
        summary |= {"steps": state.step, "train_seconds": round(state.train_seconds, 3)}
        summary["tokens_per_second"] = algo.generated_tokens / max(1e-9, state.train_seconds)
        return summary


def run_vlm_grpo(
    cfg: GRPOConfig,
    run_dir: str | Path,
    resume: bool = False,
    overwrite: bool = False,
    *,
    freeze_vision: bool = False,
) -> dict[str, Any]:
    """`postrl grpo` for a vision-language model (the hook in `postrl.lm.grpo.run_grpo`). RL trains the whole
    model, vision tower and projector included, as TRL's GRPOTrainer does by default (on task:shapes it
    scored as well as or better than training the language model alone: benchmarks/vlm.py); the tower's
    backward runs once per distinct picture (`postrl.lm.vlm.rollout.vlm_response_logits`). ``freeze_vision``:
    the vision tower and projector stay as SFT left them (`freeze_vision_parts`; logged at info level)."""
    return run_recipe(VLMGRPORecipe(freeze_vision), cfg, run_dir, resume=resume, overwrite=overwrite)
