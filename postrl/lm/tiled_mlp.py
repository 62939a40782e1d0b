"""Token-tiled MLP blocks (``run.memory.mlp_tile_tokens``): a Llama-family MLP that keeps only its input for
the backward.

A gated MLP, down(act(gate(x)) · up(x)), saves four [tokens, intermediate] tensors for its backward (gate, up,
the activation and the product), 4·I/d times its input's size: 22× for Qwen2.5-0.5B (d 896, I 4864). Under
activation checkpointing they exist for one block at a time, during its recompute; without it, for every block
of the forward. `tile` runs such a block as one autograd node that saves only x and, in the backward, runs the
block again ``mlp_tile_tokens`` rows at a time (each tile's forward and backward, the weights' gradients summed
over tiles), so at most one tile's intermediates exist at once: what Arctic Long Sequence Training's TiledMLP
does (Bekman et al. 2025). The price is one more forward of the MLP per backward. Rows are independent in an
MLP, so the output is the block's own to float rounding, and so are the gradients (summed in another order).

A module is tiled by giving it an instance attribute ``forward`` (a `TiledForward`, a plain object: it is
neither a parameter nor a submodule, so the state dict and `save_pretrained` do not change; `copy.deepcopy` and
pickling carry it to the copy). Without gradients the block runs a tile at a time too where its input has
more rows than a tile (a checkpointed block's first forward, scoring a batch), and as it is otherwise (a decode
step). A SiLU-gated block of plain linear layers (Llama, Qwen, Mistral) runs through `_SiluTiles`: products
written into buffers made once per call, its gradients by hand; any other through the module's own forward and
autograd, a tile at a time.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger(__name__)

GATED_MLP = ("gate_proj", "up_proj", "down_proj", "act_fn")
"""The attributes of the MLP blocks tiled: Llama, Qwen2/3, Mistral, Gemma, SmolLM and their kin."""


def _plain(module: torch.nn.Module, x: Tensor) -> Tensor:
    return type(module).forward(module, x)


def _silu_block(module: torch.nn.Module, x: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
    """(gate, up, down weights) of a block whose projections are bias-free ``nn.Linear`` layers of plain
    tensors of x's dtype and whose activation is SiLU (Llama, Qwen2/3, Mistral, SmolLM): `_SiluTiles` runs it
    on x; None for any other (LoRA-wrapped projections, GELU, a sharded weight, autocast), which the module's
    own forward runs."""
    projections = [getattr(module, name) for name in GATED_MLP[:3]]
    if any(type(m) is not torch.nn.Linear or m.bias is not None for m in projections):
        return None
    if torch.is_autocast_enabled(x.device.type):
        return None
    act = (
        module.act_fn
    )  # torch's SiLU or transformers' (whose forward is F.silu), not replaced on the instance
    silu = isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"
    if not silu or "forward" in vars(act):
        return None
    weights = tuple(m.weight for m in projections)
    if any(type(w) not in (torch.Tensor, torch.nn.Parameter) or w.dtype != x.dtype for w in weights):
        return None
    return weights  # type: ignore[return-value]


class _SiluTiles:
    """A SiLU-gated block, down(silu(x Wg^T) · x Wu^T), a tile at a time through [rows, intermediate] buffers
    made once per call (two for the forward, four for the backward), by products written into them (``out=``)
    and in-place elementwise steps: the
    autograd route makes each tile's intermediates and weight gradients afresh (4 forward, ~8 backward tensors
    of 10 MB at 1,024 rows of Qwen2.5-0.5B, then 3 weight gradients summed over the tiles), which an allocator
    that gives freed memory back (``run.memory.release_freed_mb``) turns into page faults at every tile. The
    backward, with p = a·u, a = silu(g), for ∂L/∂y of a tile:

        ∂L/∂Wd += (∂L/∂y)^T p,   ∂L/∂p = ∂L/∂y Wd,   ∂L/∂u = ∂L/∂p · a,   ∂L/∂g = silu'(g) · ∂L/∂p · u,
        ∂L/∂Wg += (∂L/∂g)^T x,   ∂L/∂Wu += (∂L/∂u)^T x,   ∂L/∂x = ∂L/∂g Wg + ∂L/∂u Wu

    (torch's own ``silu_backward`` for silu'). The weight gradients are summed over tiles in place (``addmm_``)."""

    def __init__(self, weights: tuple[Tensor, Tensor, Tensor], rows: int, n: int, backward: bool) -> None:
        self.wg, self.wu, self.wd = weights
        size = (min(rows, n), self.wg.shape[0])
        self.buffers = [self.wg.new_empty(size) for _ in range(4 if backward else 2)]

    def _gate_up(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """g = x Wg^T, u = x Wu^T for a tile x [n, d], in the first two buffers."""
        g, u = (buffer[: x.shape[0]] for buffer in self.buffers[:2])
        return torch.mm(x, self.wg.t(), out=g), torch.mm(x, self.wu.t(), out=u)

    def forward(self, x: Tensor, out: Tensor) -> None:
        """out [n, d_out] = the block of the tile x [n, d] (no graph)."""
        g, u = self._gate_up(x)
        a = torch.nn.functional.silu(g, inplace=True)
        torch.mm(a.mul_(u), self.wd.t(), out=out)

    def backward(
        self, x: Tensor, dy: Tensor, grads: list[Tensor | None], wants: list[bool], dx: Tensor | None
    ) -> None:
        """Add the tile's ∂L/∂(Wg, Wu, Wd) into ``grads`` (each None until its first tile, then the sum; only
        where ``wants``) and write ∂L/∂x into ``dx`` [n, d] when given."""
        g, u = self._gate_up(x)
        a, b = (buffer[: x.shape[0]] for buffer in self.buffers[2:])
        torch.nn.functional.silu(a.copy_(g), inplace=True)  # g itself is kept for silu'

        def add(k: int, left: Tensor, right: Tensor) -> None:
            if wants[k]:
                grads[k] = left @ right if grads[k] is None else grads[k].addmm_(left, right)

        add(2, dy.t(), torch.mul(a, u, out=b))  # ∂L/∂Wd = dy^T p
        torch.mm(dy, self.wd, out=b)  # ∂L/∂p
        u.mul_(b)  # ∂L/∂a = ∂L/∂p · u
        a.mul_(b)  # ∂L/∂u = ∂L/∂p · a
        torch.ops.aten.silu_backward.grad_input(u, g, grad_input=b)  # ∂L/∂g
        add(0, b.t(), x)
        add(1, a.t(), x)
        if dx is not None:
            torch.mm(b, self.wg, out=dx)
            dx.addmm_(a, self.wu)


def _tiled_output(module: torch.nn.Module, x: Tensor, rows: int) -> Tensor:
    """The block's output for x [..., d] a tile of ``rows`` rows at a time, without a graph."""
    flat = x.reshape(-1, x.shape[-1])
    weights = _silu_block(module, x)
    if weights is None:
        out = torch.cat([_plain(module, tile) for tile in flat.split(rows)])
    else:
        tiles = _SiluTiles(weights, rows, flat.shape[0], backward=False)
        out = flat.new_empty(flat.shape[0], weights[2].shape[0])
        for s, tile in zip(range(0, flat.shape[0], rows), flat.split(rows), strict=True):
            tiles.forward(tile, out[s : s + tile.shape[0]])
    return out.view(*x.shape[:-1], out.shape[-1])


