"""A decode-only forward for GPT-2 causal LMs: the second fast path of `postrl.lm.rollout`.

The same idea as `postrl.lm.fast.llama` (read that docstring first): sampling short responses from a small
model on a CPU is dominated by per-operation overhead, and the stock Hugging Face forward spends most of a
decode step building masks, growing a dynamic cache and walking module wrappers. `FastGPT2` owns the decode
forward:

- LayerNorm with its affine part in the one kernel, reading the module's own weight and bias: nothing is copied
  or folded when a decoder is built (a decoder is built three times per GRPO step; folding the affine into
  the next projection made that build cost three times as much for no gain per token: benchmarks/grpo.py);
- GPT-2's ``Conv1D`` weights are already (in, out): ``addmm`` takes them as they are, the residual add fused in;
- learned absolute positions: every future step's ``wpe`` rows are gathered once per call (a row's positions
  count its real tokens only, so left padding does not shift them);
- a KV cache preallocated to ``P + T`` positions, written in place, and one additive key mask built once.

It reads the LIVE parameters (references, no copies), and still is built anew for every `generate` call as
`FastLlama` is. Like it, it runs under the caller's grad mode (teacher-forced training forwards take it,
`postrl.lm.rollout.forwards.FusedForward`). `gpt2_unsupported_reason` says why a model must take the
Hugging Face fallback instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import GPT2LMHeadModel
from transformers.pytorch_utils import Conv1D

from postrl.lm.fast.adapters import any_lora
from postrl.lm.fast.llama import KVCache, extend_mask, forget_columns, grown_key_bias, prefill_masks

# activations computed here as one kernel; any other is the model's own module (correct, a little slower)
TANH_GELUS = frozenset({"gelu_new", "gelu_pytorch_tanh", "gelu_fast"})
_TWO_SQRT_2_OVER_PI = 2 * math.sqrt(2 / math.pi)


def gpt2_unsupported_reason(model: torch.nn.Module) -> str | None:
    """None when `FastGPT2` reproduces ``model``'s forward, else why not (the caller falls back to HF)."""
    if not isinstance(model, GPT2LMHeadModel):
        return f"{type(model).__name__} is not a GPT2LMHeadModel"
    cfg = model.config
    dropout = max(cfg.attn_pdrop, cfg.resid_pdrop, cfg.embd_pdrop)
    projections = [getattr(part, name) for b in model.transformer.h for part, names in
                   ((b.attn, ("c_attn", "c_proj")), (b.mlp, ("c_fc", "c_proj"))) for name in names]  # fmt: skip
    checks = {
        "add_cross_attention is set": cfg.add_cross_attention,
        f"dtype {model.dtype} is not float32": model.dtype != torch.float32,
        "dropout is active": model.training and dropout > 0,
        # the fast GPT-2 path reads Conv1D weights only; merging adapters is FastLlama's (adapters.py)
        "LoRA adapters wrap its projections (fast GPT-2 reads plain Conv1D weights only)": any_lora(
            [*projections, model.lm_head]
        ),
        "a projection is not a plain Conv1D": any(type(m) is not Conv1D for m in projections),
        "lm_head is not a plain Linear without bias": (
            type(model.lm_head) is not torch.nn.Linear or model.lm_head.bias is not None
        ),
    }
    return next((reason for reason, failed in checks.items() if failed), None)


def tanh_gelu(x: Tensor) -> Tensor:
    """GELU's tanh approximation ½x(1 + tanh u), u = √(2/π)(x + 0.044715x³), as x·σ(2u) (½(1 + tanh u) = σ(2u)):
    the same function to float32 rounding, and on this CPU half the time of ``F.gelu(approximate="tanh")``
    forward and a fifth less with its backward (tanh is the slow kernel there, sigmoid is not)."""
    u = (x * x).mul_(0.044715 * _TWO_SQRT_2_OVER_PI).add_(_TWO_SQRT_2_OVER_PI).mul_(x)  # 2u
    return torch.sigmoid(u).mul(x)


@dataclass
class _Block:
    """References to one ``GPT2Block``'s weights, (in, out) for ``addmm`` (``Conv1D`` stores them so)."""

    ln_1: tuple[Tensor, Tensor]  # (weight, bias)
    w_qkv: Tensor  # (d, 3d): [q | k | v]
    b_qkv: Tensor  # (3d,)
    w_o: Tensor  # (d, d)
    b_o: Tensor
    ln_2: tuple[Tensor, Tensor]
    w_fc: Tensor  # (d, I)
    b_fc: Tensor
    w_proj: Tensor  # (I, d)
    b_proj: Tensor
    act: torch.nn.Module


