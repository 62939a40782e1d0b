import math

import pytest
import torch
from core_helpers import GARBAGE, PROP, ragged_mask, rand, t, with_garbage
from hypothesis import given
from hypothesis import strategies as st

from postrl.core import masked_mean, masked_whiten


def test_masked_mean_hand_values():
    x = t([1.0, 2.0, float("nan"), 4.0])
    mask = t([1.0, 1.0, 0.0, 1.0])
    assert masked_mean(x, mask).item() == pytest.approx(7.0 / 3.0, abs=1e-15)
    assert masked_mean(x, mask.bool()).item() == pytest.approx(7.0 / 3.0, abs=1e-15)


def test_masked_mean_dim_and_dtype():
    x = t([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[True, False], [True, True]])
    out = masked_mean(x, mask, dim=-1)
    torch.testing.assert_close(out, t([1.0, 3.5]))
    assert out.dtype == torch.float64


def test_masked_mean_empty_mask_is_zero_not_nan():
    assert masked_mean(t([1.0, 2.0]), t([0.0, 0.0])).item() == 0.0


def test_masked_mean_gradient_ignores_nan_padding():
    x = t([1.0, float("nan"), 3.0]).requires_grad_()
    masked_mean(x, t([1.0, 0.0, 1.0])).backward()
    torch.testing.assert_close(x.grad, t([0.5, 0.0, 0.5]))


def test_masked_whiten_hand_values():
    # masked x = [1, 2, 3]: mean 2, Bessel variance (1 + 0 + 1) / 2 = 1
    x = t([1.0, 2.0, 3.0, 100.0])
    mask = t([1.0, 1.0, 1.0, 0.0])
    s = 1.0 / math.sqrt(1.0 + 1e-8)
    torch.testing.assert_close(masked_whiten(x, mask), t([-s, 0.0, s, 0.0]))
    torch.testing.assert_close(masked_whiten(x, mask, shift_mean=False), t([2.0 - s, 2.0, 2.0 + s, 0.0]))


def test_masked_whiten_matches_bessel_std():
    # [2, 4, 6, 8]: mean 5, var = (9 + 1 + 1 + 9) / 3 = 20/3, std = 2.5819888974716116
    out = masked_whiten(t([2.0, 4.0, 6.0, 8.0]), t([1.0, 1.0, 1.0, 1.0]))
    torch.testing.assert_close(out, t([-3.0, -1.0, 1.0, 3.0]) / 2.5819888974716116, rtol=1e-7, atol=1e-7)


@PROP
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 4),
    width=st.integers(1, 6),
    g=st.sampled_from(GARBAGE),
)
def test_masked_positions_never_matter(seed, batch, width, g):
    gen = torch.Generator().manual_seed(seed)
    x = rand(gen, batch, width, scale=3.0)
    mask = ragged_mask(gen, batch, width)
    dirty = with_garbage(x, mask, g)
    clean = with_garbage(x, mask, 0.0)
    torch.testing.assert_close(masked_mean(dirty, mask), masked_mean(clean, mask))
    torch.testing.assert_close(masked_mean(dirty, mask, dim=-1), masked_mean(clean, mask, dim=-1))
    for shift in (True, False):
        out = masked_whiten(dirty, mask, shift_mean=shift)
        torch.testing.assert_close(out, masked_whiten(clean, mask, shift_mean=shift))
        assert torch.all(out[~mask] == 0)


@PROP
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(3, 20))
def test_masked_whiten_gives_zero_mean_unit_std(seed, n):
    gen = torch.Generator().manual_seed(seed)
    x = rand(gen, n, scale=5.0) + 3.0
    mask = torch.ones(n, dtype=torch.bool)
    out = masked_whiten(x, mask)
    assert abs(out.mean().item()) < 1e-9
    # unit std up to the 1e-8 inside the rsqrt, which matters for a tightly clustered x (n = 3 can give σ ~ 0.05)
    sigma = x.std().item()
    assert out.std().item() == pytest.approx(sigma / (sigma**2 + 1e-8) ** 0.5, rel=1e-9)