class _TiledMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, module: torch.nn.Module, rows: int, *params: Tensor) -> Tensor:
        ctx.module, ctx.rows, ctx.params = module, rows, params
        ctx.save_for_backward(x)
        with torch.no_grad():
            return _tiled_output(module, x, rows)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (x,) = ctx.saved_tensors
        params, wants_x = ctx.params, ctx.needs_input_grad[0]
        flat_x, flat_g = x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1])
        grad_x = torch.empty_like(flat_x) if wants_x else None
        weights = _silu_block(ctx.module, x)
        if weights is not None:
            grad_params = _silu_backward(weights, params, flat_x, flat_g, grad_x, ctx.rows)
        else:
            grad_params = _autograd_backward(ctx.module, params, flat_x, flat_g, grad_x, ctx.rows)
        return (None if grad_x is None else grad_x.view_as(x), None, None, *grad_params)


def _silu_backward(
    weights: tuple[Tensor, Tensor, Tensor], params: tuple[Tensor, ...], x: Tensor, dy: Tensor,
    grad_x: Tensor | None, rows: int,
) -> list[Tensor | None]:  # fmt: skip
    """∂L/∂params (each of the block's weights or None) and ∂L/∂x into ``grad_x`` by `_SiluTiles`."""
    with torch.no_grad():
        tiles = _SiluTiles(weights, rows, x.shape[0], backward=True)
        wants = [any(w is p for p in params) for w in weights]
        grads: list[Tensor | None] = [None, None, None]
        for s, (tile, tile_grad) in enumerate(zip(x.split(rows), dy.split(rows), strict=True)):
            dx = None if grad_x is None else grad_x[s * rows : s * rows + tile.shape[0]]
            tiles.backward(tile, tile_grad.to(tile.dtype), grads, wants, dx)
    by_weight = {id(w): g for w, g in zip(weights, grads, strict=True)}
    return [by_weight.get(id(p)) for p in params]


