"""A decode-only forward for Llama-family causal LMs: the fast path of `postrl.lm.rollout`.

Sampling a batch of short responses from a small model on a CPU is dominated by per-operation overhead, not
arithmetic. The stock Hugging Face forward rebuilds a 4-D attention mask, grows a dynamic KV cache by
concatenation and runs separate q/k/v and gate/up projections at every step. `FastLlama` owns the decode
forward instead:

- fused projections, weights pre-transposed for ``mm`` / ``addmm`` on 2-D activations: one GEMM for
  ``[q | k | v]``, one for ``[gate | up]``; residual adds fused into the output GEMMs (``addmm``);
- RMSNorm as ``x / sqrt(Σx² + d·eps)`` with Σx² a GEMV, its weight and √d folded into the projection that
  follows (``(x·n)Wᵀ = x(W·n)ᵀ``): four kernels and no Python scalar (each costs a conversion kernel);
- RoPE as ``x·cos + swap(x)·sin±``: ``rotate_half`` swaps the halves of each head, its sign is folded into a
  precomputed sin, and every future step's cos / sin rows are gathered once per call;
- a KV cache preallocated to ``P + T`` positions, written in place;
- one additive key mask ``[B, 1, 1, P + T]`` built once (−inf on left padding) and sliced at every step.

Every fused weight is built at construction from the LIVE parameters (the policy is trained between
rollouts): build a new `FastLlama` for every `generate` call, never keep one across optimiser steps.
It runs under the caller's grad mode: with gradients on, the folded weights are differentiable functions of the
parameters and the KV cache grows by concatenation instead (autograd cannot go through in-place writes into a
buffer that an earlier attention read), so a teacher-forced training forward
(`postrl.lm.rollout.forwards.FusedForward`) takes the same short path as sampling.
`llama_unsupported_reason` says why a model must take the Hugging Face fallback instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import LlamaForCausalLM

from postrl.lm.fast.adapters import linear_weight, unsupported_projection
from postrl.lm.step_in_backward import record_rows

# RoPE variants whose inverse frequencies do not depend on the sequence length ("dynamic" and "longrope" do).
STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})


def llama_unsupported_reason(model: torch.nn.Module) -> str | None:
    """None when `FastLlama` reproduces ``model``'s forward, else why not (the caller falls back to HF)."""
    if not isinstance(model, LlamaForCausalLM):
        return f"{type(model).__name__} is not a LlamaForCausalLM"
    cfg = model.config
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    checks = {
        f"hidden_act={cfg.hidden_act!r} is not 'silu'": cfg.hidden_act != "silu",
        f"rope_type={rope_type!r} depends on the sequence length": rope_type not in STATIC_ROPE_TYPES,
        "pretraining_tp > 1": getattr(cfg, "pretraining_tp", 1) != 1,
        f"dtype {model.dtype} is not float32": model.dtype != torch.float32,
        "attention dropout is active": model.training and cfg.attention_dropout > 0,
    }
    reason = next((reason for reason, failed in checks.items() if failed), None)
    # a LoRA layer around a projection is read with its adapters merged (postrl.lm.fast.adapters)
    projections = (unsupported_projection(m) for m in (model.lm_head, *_projections(model)))
    return reason or next((why for why in projections if why is not None), None)


def prefill_masks(attention_mask: Tensor, max_len: int, like: Tensor) -> tuple[Tensor, Tensor]:
    """Additive masks of a left-padded batch, attention_mask [B, P] → (key bias [B, 1, 1, max_len]: −inf on
    the prompts' padding, 0 elsewhere, sliced at every decode step; prefill mask [B, 1, P, P]: causal with pad
    keys masked, where a pad query attends to itself only: no all −inf row, no NaN). dtype/device of ``like``."""
    B, P = attention_mask.shape
    valid = attention_mask.bool()
    key_bias = like.new_zeros(B, 1, 1, max_len)
    key_bias[:, 0, 0, :P].masked_fill_(~valid, float("-inf"))
    eye = torch.eye(P, dtype=torch.bool, device=valid.device)
    allowed = torch.ones(P, P, dtype=torch.bool, device=valid.device).tril() & (valid[:, None, :] | eye)
    return key_bias, like.new_zeros(B, 1, P, P).masked_fill_(~allowed[:, None], float("-inf"))


