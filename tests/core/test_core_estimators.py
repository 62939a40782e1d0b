import math

import pytest
import torch
from core_helpers import F64, PROP, t
from hypothesis import given
from hypothesis import strategies as st

from postrl.core import group_advantages, overlong_penalty, reinforce_pp_advantages, rloo_advantages

# ---- RLOO ----------------------------------------------------------------------------------------------------


def test_rloo_hand_values():
    # G = 2: each baseline is the other response's reward
    torch.testing.assert_close(rloo_advantages(t([1.0, 0.0, 0.0, 1.0]), 2), t([1.0, -1.0, -1.0, 1.0]))
    # G = 3, rewards [1, 2, 6]: baselines (2 + 6)/2 = 4, (1 + 6)/2 = 3.5, (1 + 2)/2 = 1.5
    torch.testing.assert_close(rloo_advantages(t([1.0, 2.0, 6.0]), 3), t([-3.0, -1.5, 4.5]))
    # other shapes are grouped in row-major order and keep their shape
    torch.testing.assert_close(rloo_advantages(t([[1.0, 0.0], [0.0, 1.0]]), 2), t([[1.0, -1.0], [-1.0, 1.0]]))


def test_rloo_constant_group_is_exactly_zero():
    out = rloo_advantages(t([0.1, 0.1, 0.1, 0.7, 0.7, 0.7, 0.0, 1.0, 1.0]), 3)
    assert torch.all(out[:6] == 0)
    torch.testing.assert_close(out[6:], t([-1.0, 0.5, 0.5]))


@pytest.mark.parametrize(
    ("n", "G", "match"), [(4, 1, "4 rewards.*groups of 1"), (5, 2, "5 rewards.*groups of 2")]
)
def test_rloo_bad_sizes(n, G, match):
    with pytest.raises(ValueError, match=match):
        rloo_advantages(torch.zeros(n, dtype=F64), G)


def test_rloo_is_detached_and_leaves_its_input():
    rewards = t([1.0, 2.0, 6.0, 0.0]).requires_grad_()
    before = rewards.detach().clone()
    out = rloo_advantages(rewards, 2)
    assert not out.requires_grad
    assert torch.equal(rewards.detach(), before)


@PROP
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 4), G=st.integers(2, 6), ties=st.booleans())
def test_rloo_is_the_scaled_group_centred_reward_and_sums_to_zero(seed, n, G, ties):
    gen = torch.Generator().manual_seed(seed)
    if ties:
        rewards = torch.randint(0, 3, (n * G,), generator=gen).to(F64)  # ties and constant groups
    else:
        rewards = torch.randn(n * G, generator=gen, dtype=F64)
    adv = rloo_advantages(rewards, G)
    groups = rewards.reshape(n, G)
    loop = torch.stack(
        [r - (groups[g].sum() - r) / (G - 1) for g in range(n) for r in groups[g]]
    )  # the leave-one-out baseline, one response at a time
    torch.testing.assert_close(adv, loop, atol=1e-12, rtol=0)
    scaled = G / (G - 1) * group_advantages(rewards, G, scale=False)
    torch.testing.assert_close(adv, scaled, atol=1e-12, rtol=0)
    torch.testing.assert_close(adv.reshape(n, G).sum(-1), torch.zeros(n, dtype=F64), atol=1e-12, rtol=0)


# ---- REINFORCE++-baseline ------------------------------------------------------------------------------------


def test_reinforce_pp_hand_values_without_groups():
    # r = [1, 2, 3, 6]: mean 3, centred [-2, -1, 0, 3], Bessel variance (4 + 1 + 0 + 9)/3 = 14/3
    out = reinforce_pp_advantages(t([1.0, 2.0, 3.0, 6.0]))
    torch.testing.assert_close(out, t([-2.0, -1.0, 0.0, 3.0]) / math.sqrt(14 / 3 + 1e-8), atol=1e-15, rtol=0)


def test_reinforce_pp_hand_values_with_groups():
    # r = [1, 3 | 0, 4]: group means 2 and 2 -> a = [-1, 1, -2, 2], mean 0, Bessel variance 10/3
    out = reinforce_pp_advantages(t([1.0, 3.0, 0.0, 4.0]), group_size=2)
    torch.testing.assert_close(out, t([-1.0, 1.0, -2.0, 2.0]) / math.sqrt(10 / 3 + 1e-8), atol=1e-15, rtol=0)
    # shapes are kept; a batch of constant groups, or of one reward, gives 0
    torch.testing.assert_close(out, reinforce_pp_advantages(t([[1.0, 3.0], [0.0, 4.0]]), 2).reshape(-1))
    assert torch.all(reinforce_pp_advantages(t([1.0, 1.0, 5.0, 5.0]), 2) == 0)
    assert torch.all(reinforce_pp_advantages(t([7.0])) == 0)


