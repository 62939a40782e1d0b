"""The rollout engine: batched sampling with a KV cache, in the one layout every LM trainer uses.

Layout (DESIGN.md, "How a batch flows through the LM trainers"): prompts are LEFT-padded to width P,
responses RIGHT-padded to width T, so ``input_ids`` is ``[B, P + T]`` and column ``P + t`` holds every row's
t-th response token. Positions count real tokens only: ``cumsum(mask) − 1`` clamped at 0, continuing
through the response.

Which log-probabilities are recorded. With sampling temperature τ the policy being optimised is the
temperature-scaled distribution π_τ(a|s) = softmax(logits / τ). ``log_probs`` are log π_τ of the sampled
token, taken BEFORE top-k / top-p filtering: the filters only choose which tokens may be drawn, they do not
change the policy whose ratio PPO and GRPO take (TRL and OpenRLHF record the same raw temperature-scaled
log-probs). `postrl.lm.rollout.scoring.score` with the same temperature reproduces them teacher-forced.

The logits come from a fast decoder where one supports the model (`postrl.lm.fast.llama.FastLlama`,
`postrl.lm.fast.gpt2.FastGPT2`), else from its own Hugging Face forward and KV cache; all agree to fp32
rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from postrl.lm.data import encode_prompts
from postrl.lm.models import position_ids_from_mask
from postrl.lm.rollout.decoders import make_decoder
from postrl.lm.rollout.forwards import distinct_prompts
from postrl.lm.rollout.sampling import mask_after_eos, sample_tokens


@dataclass
class Rollout:
    """A batch of prompts and sampled responses, in the one layout every LM trainer uses."""

    input_ids: Tensor
    """[B, P + T] prompt (left-padded) then response (right-padded with pad)"""
    attention_mask: Tensor
    """[B, P + T] long: prompt mask then ``response_mask``"""
    prompt_len: int
    """P, the column where responses start"""
    response_ids: Tensor
    """[B, T]; pad after EOS"""
    response_mask: Tensor
    """[B, T] long: 1 up to and including the EOS token, 0 after"""
    log_probs: Tensor
    """[B, T] float32: log π_τ of each sampled token (temperature applied, before top-k/top-p); 0 where masked"""
    finished: Tensor
    """[B] bool: the response ended with EOS (False: cut at max_new_tokens)"""
    texts: list[str] | None = None
    """decoded responses (without EOS) when a tokenizer was given"""
    prompts: list[str] | None = None
    """the prompt strings when a tokenizer was given"""

    @property
    def response_lengths(self) -> Tensor:
        """[B] number of response tokens, EOS included."""
        return self.response_mask.sum(-1)


# ---- generate -----------------------------------------------------------------------------------------------
def _check_args(prompt_ids: Tensor, prompt_mask: Tensor, max_new_tokens: int, temperature: float) -> None:
    if prompt_ids.shape != prompt_mask.shape or prompt_ids.dim() != 2 or prompt_ids.shape[1] == 0:
        raise ValueError(
            f"need prompt_ids and prompt_mask of one shape [B, P ≥ 1], got {tuple(prompt_ids.shape)} "
            f"and {tuple(prompt_mask.shape)}"
        )
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be ≥ 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be ≥ 0, got {temperature}")
    if bool((prompt_mask[:, -1] == 0).any()):
        raise ValueError("prompts must be LEFT-padded: some row's last prompt column is padding")


@torch.no_grad()  # not inference_mode: rollout tensors feed autograd later (masks, ids)
def generate(
    model: torch.nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_token_id: int | None,
    pad_token_id: int,
    generator: torch.Generator | None = None,
    greedy: bool = False,
    use_fast: bool | None = None,
) -> Rollout:
    """Sample up to ``max_new_tokens`` per left-padded prompt [B, P]; stop rows at EOS, the batch when all
    rows have stopped. ``greedy`` (or temperature 0) takes the argmax; log-probs then use τ = 1 when
    temperature is 0. ``eos_token_id=None`` never stops early. ``use_fast``: None picks the fast path when
    it supports the model, False forces the HF fallback. Sampling draws only from ``generator``. ``model``
    is a causal LM returning logits (for a `postrl.lm.models.PolicyWithValueHead`, pass its ``.lm``).
    """
    _check_args(prompt_ids, prompt_mask, max_new_tokens, temperature)
    B, P = prompt_ids.shape
    decoder = make_decoder(model, use_fast)
    ids, mask, inverse = distinct_prompts(prompt_ids, prompt_mask)
    shared = ids.shape[0] < B  # e.g. a GRPO group: its prompt is prefilled once
    if not shared:
        ids, mask = prompt_ids, prompt_mask
    logits = decoder.prefill(ids, mask, position_ids_from_mask(mask), P + max_new_tokens)
    if shared:
        logits = logits.index_select(0, inverse)
        decoder.select_rows(inverse)
    draw = Draw(temperature, top_k, top_p, greedy, generator)
    response, log_probs = decode(decoder, logits, max_new_tokens, draw, eos_token_id)
    return assemble(prompt_ids, prompt_mask, response, log_probs, eos_token_id, pad_token_id)


@dataclass(frozen=True)
class Draw:
    """How each next token is drawn from the logits (`generate`'s sampling arguments)."""

    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False
    generator: torch.Generator | None = None
    banned: tuple[int, ...] = ()
    """token ids never drawn (a VLM's image placeholder): −∞ before the softmax"""


def decode(
    decoder: Any, logits: Tensor, max_new_tokens: int, draw: Draw, eos_token_id: int | None
) -> tuple[Tensor, Tensor]:
    """Sample up to ``max_new_tokens`` tokens per row from a decoder whose next-token logits [B, V] are
    ``logits`` (after its prefill): (tokens [B, T], log π_τ [B, T]) with T ≤ ``max_new_tokens``, stopping when
    every row has drawn EOS. The last drawn token is never fed back: the decoder's cache holds T − 1 of them.
    ``greedy`` (or temperature 0) takes the argmax; log-probs then use τ = 1 when temperature is 0."""
    greedy = draw.greedy or draw.temperature == 0
    # τ as a tensor: dividing by a Python float costs a scalar-to-tensor conversion at every step
    tau = None if draw.temperature in (0.0, 1.0) else torch.tensor(draw.temperature, device=logits.device)
    tokens, log_probs = [], []  # per step: [B, 1] each, stacked once at the end
    finished = torch.zeros(logits.shape[0], 1, dtype=torch.bool, device=logits.device)
    banned = torch.tensor(draw.banned, dtype=torch.long, device=logits.device) if draw.banned else None
    for t in range(max_new_tokens):
        if banned is not None:
            logits = logits.float().index_fill(-1, banned, float("-inf"))
        scaled = logits if tau is None else logits / tau
        log_pi = torch.log_softmax(scaled, dim=-1)  # (B, V): log π_τ, before any top-k / top-p filter
        if greedy:
            token = log_pi.argmax(-1, keepdim=True)
        else:
            token = sample_tokens(log_pi, draw.top_k, draw.top_p, draw.generator)
        tokens.append(token)
        log_probs.append(log_pi.gather(-1, token))
        if eos_token_id is not None:
            finished |= token == eos_token_id
        if t + 1 == max_new_tokens or (eos_token_id is not None and bool(finished.all())):
            break
        logits = decoder.step(token[:, 0])
    return torch.cat(tokens, dim=1), torch.cat(log_probs, dim=1)  # (B, T)


def assemble(
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    response: Tensor,
    log_probs: Tensor,
    eos_token_id: int | None,
    pad_token_id: int,
) -> Rollout:
    """Mask everything after each row's EOS (pad ids, mask 0, log-prob 0) and concatenate the layout."""
    response_mask = mask_after_eos(response, eos_token_id)  # (B, T)
    response = response.masked_fill(response_mask == 0, pad_token_id)
    log_probs = log_probs * response_mask
    finished = torch.zeros(response.shape[0], dtype=torch.bool, device=response.device)
    if eos_token_id is not None:
        finished = (response == eos_token_id).any(-1)
    return Rollout(
        input_ids=torch.cat((prompt_ids, response), dim=1),
        attention_mask=torch.cat((prompt_mask.long(), response_mask), dim=1),
        prompt_len=prompt_ids.shape[1],
        response_ids=response,
        response_mask=response_mask,
        log_probs=log_probs,
        finished=finished,
    )


# ---- prompts as text ----------------------------------------------------------------------------------------
def left_pad(sequences: Sequence[Sequence[int]], pad_token_id: int) -> tuple[Tensor, Tensor]:
    """Token id lists → (ids [B, P], mask [B, P] long), padded on the LEFT to the longest."""
    width = max(len(s) for s in sequences)
    # built as lists, one tensor each: a slice assignment per row is one op per prompt (benchmarks/grpo.py)
    ids = torch.tensor([[pad_token_id] * (width - len(s)) + list(s) for s in sequences], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in sequences], dtype=torch.long)
    return ids, mask


