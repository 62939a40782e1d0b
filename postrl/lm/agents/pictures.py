"""Environments whose observations are pictures, and vision-language policies acting in them (issue #35).

`PictureGymEnv` plays a Gymnasium environment with discrete actions (the tabular worlds: FrozenLake,
CliffWalking, Taxi) through its ``rgb_array`` render: every observation is a user message whose content, in
TRL's format, is the picture (``{"type": "image", "image": <PIL image>}``) and a line of text; the action is
read from the reply as `postrl.lm.agents.gym_text.GymTextEnv` reads it.

`sample_picture_episodes` plays a batch of episodes with a vision-language model (`postrl.lm.vlm`, a LLaVA-style
model: the processor's picture tensor is ``pixel_values``). The tokens are laid out as for a text policy
(`postrl.lm.agents.rollout.TurnRollout`): the first prompt, then each reply and the observation after it,
concatenated; an observation's pictures become the processor's image placeholders where the chat template
puts them, and their pixel values are kept in order (``pixel_values``: every episode's pictures, row by row,
as the model's forward takes them for the whole batch). Each episode's KV cache is kept across turns as for
a text policy (`postrl.lm.rollout.turns.TurnSampler`): a turn runs only its new tokens with its new pictures
(the vision tower encodes each picture once); ``kv_cache="prefill"`` prefills every conversation with all its
pictures at every turn instead (`postrl.lm.vlm.vlm_generate`), the same episodes. The image
placeholder is never sampled, so placeholders are context only (no loss), and the sampled log-probs equal the
teacher-forced ones of `postrl.lm.vlm.vlm_score` over the whole trajectory (with ``share=False``: the
pictures are not all in the first prompt).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from PIL import Image
from torch import Tensor

from postrl.lm.agents.env import AgentError, Episode, EpisodeBudget, Message, TextEnv, reset_env
from postrl.lm.agents.gym_text import GymTextEnv
from postrl.lm.agents.rollout import (
    KV_CACHES,
    EpisodeTokens,
    TurnRollout,
    assemble_episodes,
    cut_at_context,
    room,
    take_turn,
)
from postrl.lm.models import context_length
from postrl.lm.rollout import SamplingConfig, left_pad
from postrl.lm.rollout.engine import Draw
from postrl.lm.rollout.turns import TurnSampler
from postrl.lm.vlm.model import image_token_id
from postrl.lm.vlm.rollout import VLMDecoder, vlm_generate

_DUMMY = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]


class PictureGymEnv(GymTextEnv):
    """A Gymnasium environment with ``Discrete`` actions whose observations are its ``rgb_array`` pictures.

    Args:
        env_id: a registered Gymnasium id with an ``rgb_array`` render, e.g. ``FrozenLake-v1``.
        invalid_penalty: reward of a reply in which no action can be read.
        make_kwargs: passed to ``gymnasium.make`` (e.g. ``is_slippery=False``).
    """

    def __init__(self, env_id: str, invalid_penalty: float = 0.0, **make_kwargs: Any) -> None:
        super().__init__(env_id, invalid_penalty, **make_kwargs)
        modes = self.env.metadata.get("render_modes", [])
        self.env.close()
        if "rgb_array" not in modes:
            raise AgentError(f"{env_id} has no rgb_array render (its render modes: {modes}): no pictures")
        try:
            self.env = gym.make(env_id, render_mode="rgb_array", **make_kwargs)
        except Exception as err:
            raise AgentError(
                f"{env_id} cannot be rendered as pictures (render_mode='rgb_array'): {err}"
            ) from err

    def picture(self) -> Image.Image:
        """The environment's current frame."""
        return Image.fromarray(np.asarray(self.env.render(), dtype=np.uint8))

    def _observation(self, text: str) -> list[Message]:
        content = [{"type": "image", "image": self.picture()}, {"type": "text", "text": text}]
        return [{"role": "user", "content": content}]

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        _, info = self.env.reset(seed=seed)
        return self._observation(f"Actions: {self.action_list()}. Reply with one action."), dict(info)

    def step(self, action: str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        chosen = self.parse_action(action)
        if chosen is None:
            text = f"No action read. Reply with one of: {self.action_list()}."
            return self._observation(text), self.invalid_penalty, False, False, {"invalid": True}
        _, reward, terminated, truncated, info = self.env.step(chosen)
        observation = self._observation("Your move?")
        return observation, float(reward), bool(terminated), bool(truncated), {**info, "action": chosen}


@dataclass
class PictureTurnRollout(TurnRollout):
    """`TurnRollout` with the pictures of every episode."""

    pixel_values: Tensor | None = None
    """[n_pictures, C, H, W] every episode's pictures, row by row, each episode's in order; None: none"""
    pictures_per_row: list[int] | None = None
    """how many pictures each row holds"""


def _pictures(messages: list[Message]) -> list[Any]:
    return [
        item["image"]
        for m in messages
        if isinstance(m.get("content"), list)
        for item in m["content"]
        if item.get("type") == "image"
    ]


class _Encoder:
    """Messages → tokens with the processor's image placeholders, and the pictures' pixel values."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor

    def encode(self, text: str, messages: list[Message], **kwargs: Any) -> tuple[list[int], list[Tensor]]:
        pictures = _pictures(messages)
        out = self.processor(text=[text], images=pictures or None, return_tensors="pt", **kwargs)
        extra = set(out) - {"input_ids", "attention_mask", "pixel_values"}
        if extra:
            raise AgentError(
                f"episodes with pictures take LLaVA-style processors (pixel_values only); this one also gives"
                f" {sorted(extra)}"
            )
        pixels = list(out["pixel_values"]) if pictures else []  # one [C, H, W] per picture
        return out["input_ids"][0].tolist(), pixels

    def prompt(self, messages: list[Message]) -> tuple[list[int], list[Tensor]]:
        text = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.encode(text, messages)

    def observation(self, observation: list[Message]) -> tuple[list[int], list[Tensor]]:
        """What follows a reply when ``observation`` comes next (`postrl.lm.agents.rollout.observation_text`
        with the processor's template), placeholders expanded."""
        render = self.processor.apply_chat_template
        base = render(_DUMMY, tokenize=False)
        full = render(_DUMMY + observation, tokenize=False, add_generation_prompt=True)
        if not full.startswith(base):
            raise AgentError(
                "the chat template does not render a conversation as a prefix of its continuation"
            )
        return self.encode(full[len(base) :], observation, add_special_tokens=False)


class _PictureDecoder:
    """`postrl.lm.vlm.rollout.VLMDecoder` in the shape `postrl.lm.rollout.turns.TurnSampler` drives: the
    pictures of the next prefill or append (row by row) are set in ``images`` before the turn."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.inner = VLMDecoder(model)
        self.images: dict[str, Tensor] = {}

    @property
    def length(self) -> int:
        return self.inner.length

    def prefill(self, ids: Tensor, mask: Tensor, positions: Tensor, max_len: int) -> Tensor:
        return self.inner.prefill(ids, mask, max_len, self.images)

    def append(self, ids: Tensor, mask: Tensor, positions: Tensor, max_len: int) -> Tensor:
        return self.inner.append(ids, mask, positions, max_len, self.images)

    def step(self, tokens: Tensor) -> Tensor:
        return self.inner.step(tokens)

    def select_rows(self, index: Tensor) -> None:
        self.inner.select_rows(index)

    def forget(self, start: int, keep: Tensor) -> None:
        self.inner.forget(start, keep)


def _stacked(pictures: list[Tensor], device: torch.device) -> dict[str, Tensor]:
    return {"pixel_values": torch.stack(pictures).to(device)} if pictures else {}


@torch.no_grad()
def sample_picture_episodes(
    model: torch.nn.Module,
    processor: Any,
    envs: Sequence[TextEnv],
    sampling: SamplingConfig,
    budget: EpisodeBudget,
    generator: torch.Generator | None = None,
    seeds: Sequence[int | None] | None = None,
    kv_cache: str = "auto",
) -> PictureTurnRollout:
    """Play one episode in each of ``envs`` with the vision-language ``model`` (`sample_episodes`' contract,
    the image placeholder never drawn). ``kv_cache``: ``reuse`` (``auto``) keeps each episode's KV cache
    across turns, a turn's new pictures encoded with its new tokens; ``prefill`` prefills every conversation
    with all its pictures at every turn (`postrl.lm.vlm.vlm_generate`); both give the same episodes. An
    episode is cut where it fills the model's positions, as `sample_episodes` cuts it (the dropped
    observation's pictures with it)."""
    if kv_cache not in KV_CACHES:
        raise ValueError(f"kv_cache must be one of {KV_CACHES}, got {kv_cache!r}")
    tokenizer, encoder = processor.tokenizer, _Encoder(processor)
    banned = [image_token_id(model, processor)]
    device = next(model.parameters()).device
    runs, pixels, fresh = [], [], []  # per episode: all its pictures, those not yet in the cache
    for i, env in enumerate(envs):
        messages, _ = reset_env(env, seeds[i] if seeds else None, None)
        ids, first = encoder.prompt(messages)
        episode = Episode(messages=list(messages), prompt_len=len(messages))
        runs.append(EpisodeTokens(env, ids, [], [], [], episode, ids))
        pixels.append(list(first))
        fresh.append(list(first))
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    turns, decoder = None, None
    if kv_cache != "prefill":
        decoder = _PictureDecoder(model)
        draw = Draw(
            sampling.temperature, sampling.top_k, sampling.top_p, sampling.greedy, generator, tuple(banned)
        )
        turns = TurnSampler(decoder, draw, eos, pad, device, share_prompts=False)
    context = context_length(model)

    def cut(i: int) -> bool:  # the observation dropped at the context's end takes its pictures with it
        if not cut_at_context(runs[i], context):
            return False
        pixels[i] = pixels[i][: len(pixels[i]) - len(fresh[i])]
        return True

    while active := [i for i, r in enumerate(runs) if not (r.done or cut(i))]:
        limits = room(runs, active, budget, context)
        max_new = min(sampling.max_new_tokens, max(limits))
        if turns is None:
            ids, mask = left_pad([runs[i].prompt + runs[i].after for i in active], pad)
            out = vlm_generate(
                model, ids.to(device), mask.to(device), _stacked([p for i in active for p in pixels[i]], device),
                max_new_tokens=max_new, eos_token_id=eos, pad_token_id=pad, banned=banned,
                temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                greedy=sampling.greedy, generator=generator,
            )  # fmt: skip
            tokens, log_probs = out.response_ids, out.log_probs
            lengths = torch.minimum(out.response_lengths.cpu(), torch.tensor(limits))
        else:
            decoder.images = _stacked([p for i in active for p in fresh[i]], device)
            tokens, log_probs, lengths = turns.turn(active, [runs[i].fresh for i in active], max_new, limits)
        for j, i in enumerate(active):
            fresh[i] = []
            length = int(lengths[j])
            action = tokens[j, :length].tolist()
            text = tokenizer.decode([t for t in action if t != eos], skip_special_tokens=True)

            def encode(observation: list[Message], i: int = i) -> list[int]:
                suffix, more = encoder.observation(observation)
                pixels[i].extend(more)
                fresh[i].extend(more)
                return suffix

            take_turn(runs[i], action, log_probs[j, :length].tolist(), text, budget, encode)
    layout = assemble_episodes(runs, pad)
    everything = [p for row in pixels for p in row]
    return PictureTurnRollout(
        **vars(layout),
        pixel_values=torch.stack(everything) if everything else None,
        pictures_per_row=[len(row) for row in pixels],
    )
