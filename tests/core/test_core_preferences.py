import math

import pytest
import torch
from core_helpers import PROP, rand, t
from hypothesis import given
from hypothesis import strategies as st

from postrl.core import pairwise_loss, preference_loss

LOG_SIG_1 = -math.log(1.0 + math.exp(-1.0))  # log sigma(1) = -0.31326168751822286
LOG_SIG_2 = -math.log(1.0 + math.exp(-2.0))  # log sigma(2) = -0.12692801104297263


def test_pairwise_loss_hand_values_and_margin():
    # differences [1, 0]: -(log sigma(1) + log sigma(0)) / 2
    loss = pairwise_loss(t([2.0, 0.0]), t([1.0, 0.0]))
    assert loss.item() == pytest.approx(-(LOG_SIG_1 - math.log(2)) / 2, abs=1e-12)
    # margin [1, 0] turns the differences into [0, 0]: log 2
    assert pairwise_loss(t([2.0, 0.0]), t([1.0, 0.0]), t([1.0, 0.0])).item() == pytest.approx(math.log(2))
    assert pairwise_loss(t([2.0]), t([1.0]), margin=-1.0).item() == pytest.approx(-LOG_SIG_2, abs=1e-12)


def test_pairwise_loss_is_stable_for_large_gaps():
    assert pairwise_loss(t([0.0]), t([1000.0])).item() == pytest.approx(1000.0)
    assert pairwise_loss(t([1000.0]), t([0.0])).item() == pytest.approx(0.0, abs=1e-12)


def test_preference_loss_with_random_responses():
    """P(1 ≻ 2) = ε/2 + (1 − ε) σ(d): hand values at d = 2 and a bounded loss for a confidently wrong label."""
    eps, sig2 = 0.1, 1.0 / (1.0 + math.exp(-2.0))
    p1 = eps / 2 + (1 - eps) * sig2
    assert preference_loss(t([3.0]), t([1.0]), 1.0, random_response=eps).item() == pytest.approx(
        -math.log(p1), abs=1e-12
    )
    tie = preference_loss(t([3.0]), t([1.0]), 0.5, random_response=eps).item()
    assert tie == pytest.approx(-0.5 * (math.log(p1) + math.log(1 - p1)), abs=1e-12)
    wrong = preference_loss(t([1000.0]), t([0.0]), 0.0, random_response=eps).item()
    assert wrong == pytest.approx(-math.log(eps / 2), abs=1e-9)  # not 1000
    g = torch.Generator().manual_seed(3)
    s1, s2 = rand(g, 7), rand(g, 7)
    torch.testing.assert_close(
        preference_loss(s1, s2, 0.3, random_response=0.0), preference_loss(s1, s2, 0.3)
    )


def test_preference_loss_ties_and_soft_labels():
    # tie p = 0.5 on s1 - s2 = 2: -(0.5 log sigma(2) + 0.5 log sigma(-2)), log sigma(-2) = log sigma(2) - 2
    loss = preference_loss(t([3.0]), t([1.0]), 0.5)
    assert loss.item() == pytest.approx(-(0.5 * LOG_SIG_2 + 0.5 * (LOG_SIG_2 - 2.0)), abs=1e-12)
    # equal scores with a tie: log 2, and the gradient is 0 (the prediction 0.5 matches the label)
    s1 = t([0.7]).requires_grad_()
    tie = preference_loss(s1, t([0.7]), t([0.5]))
    assert tie.item() == pytest.approx(math.log(2))
    tie.backward()
    assert s1.grad.item() == pytest.approx(0.0, abs=1e-15)
    # a batch mixing labels 1, 0 and 0.5 on differences [1, 1, 0]
    mixed = preference_loss(t([1.0, 1.0, 0.0]), t([0.0, 0.0, 0.0]), t([1.0, 0.0, 0.5]))
    assert mixed.item() == pytest.approx((-LOG_SIG_1 + (1.0 - LOG_SIG_1) + math.log(2)) / 3, abs=1e-12)


@PROP
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 8))
def test_preference_loss_with_hard_labels_is_pairwise_loss(seed, n):
    gen = torch.Generator().manual_seed(seed)
    s1, s2 = rand(gen, n, scale=4.0), rand(gen, n, scale=4.0)
    torch.testing.assert_close(preference_loss(s1, s2, 1.0), pairwise_loss(s1, s2))
    torch.testing.assert_close(
        preference_loss(s1, s2, torch.zeros(n, dtype=torch.float64)), pairwise_loss(s2, s1)
    )
