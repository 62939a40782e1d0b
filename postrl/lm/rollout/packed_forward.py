"""The padding-free `postrl.lm.rollout.forwards.ResponseForward`: `PackedForward` runs a batch in the rollout
layout through `postrl.lm.fast.packed` (`PackedLlama`, `PackedGPT2`), its products on the real tokens only;
`packed_refusal` says when it cannot, `packed_decoder` picks the decoder. `postrl.lm.rollout.forwards.
response_forward` takes it for callers whose responses are right-padded (``padding_free=True``); DPO and SFT
choose it themselves (``dpo.padding_free``, ``padding_free``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import GPT2LMHeadModel

from postrl.core import entropy_from_logits
from postrl.lm.fast.gpt2 import gpt2_unsupported_reason
from postrl.lm.fast.llama import llama_unsupported_reason
from postrl.lm.fast.packed import PackedGPT2, PackedLlama, distinct_prompts
from postrl.lm.memory import checkpointing_on
from postrl.lm.rollout.sampling import token_log_probs
from postrl.runtime import distributed as dist


@dataclass
class PackedForward:
    """The padding-free forward (`postrl.lm.fast.packed.PackedLlama`, `PackedGPT2`): every product on the
    batch's real tokens only, each distinct prompt once. Responses must be right-padded (the rollout layout);
    positions whose attention mask is 0 get logits and log-probs 0 (callers mask them). A decoder folds the
    current weights, so one is made per call."""

    model: torch.nn.Module

    def _run(self, input_ids: Tensor, attention_mask: Tensor, prompt_len: int) -> tuple[Tensor, Tensor]:
        """(logits [Nt, V] of the real response tokens, their flat index into [B, T])."""
        P = prompt_len
        ids, mask, inverse = distinct_prompts(input_ids[:, :P], attention_mask[:, :P])
        decoder = packed_decoder(self.model)
        logits, layout = decoder.response_logits(ids, mask, inverse, input_ids[:, P:], attention_mask[:, P:])
        return logits, layout.targets

    def logits(self, input_ids: Tensor, attention_mask: Tensor, prompt_len: int) -> Tensor:
        B, T = input_ids.shape[0], input_ids.shape[1] - prompt_len
        logits, targets = self._run(input_ids, attention_mask, prompt_len)
        return logits.new_zeros(B * T, logits.shape[-1]).index_copy(0, targets, logits).view(B, T, -1)

    def log_probs(
        self, input_ids: Tensor, attention_mask: Tensor, prompt_len: int, temperature: float = 1.0,
        entropy: bool = False,
    ) -> tuple[Tensor, Tensor | None]:  # fmt: skip
        """(log π_τ [B, T] float32, entropy [B, T] detached or None), 0 where the attention mask is 0."""
        B, T = input_ids.shape[0], input_ids.shape[1] - prompt_len
        logits, targets = self._run(input_ids, attention_mask, prompt_len)
        logits = logits.float() / temperature  # (Nt, V)
        log_pi = token_log_probs(logits, input_ids[:, prompt_len:].flatten()[targets])  # (Nt,)
        out = log_pi.new_zeros(B * T).index_copy(0, targets, log_pi).view(B, T)
        if not entropy:
            return out, None
        with torch.no_grad():
            ent = entropy_from_logits(logits)
        return out, ent.new_zeros(B * T).index_copy(0, targets, ent).view(B, T)


def packed_refusal(model: torch.nn.Module, gradients: bool = True) -> str | None:
    """Why `PackedForward` cannot run ``model`` (None: it can): a whole, plain Llama-family or GPT-2 model in
    float32 that `postrl.lm.fast.llama.FastLlama` or `postrl.lm.fast.gpt2.FastGPT2` supports, without
    activation checkpointing when it trains."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) or dist.is_sharded(model):
        return "DDP and FSDP synchronise through the model's own forward"
    if gradients and checkpointing_on(model):
        return "activation checkpointing runs the model's own blocks"
    if isinstance(model, GPT2LMHeadModel):
        return gpt2_unsupported_reason(model)
    return llama_unsupported_reason(model)


def packed_decoder(model: torch.nn.Module) -> PackedLlama | PackedGPT2:
    """The padding-free decoder of a model that `packed_refusal` allows (its weights read now)."""
    packed = PackedGPT2 if isinstance(model, GPT2LMHeadModel) else PackedLlama
    return packed(model, checked=True)
