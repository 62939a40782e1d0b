"""The teacher-forced forward every LM loss passes through, chosen once when a trainer is built.

A `ResponseForward` has one method, ``logits(input_ids, attention_mask, prompt_len)`` → [B, T, V]: the logits
at positions P − 1 … P + T − 2 of a batch in the `postrl.lm.rollout.Rollout` layout ([B, P + T], prompts
left-padded), so that row b's t-th predicts its response token ``input_ids[b, P + t]``. It runs under the
caller's grad mode. Four implementations give the same logits and gradients to float32 rounding (tests/lm):

- `FullForward`: the model's own forward over every column (any causal LM; DDP, FSDP, checkpointing);
- `SharedPrefixForward`: the Hugging Face forward run on each distinct prompt once with a KV cache, every row
  given its prompt's cache by a gather (autograd flows through it, so the backward sums a group's gradients
  into the shared prompt), then only the T − 1 response tokens that are inputs. A GRPO group's G rows, or a
  DPO pair's chosen and rejected, spend one prompt forward instead of G or two;
- `FusedForward`: the same two passes through a fast decoder (`postrl.lm.rollout.decoders.FAST_DECODERS`:
  GPT-2 and Llama in float32), which skips the Hugging Face forward's per-call overhead (mask building, cache
  objects, module wrappers); a GRPO step spends a third less time in its forward and backward;
- `PackedForward` (`postrl.lm.rollout.packed_forward`): the fused Llama or GPT-2 weights run padding-free
  (`postrl.lm.fast.packed`): every product on the batch's real tokens only, each distinct prompt once;
  responses must be right-padded, and positions whose attention mask is 0 hold 0. DPO (``dpo.padding_free``),
  SFT (``padding_free``) and GRPO's sampled responses (`response_forward`'s ``padding_free``) take it where
  `packed_refusal` allows.

`response_forward` picks the fastest that is exact for a model and a use (with or without gradients) — the
trainer calls it when it builds, and its loss code then reads ``forward.logits(...)`` like the reference.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from postrl.core import entropy_from_logits
from postrl.lm.fast.packed import distinct_prompts
from postrl.lm.memory import LARGE_VOCAB, checkpointing_on, memory_settings
from postrl.lm.models import position_ids_from_mask
from postrl.lm.models.lora import AdapterFreeReference, adapters_disabled
from postrl.lm.rollout.chunked import chunked_log_probs, existing_grad
from postrl.lm.rollout.decoders import cache_argument, fast_decoder_class
from postrl.lm.rollout.packed_forward import PackedForward, packed_refusal
from postrl.lm.rollout.sampling import token_log_probs
from postrl.lm.step_in_backward import record_rows, record_rows_hook, step_in_backward_of, steps_in_backward
from postrl.lm.tiled_mlp import tiled
from postrl.runtime import distributed as dist

log = logging.getLogger(__name__)


class ResponseForward(Protocol):
    """Logits of the response positions; see the module docstring."""

    def logits(self, input_ids: Tensor, attention_mask: Tensor, prompt_len: int) -> Tensor: ...


def last_output(out: Any) -> Tensor:
    """A forward's last layer per position: a causal LM's logits [b, L, V], or its decoder's (the model
    without its output layer, `ChunkedForward`) final hidden states [b, L, d]."""
    logits = getattr(out, "logits", None)
    return out.last_hidden_state if logits is None else logits


def _keep_kwarg(model: torch.nn.Module) -> str | None:
    return "logits_to_keep" if "logits_to_keep" in inspect.signature(model.forward).parameters else None


@dataclass
class FullForward:
    """One forward of the model over all P + T columns; logits kept for the last T + 1 positions only. Under
    gradients in one process the tokens go in through `_Embedding` where `_token_inputs` allows (its rows
    added into an existing gradient)."""

    model: torch.nn.Module

    def __post_init__(self) -> None:
        self.keep = _keep_kwarg(self.model)

    def logits(self, input_ids: Tensor, attention_mask: Tensor, prompt_len: int) -> Tensor:
        T = input_ids.shape[1] - prompt_len
        keep = {self.keep: T + 1} if self.keep else {}
        out = self.model(
            **_token_inputs(self.model, input_ids, self.own_embedding()), attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask), use_cache=False, **keep,
        )  # fmt: skip
        return last_output(out)[:, -(T + 1) : -1]

    def own_embedding(self) -> bool:
        """Under gradients in one process (FSDP's weights are whole only inside the module's own forward)."""
        return torch.is_grad_enabled() and not dist.is_distributed()


@dataclass
class SharedPrefixForward:
    """Each distinct prompt through the Hugging Face forward once, its KV cache gathered to the rows that share
    it, then the response tokens on top (a batch whose prompts are all distinct takes one full forward).
    ``split_backward``: the two passes' gradients reach ``.grad`` by two backwards (`split_backward_at_prefix`:
    a trainer's forward, whose loss calls ``.backward()``; ``torch.autograd.grad`` would miss the prompt
    pass's share). Weights that step in the backward (`postrl.lm.step_in_backward`) must get their gradient in
    one accumulation: with gradients, each row then takes the full forward."""

    model: torch.nn.Module
    split_backward: bool = False

    def __post_init__(self) -> None:
        self.full = FullForward(self.model)
        self.cache_kw = cache_argument(self.model)

    def logits(self, input_ids: Tensor, attention_mask: Tensor, prompt_len: int) -> Tensor:
        P, T = prompt_len, input_ids.shape[1] - prompt_len
        ids, mask, inverse = distinct_prompts(input_ids[:, :P], attention_mask[:, :P])
        split = self.split_backward and torch.is_grad_enabled()
        if ids.shape[0] == input_ids.shape[0] or (split and steps_in_backward(self.model)):
            return self.full.logits(input_ids, attention_mask, P)
        keep = {self.full.keep: 1} if self.full.keep else {}
        head = self.model(
            **_token_inputs(self.model, ids, split), attention_mask=mask, position_ids=position_ids_from_mask(mask),
            use_cache=True, **keep,
        )  # fmt: skip
        last = last_output(head)[:, -1:]  # (U, 1, V): position P − 1 predicts response token 0
        cache = getattr(head, "cache", None) or head.past_key_values
        if T > 1 and split:
            last = split_backward_at_prefix(last, cache)
        first = last[inverse]  # (B, 1, V)
        if T == 1:
            return first
        cache.batch_select_indices(inverse)  # every row gets its prompt's keys and values (differentiable)
        positions = position_ids_from_mask(attention_mask)
        tail = self.model(
            **_token_inputs(self.model, input_ids[:, P:-1], split), attention_mask=attention_mask[:, :-1],
            position_ids=positions[:, P:-1], use_cache=True, **{self.cache_kw: cache},
        )  # fmt: skip
        return torch.cat((first, last_output(tail)), dim=1)  # (B, T, V)


class _Embedding(torch.autograd.Function):
    """``F.embedding`` whose backward adds the rows' gradients into an existing ``weight.grad`` in place
    (`postrl.lm.rollout.chunked.existing_grad` says when) instead of a fresh dense [V, d] gradient: each
    backward of a step after the first otherwise zero-fills one (545 MB at V = 151,936 in float32, page faults
    mostly) for autograd to add and drop. A tied weight has one from the first backward on: the output layer's
    part is set as ``weight.grad`` before this runs (`postrl.lm.rollout.chunked.adopt_grad`). A low-precision
    gradient gets each distinct row's sum once, rounded once (float32 sums of its positions)."""

    @staticmethod
    def forward(ctx: Any, ids: Tensor, weight: Tensor, padding_idx: int | None) -> Tensor:
        ctx.save_for_backward(ids)
        # its shape and .grad only, not saved: a weight stepping in the backward has changed by then
        ctx.weight = weight
        ctx.padding_idx = padding_idx
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, Tensor | None, None]:
        (ids,), weight = ctx.saved_tensors, ctx.weight
        if not ctx.needs_input_grad[1]:
            return None, None, None
        pad = -1 if ctx.padding_idx is None else ctx.padding_idx
        into = existing_grad(weight)
        owner = step_in_backward_of([weight]) if into is None else None
        waiting = owner.embedding_part(weight) if owner is not None else None  # rows not stepped yet
        if into is None and waiting is None:
            return None, torch.ops.aten.embedding_dense_backward(grad, ids, weight.shape[0], pad, False), None
        rows, flat = grad.reshape(-1, grad.shape[-1]), ids.reshape(-1)
        if pad >= 0:  # the padding row gets no gradient, as F.embedding's backward
            real = flat != pad
            rows, flat = rows[real], flat[real]
        if weight.dtype.itemsize < 4:  # bfloat16 / float16: one rounding per distinct row
            flat, where = flat.unique(return_inverse=True)
            summed = rows.new_zeros(flat.shape[0], rows.shape[1], dtype=torch.float32)
            rows = summed.index_add_(0, where, rows.float())
        if (
            waiting is not None and flat.numel()
        ):  # into the waiting rows' gradient, at their places among them
            recorded, into = waiting
            at = torch.searchsorted(recorded, flat).clamp_(max=max(recorded.numel() - 1, 0))
            if recorded.numel() == 0 or not torch.equal(recorded[at], flat):
                raise RuntimeError(
                    "optim.step_in_backward: the input embedding reached rows its forward did not record; those "
                    "rows already stepped without its gradient"
                )
            flat = at
        elif waiting is not None:
            return None, None, None  # (padding only)
        into.index_add_(0, flat, rows.to(into.dtype))
        return None, None, None