@dataclass(frozen=True)
class SamplingConfig:
    """How responses are sampled."""

    max_new_tokens: int = 64
    """T: most tokens per response (EOS included)"""
    temperature: float = 1.0
    """τ: sample from softmax(logits / τ); log-probs are of this distribution (0 means greedy)"""
    top_k: int = 0
    """draw only among the k most likely tokens (0: off); does not change the recorded log-probs"""
    top_p: float = 1.0
    """draw only within the nucleus of mass p (1: off); does not change the recorded log-probs"""
    greedy: bool = False
    """take the argmax instead of sampling (evaluation)"""
    backend: Literal["auto", "fast", "hf"] = "auto"
    """how the model runs for sampling and scoring: fast (postrl's fused GPT-2/Llama decoders: an error if
    they cannot run the model), hf (the model's own Hugging Face forward), auto (fast where it can run the
    model, else hf; which one runs, and why, is logged at info level)"""

    CHECKS = {"max_new_tokens": ">= 1", "temperature": "> 0", "top_k": ">= 0", "top_p": "(0, 1]"}

    @property
    def use_fast(self) -> bool | None:
        """``backend`` as the ``use_fast`` argument of `generate` / `score` (None: auto)."""
        return {"auto": None, "fast": True, "hf": False}[self.backend]


