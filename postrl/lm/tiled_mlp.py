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
pickling carry it to the copy). Without gradients (sampling, scoring) the block runs as it is.
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


class _TiledMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, module: torch.nn.Module, rows: int, *params: Tensor) -> Tensor:
        ctx.module, ctx.rows, ctx.params = module, rows, params
        ctx.save_for_backward(x)
        with torch.no_grad():
            flat = x.reshape(-1, x.shape[-1])
            out = torch.cat([_plain(module, tile) for tile in flat.split(rows)])
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (x,) = ctx.saved_tensors
        params, wants_x = ctx.params, ctx.needs_input_grad[0]
        flat_x, flat_g = x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1])
        grad_x = torch.empty_like(flat_x) if wants_x else None
        grad_params: list[Tensor | None] = [None] * len(params)
        start = 0
        for tile, tile_grad in zip(flat_x.split(ctx.rows), flat_g.split(ctx.rows), strict=True):
            tile = tile.detach().requires_grad_(wants_x)
            with torch.enable_grad():
                out = _plain(ctx.module, tile)
            inputs = ([tile] if wants_x else []) + list(params)
            grads = torch.autograd.grad(out, inputs, tile_grad, allow_unused=True)
            if wants_x:
                grad_x[start : start + tile.shape[0]] = grads[0]
                grads = grads[1:]
            for k, g in enumerate(grads):
                if g is not None:
                    grad_params[k] = g if grad_params[k] is None else grad_params[k].add_(g)
            start += tile.shape[0]
        return (None if grad_x is None else grad_x.view_as(x), None, None, *grad_params)


class TiledForward:
    """The ``forward`` of a tiled MLP block (module docstring): with gradients, `_TiledMLP` over ``rows``-row
    tiles; without, the block's own forward."""

    def __init__(self, module: torch.nn.Module, rows: int) -> None:
        self.module, self.rows = module, rows

    def __call__(self, x: Tensor) -> Tensor:
        params = [p for p in self.module.parameters() if p.requires_grad]
        if not torch.is_grad_enabled() or not (x.requires_grad or params):
            return _plain(self.module, x)
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