def _token_inputs(model: torch.nn.Module, ids: Tensor, split: bool) -> dict[str, Tensor]:
    """The keyword that gives ``model`` its tokens: ``inputs_embeds`` through `_Embedding` when ``split`` (a
    trainer's forward under grad) and the model is one of `PLAIN_HEADS` with a plain ``nn.Embedding`` (no
    max_norm, frequency scaling or sparse gradient, no hooks on its forward, such as NEFTune's noise, that
    ``inputs_embeds`` would skip, but `record_rows_hook`, whose record is made here, and transformers' own under
    checkpointing, which only marks the output as
    requiring grad, as `_Embedding`'s already is), else ``input_ids``."""
    embedding = model.get_input_embeddings() if split and hasattr(model, "get_input_embeddings") else None
    plain = (
        type(embedding) is torch.nn.Embedding
        and getattr(model.config, "model_type", None) in PLAIN_HEADS
        and embedding.max_norm is None
        and not embedding.scale_grad_by_freq
        and not embedding.sparse
        and embedding.weight.requires_grad
        and all(hook is record_rows_hook for hook in embedding._forward_pre_hooks.values())
        and all(_requires_grad_hook(hook) for hook in embedding._forward_hooks.values())
    )
    if not plain:
        return {"input_ids": ids}
    record_rows(embedding.weight, ids)  # (the hook on the embedding module is skipped with inputs_embeds)
    return {"inputs_embeds": _Embedding.apply(ids, embedding.weight, embedding.padding_idx)}


