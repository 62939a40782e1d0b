import math

import pytest
import torch
import torch.nn.functional as F
from core_helpers import F64, PROP, rand, t
from hypothesis import given
from hypothesis import strategies as st

from postrl.core import dpo_loss

# beta = 0.5; chosen log-ratios [-1 - (-1.5), -3 - (-2)] = [0.5, -1], rejected [-2 - (-1.5), -1 - (-2)] =
# [-0.5, 1], so h = [1, -2] and beta·h = [0.5, -1].
BETA = 0.5


def _pairs(requires_grad=False):
    chosen, rejected = t([-1.0, -3.0]), t([-2.0, -1.0])
    if requires_grad:
        chosen, rejected = chosen.requires_grad_(), rejected.requires_grad_()
    return chosen, rejected, t([-1.5, -2.0]), t([-1.5, -2.0])


def softplus(x: float) -> float:
    """-log σ(-x) = log(1 + e^x)."""
    return math.log1p(math.exp(x))


def test_dpo_sigmoid_hand_values_and_stats():
    loss, stats = dpo_loss(*_pairs(), BETA)
    # -log σ(0.5) = log(1 + e^-0.5) = 0.474077, -log σ(-1) = log(1 + e) = 1.313262
    assert loss.item() == pytest.approx((softplus(-0.5) + softplus(1.0)) / 2, abs=1e-12)
    assert loss.item() == pytest.approx(0.8936693, abs=1e-7)
    assert stats["reward_accuracy"].item() == 0.5
    assert stats["reward_margin"].item() == pytest.approx(-0.25, abs=1e-15)  # mean(0.5, -1)
    assert stats["chosen_rewards"].item() == pytest.approx(-0.125, abs=1e-15)  # mean(0.25, -0.5)
    assert stats["rejected_rewards"].item() == pytest.approx(0.125, abs=1e-15)  # mean(-0.25, 0.5)
    for value in stats.values():
        assert value.dim() == 0 and not value.requires_grad and value.dtype == F64


def test_dpo_sigmoid_soft_targets_by_hand():
    # p = [0.75, 0.25]: -[p log σ(βh) + (1 - p) log σ(-βh)] = p·softplus(-βh) + (1 - p)·softplus(βh)
    loss, _ = dpo_loss(*_pairs(), BETA, target=t([0.75, 0.25]))
    row0 = 0.75 * softplus(-0.5) + 0.25 * softplus(0.5)
    row1 = 0.25 * softplus(1.0) + 0.75 * softplus(-1.0)
    assert loss.item() == pytest.approx((row0 + row1) / 2, abs=1e-12)
    # a scalar tie: ½[softplus(x) + softplus(-x)] per pair
    tie, _ = dpo_loss(*_pairs(), BETA, target=0.5)
    expected = (softplus(0.5) + softplus(-0.5) + softplus(1.0) + softplus(-1.0)) / 4
    assert tie.item() == pytest.approx(expected, abs=1e-12)


def test_ipo_hand_values():
    # p = 1: target margin 1/(2β) = 1 -> (1 - 1)², (-2 - 1)² -> mean 4.5
    loss, stats = dpo_loss(*_pairs(), BETA, "ipo")
    assert loss.item() == pytest.approx(4.5, abs=1e-12)
    assert stats["reward_margin"].item() == pytest.approx(-0.25, abs=1e-15)
    # tie: target 0 -> (1² + 2²)/2 = 2.5; p = [1, 0]: targets [1, -1] -> (0² + (-2 + 1)²)/2 = 0.5
    assert dpo_loss(*_pairs(), BETA, "ipo", target=0.5)[0].item() == pytest.approx(2.5, abs=1e-12)
    assert dpo_loss(*_pairs(), BETA, "ipo", target=t([1.0, 0.0]))[0].item() == pytest.approx(0.5, abs=1e-12)


def test_dpo_hand_gradients_and_the_reference_is_constant():
    # sigmoid: ∂L/∂chosen_i = -(β/B) σ(-βh_i) = -∂L/∂rejected_i; ipo: ∂L/∂chosen_i = (2/B)(h_i - 1/(2β))
    chosen, rejected, ref_chosen, ref_rejected = _pairs(requires_grad=True)
    ref_chosen.requires_grad_()
    loss, _ = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, BETA)
    loss.backward()
    sig = torch.sigmoid(t([-0.5, 1.0]))
    torch.testing.assert_close(chosen.grad, -BETA / 2 * sig, atol=1e-15, rtol=0)
    torch.testing.assert_close(rejected.grad, BETA / 2 * sig, atol=1e-15, rtol=0)
    assert ref_chosen.grad is None
    chosen, rejected, ref_chosen, ref_rejected = _pairs(requires_grad=True)
    dpo_loss(chosen, rejected, ref_chosen, ref_rejected, BETA, "ipo")[0].backward()
    torch.testing.assert_close(chosen.grad, t([0.0, -3.0]), atol=1e-15, rtol=0)
    torch.testing.assert_close(rejected.grad, t([0.0, 3.0]), atol=1e-15, rtol=0)


