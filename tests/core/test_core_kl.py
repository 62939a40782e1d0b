import math

import pytest
import torch
from core_helpers import GARBAGE, PROP, ragged_mask, rand, t, with_garbage
from hypothesis import given
from hypothesis import strategies as st

from postrl.core import AdaptiveKLController, FixedKLController, kl_estimate, kl_shaped_rewards

LOG2 = math.log(2.0)


def test_kl_estimates_hand_values():
    # token 0: pi = 0.5, pi_ref = 0.25 -> r = pi_ref / pi = 0.5;  token 1: pi = 0.25, pi_ref = 0.5 -> r = 2
    log_probs = torch.log(t([0.5, 0.25]))
    ref = torch.log(t([0.25, 0.5]))
    torch.testing.assert_close(kl_estimate(log_probs, ref, "k1"), t([LOG2, -LOG2]))
    torch.testing.assert_close(kl_estimate(log_probs, ref, "k2"), t([0.5 * LOG2**2, 0.5 * LOG2**2]))
    # k3 = r - 1 - log r: 0.5 - 1 + log 2 = log 2 - 0.5;  2 - 1 - log 2 = 1 - log 2
    torch.testing.assert_close(kl_estimate(log_probs, ref, "k3"), t([LOG2 - 0.5, 1.0 - LOG2]))


def test_kl_estimate_unknown_kind_names_the_valid_ones():
    with pytest.raises(ValueError, match="k1.*k2.*k3"):
        kl_estimate(t([0.0]), t([0.0]), "k4")


def test_k3_is_finite_for_extreme_log_ratios():
    log_probs = t([-1000.0, 0.0]).requires_grad_()
    k3 = kl_estimate(log_probs, t([0.0, -1000.0]), "k3")
    # log r clamped to +20 and -20: exp(20) - 20 - 1 and exp(-20) + 20 - 1
    torch.testing.assert_close(k3.detach(), t([math.exp(20) - 21.0, math.exp(-20) + 19.0]))
    k3.sum().backward()
    assert torch.isfinite(log_probs.grad).all()


@PROP
@given(a=st.floats(-50.0, 50.0), b=st.floats(-50.0, 50.0))
def test_k3_and_k2_are_nonnegative(a, b):
    assert kl_estimate(t([a]), t([b]), "k3").item() >= 0.0
    assert kl_estimate(t([a]), t([b]), "k2").item() >= 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_k3_stays_nonnegative_and_accurate_for_tiny_log_ratios(dtype):
    x = torch.tensor([1e-8, -1e-8, 1e-4, -1e-4, 1e-30], dtype=dtype)
    k3 = kl_estimate(torch.zeros_like(x), x, "k3")  # log r = x: k3 = x²/2 + x³/6 + …
    assert (k3 >= 0).all()  # exp(x) − x − 1 gave −1.1e-16 at x = 1e-8 in float64
    expected = x.double() ** 2 / 2 + x.double() ** 3 / 6
    # to the rounding of expm1(x), an ulp of x: 2e-24 at 1e-8 in float64; float32's ulp hides x²/2 < 1e-15
    tol = {"rtol": 1e-6, "atol": 1e-22} if dtype == torch.float64 else {"rtol": 1e-2, "atol": 1e-14}
    torch.testing.assert_close(k3.double(), expected, **tol)


def test_k1_and_k3_sample_means_approach_the_exact_kl():
    pi, pi_ref = t([0.5, 0.3, 0.2]), t([0.2, 0.3, 0.5])
    exact = (pi * (pi / pi_ref).log()).sum().item()  # 0.5 log 2.5 + 0.2 log 0.4 = 0.27487...
    gen = torch.Generator().manual_seed(1234)
    n = 200_000
    samples = torch.multinomial(pi, n, replacement=True, generator=gen)
    log_probs, ref = pi.log()[samples], pi_ref.log()[samples]
    for kind in ("k1", "k3"):
        est = kl_estimate(log_probs, ref, kind)
        stderr = est.std().item() / math.sqrt(n)
        assert abs(est.mean().item() - exact) < 4 * stderr, kind