def _requires_grad_hook(hook: Callable[..., Any]) -> bool:
    """Whether ``hook`` is the forward hook ``enable_input_require_grads`` of transformers puts on the input
    embedding (``gradient_checkpointing_enable`` does): it sets ``requires_grad`` on the output, nothing else."""
    return getattr(hook, "__qualname__", "").startswith("PreTrainedModel.enable_input_require_grads.")


class _PrefixBoundary(torch.autograd.Function):
    """Identity on the prompt pass's outputs whose backward runs the prompt pass's own backward (see
    `split_backward_at_prefix`). The outputs are detached from the prompt pass's graph: the only input that
    requires grad is a scalar ``anchor``, and the prompt pass's outputs travel as a plain list."""

    @staticmethod
    def forward(ctx: Any, anchor: Tensor, outputs: list[Tensor]) -> tuple[Tensor, ...]:
        ctx.outputs = outputs
        ctx.set_materialize_grads(False)  # an unused output (a row's last key, say) passes None, not zeros
        return tuple(t.detach() for t in outputs)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[None, None]:
        pairs = [(t, g) for t, g in zip(ctx.outputs, grads, strict=True) if g is not None]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
        ctx.outputs = None
        return None, None


def split_backward_at_prefix(last: Tensor, cache: Any) -> Tensor:
    """Cut the graph between a shared-prefix forward's prompt pass and the pass on top of it: ``last`` (the
    prompt pass's last position) and every layer's keys and values in ``cache`` are replaced by detached
    copies whose gradient, once the response pass's backward has produced all of it, is sent into the prompt
    pass by a second backward. Returns the new ``last``; the cache is changed in place.

    The gradients are the same; the memory is not. A weight used by both passes otherwise receives both
    passes' gradients summed by autograd before they reach ``.grad``: the response pass's share of every weight
    is held until the prompt pass's backward reaches that weight — a second full set of gradients when
    ``.grad`` already holds one (gradient accumulation, DPO's length groups: +2 GB on a 0.5B model). Cut,
    each pass adds its share to ``.grad`` as it goes. A cache whose layers are not plain keys and values
    (linear attention, say) is left whole."""
    layers = getattr(cache, "layers", None)
    if not layers or not all(
        isinstance(getattr(layer, "keys", None), Tensor)
        and isinstance(getattr(layer, "values", None), Tensor)
        for layer in layers
    ):
        return last
    outputs = [last] + [t for layer in layers for t in (layer.keys, layer.values)]
    anchor = torch.zeros((), device=last.device, requires_grad=True)
    cut = _PrefixBoundary.apply(anchor, outputs)
    for i, layer in enumerate(layers):
        layer.keys, layer.values = cut[1 + 2 * i], cut[2 + 2 * i]
    return cut[0]


