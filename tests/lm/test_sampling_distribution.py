"""The rollout sampler is on-policy: sequences drawn by `postrl.lm.rollout.generate` (fast decoders and the
Hugging Face fallback, a GRPO group sharing its prompt, left-padded prompts of other lengths, temperature ≠ 1)
follow the probabilities of a plain Hugging Face forward, softmax(logits / τ), token after token.

At β = 0 and one optimiser step per batch the importance ratio is 1 whatever the sampler draws, so an
off-policy sampler would show in no loss or ratio check: only a goodness-of-fit test of the draws sees it.
The test takes the exact probability of every continuation of up to ``T`` tokens (ended early by EOS),
Pearson's χ² of the drawn counts against them (cells of expected count ≥ 5, the rest pooled), and rejects
beyond z = 4.5 of the Wilson-Hilferty normal approximation (p ≈ 3e-6; the seeds are fixed, so the test is
deterministic). A second test checks that this statistic does reject a real mismatch: the same draws
against the probabilities at another temperature, or with the EOS row left out.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from postrl.lm.models import TinyLMConfig, build_tiny_lm, position_ids_from_mask
from postrl.lm.rollout import generate, left_pad

PAD, EOS, V, T, N = 0, 1, 10, 2, 6000
Z_REJECT = 4.5


def sharp_gpt2() -> GPT2LMHeadModel:
    """A tiny GPT-2 (vocab 10) whose next-token distributions are far from uniform (scaled embeddings)."""
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=32, pad_token_id=PAD, eos_token_id=EOS,
        bos_token_id=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        model.transformer.wte.weight.mul_(4.0)  # tied head: logits spread over a few nats
    return model


def sharp_llama() -> torch.nn.Module:
    cfg = TinyLMConfig(
        n_layers=2, hidden_size=32, n_heads=4, intermediate_size=64, max_position_embeddings=32
    )
    model = build_tiny_lm(V, cfg, seed=0, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=2).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)
    return model


MODELS = {"gpt2": sharp_gpt2, "llama": sharp_llama}


@torch.no_grad()
def exact_probs(model: torch.nn.Module, prompt: list[int], tau: float) -> dict[tuple[int, ...], float]:
    """P(continuation) of every continuation of T tokens, or fewer ended by EOS, from plain forwards."""
    probs: dict[tuple[int, ...], float] = {(): 1.0}
    for t in range(T):
        live = [s for s in probs if len(s) == t and not (s and s[-1] == EOS)]
        ids = torch.tensor([prompt + list(s) for s in live])
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, -1]
        p = torch.softmax(logits.double() / tau, dim=-1)
        for s, row in zip(live, p.tolist(), strict=True):
            base = probs.pop(s)
            probs.update({s + (v,): base * q for v, q in enumerate(row)})
    return probs


def continuation(row: list[int]) -> tuple[int, ...]:
    return tuple(row[: row.index(EOS) + 1] if EOS in row else row)


def chi2_z(counts: Counter, probs: dict[tuple[int, ...], float], n: int) -> float:
    """Pearson's χ² of ``counts`` against ``probs`` (cells of expected count < 5 pooled), as the z-score of
    the Wilson-Hilferty approximation (standard normal under the null)."""
    unexpected = sum(c for k, c in counts.items() if k not in probs)
    if unexpected:
        return math.inf  # a continuation of probability zero was drawn
    big = [k for k, p in probs.items() if p * n >= 5]
    rest_p = 1.0 - sum(probs[k] for k in big)
    rest_c = n - sum(counts.get(k, 0) for k in big)
    stat = sum((counts.get(k, 0) - n * probs[k]) ** 2 / (n * probs[k]) for k in big)
    df = len(big) - 1
    if rest_p * n >= 5:
        stat, df = stat + (rest_c - n * rest_p) ** 2 / (n * rest_p), df + 1
    elif rest_c > 5 * max(1.0, rest_p * n):  # the pooled tail drawn far more often than its mass allows
        return math.inf
    a = 2.0 / (9.0 * df)
    return ((stat / df) ** (1.0 / 3.0) - (1.0 - a)) / math.sqrt(a)


def draws(model: torch.nn.Module, prompts: list[list[int]], tau: float, use_fast: bool) -> list[Counter]:
    """N continuations of each prompt from one `generate` call (each prompt's rows in a row, as a GRPO
    group; prompts of different lengths, so the shorter ones are left-padded)."""
    ids, mask = left_pad([p for p in prompts for _ in range(N)], PAD)
    out = generate(
        model, ids, mask, max_new_tokens=T, temperature=tau, eos_token_id=EOS, pad_token_id=PAD,
        generator=torch.Generator().manual_seed(1), use_fast=use_fast,
    )  # fmt: skip
    rows = out.response_ids.tolist()
    return [Counter(continuation(r) for r in rows[i * N : (i + 1) * N]) for i in range(len(prompts))]


PROMPTS = [[2, 5, 7, 3, 8, 4], [2, 9, 3]]


@pytest.mark.parametrize("arch", sorted(MODELS))
@pytest.mark.parametrize("use_fast", [True, False], ids=["fast", "hf"])
@pytest.mark.parametrize("tau", [1.0, 0.7])
def test_sampled_continuations_follow_softmax_of_the_logits(arch, use_fast, tau):
    model = MODELS[arch]()
    for prompt, counts in zip(PROMPTS, draws(model, PROMPTS, tau, use_fast), strict=True):
        probs = exact_probs(model, prompt, tau)
        assert max(probs.values()) < 0.9  # a real distribution to test, not one near-certain token
        z = chi2_z(counts, probs, N)
        assert z < Z_REJECT, f"{arch} use_fast={use_fast} τ={tau} prompt {prompt}: χ² z = {z:.1f}"


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_the_statistic_rejects_an_off_policy_sampler(arch):
    """The check can fail: draws at τ = 1 against the probabilities at τ = 0.9 (z ≈ 7.5-15), and against a distribution
    whose first token never ends the response, are rejected."""
    model = MODELS[arch]()
    prompt = PROMPTS[0]
    counts = draws(model, [prompt], 1.0, use_fast=True)[0]
    assert chi2_z(counts, exact_probs(model, prompt, 1.0), N) < Z_REJECT
    assert chi2_z(counts, exact_probs(model, prompt, 0.9), N) > Z_REJECT
    no_eos = {k: p for k, p in exact_probs(model, prompt, 1.0).items() if k != (EOS,)}
    total = sum(no_eos.values())
    assert chi2_z(counts, {k: p / total for k, p in no_eos.items()}, N) > Z_REJECT


def test_exact_probs_sum_to_one_and_positions_are_plain():
    """The reference is a plain forward of unpadded ids (positions 0…L-1, as `position_ids_from_mask`)."""
    model = sharp_gpt2()
    probs = exact_probs(model, PROMPTS[1], 0.7)
    assert sum(probs.values()) == pytest.approx(1.0, abs=1e-9)
    mask = torch.ones(1, len(PROMPTS[1]), dtype=torch.long)
    assert position_ids_from_mask(mask).tolist() == [list(range(len(PROMPTS[1])))]
