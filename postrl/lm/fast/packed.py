"""A padding-free teacher-forced forward for Llama-family models: the fast path of DPO's loss.

A batch in the rollout layout ([B, P + T]: prompts left-padded to P, responses right-padded to T) spends most of
its arithmetic on padding when lengths vary: the built-in ``reviews`` pairs are 8 prompt and 7.5 response tokens
on average but up to 30, so a batch of 32 pairs is ~2,000 padded positions around ~730 real tokens. `PackedLlama`
runs every matrix product of the model (the q/k/v, output and SwiGLU projections, the output layer and its
log-softmax) on the real tokens only, packed into one [N, d] matrix (as TRL's ``padding_free``), and each
distinct prompt once (the prefix trick of `postrl.lm.rollout.forwards.SharedPrefixForward`: a DPO pair's chosen
and rejected continue from one prompt forward). Only the attention sees a padded layout: per layer the packed
q, k, v are scattered into the prompts' [U, P] and the responses' [B, T − 1] grids, attention runs there
with the same additive masks as `FastLlama` (pad keys −inf; a pad query attends to itself, so no NaN) and its
output is gathered back to the packed rows (attention is the smaller part of a step; the products the larger).

It computes what `FastLlama`'s prefill + extend compute, on fewer rows: the same logits at every real response
position, to float rounding (tests/lm/test_packed_forward.py: logits and gradients equal to 1e-12 in float64
against `postrl.lm.rollout.forwards.FusedForward`, the same fused weights on the padded batch). The weights are
folded from the LIVE parameters under the caller's grad mode: build one per forward
(`postrl.lm.rollout.packed_forward.PackedForward` does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from postrl.lm.fast.gpt2 import FastGPT2
from postrl.lm.fast.llama import FastLlama, extend_mask, prefill_masks


def distinct_prompts(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Left-padded prompts ids, mask [B, P] → (distinct ids [U, P], their mask [U, P], row → distinct [B])."""
    P = ids.shape[1]
    unique, inverse = torch.unique(torch.cat((ids, mask.to(ids.dtype)), dim=1), dim=0, return_inverse=True)
    return unique[:, :P], unique[:, P:].to(mask.dtype), inverse


@dataclass
class PackedLayout:
    """Where the real tokens of a batch sit. Packed rows are the prompts' real tokens (distinct prompts, row
    by row), then the response tokens that predict a real one (row by row); ``targets`` index the real
    response tokens of the [B, T] grid, ``sources`` the packed row whose output predicts each of them."""

    prompt_index: Tensor  # (Np,) flat index into the [U, P] prompt grid
    response_index: Tensor  # (Nr,) flat index into the [B, T − 1] grid of response inputs
    tokens: Tensor  # (Np + Nr,) token ids, packed
    positions: Tensor  # (Np + Nr,) RoPE positions, packed
    targets: Tensor  # (Nt,) flat index into [B, T] of the real response tokens
    sources: Tensor  # (Nt,) packed row predicting each target
    inverse: Tensor  # (B,) row → its distinct prompt


def packed_layout(
    prompt_ids: Tensor, prompt_mask: Tensor, inverse: Tensor, response_ids: Tensor, response_mask: Tensor
) -> PackedLayout:
    """The packing of distinct prompts [U, P] (left-padded; ``inverse`` [B]: row → its prompt) and responses
    [B, T] with their attention mask (right-padded: 1 … 1 0 … 0 per row, else `ValueError`)."""
    B, T = response_ids.shape
    valid = response_mask.bool()  # (B, T)
    if T > 1 and bool((valid[:, 1:] & ~valid[:, :-1]).any()):
        raise ValueError("packed forward: every response must be right-padded (a real token after a pad)")
    prompt_valid = prompt_mask.bool()
    prompt_index = prompt_valid.flatten().nonzero().squeeze(1)  # (Np,)
    # response input t is needed when token t + 1 is real (each row's last real token predicts nothing)
    response_index = valid[:, 1:].flatten().nonzero().squeeze(1)  # (Nr,)
    prompt_pos = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)  # (U, P), as position_ids_from_mask
    steps = torch.arange(T - 1, device=response_ids.device)
    response_pos = prompt_pos[inverse, -1:] + 1 + steps  # (B, T − 1): continues each row's prompt
    Np = prompt_index.shape[0]
    # the packed row of each prompt's last token (predicts response token 0), and of each response input
    last = prompt_valid.sum(1).cumsum(0) - 1  # (U,)
    size = max(B * (T - 1), 1)  # not empty: with T = 1 the torch.where below still reads row 0
    row_of = torch.full((size,), -1, dtype=torch.long, device=response_ids.device)
    row_of[response_index] = torch.arange(response_index.shape[0], device=row_of.device) + Np
    targets = valid.flatten().nonzero().squeeze(1)  # (Nt,)
    b, t = targets // T, targets % T
    sources = torch.where(t == 0, last[inverse[b]], row_of[(b * (T - 1) + t - 1).clamp(min=0)])
    return PackedLayout(
        prompt_index=prompt_index,
        response_index=response_index,
        tokens=torch.cat(
            (prompt_ids.flatten()[prompt_index], response_ids[:, :-1].flatten()[response_index])
        ),
        positions=torch.cat((prompt_pos.flatten()[prompt_index], response_pos.flatten()[response_index])),
        targets=targets,
        sources=sources,
        inverse=inverse,
    )