@dataclass
class FusedForward:
    """The shared-prefix passes through a fast decoder. A decoder folds the current weights into its own
    tensors under the caller's grad mode, so one is made per call; the model's parameters must be whole
    (an FSDP model: inside `postrl.runtime.distributed.gathered`)."""

    model: torch.nn.Module
    decoder_class: Any

    def logits(self, input_ids: Tensor, attention_mask: Tensor, prompt_len: int) -> Tensor:
        P = prompt_len
        ids, mask, inverse = distinct_prompts(input_ids[:, :P], attention_mask[:, :P])
        shared = ids.shape[0] < input_ids.shape[0]
        if not shared:  # every prompt distinct: no gather
            ids, mask = input_ids[:, :P], attention_mask[:, :P]
        decoder = self.decoder_class(self.model, checked=True)
        first = decoder.prefill(ids, mask, position_ids_from_mask(mask), input_ids.shape[1])  # (U, V)
        if shared:
            first = first.index_select(0, inverse)
            decoder.select_rows(inverse)
        if input_ids.shape[1] == P + 1:
            return first[:, None]
        return torch.cat((first[:, None], decoder.extend(input_ids[:, P:-1])), dim=1)  # (B, T, V)


@dataclass
class ChunkedForward:
    """The model without its output layer (``inner``: a `FullForward` or `SharedPrefixForward` of its decoder,
    giving final hidden states [B, T, d]), then the output layer ``head`` applied ``chunk_tokens`` positions at
    a time (`postrl.lm.rollout.chunked`): `log_probs` never holds the [B, T, V] logits of the batch.
    ``context``: entered around the decoder's forward (a LoRA reference: the policy with adapters off)."""

    inner: ResponseForward
    head: torch.nn.Linear
    chunk_tokens: int
    context: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext

    def logits(self, input_ids: Tensor, attention_mask: Tensor, prompt_len: int) -> Tensor:
        with self.context():
            return self.head(self.inner.logits(input_ids, attention_mask, prompt_len))  # (B, T, V)

    def log_probs(
        self, input_ids: Tensor, attention_mask: Tensor, prompt_len: int, temperature: float = 1.0,
        entropy: bool = False,
    ) -> tuple[Tensor, Tensor | None]:  # fmt: skip
        """(log π_τ [B, T] float32, entropy [B, T] detached or None) of the response tokens, unmasked."""
        with self.context():
            hidden = self.inner.logits(input_ids, attention_mask, prompt_len)  # (B, T, d)
        bias = self.head.bias
        tokens = input_ids[:, prompt_len:]
        return chunked_log_probs(
            hidden, self.head.weight, bias, tokens, temperature, self.chunk_tokens, entropy
        )


