"""grpo_loss(importance_level="sequence"): GSPO (Zheng et al. 2025)."""

import math

import pytest
import torch
from core_helpers import F64, GARBAGE, PROP, ragged_mask, rand, t, with_garbage
from hypothesis import given
from hypothesis import strategies as st

from postrl.core import grpo_loss

LOG2 = math.log(2.0)
LOSS_TYPES = ["grpo", "token", "dr_grpo"]

# The batch of test_core_grpo.py: 2 responses x 3 tokens, row 1 has a single real token, old log-probs 0,
# A = [+1, -1], eps = 0.2, beta = 0.1; k3 = [0, 0, 1 - log 2] on row 0 and [log 2 - 0.5] on row 1.
# Sequence ratios: s_0 = (1 · 1.5 · 0.9)^(1/3) = 1.35^(1/3) = 1.10520..., inside [0.8, 1.2]: not clipped;
# s_1 = 0.5 with A = -1: clipped to 0.8. Every token of a response carries its response's surrogate:
#   row 0: [-s_0, -s_0, -s_0 + 0.1 k3a], row 1: [0.8 + 0.1 k3b]
S0 = 1.35 ** (1.0 / 3.0)
K3A, K3B = 1.0 - LOG2, LOG2 - 0.5
ROW0 = -3.0 * S0 + 0.1 * K3A
ROW1 = 0.8 + 0.1 * K3B


def _expected(row0, row1):
    return {"grpo": (row0 / 3 + row1 / 1) / 2, "token": (row0 + row1) / 4, "dr_grpo": (row0 + row1) / 6}


