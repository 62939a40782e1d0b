"""GRPO of a vision-language model over episodes of an environment that returns pictures (`postrl grpo --env
pictures:<id> --model <VLM folder>`, issue #35 item 2): `PictureEpisodeEngine`, the text episodes' engine
(`postrl.lm.grpo.episodes.EpisodeEngine`: seeds for prompts, the environment's return for the reward,
trajectory or per-turn credit) with a VLM's sampling, scoring and forward.

Episodes are played by `postrl.lm.agents.pictures.sample_picture_episodes` (each observation's picture as the
processor's placeholders, the KV cache kept across turns). Every row's pictures travel with it
(`PictureInputs`), and the policy's and the reference's log-probs are `vlm_score`'s, teacher-forced over the
whole trajectory with those pictures. Observation tokens and picture placeholders are context: their
log-probs are set to 0 (a placeholder's is −∞ under the banned-token mask) and they get no gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from postrl.lm.agents.pictures import PictureTurnRollout, sample_picture_episodes
from postrl.lm.grpo.config import GRPOConfig
from postrl.lm.grpo.engine import Prompts
from postrl.lm.grpo.episodes import EpisodeEngine, EpisodeInputs
from postrl.lm.grpo.objective import PolicyForward
from postrl.lm.rollout import Rollout, SamplingConfig
from postrl.lm.rollout.batch import RolloutBatch
from postrl.lm.vlm.model import checkpoint_files, image_token_id
from postrl.lm.vlm.rollout import vlm_score
from postrl.runtime import distributed as dist


@dataclass
class PictureInputs(EpisodeInputs):
    """`EpisodeInputs` with every row's pictures."""

    pixel_values: Tensor | None = None
    """[n_pictures, C, H, W] every row's pictures, row by row, each row's in order; None: none"""
    offsets: list[int] | None = None
    """row i's pictures are ``pixel_values[offsets[i]:offsets[i + 1]]`` (B + 1 entries)"""

    def pictures(self, rows: Tensor | None = None) -> dict[str, Tensor]:
        """The model inputs of the pictures of ``rows`` (None: all), in row order."""
        if self.pixel_values is None or self.offsets is None:
            return {}
        if rows is None:
            return {"pixel_values": self.pixel_values}
        picks = [j for r in rows.tolist() for j in range(self.offsets[r], self.offsets[r + 1])]
        index = torch.tensor(picks, dtype=torch.long, device=self.pixel_values.device)
        return {"pixel_values": self.pixel_values.index_select(0, index)}


def _actions_only(values: Tensor, response_mask: Tensor) -> Tensor:
    """``values`` [B, T] with 0 where the policy did not write the token (observations, placeholders)."""
    return values.masked_fill(response_mask == 0, 0.0)


class PictureEpisodeEngine(EpisodeEngine):
    """A vision-language model acting in ``cfg.env`` (pictures): `EpisodeEngine`'s episodes and credit with
    `sample_picture_episodes` and `vlm_score` (``share=False``: a row's pictures are not all in its first
    prompt)."""

    def __init__(
        self,
        cfg: GRPOConfig,
        model: torch.nn.Module,
        ref: torch.nn.Module | None,
        processor: Any,
        train: Prompts,
        heldout: Prompts,
        device: torch.device,
    ) -> None:
        self.cfg, self.policy_module, self.ref, self.processor = cfg, model, ref, processor
        self.tokenizer = processor.tokenizer
        self.prompts = {"train": train, "heldout": heldout}
        self.device = device
        self.banned = [image_token_id(dist.unwrap(model), processor)]

    def play(
        self,
        model: torch.nn.Module,
        envs: list[Any],
        sampling: SamplingConfig,
        generator: torch.Generator,
        seeds: list[int],
    ) -> PictureTurnRollout:
        env = self.cfg.env
        return sample_picture_episodes(
            model, self.processor, envs, sampling, env.budget, generator, seeds, kv_cache=env.kv_cache
        )

    def inputs(self, out: PictureTurnRollout) -> PictureInputs:  # type: ignore[override]
        offsets = [0]
        for n in out.pictures_per_row or []:
            offsets.append(offsets[-1] + n)
        pixels = None if out.pixel_values is None else out.pixel_values.to(self.device)
        return PictureInputs(out.turn_rewards.to(self.device), out.turn_mask.to(self.device), pixels, offsets)

    def _score(self, model: torch.nn.Module, batch: Any, images: dict[str, Tensor], **kw: Any) -> Any:
        return vlm_score(
            model, batch.input_ids, batch.attention_mask, batch.prompt_len, images,
            temperature=self.cfg.sampling.temperature, banned=self.banned, share=False, **kw,
        )  # fmt: skip

    def log_probs(self, which: str, rollout: Rollout, inputs: PictureInputs) -> Tensor:
        model = dist.unwrap(self.policy_module) if which == "old" else self.ref
        with dist.gathered(self.policy_module):
            scored = self._score(model, rollout, inputs.pictures())
        return _actions_only(scored, rollout.response_mask)

    def policy(self, inputs: PictureInputs, n: int) -> PolicyForward:
        def forward(batch: RolloutBatch) -> tuple[Tensor, Tensor]:
            assert batch.row_ids is not None
            log_probs, entropy = self._score(
                self.policy_module, batch, inputs.pictures(batch.row_ids), with_entropy=True
            )
            return _actions_only(log_probs, batch.response_mask), _actions_only(entropy, batch.response_mask)

        return forward

    def write_files(self) -> Callable[[Path], None]:
        return checkpoint_files(dist.unwrap(self.policy_module), self.processor)
