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

A tied output layer (`postrl.lm.rollout.chunked.adopt_grad`) would hold its [vocabulary, hidden] gradient
from the first node of the backward to the last, where the input embedding adds its rows (272 MB at
Qwen2.5-0.5B's 151,936 × 896 in bfloat16). Only the rows of the tokens the step's forward embedded get that
second part, so the rest of the weight steps as soon as the output layer's gradient is there
(`StepInBackward.adopted`), and in bfloat16 a slice of the vocabulary at a time as the output layer's
backward makes it, so that no [vocabulary, hidden] gradient exists at all (`open_rows`, `step_block`,
`close_rows`; untied output layers too). The embedded rows' gradient (a few thousand rows) waits, their
weights and state as before the step, and those rows step once the embedding's part is added
(`StepInBackward._finish`), through the same optimiser on a tensor of just those rows. AdamW is elementwise,
so every row ends as the whole weight's single step would leave it, bit for bit (tested). The forward records
the embedded tokens (`record_rows`: postrl's own embedding function, a hook on the model's input embedding,
the fast decoders); an embedding part that reaches an unrecorded row is an error, not a silent wrong step.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

log = logging.getLogger(__name__)

_BY_ID: weakref.WeakValueDictionary[int, StepInBackward] = weakref.WeakValueDictionary()
"""id(parameter) → the `StepInBackward` that steps it (not an attribute: a deepcopy of the model must not
copy the optimiser)."""


@dataclass
class _Deferred:
    """The rows of a weight that wait for the rest of their gradient, the rest having stepped."""

    param: torch.Tensor
    rows: torch.Tensor
    """Sorted distinct row indices."""
    grad: torch.Tensor
    """[len(rows), ...]: the gradient's part in those rows so far (the input embedding adds its part into it)."""
    scalars: dict[str, torch.Tensor]
    """The weight's 0-d optimiser state (AdamW's ``step``) before the early step."""
    after: dict[str, torch.Tensor] = field(default_factory=dict)
    """The same after the step of the other rows."""


class StepInBackward:
    """Hooks that step ``optimizer`` on each of its parameters as autograd completes the parameter's gradient
    and then free it; keeps the squared norm of the gradients it stepped for `grad_norm`. With ``model``, the
    tokens its input embedding embeds under grad are recorded, so that a tied output layer's adopted gradient
    can step early outside their rows (`adopted`)."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module | None = None) -> None:
        self.optimizer = optimizer
        self.group_of = {p: g for g in optimizer.param_groups for p in g["params"]}
        self.group_ids = [id(g) for g in optimizer.param_groups]
        self.squares: list[torch.Tensor] = []
        self.stepped: set[int] = set()  # ids of the weights stepped since the last `grad_norm`
        # id(weight) → the token ids its forwards embedded since the last `grad_norm` (None: ids not seen)
        self.rows: dict[int, list[torch.Tensor | None]] = {}
        self.deferred: dict[int, _Deferred] = {}
        self.early_steps = 0  # weights stepped early outside their embedded rows, over the run
        for p in self.group_of:
            p.register_post_accumulate_grad_hook(self._step)
            _BY_ID[id(p)] = self
        self.untied: set[int] = set()  # ids of output layers' weights that are no input embedding's
        embedding = getattr(model, "get_input_embeddings", lambda: None)() if model is not None else None
        if isinstance(embedding, torch.nn.Embedding) and embedding.weight in self.group_of:
            embedding.register_forward_pre_hook(record_rows_hook)
        output = getattr(model, "get_output_embeddings", lambda: None)() if model is not None else None
        weight = getattr(output, "weight", None)
        if (
            isinstance(embedding, torch.nn.Embedding)
            and weight is not None
            and weight is not embedding.weight
        ):
            self.untied.add(id(weight))

    def _step(self, param: torch.Tensor) -> None:
        if id(param) in self.deferred:
            self._finish(param)
            return
        self._once(param)
        self.squares.append(_square_norm(param.grad))
        self.step_only(param)
        param.grad = None

    def _once(self, param: torch.Tensor) -> None:
        if id(param) in self.stepped:  # a second accumulation: the first step took part of the gradient
            raise _twice()
        self.stepped.add(id(param))

    @torch.no_grad()
    def step_only(
        self,
        param: torch.Tensor,
        rows: torch.Tensor | None = None,
        grad: torch.Tensor | None = None,
        state: dict[str, torch.Tensor] | None = None,
    ) -> None:
        """``optimizer.step()`` on ``param`` alone (its group's hyperparameters and schedule), or on ``rows`` in
        its place: a tensor of some of its rows, stepped on ``grad`` with optimiser ``state`` (views or copies
        of the weight's, updated in place)."""
        groups = self.optimizer.param_groups
        if [id(g) for g in groups] != self.group_ids:  # load_state_dict makes new group dicts
            self.group_of = {p: g for g in groups for p in g["params"]}
            self.group_ids = [id(g) for g in groups]
        mine = self.group_of[param]
        kept = [g["params"] for g in groups]
        for g in groups:
            g["params"] = [param if rows is None else rows] if g is mine else []
        if rows is not None:
            rows.grad, self.optimizer.state[rows] = grad, state
        try:
            self.optimizer.step()
        finally:
            for g, params in zip(groups, kept, strict=True):
                g["params"] = params
            if rows is not None:
                rows.grad = None
                del self.optimizer.state[rows]

    @torch.no_grad()
    def adopted(self, param: torch.Tensor) -> None:
        """``param.grad`` was just set to the output layer's part of a tied weight's gradient: step every row
        the forward's embedding did not reach, keep the others' part and pre-step values, free the rest."""
        if id(param) not in self.rows:  # not an embedding's weight, or not one this step's forward recorded
            return
        waiting = self.open_rows(param)
        if waiting is None or param.grad is None or param.grad.shape != param.shape or param.grad.is_sparse:
            return
        self.step_block(waiting, 0, param.grad)
        param.grad = None
        self.close_rows(waiting)

    def open_rows(self, param: torch.Tensor) -> _Deferred | None:
        """Start ``param``'s step block by block of rows (`step_block`, then `close_rows`), the rows its
        forward embedded held back; None when it cannot: an optimiser other than AdamW, a tied weight whose
        embedded rows were not recorded (an untied output layer has none to hold back)."""
        recorded = self.rows.pop(id(param), None)
        if recorded is None and id(param) not in self.untied or any(r is None for r in recorded or []):
            return None
        if not self._rowwise(param):
            return None
        if id(param) in self.deferred or id(param) in self.stepped:
            raise _twice()
        if recorded:
            rows = torch.cat(recorded).to(param.device).unique()  # sorted
            if rows[0] < 0 or rows[-1] >= param.shape[0]:
                return None  # (the embedding itself raises on such ids)
        else:
            rows = torch.empty(0, dtype=torch.long, device=param.device)
        state = self.optimizer.state[param]
        scalars = {k: v.clone() for k, v in state.items() if v.dim() == 0}
        held = param.new_zeros(rows.numel(), *param.shape[1:])
        return _Deferred(param, rows, held, scalars)

    @torch.no_grad()
    def step_block(self, waiting: _Deferred, start: int, grad: torch.Tensor) -> None:
        """Step rows ``start`` to ``start + len(grad)`` of the weight on ``grad`` (its gradient in those rows,
        complete but for the held-back rows, whose part is kept and which are left as they were)."""
        param, n = waiting.param, grad.shape[0]
        lo, hi = (
            int(i) for i in torch.searchsorted(waiting.rows, waiting.rows.new_tensor([start, start + n]))
        )
        held = waiting.rows[lo:hi] - start
        state = self.optimizer.state[param]
        block = param.detach()[start : start + n]
        views = {k: v[start : start + n] for k, v in state.items() if v.dim()}
        if held.numel():
            waiting.grad[lo:hi] = grad.index_select(0, held)
            grad.index_fill_(0, held, 0)
            kept = {k: v.index_select(0, held) for k, v in views.items()}
            kept_weight = block.index_select(0, held)
        self.squares.append(_square_norm(grad))
        counters = {k: v.clone() for k, v in waiting.scalars.items()}
        self.step_only(param, block, grad, {**views, **counters})
        waiting.after = counters
        if held.numel():  # held back: as before this step (they stepped on a zero gradient)
            block.index_copy_(0, held, kept_weight)
            for key, value in kept.items():
                views[key].index_copy_(0, held, value)

    def close_rows(self, waiting: _Deferred) -> None:
        """End `open_rows`: the weight's counters as after its step; its held-back rows step when the input
        embedding has added its part (`_finish`), or when the step's norm is taken."""
        param = waiting.param
        state = self.optimizer.state[param]
        for key, value in waiting.after.items():
            state[key].copy_(value)
        self.deferred[id(param)] = waiting
        if not self.early_steps:
            log.info(
                "optim.step_in_backward: the output layer's %s gradient steps as it is made, %d rows held back "
                "for the input embedding's part",
                "×".join(map(str, param.shape)),
                waiting.rows.numel(),
            )
        self.early_steps += 1

    def _rowwise(self, param: torch.Tensor) -> bool:
        """Whether ``param`` can step in blocks of rows: AdamW (torch's or `MasterAdamW`), whose state is 0-d
        counters and tensors of the weight's shape (created now if the first step would)."""
        from postrl.lm.master_adamw import MasterAdamW, adamw_state

        kind = type(self.optimizer)
        if kind not in (torch.optim.AdamW, MasterAdamW) or param.dim() < 1:
            return False
        state, group = self.optimizer.state[param], self.group_of[param]
        if not state:  # what the first step would create: the same zeros (and master) now
            if kind is MasterAdamW:
                self.optimizer._state(group, param)
            else:
                state.update(adamw_state(group, param, param))
        return all(torch.is_tensor(v) and (v.dim() == 0 or _row_shaped(v, param)) for v in state.values())

    @torch.no_grad()
    def _finish(self, param: torch.Tensor) -> None:
        """Step a weight's held-back rows on their whole gradient (``param.grad``, when autograd added the
        embedding's part there, holds it in those rows and zeros elsewhere)."""
        waiting = self.deferred.pop(id(param))
        self._once(param)
        grad, rows = waiting.grad, waiting.rows
        if param.grad is not None:
            rest = param.grad.to_dense() if param.grad.is_sparse else param.grad
            grad = grad + rest.index_select(0, rows)  # (what autograd's in-place sum gives these rows)
            if rest.index_fill_(0, rows, 0).any():
                raise RuntimeError(
                    "optim.step_in_backward: the input embedding's gradient reached rows its forward did not "
                    "record (an embedding called outside `postrl.lm.step_in_backward.record_rows`); those rows "
                    "already stepped without it"
                )
        param.grad = None
        if not rows.numel():
            return
        self.squares.append(_square_norm(grad))
        state = self.optimizer.state[param]
        few = param.index_select(0, rows)
        copies = {
            k: waiting.scalars[k] if v.dim() == 0 else v.index_select(0, rows) for k, v in state.items()
        }
        self.step_only(param, few, grad, copies)
        param.index_copy_(0, rows, few)
        for key, value in copies.items():
            if value.dim():
                state[key].index_copy_(0, rows, value)

    def embedding_part(self, param: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(rows, their gradient so far) of a weight whose other rows stepped early, for the input embedding's
        backward to add its part into (`postrl.lm.rollout.forwards._Embedding`); None otherwise."""
        deferred = self.deferred.get(id(param))
        return None if deferred is None else (deferred.rows, deferred.grad)

    def grad_norm(self, params: Iterable[torch.Tensor]) -> float:
        """The step's global gradient norm: the weights stepped in the backward and those of ``params`` that
        still hold a gradient (stepped by the trainer's ``optimizer.step()``); ends the step (every trainer
        that runs `StepInBackward` measures the norm once per step, through `trainer.clip_grad_norm`). Rows
        still waiting (a backward that never reached the input embedding) step now on what they have."""
        for deferred in list(self.deferred.values()):
            self._finish(deferred.param)
        squares = self.squares + [_square_norm(p.grad) for p in params if p.grad is not None]
        self.squares, self.stepped, self.rows = [], set(), {}
        return float(torch.stack(squares).sum().sqrt()) if squares else 0.0


def _twice() -> RuntimeError:
    return RuntimeError(
        "optim.step_in_backward: a weight's gradient was accumulated twice in one optimiser step (a second "
        "backward, or a forward whose backward runs in two passes)"
    )


def _row_shaped(value: object, param: torch.Tensor) -> bool:
    return torch.is_tensor(value) and value.shape == param.shape


def record_rows(weight: torch.Tensor, ids: torch.Tensor | None) -> None:
    """Note that a forward under grad embeds ``ids`` (None: tokens it cannot see) with ``weight``, when that
    weight steps in the backward (at once otherwise)."""
    if not _BY_ID or not torch.is_grad_enabled() or not weight.requires_grad:
        return
    owner = _BY_ID.get(id(weight))
    if owner is not None and weight in owner.group_of:
        owner.rows.setdefault(id(weight), []).append(None if ids is None else ids.detach().reshape(-1))


def record_rows_hook(module: torch.nn.Module, args: tuple) -> None:
    """A forward pre-hook on a model's input embedding: `record_rows` of its token ids (a plain function, so
    that a deep copy of the model refers to no optimiser)."""
    ids = args[0] if args and torch.is_tensor(args[0]) else None
    record_rows(module.weight, ids)


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
