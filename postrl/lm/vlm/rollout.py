"""Sampling and teacher-forced scoring for vision-language models, in the text engine's `Rollout` layout.

`vlm_generate` prefills each distinct prompt once with its pictures (the vision encoder runs once per prompt,
never per generated token: a GRPO group's G rows share the prefilled KV cache), then decodes token ids only
through the language model's cache. `vlm_score` runs the forward teacher-forced, with or without gradients, the
same way: each distinct prompt with its pictures once, a group's rows on its cache (`vlm_response_logits`; in
a GRPO step the vision tower's forward and backward run once per picture, not once per answer). Both take
log π_τ from the same masked logits: the image placeholder token (and any other ``banned`` id) gets −∞
before the softmax, so it is never drawn and the sampled log-probs equal the teacher-forced ones
(tests/lm/test_vlm.py). Image placeholders are therefore only ever prompt tokens, outside every response
mask and loss.

Layout and log-probs as `postrl.lm.rollout.engine`: prompts left-padded to P, responses right-padded to T,
positions ``cumsum(mask) − 1`` from the mask; log-probs of the temperature-scaled policy before top-k/top-p.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from postrl.lm.memory import checkpointing_on
from postrl.lm.models import position_ids_from_mask
from postrl.lm.rollout import Rollout, mask_after_eos, sample_tokens
from postrl.lm.rollout.decoders import cache_argument, forget_mask, grown_mask
from postrl.lm.vlm.inputs import model_type, response_columns, select_rows, split_inputs, with_response
from postrl.runtime import distributed as dist


def masked_logits(logits: Tensor, banned: Sequence[int]) -> Tensor:
    """``logits`` [..., V] in float32 with the ``banned`` ids at −∞ (the image placeholder)."""
    logits = logits.float()
    if banned:
        logits = logits.index_fill(-1, torch.tensor(list(banned), device=logits.device), float("-inf"))
    return logits


class VLMDecoder:
    """Prefill with pictures, then one token at a time through the model's own KV cache."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.cache_kw = cache_argument(model) or "past_key_values"
        self.cache: Any = None

    def _forward(self, positions: Tensor, **inputs: Any) -> Tensor:
        out = self.model(
            attention_mask=self.mask[:, : self.length],
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_kw: self.cache},
            **inputs,
        )
        self.cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        return out.logits[:, -1]

    def prefill(self, ids: Tensor, mask: Tensor, max_len: int, images: dict[str, Tensor]) -> Tensor:
        """Prompts [U, P] with their pictures (every processor output: `postrl.lm.vlm.inputs`) → next-token
        logits [U, V]; the vision encoder runs here, once."""
        self.mask = mask.new_ones(ids.shape[0], max_len)  # (U, P + T), sliced per step
        self.mask[:, : ids.shape[1]] = mask
        self.length, self.cache = ids.shape[1], None
        positions = position_ids_from_mask(mask)
        self.next_pos = positions[:, -1:] + 1  # (U, 1)
        token, _ = split_inputs(images, ids.shape[1], ids.shape[0])
        kind = model_type(self.model)
        self.token_inputs = {k: response_columns(kind, k, v, 1) for k, v in token.items()}  # (U, 1, ...)
        return self._forward(positions, input_ids=ids, **images)

    def append(
        self, ids: Tensor, mask: Tensor, positions: Tensor, max_len: int, images: dict[str, Tensor]
    ) -> Tensor:
        """A conversation's next turn (`postrl.lm.rollout.turns`): a left-padded chunk [B, S] (mask,
        positions [B, S]) after the cached columns, with the pictures its placeholders stand for (row by row);
        the mask grows to ``max_len``; next-token logits [B, V]. For models without per-token inputs."""
        if self.token_inputs:
            raise ValueError(
                f"appending turns needs a model without per-token inputs: {sorted(self.token_inputs)}"
            )
        self.mask = grown_mask(self.mask, self.length, mask, max_len)
        self.length += ids.shape[1]
        self.next_pos = positions[:, -1:] + 1
        return self._forward(positions, input_ids=ids, **images)

    def forget(self, start: int, keep: Tensor) -> None:
        """Row b keeps only its first ``keep[b]`` columns from ``start`` on: the later ones are masked."""
        forget_mask(self.mask, start, keep, self.length)

    def select_rows(self, index: Tensor) -> None:
        """Row b continues prefilled row ``index[b]`` (a group's rows share their prompt's cache)."""
        self.cache.batch_select_indices(index)
        self.mask, self.next_pos = self.mask[index], self.next_pos[index]
        self.token_inputs = {k: v[index] for k, v in self.token_inputs.items()}

    def step(self, tokens: Tensor) -> Tensor:
        """One token per row [B] → logits [B, V]; no pictures (their features are in the cache), but the
        per-token inputs' response column (Mllama's ``cross_attention_mask``: which pictures it sees)."""
        self.length += 1
        positions, self.next_pos = self.next_pos, self.next_pos + 1
        return self._forward(positions, input_ids=tokens[:, None], **self.token_inputs)


