"""Decoders for the rollout engine (`postrl.lm.rollout.generate`): ``prefill`` the prompts, then ``step`` one
token at a time, each returning next-token logits [B, V].

`make_decoder` picks a fast decoder that supports the model (`postrl.lm.fast.llama.FastLlama`,
`postrl.lm.fast.gpt2.FastGPT2`), else `HFDecoder`, the model's own Hugging Face forward and KV cache, which
runs any causal LM. All agree to float32 rounding (tests/lm).
"""

from __future__ import annotations

import inspect
import logging
import weakref
from typing import Any

import torch
from torch import Tensor

from postrl.lm.fast import gpt2, llama
from postrl.runtime.errors import ConfigError

log = logging.getLogger(__name__)


def cache_argument(model: torch.nn.Module) -> str | None:
    """The forward's KV-cache keyword: transformers 5 renamed ``past_key_values`` to ``cache``; None: neither."""
    params = inspect.signature(model.forward).parameters
    return next((name for name in ("cache", "past_key_values") if name in params), None)


def grown_mask(mask: Tensor, length: int, chunk_mask: Tensor, max_len: int) -> Tensor:
    """A decoder's attention mask [B, ≥ max_len] after a left-padded chunk (mask [B, S]) is appended at
    column ``length``: the first ``length`` columns kept, the chunk's, then ones (the columns decoding fills)."""
    grown = mask.new_ones(mask.shape[0], max(max_len, mask.shape[1]))
    grown[:, :length] = mask[:, :length]
    grown[:, length : length + chunk_mask.shape[1]] = chunk_mask
    return grown


def forget_mask(mask: Tensor, start: int, keep: Tensor, length: int) -> None:
    """In place: row b no longer attends to columns ``start + keep[b] … length − 1`` of ``mask`` [B, L]."""
    columns = torch.arange(start, length, device=mask.device)
    mask[:, start:length].masked_fill_(columns[None, :] >= start + keep[:, None], 0)


class HFDecoder:
    """Incremental decoding through the model's own forward and KV cache (any HF causal LM)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        params = inspect.signature(model.forward).parameters
        self.cache_kw = cache_argument(model) or "past_key_values"
        self.keep_kw = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self.cache: Any = None

    def _forward(self, ids: Tensor, positions: Tensor) -> Tensor:
        out = self.model(
            input_ids=ids,
            attention_mask=self.mask[:, : self.length],
            position_ids=positions,
            use_cache=True,
            **{self.cache_kw: self.cache},
            **self.keep_kw,
        )
        self.cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        return out.logits[:, -1].float()

    def prefill(
        self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, max_len: int
    ) -> Tensor:
        """Prompts [B, P] → next-token logits [B, V]; generated columns count as real tokens."""
        self.mask = attention_mask.new_ones(input_ids.shape[0], max_len)  # (B, P + T), sliced per step
        self.mask[:, : input_ids.shape[1]] = attention_mask
        self.length, self.cache = input_ids.shape[1], None
        self.next_pos = position_ids[:, -1:] + 1  # (B, 1)
        return self._forward(input_ids, position_ids)

    def select_rows(self, index: Tensor) -> None:
        """After `prefill`: row b continues prefilled row ``index[b]`` (a prompt shared by several rows)."""
        self.cache.batch_select_indices(index)
        self.mask, self.next_pos = self.mask[index], self.next_pos[index]

    def append(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, max_len: int) -> Tensor:
        """A conversation's next turn (`postrl.lm.rollout.turns`): a left-padded chunk [B, S] (mask, positions
        [B, S]) after the cache's columns, whose mask grows to ``max_len``; next-token logits [B, V]."""
        self.mask = grown_mask(self.mask, self.length, attention_mask, max_len)
        self.length += input_ids.shape[1]
        self.next_pos = position_ids[:, -1:] + 1
        return self._forward(input_ids, position_ids)

    def forget(self, start: int, keep: Tensor) -> None:
        """Row b keeps only its first ``keep[b]`` columns from ``start`` on: the later ones are masked."""
        forget_mask(self.mask, start, keep, self.length)

    def step(self, tokens: Tensor) -> Tensor:
        """Append one token per row (positions continue from the prompt): tokens [B] → logits [B, V]."""
        self.length += 1
        positions, self.next_pos = self.next_pos, self.next_pos + 1
        return self._forward(tokens[:, None], positions)


FAST_DECODERS = {
    llama.FastLlama: llama.llama_unsupported_reason,
    gpt2.FastGPT2: gpt2.gpt2_unsupported_reason,
}


def fast_decoder_class(model: torch.nn.Module) -> type | None:
    """The fast decoder class that supports ``model``, or None."""
    return next((cls for cls, why in FAST_DECODERS.items() if why(model) is None), None)


def fast_decoder(model: torch.nn.Module) -> Any | None:
    """A fast decoder for ``model``, or None."""
    cls = fast_decoder_class(model)
    return None if cls is None else cls(model, checked=True)


# the paths already logged per model: one line per model, not per call (weak keys: a new model at a freed
# model's address is a new model; an id() key would keep it quiet)
_SAID: weakref.WeakKeyDictionary[torch.nn.Module, set[str]] = weakref.WeakKeyDictionary()


def _say(model: torch.nn.Module, path: str, why: str) -> None:
    said = _SAID.setdefault(model, set())
    if path not in said:
        said.add(path)
        log.info("%s runs through %s (%s)", type(model).__name__, path, why)


def make_decoder(model: torch.nn.Module, use_fast: bool | None = None) -> Any:
    """The fast decoder that supports ``model`` (``use_fast=None``: auto; True: required), else `HFDecoder`
    (`postrl.lm.rollout.SamplingConfig.backend`); the choice and the reason are logged at info level."""
    fast = None if use_fast is False else fast_decoder(model)
    if fast is not None:
        _say(model, type(fast).__name__, "sampling.backend " + ("fast" if use_fast else "auto"))
        return fast
    reasons = (why(model) for why in FAST_DECODERS.values())
    reason = "sampling.backend hf" if use_fast is False else "; ".join(r for r in reasons if r)
    if use_fast:
        raise ValueError(f"sampling.backend is fast but the fast decoders cannot run this model: {reason}")
    attention = getattr(getattr(model, "config", None), "_attn_implementation", None) or "default"
    _say(model, f"the Hugging Face forward ({attention} attention)", reason)
    return HFDecoder(model)


def check_backend(model: torch.nn.Module, backend: str) -> None:
    """Before a run: ``sampling.backend=fast`` on a model the fast decoders cannot run is a config error."""
    if backend == "fast" and fast_decoder(model) is None:
        reasons = "; ".join(r for why in FAST_DECODERS.values() if (r := why(model)))
        raise ConfigError(f"sampling.backend is fast but the fast decoders cannot run this model: {reasons}")
