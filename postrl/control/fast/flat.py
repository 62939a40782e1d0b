"""All parameters of a few small networks as views of ONE flat tensor, their gradients as views of one flat
gradient.

For the 64×64 MLPs of classic control, the work around a gradient step costs as much as the step itself when
it is done tensor by tensor: zeroing a dozen gradients, a global-norm clip over a dozen tensors and Adam over
a dozen tensors are each a dozen small kernel launches. With one flat parameter each is one or two ops
(``benchmarks/control.py`` measures the effect on PPO's steps per second). The modules keep their own
``nn.Parameter`` objects, so forward passes, ``state_dict`` and checkpoints are unchanged; only the
optimizer sees the flat tensor.

Autograd accumulates into an existing ``.grad`` in place, so backward writes straight into the flat
gradient as long as nobody replaces a parameter's ``.grad``: use :meth:`FlatParameters.zero_grad`, never
``optimizer.zero_grad(set_to_none=True)`` or ``module.zero_grad()`` (``zero_grad`` here re-attaches the
views if something did).

Checkpoints: :class:`FlatAdam` saves Adam's state as one flat tensor (as postrl always has), and PPO's
reference path (``torch.optim.Adam`` over the same parameters) one tensor per parameter. Each loads the
other's: :meth:`FlatAdam.load_state_dict` concatenates a per-parameter state, :func:`split_flat_state` (a
``torch.optim.Optimizer`` load pre-hook) splits a flat one. The numbers are the same either way, so a run
resumes exactly whichever path wrote its checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

__all__ = ["FlatAdam", "FlatParameters", "split_flat_state"]


class FlatParameters:
    """The parameters of ``modules`` re-homed into one flat ``nn.Parameter`` (``.param``) with a flat
    ``.grad``; hand ``.param`` to the optimizer."""

    def __init__(self, modules: Iterable[nn.Module]):
        self.params = [p for module in modules for p in module.parameters()]
        self.param = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in self.params]))
        self.param.grad = torch.zeros_like(self.param)
        self._grads = []
        offset = 0
        for p in self.params:
            n = p.numel()
            p.data = self.param.data[offset : offset + n].view_as(p)
            self._grads.append(self.param.grad[offset : offset + n].view_as(p))
            offset += n
        self._attach_grads()

    def _attach_grads(self) -> None:
        for p, grad in zip(self.params, self._grads, strict=True):
            p.grad = grad

    def zero_grad(self) -> None:
        """Zero the flat gradient (one op), re-attaching the per-parameter views if one was replaced."""
        if any(p.grad is not grad for p, grad in zip(self.params, self._grads, strict=True)):
            self._attach_grads()
        self.param.grad.zero_()

    def clip_divisor(self, max_norm: float) -> torch.Tensor:
        """The clip of ``nn.utils.clip_grad_norm_`` as a divisor, for :meth:`FlatAdam.update`'s ``grad_scale``:
        max(1, (‖g‖₂ + 1e-6) / max_norm), so that g / divisor = g · min(1, max_norm / (‖g‖₂ + 1e-6)) to float32
        rounding. Two small ops, and the division rides in Adam's kernel instead of a pass over the gradient."""
        norm = torch.linalg.vector_norm(self.param.grad)
        return torch.add(1e-6 / max_norm, norm, alpha=1.0 / max_norm).clamp_min_(1.0)

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """``nn.utils.clip_grad_norm_`` on the flat gradient: scale it by min(1, max_norm / (‖g‖₂ + 1e-6));
        returns ‖g‖₂ before clipping."""
        grad = self.param.grad
        norm = torch.linalg.vector_norm(grad)
        grad.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        return norm