def _scatter(rows: Tensor, index: Tensor, n: int) -> Tensor:
    """rows [k, D] placed at ``index`` of an [n, D] zero grid (differentiable in ``rows``)."""
    return rows.new_zeros(n, rows.shape[1]).index_copy(0, index, rows)


def _heads(grid: Tensor, rows: int, heads: tuple[int, int, int]) -> tuple[Tensor, Tensor, Tensor]:
    """A grid [rows·L, (nh + 2·nkv)·hs] → q [rows, nh, L, hs], k and v [rows, nkv, L, hs]."""
    nh, nkv, hs = heads
    g = grid.view(rows, -1, nh + 2 * nkv, hs).transpose(1, 2)  # (rows, heads, L, hs)
    return g[:, :nh], g[:, nh : nh + nkv], g[:, nh + nkv :]


def packed_attention(
    y: Tensor, heads: tuple[int, int, int], lay: PackedLayout, dims: tuple[int, int, int, int],
    prompt_att: Tensor, response_att: Tensor, scale: float | None = None,
) -> Tensor:  # fmt: skip
    """Attention of one layer from its packed [q | k | v] rows y [N, (nh + 2·nkv)·hs] (``heads`` = (nh, nkv,
    hs); ``dims`` = (U, P, B, S)): the prompts on their [U, P] grid, the responses on [B, S] after their
    prompt's keys and values, with the additive masks ``prompt_att`` [U, 1, P, P] and ``response_att``
    [B, 1, S, P + S]; ``scale``: the scores' factor (None: 1/√hs). Returns [N, nh·hs]."""
    nh, nkv, hs = heads
    U, P, B, S = dims
    Np = lay.prompt_index.shape[0]
    q, k, v = _heads(_scatter(y[:Np], lay.prompt_index, U * P), U, heads)  # (U, heads, P, hs)
    gqa = nh != nkv
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=prompt_att, scale=scale, enable_gqa=gqa)
    outs = [out.transpose(1, 2).reshape(U * P, nh * hs).index_select(0, lay.prompt_index)]  # (Np, nh·hs)
    if S > 0:
        q, k_r, v_r = _heads(_scatter(y[Np:], lay.response_index, B * S), B, heads)  # (B, heads, S, hs)
        # (B, nkv, P + S, hs): the row's prompt, then itself
        k = torch.cat((k.index_select(0, lay.inverse), k_r), dim=2)
        v = torch.cat((v.index_select(0, lay.inverse), v_r), dim=2)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=response_att, scale=scale, enable_gqa=gqa
        )  # (B, nh, S, hs)
        outs.append(out.transpose(1, 2).reshape(B * S, nh * hs).index_select(0, lay.response_index))
    return torch.cat(outs)  # (N, nh·hs)


