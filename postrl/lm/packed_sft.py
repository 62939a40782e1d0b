"""SFT's loss forward without padding (``padding_free: auto``), the fast path of `postrl.lm.trainer.token_losses`.

An SFT batch is right-padded to its longest example ([B, L]); on the built-in ``arithmetic`` rows most of a
batch's positions are padding or prompt. This path cuts each row before its first target token, lays the rows
out as a rollout (prompts left-padded to P, the rest right-padded to T) and runs them through
`postrl.lm.rollout.packed_forward.PackedForward`'s decoder (`postrl.lm.fast.packed.PackedLlama` or
`PackedGPT2`): every matrix product on the real tokens only, each distinct prompt once, and the output layer and
its log-softmax only where a token is predicted after the cut. The log-probs it returns are those of the padded forward at every target
position (tests/lm/test_packed_sft.py: the loss and every gradient equal to 1e-12 in float64), so the loss
(Σ NLL over the step's target tokens / their count) and its normalisation over micro-batches are unchanged.
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
from torch import Tensor

from postrl.lm.fast.packed import distinct_prompts
from postrl.lm.rollout.forwards import chunks_output_layer
from postrl.lm.rollout.packed_forward import packed_decoder, packed_refusal

log = logging.getLogger(__name__)

IGNORE_INDEX = -100
"""The label of a token outside the loss (prompt tokens, padding)."""


def sft_padding_free(model: torch.nn.Module, mode: Literal["auto", "off"], *, gradients: bool = True) -> bool:
    """Whether SFT's loss forward runs padding-free for ``model``: ``mode`` is auto and `packed_refusal` allows
    it (a whole Llama-family or GPT-2 model in float32, no activation checkpointing when it trains) and
    ``run.memory.log_probs`` did not choose the chunked output layer. The choice, or why it was refused, is
    logged when ``gradients`` (the training forward)."""
    if mode == "off":
        return False
    why = packed_refusal(model, gradients)
    if why is None and chunks_output_layer(model):
        why = "run.memory.log_probs chose the chunked output layer (the whole logits of a batch do not fit)"
    if gradients and why is None:
        log.info("sft: padding-free forward (padding_free=auto): real tokens only, each distinct prompt once")
    elif gradients:
        log.info("sft: padded forward, the padding-free one refused: %s", why)
    return why is None


def sft_rollout_layout(
    input_ids: Tensor, attention_mask: Tensor, labels: Tensor
) -> tuple[Tensor, Tensor, int, Tensor]:
    """A right-padded SFT batch [B, L] in the rollout layout: row b cut at ``cut_b``, its first target token
    (at least 1; a row without targets keeps every token in its prompt), tokens before the cut left-padded to
    P = max cut, the rest right-padded to T. Returns (ids [B, P + T], attention mask [B, P + T], P, position
    [B, T]: the column of [B, L − 1] — position t predicts token t + 1 — that response column t predicts,
    −1 on padding)."""
    B, L = input_ids.shape
    n = attention_mask.sum(1)  # (B,) real tokens, all at the front
    target = labels != IGNORE_INDEX
    target[:, 0] = False  # token 0 is never predicted
    first = target.long().argmax(1)  # (B,) the first target token (0 when there is none)
    cut = torch.where(target.any(1), first, n).clamp(min=1)  # (B,)
    P, T = int(cut.max()), int((n - cut).max())
    source = torch.arange(P, device=cut.device) - (P - cut)[:, None]  # (B, P) token index of prompt column c
    prompt_valid = source >= 0
    prompt_ids = input_ids.gather(1, source.clamp(min=0)).masked_fill(~prompt_valid, 0)
    source = cut[:, None] + torch.arange(T, device=cut.device)  # (B, T) token index of response column t
    response_valid = source < n[:, None]
    response_ids = input_ids.gather(1, source.clamp(max=L - 1)).masked_fill(~response_valid, 0)
    ids = torch.cat((prompt_ids, response_ids), dim=1)  # (B, P + T)
    mask = torch.cat((prompt_valid, response_valid), dim=1).long()
    return ids, mask, P, (source - 1).masked_fill(~response_valid, -1)


def packed_next_token_log_probs(
    model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, labels: Tensor
) -> Tensor:
    """log π(token t + 1) at every position t of a right-padded SFT batch [B, L] → [B, L − 1], the padded
    forward's log-probs wherever ``labels[:, t + 1]`` is a target (elsewhere 0 or a log-prob the loss masks),
    through `packed_decoder` (the model must pass `packed_refusal`). The log-softmax runs in float32, or in the
    model's dtype when wider (float64 in the tests). Runs under the caller's grad mode."""
    B, L = input_ids.shape
    ids, mask, P, position = sft_rollout_layout(input_ids, attention_mask, labels)
    out_dtype = torch.promote_types(model.dtype, torch.float32)
    if ids.shape[1] == P:  # no row has a token to predict
        return torch.zeros(B, L - 1, dtype=out_dtype, device=input_ids.device)
    prompt_ids, prompt_mask, inverse = distinct_prompts(ids[:, :P], mask[:, :P])
    decoder = packed_decoder(model)
    logits, layout = decoder.response_logits(prompt_ids, prompt_mask, inverse, ids[:, P:], mask[:, P:])
    tokens = ids[:, P:].flatten()[layout.targets]  # (Nt,) the predicted tokens
    log_pi = torch.log_softmax(logits.to(out_dtype), dim=-1).gather(1, tokens[:, None]).squeeze(1)  # (Nt,)
    columns = position.flatten()[layout.targets]  # (Nt,) each one's column of [B, L − 1]
    rows = layout.targets // position.shape[1]
    return log_pi.new_zeros(B, L - 1).index_put((rows, columns), log_pi)