def _hand_batch():
    nan = float("nan")
    log_probs = t([[0.0, math.log(1.5), math.log(0.9)], [math.log(0.5), nan, 3.0]])
    old = t([[0.0, 0.0, 0.0], [0.0, 0.0, nan]])
    ref = t([[0.0, math.log(1.5), math.log(0.9) + LOG2], [math.log(0.5) - LOG2, 5.0, nan]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    return log_probs, old, ref, t([1.0, -1.0]), mask


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_gspo_hand_values(loss_type):
    log_probs, old, ref, adv, mask = _hand_batch()
    assert S0 == pytest.approx(1.1052094, abs=1e-7)
    loss, stats = grpo_loss(log_probs, old, ref, adv, mask, 0.2, 0.1, loss_type, importance_level="sequence")
    assert loss.item() == pytest.approx(_expected(ROW0, ROW1)[loss_type], abs=1e-12)
    assert stats["clip_fraction"].item() == pytest.approx(0.5)  # 1 of 2 responses
    assert stats["ratio_mean"].item() == pytest.approx((S0 + 0.5) / 2, abs=1e-12)  # over responses
    assert stats["kl"].item() == pytest.approx(0.5 / 4, abs=1e-12)  # per token, as the token level
    # clip-higher 0.05: s_0 > 1.05 is now clipped too, each of row 0's tokens carries 1.05
    loss, stats = grpo_loss(
        log_probs, old, ref, adv, mask, 0.2, 0.1, loss_type, clip_eps_high=0.05, importance_level="sequence"
    )
    assert loss.item() == pytest.approx(_expected(-3.15 + 0.1 * K3A, ROW1)[loss_type], abs=1e-12)
    assert stats["clip_fraction"].item() == 1.0


def test_gspo_hand_gradient():
    # beta = 0, "grpo": L = -(1/2) Σ_i min(s_i A_i, clip(s_i) A_i); row 1 is clipped (no gradient), and
    # ∂s_0/∂log π_{0,t} = s_0/3, so every real token of row 0 gets -(1/2) · s_0/3 · A_0 = -s_0/6
    log_probs, old, _, adv, mask = _hand_batch()
    log_probs = log_probs.requires_grad_()
    loss, _ = grpo_loss(log_probs, old, None, adv, mask, 0.2, 0.0, importance_level="sequence")
    loss.backward()
    torch.testing.assert_close(log_probs.grad, t([[-S0 / 6] * 3, [0.0, 0.0, 0.0]]), atol=1e-15, rtol=0)


def test_importance_level_errors_and_default():
    log_probs, old, ref, adv, mask = _hand_batch()
    with pytest.raises(ValueError, match="importance_level 'seq'.*sequence.*token"):
        grpo_loss(log_probs, old, ref, adv, mask, 0.2, 0.1, importance_level="seq")
    default, _ = grpo_loss(log_probs, old, ref, adv, mask, 0.2, 0.1)
    token, _ = grpo_loss(log_probs, old, ref, adv, mask, 0.2, 0.1, importance_level="token")
    assert torch.equal(default, token)


def _loss_and_grad(log_probs, *args, **kwargs):
    log_probs = log_probs.detach().clone().requires_grad_()
    loss, stats = grpo_loss(log_probs, *args, **kwargs)
    (grad,) = torch.autograd.grad(loss, log_probs)
    return loss, grad, stats


@PROP
@given(
    seed=st.integers(0, 2**31 - 1),
    width=st.integers(1, 4),
    loss_type=st.sampled_from(LOSS_TYPES),
    beta=st.sampled_from([0.0, 0.05]),
)
def test_gspo_equals_token_level_for_one_token_responses(seed, width, loss_type, beta):
    gen = torch.Generator().manual_seed(seed)
    B = 5
    position = torch.randint(0, width, (B, 1), generator=gen)
    mask = torch.arange(width).unsqueeze(0) == position  # one real token per row, anywhere
    lp, old, ref = (with_garbage(rand(gen, B, width, scale=0.3), mask, 7.0) for _ in range(3))
    args = (old, ref, rand(gen, B), mask, 0.2, beta, loss_type)
    token = _loss_and_grad(lp, *args)
    sequence = _loss_and_grad(lp, *args, importance_level="sequence")
    torch.testing.assert_close(sequence[0], token[0], atol=1e-12, rtol=0)
    torch.testing.assert_close(sequence[1], token[1], atol=1e-12, rtol=0)
    for k in token[2]:  # one token per response: per-token and per-response statistics agree
        torch.testing.assert_close(sequence[2][k], token[2][k], atol=1e-12, rtol=0)


@PROP
@given(
    seed=st.integers(0, 2**31 - 1),
    width=st.integers(1, 5),
    loss_type=st.sampled_from(LOSS_TYPES),
    beta=st.sampled_from([0.0, 0.05]),
    unbiased=st.booleans(),
)
def test_gspo_equals_token_level_when_log_ratios_are_equal_within_responses(
    seed, width, loss_type, beta, unbiased
):
    # ρ_{i,t} = s_i for every t, so values agree; gradients agree too: Σ_t ∂(s_i A_i)/∂log π_{i,u} = s_i A_i
    gen = torch.Generator().manual_seed(seed)
    B = 4
    mask = ragged_mask(gen, B, width)
    old = rand(gen, B, width, scale=0.5)
    lp = old + rand(gen, B, 1, scale=0.3)  # one log-ratio per response: some clipped, some not
    args = (old, rand(gen, B, width, scale=0.5), rand(gen, B), mask, 0.2, beta, loss_type)
    token = _loss_and_grad(lp, *args, unbiased_kl=unbiased)
    sequence = _loss_and_grad(lp, *args, unbiased_kl=unbiased, importance_level="sequence")
    torch.testing.assert_close(sequence[0], token[0], atol=1e-12, rtol=0)
    torch.testing.assert_close(sequence[1], token[1], atol=1e-12, rtol=0)


def _gspo_written_out(lp, old, ref, adv, mask, eps, eps_high, beta, loss_type):
    """The GSPO loss as DESIGN.md states it, with clean (0) padding."""
    m = mask.to(F64)
    s = torch.exp(((lp - old) * m).sum(-1) / m.sum(-1))  # [B]
    surrogate = torch.minimum(s * adv, torch.clamp(s, 1 - eps, 1 + eps_high) * adv)  # [B]
    k3 = torch.exp(ref - lp) - (ref - lp) - 1.0
    per_token = (-surrogate.unsqueeze(-1) + beta * k3) * m  # [B, T]
    B, T = m.shape
    return {
        "grpo": (per_token.sum(-1) / m.sum(-1)).mean(),
        "token": per_token.sum() / m.sum(),
        "dr_grpo": per_token.sum() / (B * T),
    }[loss_type]


@PROP
@given(
    seed=st.integers(0, 2**31 - 1),
    width=st.integers(1, 5),
    loss_type=st.sampled_from(LOSS_TYPES),
    eps_high=st.sampled_from([0.1, 0.3]),
)
def test_gspo_value_and_gradient_match_autograd_of_the_written_out_formula(seed, width, loss_type, eps_high):
    gen = torch.Generator().manual_seed(seed)
    B = 4
    mask = ragged_mask(gen, B, width)
    lp, old, ref = (torch.where(mask, rand(gen, B, width, scale=0.3), 0.0) for _ in range(3))
    adv = rand(gen, B)
    loss, grad, _ = _loss_and_grad(
        lp, old, ref, adv, mask, 0.1, 0.05, loss_type, clip_eps_high=eps_high, importance_level="sequence"
    )
    x = lp.clone().requires_grad_()
    expected = _gspo_written_out(x, old, ref, adv, mask, 0.1, eps_high, 0.05, loss_type)
    (expected_grad,) = torch.autograd.grad(expected, x)
    torch.testing.assert_close(loss, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(grad, expected_grad, atol=1e-12, rtol=0)


@PROP
@given(seed=st.integers(0, 2**31 - 1), width=st.integers(1, 5))
def test_sequence_ratio_gradient_is_s_over_length(seed, width):
    # no clipping (ε = 10), β = 0, "grpo": ∂L/∂log π_{i,u} = -(1/B) A_i s_i m_{i,u} / |o_i|
    gen = torch.Generator().manual_seed(seed)
    B = 4
    mask = ragged_mask(gen, B, width)
    lp, old, adv = rand(gen, B, width, scale=0.3), rand(gen, B, width, scale=0.3), rand(gen, B)
    _, grad, stats = _loss_and_grad(lp, old, None, adv, mask, 10.0, 0.0, "grpo", importance_level="sequence")
    m = mask.to(F64)
    s = torch.exp(((lp - old) * m).sum(-1) / m.sum(-1))
    expected = -(adv * s / m.sum(-1)).unsqueeze(-1) * m / B
    torch.testing.assert_close(grad, expected, atol=1e-14, rtol=0)
    assert stats["clip_fraction"].item() == 0.0
    torch.testing.assert_close(stats["ratio_mean"], s.mean())


@PROP
@given(
    seed=st.integers(0, 2**31 - 1),
    width=st.integers(1, 5),
    g=st.sampled_from(GARBAGE),
    loss_type=st.sampled_from(LOSS_TYPES),
)
def test_masked_positions_never_change_gspo(seed, width, g, loss_type):
    gen = torch.Generator().manual_seed(seed)
    mask = ragged_mask(gen, 3, width)
    tensors = [rand(gen, 3, width, scale=0.4) for _ in range(3)]
    adv = rand(gen, 3)
    results = []
    for fill in (0.0, g):
        lp, old, ref = (with_garbage(x, mask, fill) for x in tensors)
        results.append(
            _loss_and_grad(lp, old, ref, adv, mask, 0.2, 0.05, loss_type, importance_level="sequence")
        )
    (loss, grad, stats), (loss_g, grad_g, stats_g) = results
    torch.testing.assert_close(loss_g, loss)
    torch.testing.assert_close(grad_g, grad)
    assert torch.all(grad[~mask] == 0)
    for k in stats:
        torch.testing.assert_close(stats_g[k], stats[k])


@PROP
@given(seed=st.integers(0, 2**31 - 1), loss_type=st.sampled_from(LOSS_TYPES))
def test_gspo_micro_batches_with_the_global_normalizer_sum_to_the_full_batch(seed, loss_type):
    gen = torch.Generator().manual_seed(seed)
    B, width = 6, 4
    mask = ragged_mask(gen, B, width)
    lp, old, ref = (rand(gen, B, width, scale=0.3) for _ in range(3))
    adv = rand(gen, B)
    full, full_grad, _ = _loss_and_grad(
        lp, old, ref, adv, mask, 0.2, 0.04, loss_type, importance_level="sequence"
    )
    norm = {"grpo": B, "token": mask.sum(), "dr_grpo": B * width}[loss_type]
    x = lp.clone().requires_grad_()
    total = sum(
        grpo_loss(
            x[rows], old[rows], ref[rows], adv[rows], mask[rows], 0.2, 0.04, loss_type,
            normalizer=norm, importance_level="sequence",
        )[0]
        for rows in torch.arange(B).chunk(3)
    )  # fmt: skip
    (micro_grad,) = torch.autograd.grad(total, x)
    torch.testing.assert_close(total, full)
    torch.testing.assert_close(micro_grad, full_grad)


def test_gspo_leaves_its_inputs_and_a_row_without_tokens():
    gen = torch.Generator().manual_seed(3)
    mask = torch.tensor([[True, True, False], [False, False, False]])
    lp, old, ref = (rand(gen, 2, 3, scale=0.3) for _ in range(3))
    adv = t([1.0, -2.0])
    inputs = [lp, old, ref, adv, mask]
    before = [x.clone() for x in inputs]
    loss, stats = grpo_loss(lp, old, ref, adv, mask, 0.2, 0.1, importance_level="sequence")
    for x, y in zip(inputs, before, strict=True):
        assert torch.equal(x, y)
    assert torch.isfinite(loss)
    # the empty row counts as a response in "grpo" (B = 2) but not in the per-response statistics
    s0 = torch.exp((lp[0, :2] - old[0, :2]).mean())
    torch.testing.assert_close(stats["ratio_mean"], s0)