def test_kl_shaped_rewards_on_a_padded_batch():
    nan = float("nan")
    # row 0 has 3 response tokens, row 1 has 2; log pi - log pi_ref = [0.5, -1, 0] and [0.5, 0]
    log_probs = t([[-1.0, -2.0, -1.0, nan], [-0.5, -1.0, nan, nan]])
    ref = t([[-1.5, -1.0, -1.0, 7.0], [-1.0, -1.0, 0.0, 0.0]])
    mask = t([[1, 1, 1, 0], [1, 1, 0, 0]])
    # -beta * diff with beta = 0.1, score 1 on token 2 of row 0, score 2 on token 1 of row 1
    expected = t([[-0.05, 0.1, 1.0, 0.0], [-0.05, 2.0, 0.0, 0.0]])
    out = kl_shaped_rewards(t([1.0, 2.0]), log_probs, ref, mask, 0.1)
    torch.testing.assert_close(out, expected)
    assert not out.requires_grad


def test_kl_shaped_rewards_left_padding_and_empty_rows():
    zeros = torch.zeros(3, 3, dtype=torch.float64)
    mask = torch.tensor([[False, True, True], [True, False, False], [False, False, False]])
    out = kl_shaped_rewards(t([5.0, 6.0, 7.0]), zeros, zeros, mask, 0.1)
    # the score lands on the LAST real token; a row without tokens gets nothing
    torch.testing.assert_close(out, t([[0.0, 0.0, 5.0], [6.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))


@PROP
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 4),
    width=st.integers(1, 6),
    g=st.sampled_from(GARBAGE),
)
def test_masked_positions_never_change_kl_shaped_rewards(seed, batch, width, g):
    gen = torch.Generator().manual_seed(seed)
    mask = ragged_mask(gen, batch, width)
    log_probs, ref, scores = rand(gen, batch, width), rand(gen, batch, width), rand(gen, batch)
    clean = kl_shaped_rewards(scores, log_probs, ref, mask, 0.05)
    dirty = kl_shaped_rewards(
        scores, with_garbage(log_probs, mask, g), with_garbage(ref, mask, g), mask, 0.05
    )
    torch.testing.assert_close(dirty, clean)
    assert torch.all(clean[~mask] == 0)
    # the rewards sum to score - beta * sum of k1 over real tokens
    k1_sum = torch.where(mask, log_probs - ref, 0.0).sum(-1)
    torch.testing.assert_close(clean.sum(-1), scores - 0.05 * k1_sum)


def test_adaptive_kl_controller_two_updates():
    ctl = AdaptiveKLController(0.1, target=6.0, horizon=10_000)
    # KL 9: e = 9/6 - 1 = 0.5 -> clipped 0.2; beta = 0.1 * (1 + 0.2 * 256 / 10000) = 0.1 * 1.00512
    assert ctl.update(9.0, 256) == pytest.approx(0.100512, abs=1e-15)
    # KL 3 (tensor): e = -0.5 -> -0.2; beta *= 1 - 0.2 * 512 / 10000 = 0.98976
    ctl.update(torch.tensor(3.0), 512)
    assert ctl.value == pytest.approx(0.100512 * 0.98976, abs=1e-15)
    # KL 6.6: e = 0.1 inside the clip; beta *= 1 + 0.1 * 1000 / 10000 = 1.01
    ctl.update(6.6, 1000)
    assert ctl.value == pytest.approx(0.100512 * 0.98976 * 1.01, abs=1e-15)


def test_kl_controllers_checkpoint_round_trip():
    ctl = AdaptiveKLController(0.2, 6.0, 100.0)
    ctl.update(12.0, 10)
    fresh = AdaptiveKLController(1.0, 1.0, 1.0)
    fresh.load_state_dict(ctl.state_dict())
    assert (fresh.value, fresh.target, fresh.horizon) == (ctl.value, 6.0, 100.0)
    fixed = FixedKLController(0.05)
    assert fixed.update(100.0, 1000) == 0.05 and fixed.value == 0.05
    other = FixedKLController(1.0)
    other.load_state_dict(fixed.state_dict())
    assert other.value == 0.05
