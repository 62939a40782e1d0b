import math

import pytest
import torch
from core_helpers import GARBAGE, PROP, ragged_mask, rand, t, with_garbage
from hypothesis import given
from hypothesis import strategies as st

from postrl.core import entropy_from_logits, ppo_clip_loss, reinforce_loss, value_loss


def test_reinforce_loss_hand_values_and_detached_weights():
    log_probs = t([-1.0, -2.0]).requires_grad_()
    weights = t([2.0, 3.0]).requires_grad_()
    loss = reinforce_loss(log_probs, weights)  # -mean(-2, -6) = 4
    assert loss.item() == pytest.approx(4.0)
    loss.backward()
    torch.testing.assert_close(log_probs.grad, t([-1.0, -1.5]))  # -w / N
    assert weights.grad is None
    masked = reinforce_loss(t([-1.0, float("nan")]), t([2.0, float("inf")]), mask=t([1.0, 0.0]))
    assert masked.item() == pytest.approx(2.0)


# Six PPO cases with eps = 0.2, old log-prob 0 so that rho = exp(log_prob):
#  rho  A    rho*A  clip(rho)*A   min     clipping active?
#  1.1  +1   1.1    1.1           1.1     no (inside the band)
#  1.5  +1   1.5    1.2           1.2     yes (A > 0, rho > 1.2)
#  0.5  +1   0.5    0.8           0.5     no (clip would help, min keeps rho*A)
#  0.5  -1  -0.5   -0.8          -0.8     yes (A < 0, rho < 0.8)
#  1.5  -1  -1.5   -1.2          -1.5     no
#  0.9  -2  -1.8   -1.8          -1.8     no
# loss = -(1.1 + 1.2 + 0.5 - 0.8 - 1.5 - 1.8) / 6 = 1.3 / 6
RHO = [1.1, 1.5, 0.5, 0.5, 1.5, 0.9]
ADV = [1.0, 1.0, 1.0, -1.0, -1.0, -2.0]


def test_ppo_clip_loss_inside_and_outside_the_band():
    log_probs = t([math.log(r) for r in RHO]).requires_grad_()
    loss, stats = ppo_clip_loss(log_probs, torch.zeros(6, dtype=torch.float64), t(ADV), 0.2)
    assert loss.item() == pytest.approx(1.3 / 6, abs=1e-12)
    assert stats["clip_fraction"].item() == pytest.approx(2 / 6)  # |rho - 1| > eps would give 4/6
    assert stats["ratio_mean"].item() == pytest.approx(1.0)
    approx_kl = sum((r - 1) - math.log(r) for r in RHO) / 6
    assert stats["approx_kl"].item() == pytest.approx(approx_kl, abs=1e-12)
    assert all(v.dim() == 0 and not v.requires_grad for v in stats.values())
    loss.backward()
    # dL/dlog_prob = -rho*A/6 where the unclipped term is active, 0 where clipping is active
    torch.testing.assert_close(log_probs.grad, t([-1.1, 0.0, -0.5, 0.0, 1.5, 1.8]) / 6)


def test_ppo_clip_higher():
    # eps = 0.2, eps_high = 0.28, A = +1: rho 1.25 is no longer clipped, rho 1.3 is clipped at 1.28
    log_probs = t([math.log(1.25), math.log(1.3), math.log(0.7)])
    loss, stats = ppo_clip_loss(
        log_probs, torch.zeros(3, dtype=torch.float64), t([1.0, 1.0, -1.0]), 0.2, None, 0.28
    )
    # terms: 1.25, 1.28, min(-0.7, -0.8) = -0.8
    assert loss.item() == pytest.approx(-(1.25 + 1.28 - 0.8) / 3, abs=1e-12)
    assert stats["clip_fraction"].item() == pytest.approx(2 / 3)