def test_reinforce_pp_bad_sizes_and_detached():
    with pytest.raises(ValueError, match="3 rewards.*groups of 2"):
        reinforce_pp_advantages(t([1.0, 2.0, 3.0]), 2)
    with pytest.raises(ValueError, match="groups of 0"):
        reinforce_pp_advantages(t([1.0, 2.0]), 0)
    rewards = t([1.0, 2.0, 3.0, 6.0]).requires_grad_()
    before = rewards.detach().clone()
    for G in (None, 2):
        assert not reinforce_pp_advantages(rewards, G).requires_grad
    assert torch.equal(rewards.detach(), before)


@PROP
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 4), G=st.sampled_from([None, 1, 2, 3]))
def test_reinforce_pp_has_mean_zero_and_the_masked_whiten_scale(seed, n, G):
    gen = torch.Generator().manual_seed(seed)
    N = n * (G or 3)
    rewards = torch.randint(0, 4, (N,), generator=gen).to(F64) * 0.5
    out = reinforce_pp_advantages(rewards, G)
    a = rewards if G is None else rewards - rewards.reshape(-1, G).mean(-1).repeat_interleave(G)
    var = a.var() if N > 1 else torch.zeros((), dtype=F64)  # torch.var is Bessel-corrected
    torch.testing.assert_close(out, (a - a.mean()) / torch.sqrt(var + 1e-8), atol=1e-9, rtol=1e-9)
    assert abs(out.mean().item()) < 1e-9
    if N > 1:
        expected_std = math.sqrt(var.item()) / math.sqrt(var.item() + 1e-8)
        assert out.std().item() == pytest.approx(expected_std, abs=1e-9)


# ---- DAPO overlong penalty -----------------------------------------------------------------------------------


def test_overlong_penalty_hand_values():
    lengths = torch.tensor([2, 4, 5, 6, 7, 8, 9, 20])
    # max_len 8, buffer 4: free up to 4, then -(L - 4)/4 up to 8, then -1
    expected = [0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0]
    assert overlong_penalty(lengths, 8, 4).tolist() == expected
    assert overlong_penalty(lengths, 8, 4, penalty=2.0).tolist() == [2 * x for x in expected]
    # buffer 0: the ramp is empty, a hard cut at max_len (responses capped at max_len never pay)
    assert overlong_penalty(lengths, 8, 0).tolist() == [0.0] * 6 + [-1.0, -1.0]


def test_overlong_penalty_dtype_and_errors():
    assert overlong_penalty(torch.tensor([3, 9]), 8, 4).dtype == torch.get_default_dtype()
    floats = t([5.5, 8.0])
    out = overlong_penalty(floats, 8, 4, 0.5)
    assert out.dtype == F64
    torch.testing.assert_close(out, t([-0.5 * 1.5 / 4, -0.5]))
    assert torch.equal(floats, t([5.5, 8.0]))
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_penalty(floats, 8, -1)


@PROP
@given(
    seed=st.integers(0, 2**31 - 1),
    max_len=st.integers(1, 64),
    buffer_frac=st.floats(0.0, 1.0),
    penalty=st.floats(0.0, 3.0),
)
def test_overlong_penalty_is_continuous_monotone_and_the_clamp_form(seed, max_len, buffer_frac, penalty):
    buffer_len = int(buffer_frac * max_len)
    start = max_len - buffer_len
    gen = torch.Generator().manual_seed(seed)
    lengths = (torch.rand(200, generator=gen, dtype=F64) * (max_len + 10)).sort().values
    out = overlong_penalty(lengths, max_len, buffer_len, penalty)
    assert torch.all(out.diff() <= 0)  # non-increasing in L
    assert torch.all((out <= 0) & (out >= -penalty))
    if buffer_len > 0:
        # the form of the lm module it replaces: -penalty · clamp(clamp(L − start, min=0)/buffer, max=1)
        clamp_form = -penalty * ((lengths - start).clamp(min=0.0) / buffer_len).clamp(max=1.0)
        torch.testing.assert_close(out, clamp_form, atol=1e-12, rtol=0)
        # continuous at both ends of the ramp
        delta = 1e-9
        probes = t([start, start + delta, max_len - delta, max_len, max_len + delta])
        ends = overlong_penalty(probes, max_len, buffer_len, penalty)
        assert ends[0].item() == 0.0 and abs(ends[1].item()) <= 2 * penalty * delta / buffer_len + 1e-15
        assert ends[3].item() == -penalty and ends[4].item() == -penalty
        assert abs(ends[2].item() + penalty) <= 2 * penalty * delta / buffer_len + 1e-15
