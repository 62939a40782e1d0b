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


def _chunk_logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float) -> Tensor:
    """z = (h W^T + b)/τ in float32 (the reference: the model's logits in its dtype, then ``.float()``)."""
    return F.linear(hidden, weight, bias).float() / temperature  # (n, V)


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
            z = _chunk_logits(hidden[s : s + chunk_tokens], weight, bias, temperature)  # (n, V)
            lse_c = torch.logsumexp(z, dim=-1)  # (n,)
            lse[s : s + chunk_tokens] = lse_c
            log_probs[s : s + chunk_tokens] = (
                z.gather(-1, tokens[s : s + chunk_tokens, None]).squeeze(-1) - lse_c
            )
            if with_entropy:
                entropy[s : s + chunk_tokens] = lse_c - (torch.softmax(z, dim=-1) * z).sum(-1)
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
        grad_w = existing_grad(weight, acc) if need_w else None  # added to in place, None returned for W
        into_grad = grad_w is not None
        grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None
        for s in range(0, hidden.shape[0], n):
            h, g = hidden[s : s + n], grad_log_probs[s : s + n]
            p = torch.exp(_chunk_logits(h, weight, bias, tau) - lse[s : s + n, None])  # (n, V): softmax(z)
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
        grad_w = None if grad_w is None or into_grad else grad_w.to(weight.dtype)
        grad_b = None if grad_b is None else grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None


SLICE_ROWS = 16384
"""Most vocabulary rows of one slice of `_sliced_backward` (its float32 ∂L/∂W rows: 59 MB at d = 896)."""


def _sliced_backward(
    ctx: Any, grad_log_probs: Tensor, need_h: bool, need_b: bool
) -> tuple[Tensor | None, ...]:
    """The backward of a trained low-precision output layer, a slice of the vocabulary at a time instead of a
    chunk of positions: each slice's ∂L/∂W rows are one float32 product over all positions, rounded once into
    the weight's dtype, so no float32 [V, d] gradient is held (at V = 151,936, d = 896: 544 MB, and 272 MB more
    while it is rounded). The values of the chunk loop (one rounding of a float32 sum over positions); the
    logits alive at once are at most a chunk's (``chunk_tokens`` · V), a slice at most `SLICE_ROWS` rows."""
    hidden, weight, bias, tokens, lse = ctx.saved_tensors
    tau, N, V = ctx.temperature, hidden.shape[0], weight.shape[0]
    step = max(1, min(ctx.chunk_tokens * V // max(N, 1), SLICE_ROWS))  # vocabulary rows per slice
    h32, g = hidden.float(), grad_log_probs.float()
    grad_w = torch.empty_like(weight)
    grad_h = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if need_h else None
    grad_b = torch.empty_like(bias) if need_b else None
    rows = torch.arange(N, device=hidden.device)
    for v in range(0, V, step):
        w = weight[v : v + step]
        b = None if bias is None else bias[v : v + step]
        grad_z = torch.exp(_chunk_logits(hidden, w, b, tau) - lse[:, None]).mul_(-g[:, None])  # (N, Vs)
        inside = (tokens >= v) & (tokens < v + w.shape[0])  # the onehot's column falls in this slice
        grad_z.index_put_((rows[inside], tokens[inside] - v), g[inside], accumulate=True)
        grad_z = grad_z.div_(tau)
        grad_w[v : v + step] = (grad_z.T @ h32).to(weight.dtype)  # (Vs, d), one rounding
        if need_h:
            grad_h.addmm_(grad_z.to(weight.dtype).float(), w.float())
        if need_b:
            grad_b[v : v + step] = grad_z.sum(0).to(bias.dtype)
    grad_h = None if grad_h is None else grad_h.to(hidden.dtype)
    return grad_h, grad_w, grad_b, None, None, None, None


def existing_grad(weight: Tensor, acc: torch.dtype) -> Tensor | None:
    """``weight.grad`` when the backward may add ∂L/∂W into it in place instead of returning it: a second
    backward onto an existing gradient (gradient accumulation, DPO's length groups, a shared prompt's second
    pass) would otherwise allocate a fresh [V, d] product, 545 MB at V = 151,936 and mostly page faults, for
    autograd to add and drop. Only for a float32 leaf whose gradient is a plain tensor of its shape, in a
    ``.backward()`` over the whole graph (``torch.autograd.grad`` and ``backward(inputs=...)`` return
    gradients instead: `torch.autograd._is_checkpoint_valid` tells them apart, as reentrant checkpointing
    does) and without hooks on the weight (they would not see this part)."""
    grad = weight.grad if weight.is_leaf and weight.requires_grad else None
    if grad is None or grad.dtype != acc or weight.dtype != acc or grad.shape != weight.shape:
        return None
    if grad.is_sparse or not grad.is_contiguous() or weight._backward_hooks:
        return None
    post_hooks = getattr(weight, "_post_accumulate_grad_hooks", None)
    whole_graph = getattr(torch.autograd, "_is_checkpoint_valid", lambda: False)  # private: absent, never
    return grad if not post_hooks and whole_graph() else None


def chunked_log_probs(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    tokens: Tensor,
    temperature: float = 1.0,
    chunk_tokens: int = 512,
    entropy: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """(log softmax(z)_y, entropy of softmax(z)) at every position, z = (h W^T + b)/τ, one chunk at a time.

    hidden: [..., d] final hidden states; weight: [V, d] (the output layer's, tied or not); bias: [V] or None;
    tokens: [...] long. Returns log_probs [...] float32 (differentiable in hidden, weight, bias) and entropy
    [...] float32 (detached; None unless ``entropy``). ``chunk_tokens``: positions whose logits exist at once (peak memory
    ≈ chunk_tokens · V · 4 bytes, times about three)."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    shape = tokens.shape
    flat_h = hidden.reshape(-1, hidden.shape[-1])  # (N, d)
    log_probs, entropies = _SelectiveLogSoftmax.apply(
        flat_h, weight, bias, tokens.reshape(-1), float(temperature), int(chunk_tokens), bool(entropy)
    )
    return log_probs.reshape(shape), entropies.reshape(shape) if entropy else None