class RolloutEngine:
    """Tokenise prompts with left padding, `generate`, and decode the responses.

    ``tokenizer`` is a Hugging Face tokenizer with ``pad_token_id`` and ``eos_token_id`` (pad may equal eos).
    The model is read live at every call, so the engine can be kept across optimiser steps.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        config: SamplingConfig | None = None,
        *,
        use_fast: bool | None = None,
        max_prompt_len: int | None = None,
    ) -> None:
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("RolloutEngine needs a tokenizer with both pad_token_id and eos_token_id")
        self.model, self.tokenizer = model, tokenizer
        self.config = config or SamplingConfig()
        self.use_fast, self.max_prompt_len = use_fast, max_prompt_len

    def encode(self, prompts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """Prompts → left-padded (ids [B, P], mask [B, P]) on the model's device; long prompts keep their end."""
        encoded = encode_prompts(self.tokenizer, list(prompts))  # as SFT and GRPO encode them (one BOS)
        if self.max_prompt_len is not None:
            encoded = [seq[-self.max_prompt_len :] for seq in encoded]
        ids, mask = left_pad(encoded, self.tokenizer.pad_token_id)
        device = next(self.model.parameters()).device
        return ids.to(device), mask.to(device)

    def generate(self, prompts: Sequence[str], generator: torch.Generator | None = None) -> Rollout:
        """Sample one response per prompt (repeat a prompt G times for a GRPO group)."""
        if not prompts:
            raise ValueError("generate needs at least one prompt")
        ids, mask = self.encode(prompts)
        rollout = self.sample(ids, mask, generator)
        rollout.prompts = list(prompts)
        rollout.texts = self.decode(rollout)
        return rollout

    def sample(self, ids: Tensor, mask: Tensor, generator: torch.Generator | None = None) -> Rollout:
        """`generate` with this engine's sampling config on left-padded prompt ``ids``/``mask`` (no decoding)."""
        c = self.config
        return generate(
            self.model,
            ids,
            mask,
            max_new_tokens=c.max_new_tokens,
            temperature=c.temperature,
            top_k=c.top_k,
            top_p=c.top_p,
            eos_token_id=self.tokenizer.eos_token_id,
            pad_token_id=self.tokenizer.pad_token_id,
            generator=generator,
            greedy=c.greedy,
            use_fast=c.use_fast if self.use_fast is None else self.use_fast,
        )

    def decode(self, rollout: Rollout) -> list[str]:
        """Response texts: each row's tokens before EOS."""
        eos = self.tokenizer.eos_token_id
        rows = []
        for ids, n in zip(rollout.response_ids.tolist(), rollout.response_lengths.tolist(), strict=True):
            ids = ids[:n]
            rows.append(ids[:-1] if ids and ids[-1] == eos else ids)
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)
