"""``optim.step_in_backward``: each weight's optimiser update inside the backward, its gradient freed at once.

A training step ordinarily holds every trained weight's gradient from the backward until ``optimizer.step()``:
2 bytes per bfloat16 parameter (0.99 GB for a 494M-parameter model), 4 per float32. Run the update of a weight
as soon as its gradient is complete, in a hook that autograd calls after accumulating it
(``Tensor.register_post_accumulate_grad_hook``), and free the gradient there: at any moment the backward then
holds only the gradients still being completed (PyTorch's recipe "How to save memory by fusing the optimizer
step into the backward pass"; torchtune's ``optimizer_in_bwd``).

The update is the optimiser's own (``torch.optim.AdamW`` or `postrl.lm.master_adamw.MasterAdamW`, with its
learning-rate schedule, state and checkpoints unchanged): the hook runs ``optimizer.step()`` with the
parameter groups narrowed to the one weight, so a weight whose gradient is already there but not yet complete
(an output layer's adopted gradient, `postrl.lm.rollout.chunked.adopt_grad`, waiting for its tied input
embedding's part) is not stepped early. A weight whose gradient autograd never accumulates (an untied output
layer whose backward wrote it directly) is stepped by the trainer's own ``optimizer.step()`` after the
backward, as always.

What it costs: the global gradient norm is known only after every weight has stepped, so it cannot be clipped
(``optim.max_grad_norm`` must be null; the norm is still measured and logged), and the step must be one
backward (no gradient accumulation) in one process (DDP and FSDP reduce gradients after the backward).
`postrl.lm.recipe.run_recipe` refuses other configs up front; `check_one_backward` (in `postrl.lm.spine.
accumulate`) and a weight accumulated twice in one step (`StepInBackward._step`) are the nets behind it.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import torch

_BY_ID: weakref.WeakValueDictionary[int, StepInBackward] = weakref.WeakValueDictionary()
"""id(parameter) → the `StepInBackward` that steps it (not an attribute: a deepcopy of the model must not
copy the optimiser)."""


class StepInBackward:
    """Hooks that step ``optimizer`` on each of its parameters as autograd completes the parameter's gradient
    and then free it; keeps the squared norm of the gradients it stepped for `grad_norm`."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.group_of = {p: g for g in optimizer.param_groups for p in g["params"]}
        self.group_ids = [id(g) for g in optimizer.param_groups]
        self.squares: list[torch.Tensor] = []
        self.stepped: set[int] = set()  # ids of the weights stepped since the last `grad_norm`
        for p in self.group_of:
            p.register_post_accumulate_grad_hook(self._step)
            _BY_ID[id(p)] = self

    def _step(self, param: torch.Tensor) -> None:
        if id(param) in self.stepped:  # a second accumulation: the first step took part of the gradient
            raise RuntimeError(
                "optim.step_in_backward: a weight's gradient was accumulated twice in one optimiser step (a "
                "second backward, or a forward whose backward runs in two passes)"
            )
        self.stepped.add(id(param))
        self.squares.append(_square_norm(param.grad))
        self.step_only(param)
        param.grad = None

    @torch.no_grad()
    def step_only(self, param: torch.Tensor) -> None:
        """``optimizer.step()`` on ``param`` alone (its group's hyperparameters and schedule)."""
        groups = self.optimizer.param_groups
        if [id(g) for g in groups] != self.group_ids:  # load_state_dict makes new group dicts
            self.group_of = {p: g for g in groups for p in g["params"]}
            self.group_ids = [id(g) for g in groups]
        mine = self.group_of[param]
        kept = [g["params"] for g in groups]
        for g in groups:
            g["params"] = [param] if g is mine else []
        try:
            self.optimizer.step()
        finally:
            for g, params in zip(groups, kept, strict=True):
                g["params"] = params

    def grad_norm(self, params: Iterable[torch.Tensor]) -> float:
        """The step's global gradient norm: the weights stepped in the backward and those of ``params`` that
        still hold a gradient (stepped by the trainer's ``optimizer.step()``); ends the step (every trainer
        that runs `StepInBackward` measures the norm once per step, through `trainer.clip_grad_norm`)."""
        squares = self.squares + [_square_norm(p.grad) for p in params if p.grad is not None]
        self.squares, self.stepped = [], set()
        return float(torch.stack(squares).sum().sqrt()) if squares else 0.0


NORM_CHUNK = 1 << 20
"""Gradient elements cast to float32 at once for the norm (4 MB): a whole bfloat16 [151,936, 896] gradient
cast at once adds 520 MB to the backward's peak (measured), and so does a list of the chunks' norms (each
0-d result keeps its chunk's float32 copy alive), hence the running sum."""


def _square_norm(grad: torch.Tensor) -> torch.Tensor:
    """‖grad‖² in float32, NORM_CHUNK elements at a time."""
    flat = grad.detach().reshape(-1)
    if flat.dtype == torch.float32:
        return torch.linalg.vector_norm(flat).square()
    total = torch.zeros((), dtype=torch.float32, device=flat.device)
    for chunk in flat.split(NORM_CHUNK):
        total += torch.linalg.vector_norm(chunk, dtype=torch.float32).square()
    return total


def step_in_backward_of(params: Iterable[torch.Tensor]) -> StepInBackward | None:
    """The `StepInBackward` that steps any of ``params``, or None (at once when no run steps in the backward:
    trainers ask at every step)."""
    if not _BY_ID:
        return None
    for p in params:
        found = _BY_ID.get(id(p))
        if found is not None and p in found.group_of:  # (an id may be reused once its tensor is gone)
            return found
    return None


def steps_in_backward(model: torch.nn.Module) -> bool:
    """Whether any of ``model``'s weights step in the backward."""
    return step_in_backward_of(model.parameters()) is not None


def check_one_backward(models: Iterable[torch.nn.Module], backwards: int) -> None:
    """Raise when a step of ``backwards`` backwards would reach a model whose weights step in the backward
    (each backward would step every weight: not the accumulated step). The config checks refuse such runs."""
    if backwards > 1 and any(step_in_backward_of(m.parameters()) for m in models):
        raise RuntimeError(
            f"optim.step_in_backward: this step runs {backwards} backwards; it needs one (no gradient accumulation)"
        )
