import math

import pytest
import torch
from core_helpers import rand, t

from postrl.core import diag_gaussian_entropy, diag_gaussian_log_prob


def test_diag_gaussian_log_prob_hand_value():
    # dim 0: x = 1, mu = 0, sigma = 1 -> -0.5 (1 + 0 + log 2pi); dim 1: x = mu, sigma = 2 -> -0.5 (0 + 2 log 2 + log 2pi)
    out = diag_gaussian_log_prob(t([1.0, 0.0]), t([0.0, 0.0]), t([0.0, math.log(2.0)]))
    assert out.item() == pytest.approx(-0.5 - math.log(2.0) - math.log(2 * math.pi), abs=1e-12)


def test_diag_gaussian_matches_torch_normal():
    gen = torch.Generator().manual_seed(5)
    x, mean = rand(gen, 6, 3), rand(gen, 6, 3)
    log_std = rand(gen, 3, scale=0.5)  # state-independent parameter, broadcast over the batch
    normal = torch.distributions.Normal(mean, log_std.exp())
    torch.testing.assert_close(diag_gaussian_log_prob(x, mean, log_std), normal.log_prob(x).sum(-1))
    torch.testing.assert_close(diag_gaussian_entropy(log_std.expand(6, 3)), normal.entropy().sum(-1))


def test_diag_gaussian_entropy_hand_value():
    # sigma = 1 in 2 dims: 2 * 0.5 * (1 + log 2pi)
    assert diag_gaussian_entropy(t([0.0, 0.0])).item() == pytest.approx(
        1.0 + math.log(2 * math.pi), abs=1e-12
    )