def test_ppo_sequence_advantages_broadcast_over_tokens():
    gen = torch.Generator().manual_seed(1)
    log_probs, old = rand(gen, 2, 3, scale=0.3), rand(gen, 2, 3, scale=0.3)
    adv = t([1.0, -2.0])
    mask = t([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss_b, _ = ppo_clip_loss(log_probs, old, adv, 0.2, mask)
    loss_b1, _ = ppo_clip_loss(log_probs, old, adv.unsqueeze(-1), 0.2, mask)
    loss_bt, _ = ppo_clip_loss(log_probs, old, adv.unsqueeze(-1).expand(2, 3), 0.2, mask)
    torch.testing.assert_close(loss_b, loss_b1)
    torch.testing.assert_close(loss_b, loss_bt)


def _clean_and_dirty(seed, batch, width, g):
    gen = torch.Generator().manual_seed(seed)
    mask = ragged_mask(gen, batch, width)
    tensors = [rand(gen, batch, width, scale=0.5) for _ in range(4)]
    clean = [with_garbage(x, mask, 0.0) for x in tensors]
    dirty = [with_garbage(x, mask, g) for x in tensors]
    return mask, clean, dirty


def _loss_and_grad(fn, first, *rest):
    first = first.clone().requires_grad_()
    out = fn(first, *rest)
    loss = out[0] if isinstance(out, tuple) else out
    loss.backward()
    return out, first.grad


@PROP
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 4),
    width=st.integers(1, 5),
    g=st.sampled_from(GARBAGE),
)
def test_masked_positions_never_change_ppo_or_value_loss(seed, batch, width, g):
    mask, (lp, old, adv, vals), (lp_d, old_d, adv_d, vals_d) = _clean_and_dirty(seed, batch, width, g)
    for eps_high in (None, 0.3):
        ppo = lambda x, *a, eh=eps_high: ppo_clip_loss(x, *a, 0.2, mask, eh)  # noqa: E731
        (loss, stats), grad = _loss_and_grad(ppo, lp, old, adv)
        (loss_d, stats_d), grad_d = _loss_and_grad(ppo, lp_d, old_d, adv_d)
        torch.testing.assert_close(loss_d, loss)
        torch.testing.assert_close(grad_d, grad)
        for k in stats:
            torch.testing.assert_close(stats_d[k], stats[k])
    plain = (lambda v, r: value_loss(v, r, mask), lambda v, r: value_loss(v, r, mask))  # noqa: E731
    clipped = (
        lambda v, r: value_loss(v, r, mask, vals, 0.1),  # noqa: E731
        lambda v, r: value_loss(v, r, mask, vals_d, 0.1),  # noqa: E731
    )
    for clean_fn, dirty_fn in (plain, clipped):
        loss, grad = _loss_and_grad(clean_fn, lp, adv)
        loss_d, grad_d = _loss_and_grad(dirty_fn, lp_d, adv_d)
        torch.testing.assert_close(loss_d, loss)
        torch.testing.assert_close(grad_d, grad)


@PROP
@given(
    log_ratio=st.lists(st.floats(-1.0, 1.0), min_size=1, max_size=8),
    seed=st.integers(0, 2**31 - 1),
    eps=st.floats(0.05, 0.4),
)
def test_ppo_gradient_is_zero_where_clipped_on_the_improving_side(log_ratio, seed, eps):
    gen = torch.Generator().manual_seed(seed)
    n = len(log_ratio)
    old = rand(gen, n)
    log_probs = (old + t(log_ratio)).requires_grad_()
    adv = rand(gen, n)
    loss, _ = ppo_clip_loss(log_probs, old, adv, eps)
    loss.backward()
    rho = torch.exp(log_probs.detach() - old)
    clipped = ((adv > 0) & (rho > 1 + eps)) | ((adv < 0) & (rho < 1 - eps))
    assert torch.all(log_probs.grad[clipped] == 0)
    free = ~clipped & ((rho - (1 + eps)).abs() > 1e-9) & ((rho - (1 - eps)).abs() > 1e-9)
    torch.testing.assert_close(log_probs.grad[free], (-rho * adv / n)[free])


def test_value_loss_hand_values():
    values, returns = t([1.0, 2.0, 3.0]), t([1.5, 2.0, 1.0])
    # squared errors [0.25, 0, 4] -> 0.5 * 4.25 / 3
    assert value_loss(values, returns).item() == pytest.approx(0.5 * 4.25 / 3, abs=1e-12)
    # old = [0.5, 2.5, 2.0], eps = 0.2: V - old = [0.5, -0.5, 1.0] -> clipped [0.2, -0.2, 0.2]
    # V_clip = [0.7, 2.3, 2.2]; (V_clip - R)^2 = [0.64, 0.09, 1.44]; max with [0.25, 0, 4] = [0.64, 0.09, 4]
    old = t([0.5, 2.5, 2.0])
    clipped = value_loss(values, returns, None, old, 0.2)
    assert clipped.item() == pytest.approx(0.5 * 4.73 / 3, abs=1e-12)
    masked = value_loss(values, returns, t([1.0, 0.0, 1.0]), old, 0.2)  # (0.64 + 4) / 2
    assert masked.item() == pytest.approx(0.5 * 4.64 / 2, abs=1e-12)


def test_value_loss_clipped_form_needs_both_arguments():
    with pytest.raises(ValueError, match="old_values"):
        value_loss(t([1.0]), t([0.0]), clip_eps=0.2)
    with pytest.raises(ValueError, match="clip_eps"):
        value_loss(t([1.0]), t([0.0]), old_values=t([0.0]))


def test_entropy_hand_value_and_minus_inf_logits():
    # p = [1/4, 1/4, 1/2]: H = 2 * (1/4) log 4 + (1/2) log 2 = 1.5 log 2
    logits = torch.log(t([1.0, 1.0, 2.0]))
    assert entropy_from_logits(logits).item() == pytest.approx(1.5 * math.log(2), abs=1e-12)
    masked = t([0.0, 0.0, -float("inf")]).requires_grad_()
    h = entropy_from_logits(masked)
    assert h.item() == pytest.approx(math.log(2), abs=1e-12)
    h.backward()
    assert torch.isfinite(masked.grad).all()
    assert entropy_from_logits(t([1000.0, 0.0])).item() == pytest.approx(0.0, abs=1e-12)


def test_entropy_matches_torch_categorical():
    gen = torch.Generator().manual_seed(3)
    logits = rand(gen, 4, 5, 7, scale=3.0)
    expected = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(entropy_from_logits(logits), expected)