class FlatAdam(torch.optim.Adam):
    """``torch.optim.Adam`` (same hyperparameters, state and checkpoint format) for the ONE flat parameter of
    :class:`FlatParameters`, stepped by torch's fused Adam kernel without the optimizer's Python bookkeeping.

    ``torch.optim.Adam.step`` spends several times the cost of the update itself in Python per call on a
    10k-element tensor, and the update written out as single-tensor ops is ~8 kernels; the fused kernel is one
    (benchmarks/control.py). PPO on CartPole takes 20 such steps per 256 env steps. The kernel is torch's own
    (``torch.optim.Adam(fused=True)``; Kingma & Ba 2015, Algorithm 1), so results match it on the one tensor
    exactly, and over the separate parameters (the kernel's vectorised body and scalar tail then fall
    elsewhere) and ``torch.optim.Adam(foreach=False)`` to float32 rounding (tests/control/test_flat.py,
    test_ppo_paths.py).
    """

    def __init__(self, param: nn.Parameter, lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
        super().__init__([param], lr=lr, betas=betas, eps=eps, fused=True)
        # what the kernel updates in place: a detached view, so no torch.no_grad() is needed per call
        self._detached = param.detach()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """``torch.optim.Adam.load_state_dict``, also of a state with one entry per parameter (a checkpoint of
        ``torch.optim.Adam`` over the parameters that :class:`FlatParameters` re-homed, in their order)."""
        super().load_state_dict(_joined(state_dict))

    def step(self, closure=None):  # noqa: D102 - torch.optim.Optimizer.step
        if closure is not None:
            raise ValueError("FlatAdam.step takes no closure")
        self.update()

    def update(self, grad_scale: torch.Tensor | None = None) -> None:
        """``step`` without ``torch.optim.Optimizer``'s per-call hook wrapper (optimizer hooks and a
        profiler range), for the training loops in this package. ``grad_scale`` (a 0-d tensor): the kernel
        steps with grad / grad_scale and leaves that in ``.grad`` (:meth:`FlatParameters.clip_divisor`)."""
        group = self.param_groups[0]
        (param,) = group["params"]
        state = self.state[param]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(param)
            state["exp_avg_sq"] = torch.zeros_like(param)
        beta1, beta2 = group["betas"]
        state["step"] += 1  # torch.optim.Adam(fused=True) counts the step before the kernel, as here
        torch._fused_adam_(
            [self._detached],
            [param.grad],
            [state["exp_avg"]],
            [state["exp_avg_sq"]],
            [],
            [state["step"]],
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            weight_decay=0.0,
            eps=group["eps"],
            amsgrad=False,
            maximize=False,
            grad_scale=grad_scale,
        )


_PER_ELEMENT = ("exp_avg", "exp_avg_sq")  # Adam's state that has a parameter's shape (the rest: "step")


def _joined(state_dict: dict[str, Any]) -> dict[str, Any]:
    """A ``torch.optim.Adam`` state dict of one group over several parameters as one over their flat
    concatenation (unchanged when it already has one parameter)."""
    (group,) = state_dict["param_groups"]
    ids = group["params"]
    if len(ids) == 1:
        return state_dict
    states = [state_dict["state"][i] for i in ids if i in state_dict["state"]]
    state = {}
    if states:  # none before the first step
        if len(states) != len(ids):
            raise ValueError("an Adam state with some parameters stepped and others not cannot be flattened")
        state[0] = {"step": states[0]["step"]}
        for key in _PER_ELEMENT:
            state[0][key] = torch.cat([s[key].reshape(-1) for s in states])
    return {"state": state, "param_groups": [{**group, "params": [0]}]}


def split_flat_state(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    """A load pre-hook (``optimizer.register_load_state_dict_pre_hook``) for ``torch.optim.Adam`` over several
    parameters: a state saved by :class:`FlatAdam` over their flat concatenation, in the same order, is split
    into one entry per parameter; any other state is returned unchanged."""
    (group,) = optimizer.param_groups
    (saved,) = state_dict["param_groups"]
    params = group["params"]
    if len(saved["params"]) != 1 or len(params) == 1:
        return state_dict
    state = {}
    flat = state_dict["state"].get(saved["params"][0])
    if flat is not None:
        sizes = [p.numel() for p in params]
        parts = {key: flat[key].split(sizes) for key in _PER_ELEMENT}
        for i, p in enumerate(params):
            state[i] = {"step": flat["step"].clone()}
            state[i].update({key: parts[key][i].view_as(p).clone() for key in _PER_ELEMENT})
    return {"state": state, "param_groups": [{**saved, "params": list(range(len(params)))}]}
