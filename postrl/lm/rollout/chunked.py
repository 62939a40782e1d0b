"""Log-probs of chosen tokens over a large vocabulary without the [tokens, V] logits of the whole batch.

The reference path (`postrl.lm.rollout.sampling.token_log_probs`) takes the model's logits [B, T, V] and a
log-softmax of them: for Qwen2.5's V = 151,936 and a GRPO step's 32 × 128 response tokens that is 2.5 GB of
float32 logits, twice more for the log-softmax and its gradient (TRL #2709's out-of-memory reports).
Here the output layer is applied to the final hidden states ``chunk_tokens`` rows at a time:

    z = (h W^T + b) / τ,   log π(y) = z_y − logsumexp(z),   H = logsumexp(z) − Σ_v softmax(z)_v z_v

and only the per-token log-prob, the logsumexp and the entropy are kept. The backward recomputes each chunk's
logits from the saved hidden states (a custom `torch.autograd.Function`), with the exact gradient of the
selected log-prob, ∂ log π(y)/∂z = onehot(y) − softmax(z):

    ∂L/∂h = (g ⊙ (onehot − p) / τ) W,   ∂L/∂W = (g ⊙ (onehot − p) / τ)^T h,   ∂L/∂b = Σ_rows g ⊙ (onehot − p) / τ

so peak memory holds one chunk's [chunk_tokens, V] logits instead of the batch's. ∂L/∂W goes straight into
``W.grad`` where one exists (`existing_grad`: accumulation adds no [V, d] temporary). The entropy is returned
detached (a metric). tests/lm/test_chunked_log_probs.py pins both to the reference in float64.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from postrl.lm.step_in_backward import StepInBackward, step_in_backward_of


def _chunk_logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float) -> Tensor:
    """z = (h W^T + b)/τ in float32 (the reference: the model's logits in its dtype, then ``.float()``), a new
    tensor the caller may change in place."""
    z = F.linear(hidden, weight, bias).float()  # (n, V)
    return z.div_(temperature) if temperature != 1.0 else z


def _logsumexp_entropy(z: Tensor, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    """(logsumexp(z), entropy of softmax(z) or None) over the last dim of ``z`` [n, V] float32, which this
    overwrites (z − max): one more [n, V] buffer at most, where ``torch.logsumexp`` and ``softmax(z) * z`` made
    three. With S = Σ e^(z − m): logsumexp = m + log S, H = log S − Σ e^(z − m) (z − m) / S."""
    m = z.amax(-1, keepdim=True)
    m = m.masked_fill_(~m.isfinite(), 0.0)  # a row of −inf stays −inf, as torch.logsumexp's
    shifted = z.sub_(m)
    if not with_entropy:
        return shifted.exp_().sum(-1).log_() + m[:, 0], None
    e = shifted.exp()
    total = e.sum(-1)
    # 0 · (−inf) is nan: a token of probability 0 adds 0
    weighted = e.mul_(shifted).nan_to_num_(nan=0.0).sum(-1)
    log_total = total.log()
    return log_total + m[:, 0], log_total - weighted / total


class _SelectiveLogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: Tensor, weight: Tensor, bias: Tensor | None, tokens: Tensor, temperature: float,
        chunk_tokens: int, with_entropy: bool,
    ) -> tuple[Tensor, Tensor]:  # fmt: skip
        N = hidden.shape[0]
        log_probs = hidden.new_empty(N, dtype=torch.float32)
        lse = hidden.new_empty(N, dtype=torch.float32)
        entropy = hidden.new_zeros(N if with_entropy else 0, dtype=torch.float32)
        for s in range(0, N, chunk_tokens):
            rows = slice(s, s + chunk_tokens)
            z = _chunk_logits(hidden[rows], weight, bias, temperature)  # (n, V)
            picked = z.gather(-1, tokens[rows, None]).squeeze(-1)
            lse[rows], entropies = _logsumexp_entropy(z, with_entropy)
            log_probs[rows] = picked - lse[rows]
            if with_entropy:
                entropy[rows] = entropies
        ctx.save_for_backward(hidden, weight, bias, tokens, lse)
        ctx.temperature, ctx.chunk_tokens = temperature, chunk_tokens
        ctx.mark_non_differentiable(entropy)
        return log_probs, entropy

    @staticmethod
    def backward(ctx: Any, grad_log_probs: Tensor, _grad_entropy: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        hidden, weight, bias, tokens, lse = ctx.saved_tensors
        tau, n = ctx.temperature, ctx.chunk_tokens
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        # summed over chunks in float32 at least (bfloat16 weights: one rounding at the end, not one per chunk).
        # The first chunk's product is the sum (no zeroed [V, d] buffer to fill), later ones are added in place
        # by addmm_ (no [V, d] temporary): at V = 151,936 each of those was 544 MB and seconds of page faults.
        acc = torch.promote_types(weight.dtype, torch.float32)
        if need_w and acc != weight.dtype:
            return _sliced_backward(ctx, grad_log_probs, need_h, need_b)
        grad_w = existing_grad(weight) if need_w else None  # added to in place, None returned for W
        into_grad = grad_w is not None
        grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None
        for s in range(0, hidden.shape[0], n):
            h, g = hidden[s : s + n], grad_log_probs[s : s + n]
            p = _chunk_logits(h, weight, bias, tau).sub_(lse[s : s + n, None]).exp_()  # (n, V): softmax(z)
            grad_z = p.mul_(-g[:, None])  # g ⊙ (onehot − p), the onehot added next
            grad_z.scatter_add_(-1, tokens[s : s + n, None], g[:, None])
            grad_z = grad_z.div_(tau)
            if need_h:
                grad_h[s : s + n] = (grad_z.to(weight.dtype) @ weight).to(hidden.dtype)  # (n, d)
            if need_w:
                part, rows = grad_z.to(acc).T, h.to(acc)  # (V, n), (n, d)
                grad_w = part @ rows if grad_w is None else grad_w.addmm_(part, rows)  # (V, d)
            if need_b:
                grad_b += grad_z.to(acc).sum(0)
        if grad_w is not None and not into_grad and adopt_grad(weight, grad_w):
            into_grad = True  # W.grad is this product: a tied input embedding's rows are added into it next
        grad_w = None if grad_w is None or into_grad else grad_w.to(weight.dtype)
        grad_b = None if grad_b is None else grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None


SLICE_ROWS = 16384
"""Most vocabulary rows of one slice of `_sliced_backward` (its float32 ∂L/∂W rows: 59 MB at d = 896)."""


def _sliced_backward(
    ctx: Any, grad_log_probs: Tensor, need_h: bool, need_b: bool
) -> tuple[Tensor | None, ...]:
    """The backward of a trained low-precision output layer, a slice of the vocabulary at a time instead of a
    chunk of positions, as the plain path computes it: the slice's ∂L/∂z rounded to the weight's dtype (the
    plain path's logits are in that dtype), then low-precision products that accumulate in float32 inside and
    round once: ∂L/∂W rows over all positions, ∂L/∂h summed over slices in float32. A weight that steps in the
    backward steps each slice's rows there (`_stepped_by_slices`): no [V, d] gradient exists. No float32 [V, d]
    gradient is held (at V = 151,936, d = 896: 544 MB, and 272 MB more while it is rounded), and ∂L/∂W goes into
    ``W.grad`` itself where `existing_grad` or `adopt_grad` allow (a second [V, d] of 272 MB otherwise, while
    autograd adds it). The logits alive at once are at most a chunk's (``chunk_tokens`` · V), a slice at most
    `SLICE_ROWS` rows. float32 products instead of low-precision ones took 2.4x the time at 0.5B."""
    hidden, weight, bias, tokens, lse = ctx.saved_tensors
    tau, N, V = ctx.temperature, hidden.shape[0], weight.shape[0]
    step = max(1, min(ctx.chunk_tokens * V // max(N, 1), SLICE_ROWS))  # vocabulary rows per slice
    g, h_low = grad_log_probs.float(), hidden.to(weight.dtype)
    into = existing_grad(weight)  # added to in place, None returned for W
    stepped = _stepped_by_slices(weight) if into is None else None  # each slice's rows step as they are made
    grad_w = torch.empty_like(weight) if into is None and stepped is None else None
    grad_h = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if need_h else None
    grad_b = torch.empty_like(bias) if need_b else None
    rows = torch.arange(N, device=hidden.device)
    for v in range(0, V, step):
        w = weight[v : v + step]
        b = None if bias is None else bias[v : v + step]
        grad_z = _chunk_logits(hidden, w, b, tau).sub_(lse[:, None]).exp_().mul_(-g[:, None])  # (N, Vs)
        inside = (tokens >= v) & (tokens < v + w.shape[0])  # the onehot's column falls in this slice
        grad_z.index_put_((rows[inside], tokens[inside] - v), g[inside], accumulate=True)
        grad_z = grad_z.div_(tau)
        if need_b:
            grad_b[v : v + step] = grad_z.sum(0).to(bias.dtype)
        grad_z = grad_z.to(weight.dtype)  # (N, Vs)
        if stepped is not None:
            part = torch.mm(grad_z.T, h_low)  # (Vs, d)
        elif into is None:
            torch.mm(grad_z.T, h_low, out=grad_w[v : v + step])  # (Vs, d)
        else:
            into[v : v + step].addmm_(grad_z.T, h_low)
        if need_h:
            grad_h += (grad_z @ w).float()
        if stepped is not None:  # (after this slice's last use of its rows' weights)
            owner, waiting = stepped
            owner.step_block(waiting, v, part)
            del part
    if stepped is not None:
        owner, waiting = stepped
        owner.close_rows(waiting)
    if grad_w is not None and adopt_grad(weight, grad_w):
        grad_w = None  # W.grad is this product: a tied input embedding's rows are added into it next
    grad_h = None if grad_h is None else grad_h.to(hidden.dtype)
    return grad_h, grad_w, grad_b, None, None, None, None


def _stepped_by_slices(weight: Tensor) -> tuple[StepInBackward, Any] | None:
    """The `StepInBackward` that steps ``weight`` and its block-by-block step (`StepInBackward.open_rows`),
    when the output layer's backward may step each slice of ∂L/∂W as it makes it instead of holding the whole
    [V, d] gradient (272 MB at V = 151,936, d = 896 in bfloat16): a weight that steps in the backward, whose
    gradient this backward may write itself (`_writable`), untied or with its embedded rows recorded."""
    owner = step_in_backward_of([weight])
    if owner is None or not _writable(weight):
        return None
    waiting = owner.open_rows(weight)
    return None if waiting is None else (owner, waiting)


def existing_grad(weight: Tensor) -> Tensor | None:
    """``weight.grad`` when the backward may add ∂L/∂W into it in place instead of returning it: a second
    backward onto an existing gradient (gradient accumulation, DPO's length groups, a shared prompt's second
    pass) would otherwise allocate a fresh [V, d] product, 545 MB at V = 151,936 and mostly page faults, for
    autograd to add and drop. Only for a leaf whose gradient is a plain tensor of its shape and dtype, in a
    ``.backward()`` over the whole graph (``torch.autograd.grad`` and ``backward(inputs=...)`` return
    gradients instead: `torch.autograd._is_checkpoint_valid` tells them apart, as reentrant checkpointing
    does) and without hooks on the weight (they would not see this part)."""
    grad = weight.grad if _writable(weight) else None
    if grad is None or grad.dtype != weight.dtype or grad.shape != weight.shape:
        return None
    return grad if not grad.is_sparse and grad.is_contiguous() else None


def adopt_grad(weight: Tensor, grad: Tensor) -> bool:
    """Set ``grad`` (∂L/∂W of this backward, W's shape and dtype) as ``weight.grad`` when W has none yet and
    `existing_grad` would take one; True when set, and the backward then returns None for W. A weight shared
    by another use in the same backward (a tied input embedding, `postrl.lm.rollout.forwards`) then adds its
    part into it in place, where autograd would hold both [V, d] parts to sum them (272 MB more at V = 151,936,
    d = 896 in bfloat16). A weight that steps in the backward steps at once outside the rows its tied
    embedding reaches (`postrl.lm.step_in_backward.StepInBackward.adopted`), and ``weight.grad`` is None again."""
    if weight.grad is not None or not _writable(weight) or grad.shape != weight.shape:
        return False
    if grad.dtype != weight.dtype or not grad.is_contiguous():
        return False
    weight.grad = grad
    owner = step_in_backward_of([weight])
    if owner is not None:  # a tied weight steps now outside the rows its embedding reached
        owner.adopted(weight)
    return True


def _writable(weight: Tensor) -> bool:
    """A backward may write ``weight.grad`` itself: a leaf that requires grad, no hooks that would miss the
    write (`_steps_in_backward`'s are not such), a ``.backward()`` over the whole graph, one process (DDP's
    reducer hooks the gradient accumulator, which a write that returns None for W never runs: the weight's
    gradient would not be averaged)."""
    if not (weight.is_leaf and weight.requires_grad) or weight._backward_hooks:
        return False
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return False
    hooks = getattr(weight, "_post_accumulate_grad_hooks", None) or {}
    if any(not _steps_in_backward(h) for h in hooks.values()):
        return False
    whole_graph = getattr(torch.autograd, "_is_checkpoint_valid", lambda: False)  # private: absent, never
    return bool(whole_graph())


def _steps_in_backward(hook: object) -> bool:
    """A `StepInBackward` hook: autograd calls it once the backward is done with the weight (a tied embedding's
    part added into the adopted gradient; for a weight with no other use too, though its backward returned no
    gradient, and were it not called the trainer's ``optimizer.step()`` would step that weight)."""
    return isinstance(getattr(hook, "__self__", None), StepInBackward)


def chunked_log_probs(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    tokens: Tensor,
    temperature: float = 1.0,
    chunk_tokens: int = 64,
    entropy: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """(log softmax(z)_y, entropy of softmax(z)) at every position, z = (h W^T + b)/τ, one chunk at a time.

    hidden: [..., d] final hidden states; weight: [V, d] (the output layer's, tied or not); bias: [V] or None;
    tokens: [...] long. Returns log_probs [...] float32 (differentiable in hidden, weight, bias) and entropy
    [...] float32 (detached; None unless ``entropy``). ``chunk_tokens``: positions whose logits exist at once
    (peak memory ≈ chunk_tokens · V · 4 bytes, twice with the entropy: the logits and their exp)."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    shape = tokens.shape
    flat_h = hidden.reshape(-1, hidden.shape[-1])  # (N, d)
    log_probs, entropies = _SelectiveLogSoftmax.apply(
        flat_h, weight, bias, tokens.reshape(-1), float(temperature), int(chunk_tokens), bool(entropy)
    )
    return log_probs.reshape(shape), entropies.reshape(shape) if entropy else None