def forward_log_probs(
    forward: ResponseForward,
    input_ids: Tensor,
    attention_mask: Tensor,
    prompt_len: int,
    temperature: float = 1.0,
    *,
    entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """(log π_τ of the response tokens [B, T] float32, entropy per token [B, T] detached or None unless
    ``entropy``), unmasked, through ``forward``: `ChunkedForward`'s own chunks, else a log-softmax of the whole
    logits (the reference). Runs under the caller's grad mode."""
    chunked = getattr(forward, "log_probs", None)
    if chunked is not None:
        return chunked(input_ids, attention_mask, prompt_len, temperature, entropy)
    logits = forward.logits(input_ids, attention_mask, prompt_len).float() / temperature  # (B, T, V)
    entropies = None
    if entropy:
        with torch.no_grad():
            entropies = entropy_from_logits(logits)
    return token_log_probs(logits, input_ids[:, prompt_len:]), entropies


# architectures whose logits are exactly output_layer(final hidden state): no soft-capping, no logit scale
PLAIN_HEADS = tuple("llama mistral qwen2 qwen3 qwen2_moe qwen3_moe gemma olmo olmo2 phi3".split())


def chunked_refusal(model: torch.nn.Module) -> str | None:
    """Why `ChunkedForward` cannot run ``model`` (None: it can)."""
    base = model.policy if isinstance(model, AdapterFreeReference) else model
    if isinstance(base, torch.nn.parallel.DistributedDataParallel) or dist.is_sharded(base):
        return "DDP and FSDP synchronise through the model's own forward"
    model_type = getattr(getattr(base, "config", None), "model_type", None)
    if model_type not in PLAIN_HEADS:
        return f"model type {model_type!r} is not one whose logits are its output layer's (postrl knows {PLAIN_HEADS})"
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear) or not hasattr(base, "get_decoder"):
        return f"{type(base).__name__} has no plain output layer and decoder"
    return None


def _chunked_forward(model: torch.nn.Module, chunk_tokens: int, gradients: bool) -> ChunkedForward:
    """`ChunkedForward` of a model `chunked_refusal` accepts."""
    reference = isinstance(model, AdapterFreeReference)
    base = model.policy if reference else model
    decoder = base.get_decoder()
    single = checkpointing_on(base) or cache_argument(decoder) is None
    inner = FullForward(decoder) if single else SharedPrefixForward(decoder, split_backward=gradients)
    context = (lambda: adapters_disabled(base)) if reference else contextlib.nullcontext
    return ChunkedForward(inner, base.get_output_embeddings(), chunk_tokens, context)


def _wants_chunks(model: torch.nn.Module) -> bool:
    """Whether the run's ``run.memory.log_probs`` (`postrl.lm.memory`) picks `ChunkedForward` for ``model``;
    the choice, or the refusal of an explicit ``chunked``, is logged."""
    mode = memory_settings(model).log_probs
    if mode == "full":
        return False
    why = chunked_refusal(model)
    vocab = getattr(getattr(model, "config", None), "vocab_size", 0) or 0
    if why is None and (mode == "chunked" or vocab >= LARGE_VOCAB):
        log.info("%s: log-probs through the output layer in chunks (run.memory.log_probs=%s, vocab %d)",
                 type(model).__name__, mode, vocab)  # fmt: skip
        return True
    if mode == "auto" and why is not None and vocab >= LARGE_VOCAB:
        log.info("%s: whole logits, the chunked output layer refused: %s", type(model).__name__, why)
    if mode == "chunked":
        log.warning(
            "run.memory.log_probs=chunked refused for %s: %s; whole logits", type(model).__name__, why
        )
    return False