def extend_mask(key_bias: Tensor, length: int, S: int) -> Tensor:
    """Additive mask [B, 1, S, length + S] of S new tokens after ``length`` cache columns: the key bias of
    the filled columns, causal among the new ones."""
    causal = torch.full((S, S), float("-inf"), dtype=key_bias.dtype, device=key_bias.device).triu(1)
    mask = key_bias[..., : length + S].expand(-1, -1, S, -1).clone()  # (B, 1, S, length + S)
    mask[..., length:] += causal
    return mask


class KVCache:
    """Keys and values of every layer, [B, heads, columns, hs]. Without gradients: preallocated to ``max_len``
    columns and written in place (decoding). With gradients (a teacher-forced training forward): grown by
    concatenation, as autograd cannot go through in-place writes into a buffer that an earlier attention read."""

    def __init__(self, layers: int, shape: tuple[int, ...], like: Tensor) -> None:
        self.grow = torch.is_grad_enabled()
        self.k: list[Tensor | None] = [None if self.grow else like.new_zeros(shape) for _ in range(layers)]
        self.v: list[Tensor | None] = [None if self.grow else like.new_zeros(shape) for _ in range(layers)]

    def write(self, i: int, k: Tensor, v: Tensor, start: int) -> tuple[Tensor, Tensor]:
        """Store layer ``i``'s k, v [B, S, heads, hs] in columns ``start … start + S − 1``; return the keys
        and values of columns ``0 … start + S − 1``."""
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, S, hs)
        if self.grow:
            if start:
                k, v = torch.cat((self.k[i], k), dim=2), torch.cat((self.v[i], v), dim=2)
            self.k[i], self.v[i] = k, v
            return k, v
        end = start + k.shape[2]
        self.k[i][:, :, start:end] = k
        self.v[i][:, :, start:end] = v
        return self.k[i][:, :, :end], self.v[i][:, :, :end]

    def select_rows(self, index: Tensor) -> None:
        """Row b becomes row ``index[b]`` (differentiable when grown)."""
        # index_select, not k[index]: the same rows; advanced indexing of 4-d tensors is several times slower on
        # CPU (measured in benchmarks/grpo.py)
        self.k = [k.index_select(0, index) for k in self.k]
        self.v = [v.index_select(0, index) for v in self.v]

    def resize(self, max_len: int, length: int) -> None:
        """Preallocated (decoding): room for ``max_len`` columns, the first ``length`` kept."""
        if self.grow or self.k[0].shape[2] >= max_len:
            return
        for buffers in (self.k, self.v):
            for i, old in enumerate(buffers):
                buffers[i] = old.new_zeros(*old.shape[:2], max_len, old.shape[3])
                buffers[i][:, :, :length] = old[:, :, :length]


def grown_key_bias(key_bias: Tensor, length: int, chunk_mask: Tensor, max_len: int) -> Tensor:
    """The key bias [B, 1, 1, max_len] after a left-padded chunk (mask [B, S]) is appended at column
    ``length``: the first ``length`` columns kept, −inf on the chunk's padding, 0 on the columns after it."""
    bias = key_bias.new_zeros(key_bias.shape[0], 1, 1, max(max_len, key_bias.shape[-1]))
    bias[..., :length] = key_bias[..., :length]
    S = chunk_mask.shape[1]
    bias[:, 0, 0, length : length + S].masked_fill_(chunk_mask == 0, float("-inf"))
    return bias


def forget_columns(key_bias: Tensor, start: int, keep: Tensor, length: int) -> None:
    """In place: row b no longer attends to columns ``start + keep[b] … length − 1`` (its tokens after EOS,
    or cut by a budget, written by the decoding of a batch that went on)."""
    columns = torch.arange(start, length, device=key_bias.device)  # (n,)
    drop = columns[None, :] >= start + keep[:, None]  # (B, n)
    key_bias[:, 0, 0, start:length].masked_fill_(drop, float("-inf"))


def _projections(model: torch.nn.Module) -> list[torch.nn.Module]:
    names = {
        "self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
        "mlp": ("gate_proj", "up_proj", "down_proj"),
    }
    return [
        getattr(getattr(layer, part), name)
        for layer in model.model.layers
        for part in names
        for name in names[part]
    ]


