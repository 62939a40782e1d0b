"""Drawing tokens: log π_τ at given tokens, top-k / top-p sampling by inverse CDF, and the mask after EOS.

``log_probs`` are log π_τ of the sampled token, taken BEFORE top-k / top-p filtering: the filters only choose
which tokens may be drawn, they do not change the policy whose ratio PPO and GRPO take.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _inverse_cdf(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One draw per row from unnormalised probs [B, K] → indices [B, 1].

    One uniform per row against the cumulative sum: ``torch.multinomial`` on CPU costs ~20× more at B = 256.
    ``right=True`` never lands on a zero-probability index (its cumsum equals its predecessor's).
    """
    cdf = probs.cumsum(-1)  # (B, K)
    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=probs.dtype)
    idx = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
    return idx.clamp_(max=probs.shape[-1] - 1)


def _top_p_keep(sorted_probs: Tensor, top_p: float) -> Tensor:
    """Zero the tail of descending probs [B, K] outside the nucleus: keep a token while the mass before it
    is < top_p (the first token always stays; Holtzman et al. 2020, as HF ``TopPLogitsWarper``)."""
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    return sorted_probs.masked_fill(mass_before >= top_p * sorted_probs.sum(-1, keepdim=True), 0.0)


def sample_tokens(
    log_probs: Tensor, top_k: int = 0, top_p: float = 1.0, generator: torch.Generator | None = None
) -> Tensor:
    """Draw one token per row from log π_τ [B, V] restricted to the top-k, then the top-p nucleus → [B, 1].

    k = 0 and p = 1 disable the filters. Filtering works in sorted space, so no scatter back is needed.
    """
    probs = log_probs.exp()  # (B, V)
    if top_k <= 0 and top_p >= 1.0:
        return _inverse_cdf(probs, generator)
    if top_k > 0:
        probs, order = probs.topk(min(top_k, probs.shape[-1]), dim=-1)  # (B, k), descending
    else:
        probs, order = probs.sort(dim=-1, descending=True)
    if top_p < 1.0:
        probs = _top_p_keep(probs, top_p)
    return order.gather(-1, _inverse_cdf(probs, generator))


def token_log_probs(logits: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
    """log softmax(logits / τ) at the given tokens: logits [..., V], tokens [...] → [...] float32."""
    log_pi = torch.log_softmax(logits.float() / temperature, dim=-1)
    return log_pi.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def mask_after_eos(response_ids: Tensor, eos_token_id: int | None) -> Tensor:
    """[B, T] → long mask: 1 up to and including each row's first EOS, 0 after (all 1 without EOS)."""
    if eos_token_id is None:
        return torch.ones_like(response_ids)
    is_eos = (response_ids == eos_token_id).long()
    return ((is_eos.cumsum(-1) - is_eos) == 0).long()