# whether each model's next-token log-probs run chunked: decided (and logged) once per model
_CHUNKED: weakref.WeakKeyDictionary[torch.nn.Module, bool] = weakref.WeakKeyDictionary()


def chunks_output_layer(model: torch.nn.Module) -> bool:
    """Whether ``run.memory.log_probs`` picks the chunked output layer for ``model`` (`_wants_chunks`), decided
    and logged once per model."""
    if model not in _CHUNKED:
        _CHUNKED[model] = _wants_chunks(model)
    return _CHUNKED[model]


def next_token_log_probs(
    model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, targets: Tensor
) -> Tensor:
    """log π(targets) [B, L − 1] float32 of a teacher-forced forward over [B, L] (position t predicts
    ``targets[:, t]``, the next token; every target a valid id), as SFT's loss reads it: through the chunked
    output layer when ``run.memory.log_probs`` picks it for ``model`` (`chunks_output_layer`), else the whole logits."""
    if not chunks_output_layer(model):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]  # (B, L − 1, V)
        return token_log_probs(logits, targets)
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    head = model.get_output_embeddings()
    chunk = memory_settings(model).chunk_tokens
    return chunked_log_probs(hidden[:, :-1], head.weight, head.bias, targets, 1.0, chunk, entropy=False)[0]


def response_forward(
    model: torch.nn.Module,
    use_fast: bool | None = None,
    *,
    gradients: bool = True,
    gathered: bool = False,
    padding_free: bool = False,
) -> ResponseForward:
    """The forward a trainer uses for ``model``. ``gradients``: whether a loss backpropagates through it (False:
    reference and old log-probs under ``torch.no_grad``). ``use_fast``: `postrl.lm.rollout.SamplingConfig.
    use_fast` (None: a fast decoder where one runs the model; False: never). ``gathered``: the caller runs it
    inside `postrl.runtime.distributed.gathered`, where an FSDP model's weights are whole. ``padding_free``:
    the caller's responses are always right-padded (a sampled rollout): `PackedForward` where a fast decoder
    would run and `packed_refusal` allows (the same log-probs to float rounding, on the real tokens only).

    A fast decoder reads whole weights and does not checkpoint: it is taken without gradients on any model it
    supports whose weights are whole when it runs, and with gradients only on a plain module without
    activation checkpointing. The shared prefix needs the model's own KV cache and one forward per backward:
    not under DDP or FSDP (every rank must run the same forwards) nor with checkpointing (the blocks drop the
    cache). Otherwise the full forward. Before all of these, ``run.memory.log_probs`` (`postrl.lm.memory`:
    ``auto`` for a large vocabulary, or ``chunked``) picks `ChunkedForward`, where `chunked_refusal` allows.
    """
    if _wants_chunks(model):
        return _chunked_forward(model, memory_settings(model).chunk_tokens, gradients)
    sharded = dist.is_sharded(model)
    checkpointing = checkpointing_on(model)
    decoder = None if use_fast is False else fast_decoder_class(model)
    whole = not sharded or (gathered and not gradients)
    # postrl's fast forward reads the weights itself: it would run neither checkpointing nor tiled MLPs
    if decoder is not None and whole and not (gradients and (checkpointing or tiled(model))):
        if padding_free and packed_refusal(model, gradients) is None:
            return PackedForward(model)
        return FusedForward(model, decoder)
    ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
    if ddp or sharded or checkpointing or cache_argument(model) is None:
        return FullForward(model)
    return SharedPrefixForward(model, split_backward=gradients)