def _cat_bias(*biases: Tensor | None) -> Tensor | None:
    return None if biases[0] is None else torch.cat(biases)


@dataclass
class _Layer:
    """Fused weights of one decoder layer, transposed to (in, out) for ``mm``; biases None unless configured."""

    w_qkv: Tensor  # (d, (nh + 2·nkv)·hs): [q | k | v], input norm folded in
    b_qkv: Tensor | None
    w_o: Tensor  # (nh·hs, d)
    b_o: Tensor | None
    w_gate_up: Tensor  # (d, 2·I): [gate | up], post-attention norm folded in
    b_gate_up: Tensor | None
    w_down: Tensor  # (I, d)
    b_down: Tensor | None


def _fuse_layer(layer: torch.nn.Module, norm_scale: float) -> _Layer:
    """Fused weights of one ``LlamaDecoderLayer`` from its current parameters (see `FastLlama._norm`; LoRA
    adapters merged, `postrl.lm.fast.adapters.linear_weight`)."""
    att, mlp = layer.self_attn, layer.mlp
    n1 = layer.input_layernorm.weight * norm_scale
    n2 = layer.post_attention_layernorm.weight * norm_scale
    (wq, bq), (wk, bk), (wv, bv), (wo, bo) = (
        linear_weight(p) for p in (att.q_proj, att.k_proj, att.v_proj, att.o_proj)
    )
    (wg, bg), (wu, bu), (wd, bd) = (linear_weight(p) for p in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
    return _Layer(
        w_qkv=(torch.cat((wq, wk, wv)) * n1).t().contiguous(),
        b_qkv=_cat_bias(bq, bk, bv),
        w_o=wo.t().contiguous(),
        b_o=bo,
        w_gate_up=(torch.cat((wg, wu)) * n2).t().contiguous(),
        b_gate_up=_cat_bias(bg, bu),
        w_down=wd.t().contiguous(),
        b_down=bd,
    )


def _mm(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """x [N, in] @ w [in, out] (+ b): one kernel, no transpose or reshape on the way."""
    return torch.mm(x, w) if b is None else torch.addmm(b, x, w)


class FastLlama:
    """Prefill + incremental decode for a `LlamaForCausalLM`, batch laid out as ``[B, P + t]``.

    Left padding keeps every row's step-t token in the same column ``P + t``, so one cache write serves the
    whole batch; only the RoPE positions differ per row. Use: ``prefill`` once, then ``step`` per new token.
    Activations are 2-D, [B·S, d], between layers.
    """

    def __init__(self, model: torch.nn.Module, checked: bool = False) -> None:
        """``checked``: the caller has just seen `llama_unsupported_reason` return None (it is not run again)."""
        reason = None if checked else llama_unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"FastLlama cannot run this model: {reason}")
        cfg = model.config
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self._rotary = model.model.rotary_emb
        d = cfg.hidden_size
        # under the caller's grad mode (see the module docstring)
        self.embed = model.model.embed_tokens.weight
        self.layers = [_fuse_layer(layer, d**0.5) for layer in model.model.layers]
        w_lm, _ = linear_weight(model.lm_head)
        self.w_lm = (w_lm * (model.model.norm.weight * d**0.5)).t().contiguous()  # (d, V)
        self._ones = self.embed.new_ones(d, 1)
        self._d_eps = self.embed.new_full((1,), d * cfg.rms_norm_eps)
        self.length = 0  # cache columns filled so far

    # ---- pieces -----------------------------------------------------------------------------------------
    def _norm(self, x: Tensor) -> Tensor:
        """x [N, d] → x / sqrt(Σx² + d·eps) = RMSNorm(x) / √d without its weight: the √d and the weight are
        folded into the next projection. Σx² + d·eps is one GEMV (no Python scalar enters an op)."""
        return x * torch.addmm(self._d_eps, x * x, self._ones).rsqrt_()  # (N, d) · (N, 1)

    def _alloc(self, batch: int, max_len: int) -> None:
        """Preallocate the KV cache and the RoPE tables for ``max_len`` columns."""
        nkv, hs, like = self.n_kv, self.head_dim, self.embed
        self.cache = KVCache(len(self.layers), (batch, nkv, max_len, hs), like)
        self._rope_tables(max_len)

    def _rope_tables(self, max_len: int) -> None:
        """cos / sin rows of positions 0 … max_len − 1, per q and k head."""
        hs, like = self.head_dim, self.embed
        pos = torch.arange(max_len, device=like.device)[None]  # (1, L)
        cos, sin = self._rotary(like[:1], position_ids=pos)  # (1, L, hs) each: the model's own RoPE values
        half = torch.ones(hs // 2, device=like.device)
        sign = torch.cat((-half, half))  # rotate_half(x) = swap(x)·sign, head by head
        reps = self.n_heads + self.n_kv
        self.cos = cos[0].repeat(1, reps)  # (L, (nh + nkv)·hs), one copy per q and k head
        self.sin = (sin[0] * sign).repeat(1, reps)

    def _attention(self, i: int, y: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, batch: int) -> Tensor:
        """RoPE, cache write and attention of layer ``i`` from its projections y [B·S, (nh + 2·nkv)·hs],
        for tokens in cache columns ``length … length + S − 1``. Returns [B·S, nh·hs]."""
        nh, nkv, hs = self.n_heads, self.n_kv, self.head_dim
        B, S, qk_dim = batch, y.shape[0] // batch, (nh + nkv) * hs
        qk = y[:, :qk_dim]
        swapped = qk.unflatten(-1, (nh + nkv, 2, hs // 2)).flip(-2).flatten(-3)  # halves of each head swapped
        qk = torch.addcmul(qk * cos, swapped, sin)  # RoPE: x·cos + rotate_half(x)·sin, (B·S, qk)
        k, v = qk[:, nh * hs :].view(B, S, nkv, hs), y[:, qk_dim:].view(B, S, nkv, hs)
        k, v = self.cache.write(i, k, v, self.length)  # (B, nkv, end, hs)
        q = qk[:, : nh * hs].view(B, S, nh, hs).transpose(1, 2)  # (B, nh, S, hs)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=nh != nkv)  # (B, nh, S, hs)
        return att.transpose(1, 2).reshape(B * S, nh * hs)  # (B·S, nh·hs)

    def _layer(self, i: int, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, batch: int) -> Tensor:
        """Decoder layer ``i`` on x [B·S, d]; cos, sin: [B·S, (nh + nkv)·hs]; mask: additive
        [B, 1, S, length + S]. Returns x [B·S, d]."""
        layer = self.layers[i]
        y = _mm(self._norm(x), layer.w_qkv, layer.b_qkv)  # (B·S, (nh + 2·nkv)·hs)
        x = torch.addmm(x, self._attention(i, y, cos, sin, mask, batch), layer.w_o)  # residual + attention
        if layer.b_o is not None:
            x = x + layer.b_o
        gate_up = _mm(self._norm(x), layer.w_gate_up, layer.b_gate_up)  # (B·S, 2I)
        inter = gate_up.shape[-1] // 2
        gate, up = gate_up[:, :inter], gate_up[:, inter:]
        # SwiGLU (B·S, I), in place when no backward needs the inputs
        act = F.silu(gate) * up if torch.is_grad_enabled() else F.silu(gate, inplace=True).mul_(up)
        x = torch.addmm(x, act, layer.w_down)
        return x if layer.b_down is None else x + layer.b_down

    def _run(self, ids: Tensor, cos: Tensor, sin: Tensor, mask: Tensor) -> Tensor:
        """All layers on ids [B, S] with RoPE tables [B·S, (nh + nkv)·hs] → final hidden states [B·S, d]."""
        B, S = ids.shape
        record_rows(self.embed, ids)  # (a weight that steps in the backward: `postrl.lm.step_in_backward`)
        x = F.embedding(ids.reshape(B * S), self.embed)  # (B·S, d)
        for i in range(len(self.layers)):
            x = self._layer(i, x, cos, sin, mask, B)
        self.length += S
        return x

    # ---- public -----------------------------------------------------------------------------------------
    def prefill(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        max_len: int,
        all_logits: bool = False,
    ) -> Tensor:
        """Run the left-padded prompts [B, P] and fill the cache (sized ``max_len`` ≥ P columns).

        Returns the next-token logits [B, V], or with ``all_logits`` every position's logits [B, P, V].
        Pad keys are masked; a pad query attends to itself only (no all −inf row, no NaN).
        """
        B, P = input_ids.shape
        self._alloc(B, max_len)
        self.length = 0
        self.key_bias, mask = prefill_masks(attention_mask, max_len, self.embed)
        flat_pos = position_ids.reshape(B * P)
        x = self._run(input_ids, self.cos[flat_pos], self.sin[flat_pos], mask).view(B, P, -1)  # (B, P, d)
        self._step_tables(position_ids, max_len)
        if not all_logits:
            return self._norm(x[:, -1]) @ self.w_lm  # (B, V)
        return (self._norm(x.reshape(B * P, -1)) @ self.w_lm).view(B, P, -1)  # (B, P, V)

    def _step_tables(self, position_ids: Tensor, max_len: int) -> None:
        """After the prompt (or an appended chunk) with positions [B, S]: decode positions continue each
        row's count; the RoPE rows of every future step up to column ``max_len``, gathered once."""
        steps = position_ids[:, -1:] + 1 + torch.arange(max_len - self.length, device=position_ids.device)
        self.cos_steps, self.sin_steps = self.cos[steps], self.sin[steps]  # (B, T, (nh + nkv)·hs)
        self.prompt_len = self.length

    def append(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, max_len: int) -> Tensor:
        """A conversation's next turn (`postrl.lm.rollout.turns`): after `prefill` and `step`, run a left-padded
        chunk [B, S] (mask, positions [B, S]) after the cache's columns, which grow to ``max_len``; the
        next-token logits [B, V]; `step` then continues from the chunk's last position. No gradients."""
        B, S = input_ids.shape
        self.cache.resize(max_len, self.length)
        self.key_bias = grown_key_bias(self.key_bias, self.length, attention_mask, max_len)
        if max_len > self.cos.shape[0]:
            self._rope_tables(max_len)
        mask = extend_mask(self.key_bias, self.length, S)  # (B, 1, S, length + S)
        flat = position_ids.reshape(B * S)
        x = self._run(input_ids, self.cos[flat], self.sin[flat], mask).view(B, S, -1)  # (B, S, d)
        self._step_tables(position_ids, max_len)
        return self._norm(x[:, -1]) @ self.w_lm  # (B, V)

    def forget(self, start: int, keep: Tensor) -> None:
        """Row b keeps only its first ``keep[b]`` columns from ``start`` on (`forget_columns`)."""
        forget_columns(self.key_bias, start, keep, self.length)

    def select_rows(self, index: Tensor) -> None:
        """After `prefill`: row b continues prefilled row ``index[b]`` (a prompt shared by several rows)."""
        self.cache.select_rows(index)
        self.key_bias, self.cos_steps, self.sin_steps = (
            t.index_select(0, index) for t in (self.key_bias, self.cos_steps, self.sin_steps)
        )

    def step(self, tokens: Tensor) -> Tensor:
        """Append one token per row (positions continue from the prompt): tokens [B] → logits [B, V]."""
        t = self.length - self.prompt_len
        mask = self.key_bias[..., : self.length + 1]  # (B, 1, 1, length + 1)
        x = self._run(tokens[:, None], self.cos_steps[:, t], self.sin_steps[:, t], mask)  # (B, d)
        return torch.mm(self._norm(x), self.w_lm)  # (B, V)

    def extend(self, tokens: Tensor) -> Tensor:
        """Append S tokens per row at once, teacher-forced (what S `step` calls would compute): tokens [B, S]
        → logits [B, S, V]."""
        B, S = tokens.shape
        t = self.length - self.prompt_len
        mask = extend_mask(self.key_bias, self.length, S)  # (B, 1, S, length + S)
        cos, sin = (r[:, t : t + S].reshape(B * S, -1) for r in (self.cos_steps, self.sin_steps))
        x = self._run(tokens, cos, sin, mask)  # (B·S, d)
        return torch.mm(self._norm(x), self.w_lm).view(B, S, -1)  # (B, S, V)