def test_dpo_is_stable_for_large_margins():
    big = t([1e4, -1e4])
    zeros = torch.zeros(2, dtype=F64)
    loss, _ = dpo_loss(big, zeros, zeros, zeros, 0.1)  # βh = ±1000: per pair 0 and 1000
    assert loss.item() == pytest.approx(500.0, abs=1e-9)
    tie, _ = dpo_loss(big, zeros, zeros, zeros, 0.1, target=0.5)
    assert tie.item() == pytest.approx(500.0, abs=1e-9)


def test_dpo_errors_and_inputs_unchanged():
    pairs = _pairs()
    before = [x.clone() for x in pairs]
    with pytest.raises(ValueError, match="loss_type 'hinge'.*ipo.*sigmoid"):
        dpo_loss(*pairs, BETA, "hinge")
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(*pairs, 0.0)
    target = t([0.3, 0.9])
    for loss_type in ("sigmoid", "ipo"):
        dpo_loss(*pairs, BETA, loss_type, target)
    for x, y in zip(pairs, before, strict=True):
        assert torch.equal(x, y)
    assert torch.equal(target, t([0.3, 0.9]))


def _random_pairs(seed, B=6):
    gen = torch.Generator().manual_seed(seed)
    return [rand(gen, B, scale=3.0) for _ in range(4)], torch.rand(B, generator=gen, dtype=F64)


@PROP
@given(seed=st.integers(0, 2**31 - 1), beta=st.floats(0.01, 2.0))
def test_dpo_sigmoid_without_target_is_minus_log_sigmoid(seed, beta):
    (c, r, rc, rr), _ = _random_pairs(seed)
    loss, stats = dpo_loss(c, r, rc, rr, beta)
    h = (c - rc) - (r - rr)
    torch.testing.assert_close(loss, -torch.log(torch.sigmoid(beta * h)).mean(), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(loss, dpo_loss(c, r, rc, rr, beta, target=1.0)[0], atol=1e-15, rtol=0)
    assert stats["reward_accuracy"].item() == (h > 0).double().mean().item()
    margin = stats["chosen_rewards"] - stats["rejected_rewards"]
    torch.testing.assert_close(margin, stats["reward_margin"], atol=1e-12, rtol=0)


@PROP
@given(
    seed=st.integers(0, 2**31 - 1), beta=st.floats(0.01, 2.0), loss_type=st.sampled_from(["sigmoid", "ipo"])
)
def test_swapping_chosen_and_rejected_with_target_one_minus_p_is_the_same_loss(seed, beta, loss_type):
    (c, r, rc, rr), p = _random_pairs(seed)
    loss, stats = dpo_loss(c, r, rc, rr, beta, loss_type, p)
    swapped, swapped_stats = dpo_loss(r, c, rr, rc, beta, loss_type, 1.0 - p)
    torch.testing.assert_close(swapped, loss, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(swapped_stats["reward_margin"], -stats["reward_margin"], atol=1e-12, rtol=0)
    torch.testing.assert_close(swapped_stats["chosen_rewards"], stats["rejected_rewards"])


def _single(h: torch.Tensor, beta: float, loss_type: str, p: float) -> torch.Tensor:
    """The loss of one pair with log-ratio margin h (policy chosen log-prob h, the rest 0)."""
    zero = torch.zeros(1, dtype=F64)
    return dpo_loss(h.reshape(1), zero, zero, zero, beta, loss_type, p)[0]


@PROP
@given(h=st.floats(-20.0, 20.0), beta=st.floats(0.05, 2.0), p=st.floats(0.0, 1.0))
def test_the_loss_is_minimised_at_the_target_margin(h, beta, p):
    # tie: sigmoid minimised at h = 0 (value log 2); IPO minimised at h* = (2p - 1)/(2β) (value 0)
    tie_min = _single(t(0.0), beta, "sigmoid", 0.5)
    assert tie_min.item() == pytest.approx(math.log(2.0), abs=1e-15)
    assert _single(t(h), beta, "sigmoid", 0.5).item() >= tie_min.item() - 1e-15
    h_star = t((2 * p - 1) / (2 * beta)).requires_grad_()
    ipo_min = _single(h_star, beta, "ipo", p)
    (grad,) = torch.autograd.grad(ipo_min, h_star)
    assert ipo_min.item() == pytest.approx(0.0, abs=1e-20) and grad.item() == pytest.approx(0.0, abs=1e-12)
    assert _single(t(h), beta, "ipo", p).item() == pytest.approx(
        (h - h_star.item()) ** 2, rel=1e-12, abs=1e-12
    )
    # a soft target p ∈ (0, 1): the sigmoid loss is stationary where σ(βh) = p
    if 1e-6 < p < 1 - 1e-6:
        h_p = t(math.log(p / (1 - p)) / beta).requires_grad_()
        (grad,) = torch.autograd.grad(_single(h_p, beta, "sigmoid", p), h_p)
        assert grad.item() == pytest.approx(0.0, abs=1e-12)


def test_sigmoid_matches_logsigmoid_cross_entropy_for_soft_targets():
    (c, r, rc, rr), p = _random_pairs(5, B=8)
    loss, _ = dpo_loss(c, r, rc, rr, 0.3, target=p)
    logits = 0.3 * ((c - rc) - (r - rr))
    expected = F.binary_cross_entropy_with_logits(logits, p)  # an independent formulation
    torch.testing.assert_close(loss, expected, atol=1e-12, rtol=1e-12)