@torch.no_grad()
def vlm_generate(
    model: torch.nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    images: dict[str, Tensor],
    *,
    max_new_tokens: int,
    eos_token_id: int,
    pad_token_id: int,
    banned: Sequence[int] = (),
    repeat: int = 1,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> Rollout:
    """Sample ``repeat`` responses to each of U left-padded prompts [U, P] (rows ``u·repeat … u·repeat +
    repeat − 1`` answer prompt u) → a `Rollout` of U·repeat rows. ``images``: the processor's picture tensors
    for the U prompts (``pixel_values`` [n_images, C, H, W], ...). ``greedy`` or τ = 0 takes the argmax (its
    log-probs at τ = 1). ``banned`` ids are never drawn."""
    if max_new_tokens < 1 or prompt_ids.dim() != 2 or bool((prompt_mask[:, -1] == 0).any()):
        raise ValueError("need left-padded prompts [U, P] and max_new_tokens ≥ 1")
    greedy = greedy or temperature == 0
    tau = 1.0 if temperature == 0 else temperature
    U, P = prompt_ids.shape
    decoder = VLMDecoder(model)
    logits = decoder.prefill(prompt_ids, prompt_mask, P + max_new_tokens, images)
    if repeat > 1:
        index = torch.arange(U, device=prompt_ids.device).repeat_interleave(repeat)  # (U·G,)
        logits = logits[index]
        decoder.select_rows(index)
    finished = torch.zeros(U * repeat, 1, dtype=torch.bool, device=prompt_ids.device)
    tokens, log_probs = [], []
    for t in range(max_new_tokens):
        log_pi = torch.log_softmax(masked_logits(logits, banned) / tau, dim=-1)  # (B, V): log π_τ
        token = log_pi.argmax(-1, keepdim=True) if greedy else sample_tokens(log_pi, top_k, top_p, generator)
        tokens.append(token)
        log_probs.append(log_pi.gather(-1, token))
        finished |= token == eos_token_id
        if t + 1 == max_new_tokens or bool(finished.all()):
            break
        logits = decoder.step(token[:, 0])
    response, log_probs_t = torch.cat(tokens, 1), torch.cat(log_probs, 1)  # (B, T)
    response_mask = mask_after_eos(response, eos_token_id)
    response = response.masked_fill(response_mask == 0, pad_token_id)
    ids = prompt_ids.repeat_interleave(repeat, 0)
    mask = prompt_mask.long().repeat_interleave(repeat, 0)
    return Rollout(
        input_ids=torch.cat((ids, response), 1),
        attention_mask=torch.cat((mask, response_mask), 1),
        prompt_len=P,
        response_ids=response,
        response_mask=response_mask,
        log_probs=log_probs_t * response_mask,
        finished=(response == eos_token_id).any(-1),
    )


def shared_rows(input_ids: Tensor, attention_mask: Tensor, prompt_len: int, images: dict[str, Tensor]):
    """(first row of each distinct prompt [U], row → distinct [B]) when the B rows hold U < B distinct prompts
    (a GRPO group's G rows), else None. A prompt is its ids, mask and pictures: every tensor of ``images``
    (leading dim B · n_images, row order), so the same question about another picture is another prompt."""
    B, P = input_ids.shape[0], prompt_len
    keys = [input_ids[:, :P], attention_mask[:, :P].to(input_ids.dtype)]
    for value in images.values():
        if not isinstance(value, Tensor) or value.shape[0] % max(B, 1):
            return None
        keys.append(torch.unique(value.reshape(B, -1), dim=0, return_inverse=True)[1][:, None])
    inverse = torch.unique(torch.cat(keys, 1), dim=0, return_inverse=True)[1]
    U = int(inverse.max()) + 1 if B else 0
    if U == B:
        return None
    first = torch.full((U,), B, dtype=torch.long, device=inverse.device)
    return first.scatter_reduce(0, inverse, torch.arange(B, device=inverse.device), "amin"), inverse


def _can_share(model: torch.nn.Module) -> bool:
    """Two forwards per backward (prompt, then responses on its cache): not under DDP or FSDP, nor with
    gradient checkpointing (the blocks drop the cache)."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) or dist.is_sharded(model):
        return False
    if not model.training:
        return True
    return not checkpointing_on(model)


def vlm_response_logits(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    prompt_len: int,
    images: dict[str, Tensor],
    share: bool = True,
) -> Tensor:
    """Teacher-forced logits predicting each response token: [B, P + T] with the rows' pictures → [B, T, V].

    Where rows share a prompt and its pictures (`shared_rows`: a GRPO group) and ``share``, each distinct
    prompt runs once with its pictures (the vision encoder once per distinct prompt), every row gets its
    prompt's KV cache (a gather: the backward sums a group's gradients into the shared prompt and the
    vision parts), and only the T − 1 response tokens that are inputs run on top: the logits of the plain
    forward to float32 rounding (tests/lm/test_vlm.py), for about U·P + B·T tokens instead of B·(P + T)."""
    P, T = prompt_len, input_ids.shape[1] - prompt_len
    positions = position_ids_from_mask(attention_mask)
    groups = shared_rows(input_ids, attention_mask, P, images) if share and _can_share(model) else None
    B = input_ids.shape[0]
    if groups is None:
        out = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False,
            logits_to_keep=T + 1, **with_response(model, images, P, P + T, B),
        )  # fmt: skip
        return out.logits[:, :-1]  # (B, T, V): position P − 1 + t predicts response token t
    first, inverse = groups
    head = model(
        input_ids=input_ids[first, :P], attention_mask=attention_mask[first, :P],
        position_ids=positions[first, :P], use_cache=True, logits_to_keep=1, **select_rows(images, first, B),
    )  # fmt: skip
    logits = head.logits[inverse, -1:]  # (B, 1, V): position P − 1 predicts response token 0
    if T == 1:
        return logits
    cache = getattr(head, "cache", None) or head.past_key_values
    cache.batch_select_indices(inverse)  # every row gets its prompt's keys and values (differentiable)
    # no pictures: a response never holds an image placeholder (banned from sampling); per-token inputs
    # continue over the response as in `vlm_generate`
    token, _ = split_inputs(images, P, B)
    kind = model_type(model)
    tail = model(
        input_ids=input_ids[:, P:-1], attention_mask=attention_mask[:, :-1], position_ids=positions[:, P:-1],
        use_cache=True, **{cache_argument(model) or "past_key_values": cache},
        **{k: response_columns(kind, k, v, T - 1) for k, v in token.items()},
    )  # fmt: skip
    return torch.cat((logits, tail.logits), dim=1)  # (B, T, V)


def vlm_score(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    prompt_len: int,
    images: dict[str, Tensor],
    *,
    temperature: float = 1.0,
    banned: Sequence[int] = (),
    with_entropy: bool = False,
    share: bool = True,
) -> Tensor | tuple[Tensor, Tensor]:
    """Teacher-forced log π_τ of the response tokens → [B, T] float32, 0 where masked (and, ``with_entropy``,
    the per-token entropy, detached). Runs under the caller's grad mode; ``images`` hold the pictures of the B
    rows in row order; rows that share a prompt and its pictures share its forward (`vlm_response_logits`)."""
    logits = vlm_response_logits(model, input_ids, attention_mask, prompt_len, images, share)
    logits = masked_logits(logits, banned)
    log_pi = torch.log_softmax(logits / temperature, dim=-1)  # (B, T, V)
    mask = attention_mask[:, prompt_len:].float()
    log_probs = log_pi.gather(-1, input_ids[:, prompt_len:, None]).squeeze(-1) * mask
    if not with_entropy:
        return log_probs
    with torch.no_grad():
        p = log_pi.exp()
        entropy = -(p * log_pi.masked_fill(p == 0, 0.0)).sum(-1) * mask
    return log_probs, entropy