class PackedLlama(FastLlama):
    """`FastLlama`'s fused weights run padding-free over a batch in the rollout layout (module docstring)."""

    def response_logits(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        inverse: Tensor,
        response_ids: Tensor,
        response_mask: Tensor,
    ) -> tuple[Tensor, PackedLayout]:
        """(logits [Nt, V] of every real response token, the layout: ``targets`` says which). Distinct
        prompts [U, P] with ``inverse`` [B] (row → prompt), responses [B, T] with their attention mask."""
        U, P = prompt_ids.shape
        B, T = response_ids.shape
        lay = packed_layout(prompt_ids, prompt_mask, inverse, response_ids, response_mask)
        self._alloc(1, P + T)  # the RoPE tables (cos, sin) of P + T positions
        key_bias, prompt_att = prefill_masks(prompt_mask, P + T - 1, self.embed)
        response_att = extend_mask(key_bias[inverse], P, T - 1)  # (B, 1, T − 1, P + T − 1)
        cos, sin = self.cos[lay.positions], self.sin[lay.positions]  # (N, (nh + nkv)·hs)
        x = F.embedding(lay.tokens, self.embed)  # (N, d)
        for layer in self.layers:
            y = torch.mm(self._norm(x), layer.w_qkv)  # (N, (nh + 2·nkv)·hs)
            y = y if layer.b_qkv is None else y + layer.b_qkv
            att = self._packed_attention(y, cos, sin, lay, (U, P, B, T - 1), prompt_att, response_att)
            x = self._feed_forward(layer, x, att)  # (N, d)
        hidden = self._norm(x[lay.sources])  # (Nt, d)
        return hidden @ self.w_lm, lay  # (Nt, V)

    def _packed_attention(
        self, y: Tensor, cos: Tensor, sin: Tensor, lay: PackedLayout, dims: tuple[int, int, int, int],
        prompt_att: Tensor, response_att: Tensor,
    ) -> Tensor:  # fmt: skip
        """RoPE and attention of one layer from its packed projections y [N, (nh + 2·nkv)·hs]
        (`packed_attention`). Returns [N, nh·hs]."""
        nh, nkv, hs = self.n_heads, self.n_kv, self.head_dim
        qk_dim = (nh + nkv) * hs
        qk = y[:, :qk_dim]
        swapped = qk.unflatten(-1, (nh + nkv, 2, hs // 2)).flip(-2).flatten(-3)  # halves of each head swapped
        y = torch.cat((torch.addcmul(qk * cos, swapped, sin), y[:, qk_dim:]), dim=1)  # RoPE on q and k
        return packed_attention(y, (nh, nkv, hs), lay, dims, prompt_att, response_att)

    def _feed_forward(self, layer: Any, x: Tensor, att: Tensor) -> Tensor:
        """Output projection and residual, then the SwiGLU block and its residual: x [N, d] → [N, d]."""
        x = torch.addmm(x, att, layer.w_o)
        x = x if layer.b_o is None else x + layer.b_o
        gate_up = torch.mm(self._norm(x), layer.w_gate_up)  # (N, 2I)
        gate_up = gate_up if layer.b_gate_up is None else gate_up + layer.b_gate_up
        gate, up = gate_up.chunk(2, dim=-1)
        x = torch.addmm(x, F.silu(gate) * up, layer.w_down)
        return x if layer.b_down is None else x + layer.b_down


class PackedGPT2(FastGPT2):
    """`FastGPT2`'s weights run padding-free over a batch in the rollout layout: what `PackedLlama` does for
    Llama (module docstring), with GPT-2's learned positions, LayerNorm and GELU block."""

    def response_logits(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        inverse: Tensor,
        response_ids: Tensor,
        response_mask: Tensor,
    ) -> tuple[Tensor, PackedLayout]:
        """As `PackedLlama.response_logits`: (logits [Nt, V] of every real response token, the layout)."""
        U, P = prompt_ids.shape
        B, T = response_ids.shape
        lay = packed_layout(prompt_ids, prompt_mask, inverse, response_ids, response_mask)
        last = int(lay.positions.max()) if lay.positions.numel() else 0
        if last >= self.wpe.shape[0]:
            raise ValueError(f"position {last} is beyond the model's n_positions={self.wpe.shape[0]}")
        key_bias, prompt_att = prefill_masks(prompt_mask, P + T - 1, self.wte)
        response_att = extend_mask(key_bias.index_select(0, inverse), P, T - 1)  # (B, 1, T − 1, P + T − 1)
        heads, dims = (self.n_heads, self.n_heads, self.head_dim), (U, P, B, T - 1)
        x = F.embedding(lay.tokens, self.wte) + F.embedding(lay.positions, self.wpe)  # (N, d)
        for i, blk in enumerate(self.blocks):
            qkv = torch.addmm(blk.b_qkv, self._norm(x, blk.ln_1), blk.w_qkv)  # (N, 3d): [q | k | v]
            att = packed_attention(qkv, heads, lay, dims, prompt_att, response_att, self.scales[i])
            x = torch.addmm(x, att, blk.w_o).add_(blk.b_o)  # residual
            h = self._act(blk, torch.addmm(blk.b_fc, self._norm(x, blk.ln_2), blk.w_fc))  # (N, I)
            x = torch.addmm(x, h, blk.w_proj).add_(blk.b_proj)
        return self._logits(x.index_select(0, lay.sources)), lay  # (Nt, V)