def _autograd_backward(
    module: torch.nn.Module, params: tuple[Tensor, ...], x: Tensor, dy: Tensor, grad_x: Tensor | None,
    rows: int,
) -> list[Tensor | None]:  # fmt: skip
    """∂L/∂params and ∂L/∂x into ``grad_x``, each tile's forward run again with a graph (any gated block)."""
    wants_x = grad_x is not None
    grad_params: list[Tensor | None] = [None] * len(params)
    start = 0
    for tile, tile_grad in zip(x.split(rows), dy.split(rows), strict=True):
        tile = tile.detach().requires_grad_(wants_x)
        with torch.enable_grad():
            out = _plain(module, tile)
        inputs = ([tile] if wants_x else []) + list(params)
        grads = torch.autograd.grad(out, inputs, tile_grad, allow_unused=True)
        if wants_x:
            grad_x[start : start + tile.shape[0]] = grads[0]
            grads = grads[1:]
        for k, g in enumerate(grads):
            if g is not None:
                grad_params[k] = g if grad_params[k] is None else grad_params[k].add_(g)
        start += tile.shape[0]
    return grad_params


class TiledForward:
    """The ``forward`` of a tiled MLP block (module docstring): with gradients, `_TiledMLP` over ``rows``-row
    tiles; without, the block's own forward, a tile at a time when x has more rows than one (a checkpointed
    block's first forward, scoring a batch: one tile's intermediates at once there too)."""

    def __init__(self, module: torch.nn.Module, rows: int) -> None:
        self.module, self.rows = module, rows

    def __call__(self, x: Tensor) -> Tensor:
        params = [p for p in self.module.parameters() if p.requires_grad]
        if not torch.is_grad_enabled() or not (x.requires_grad or params):
            if x.numel() // max(x.shape[-1], 1) <= self.rows:
                return _plain(self.module, x)
            return _tiled_output(self.module, x, self.rows)  # e.g. a checkpointed block's first forward
        return _TiledMLP.apply(x, self.module, self.rows, *params)


def tile_mlps(model: torch.nn.Module, rows: int) -> int:
    """Tile every gated MLP block of ``model`` at ``rows`` rows (`GATED_MLP`); returns how many."""
    blocks = [m for m in model.modules() if all(hasattr(m, name) for name in GATED_MLP)]
    for block in blocks:
        block.forward = TiledForward(block, rows)
    return len(blocks)


def tiled(model: torch.nn.Module) -> bool:
    """Whether a block of ``model`` runs tiled (`tile_mlps`)."""
    return any(isinstance(m.__dict__.get("forward"), TiledForward) for m in model.modules())