def _block(block: torch.nn.Module) -> _Block:
    att, mlp = block.attn, block.mlp
    return _Block(
        (block.ln_1.weight, block.ln_1.bias),
        att.c_attn.weight,
        att.c_attn.bias,
        att.c_proj.weight,
        att.c_proj.bias,
        (block.ln_2.weight, block.ln_2.bias),
        mlp.c_fc.weight,
        mlp.c_fc.bias,
        mlp.c_proj.weight,
        mlp.c_proj.bias,
        mlp.act,
    )


class FastGPT2:
    """Prefill + incremental decode for a `GPT2LMHeadModel`: the layout and use of
    `postrl.lm.fast.llama.FastLlama` (``prefill`` once, then ``step`` per token), positions from ``wpe``."""

    def __init__(self, model: torch.nn.Module, checked: bool = False) -> None:
        """``checked``: the caller has just seen `gpt2_unsupported_reason` return None (it is not run again)."""
        reason = None if checked else gpt2_unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"FastGPT2 cannot run this model: {reason}")
        cfg, body = model.config, model.transformer
        self.n_heads, self.d = cfg.num_attention_heads, cfg.hidden_size
        self.head_dim = self.d // self.n_heads
        self.eps = cfg.layer_norm_epsilon
        self.tanh_gelu = cfg.activation_function in TANH_GELUS
        scale = self.head_dim**-0.5 if cfg.scale_attn_weights else 1.0
        # scale_attn_by_inverse_layer_idx divides block i's scores by i + 1 (a stability option of the config)
        self.scales = [
            scale / (i + 1 if cfg.scale_attn_by_inverse_layer_idx else 1) for i in range(cfg.n_layer)
        ]
        # the parameters themselves: under the caller's grad mode the backward reaches them directly
        self.wte, self.wpe = body.wte.weight, body.wpe.weight
        self.blocks = [_block(block) for block in body.h]
        self.ln_f = (body.ln_f.weight, body.ln_f.bias)
        self.w_lm = model.lm_head.weight.t()  # (d, V), a view
        self.length = 0  # cache columns filled so far

    # ---- pieces -----------------------------------------------------------------------------------------
    def _norm(self, x: Tensor, affine: tuple[Tensor, Tensor]) -> Tensor:
        """LayerNorm over the last dimension with ``affine`` = (γ, β)."""
        return F.layer_norm(x, (self.d,), affine[0], affine[1], self.eps)

    def _act(self, block: _Block, x: Tensor) -> Tensor:
        return tanh_gelu(x) if self.tanh_gelu else block.act(x)

    def _attention(self, i: int, qkv: Tensor, mask: Tensor, batch: int) -> Tensor:
        """Cache write and attention of block ``i`` from qkv [B·S, 3d] for tokens in cache columns
        ``length … length + S − 1``. Returns [B·S, d]."""
        nh, hs, d = self.n_heads, self.head_dim, self.d
        B, S = batch, qkv.shape[0] // batch
        # unbind, not three selects: the same views, and one backward node (a stack) instead of three that
        # each write into zeros of qkv's size and two adds
        q, k, v = qkv.view(B, S, 3, nh, hs).unbind(2)  # (B, S, nh, hs) each
        k, v = self.cache.write(i, k, v, self.length)  # (B, nh, end, hs)
        q = q.transpose(1, 2)  # (B, nh, S, hs)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scales[i])  # (B, nh, S, hs)
        return att.transpose(1, 2).reshape(B * S, d)

    def _run(self, x: Tensor, mask: Tensor, batch: int) -> Tensor:
        """Every block on embeddings x [B·S, d]; mask: additive [B, 1, S, length + S] → final hidden [B·S, d]
        (before ln_f)."""
        for i, blk in enumerate(self.blocks):
            qkv = torch.addmm(blk.b_qkv, self._norm(x, blk.ln_1), blk.w_qkv)  # (B·S, 3d)
            x = torch.addmm(x, self._attention(i, qkv, mask, batch), blk.w_o).add_(blk.b_o)  # residual
            h = self._act(blk, torch.addmm(blk.b_fc, self._norm(x, blk.ln_2), blk.w_fc))  # (B·S, I)
            x = torch.addmm(x, h, blk.w_proj).add_(blk.b_proj)
        self.length += x.shape[0] // batch
        return x

    def _logits(self, x: Tensor) -> Tensor:
        return torch.mm(self._norm(x, self.ln_f), self.w_lm)  # (N, V); GPT-2's lm_head has no bias

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

        Returns the next-token logits [B, V], or with ``all_logits`` every position's logits [B, P, V]
        (masks: `postrl.lm.fast.llama.prefill_masks`).
        """
        B, P = input_ids.shape
        self._check_positions(position_ids, max_len - P)
        self.cache = KVCache(len(self.blocks), (B, self.n_heads, max_len, self.head_dim), self.wte)
        self.length = 0
        self.key_bias, mask = prefill_masks(attention_mask, max_len, self.wte)  # (B, 1, 1, L), (B, 1, P, P)
        x = F.embedding(input_ids, self.wte) + F.embedding(position_ids, self.wpe)  # (B, P, d)
        x = self._run(x.view(B * P, self.d), mask, B).view(B, P, self.d)
        self._step_positions(position_ids, max_len)
        if not all_logits:
            return self._logits(x[:, -1])  # (B, V)
        return self._logits(x.view(B * P, self.d)).view(B, P, -1)  # (B, P, V)

    def _check_positions(self, position_ids: Tensor, steps: int) -> None:
        """`generate` feeds at most ``steps`` − 1 tokens through `step` after ``position_ids`` [B, S]: the
        largest position it can reach must have a ``wpe`` row."""
        last = int(position_ids[:, -1].max()) + steps - 1
        if last >= self.wpe.shape[0]:
            raise ValueError(f"position {last} is beyond the model's n_positions={self.wpe.shape[0]}")

    def _step_positions(self, position_ids: Tensor, max_len: int) -> None:
        """Decode positions continue each row's count after ``position_ids`` [B, S]: the wpe rows of every
        future step up to column ``max_len``, gathered once."""
        steps = position_ids[:, -1:] + 1 + torch.arange(max_len - self.length, device=position_ids.device)
        self.pos_steps = F.embedding(steps.clamp(max=self.wpe.shape[0] - 1), self.wpe)  # (B, T, d)
        self.prompt_len = self.length

    def append(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, max_len: int) -> Tensor:
        """A conversation's next turn, as `postrl.lm.fast.llama.FastLlama.append`: a left-padded chunk [B, S]
        after the cache's columns (grown to ``max_len``); next-token logits [B, V]. No gradients."""
        B, S = input_ids.shape
        self._check_positions(position_ids, max_len - self.length - S)
        self.cache.resize(max_len, self.length)
        self.key_bias = grown_key_bias(self.key_bias, self.length, attention_mask, max_len)
        mask = extend_mask(self.key_bias, self.length, S)  # (B, 1, S, length + S)
        x = F.embedding(input_ids, self.wte) + F.embedding(position_ids, self.wpe)  # (B, S, d)
        x = self._run(x.view(B * S, self.d), mask, B).view(B, S, self.d)
        self._step_positions(position_ids, max_len)
        return self._logits(x[:, -1])  # (B, V)

    def forget(self, start: int, keep: Tensor) -> None:
        """Row b keeps only its first ``keep[b]`` columns from ``start`` on (`forget_columns`)."""
        forget_columns(self.key_bias, start, keep, self.length)

    def select_rows(self, index: Tensor) -> None:
        """After `prefill`: row b continues prefilled row ``index[b]`` (a prompt shared by several rows)."""
        self.cache.select_rows(index)
        self.key_bias, self.pos_steps = (
            self.key_bias.index_select(0, index),
            self.pos_steps.index_select(0, index),
        )

    def step(self, tokens: Tensor) -> Tensor:
        """Append one token per row (positions continue from the prompt): tokens [B] → logits [B, V]."""
        t = self.length - self.prompt_len
        mask = self.key_bias[..., : self.length + 1]  # (B, 1, 1, length + 1)
        x = F.embedding(tokens, self.wte).add_(self.pos_steps[:, t])  # (B, d)
        return self._logits(self._run(x, mask, tokens.shape[0]))  # (B, V)

    def extend(self, tokens: Tensor) -> Tensor:
        """Append S tokens per row at once, teacher-forced (what S `step` calls would compute): tokens [B, S]
        → logits [B, S, V]."""
        B, S = tokens.shape
        t = self.length - self.prompt_len
        mask = extend_mask(self.key_bias, self.length, S)  # (B, 1, S, length + S)
        x = F.embedding(tokens, self.wte).add_(self.pos_steps[:, t : t + S])  # (B, S, d)
        return self._logits(self._run(x.view(B * S, self.d), mask, B)).view(B, S, -1)  # (B, S, V)
