import math

import pytest
import torch
from core_helpers import F64, PROP, rand, t
from hypothesis import given
from hypothesis import strategies as st

from postrl.core import kto_loss

BETA = 0.5


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _batch(requires_grad=False):
    # r = logps - ref = [1, -1, 0.5]; the first desirable, the others undesirable
    logps = t([-1.0, -3.0, -2.0]).requires_grad_(requires_grad)
    return logps, t([-2.0, -2.0, -2.5]), torch.tensor([True, False, False])


def test_kto_hand_values_and_stats():
    loss, stats = kto_loss(*_batch(), kl=0.2, beta=BETA)
    # z0 = 0.2: desirable 1 - σ(0.5·(1 - 0.2)); undesirable 1 - σ(0.5·(0.2 + 1)), 1 - σ(0.5·(0.2 - 0.5))
    expected = ((1 - sigmoid(0.4)) + (1 - sigmoid(0.6)) + (1 - sigmoid(-0.15))) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert loss.item() == pytest.approx(0.4310286, abs=1e-7)  # (0.401312 + 0.354344 + 0.537430) / 3
    assert stats["rewards_desirable"].item() == pytest.approx(0.5, abs=1e-15)  # β·1
    assert stats["rewards_undesirable"].item() == pytest.approx(-0.125, abs=1e-15)  # mean(β·-1, β·0.5)
    assert stats["kl"].item() == pytest.approx(0.2, abs=1e-15)
    for value in stats.values():
        assert value.dim() == 0 and not value.requires_grad and value.dtype == F64


def test_kto_weights_scale_each_kind_and_kl_is_clamped_at_zero():
    logps, ref, desirable = _batch()
    loss, stats = kto_loss(
        logps, ref, desirable, kl=-3.0, beta=BETA, desirable_weight=2.0, undesirable_weight=0.5
    )
    # z0 = max(-3, 0) = 0
    expected = (2.0 * (1 - sigmoid(0.5)) + 0.5 * (1 - sigmoid(0.5)) + 0.5 * (1 - sigmoid(-0.25))) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert stats["kl"].item() == 0.0


def test_kto_gradient_by_hand_and_none_through_kl_or_reference():
    logps, ref, desirable = _batch(requires_grad=True)
    kl = torch.tensor(0.2, dtype=F64, requires_grad=True)
    ref = ref.clone().requires_grad_()
    loss, _ = kto_loss(logps, ref, desirable, kl, BETA)
    loss.backward()

    # d/dr (1 - σ(β(r - z))) = -β σ'(·); d/dr (1 - σ(β(z - r))) = +β σ'(·); σ' = σ(1 - σ); mean over 3
    def dsig(x):
        return sigmoid(x) * (1 - sigmoid(x))

    expected = [-BETA * dsig(0.4) / 3, BETA * dsig(0.6) / 3, BETA * dsig(-0.15) / 3]
    assert logps.grad.tolist() == pytest.approx(expected, abs=1e-12)
    assert kl.grad is None and ref.grad is None


def test_kto_a_kind_absent_gives_nan_stat():
    logps, ref, _ = _batch()
    _, stats = kto_loss(logps, ref, torch.ones(3, dtype=torch.bool), 0.0, BETA)
    assert math.isnan(stats["rewards_undesirable"].item())
    assert not math.isnan(stats["rewards_desirable"].item())


def test_kto_rejects_bad_arguments():
    logps, ref, desirable = _batch()
    with pytest.raises(ValueError, match="beta"):
        kto_loss(logps, ref, desirable, 0.0, 0.0)
    with pytest.raises(ValueError, match="weights"):
        kto_loss(logps, ref, desirable, 0.0, BETA, undesirable_weight=-1.0)
    with pytest.raises(ValueError, match="shape"):
        kto_loss(logps, ref[:2], desirable, 0.0, BETA)


@PROP
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 8), kl=st.floats(0, 3), beta=st.floats(0.01, 5))
def test_kto_loss_is_bounded_and_monotone_in_the_reward(seed, n, kl, beta):
    """0 ≤ ℓ ≤ w, and raising a desirable response's log-prob (or lowering an undesirable one's) lowers ℓ."""
    gen = torch.Generator().manual_seed(seed)
    logps, ref = rand(gen, n), rand(gen, n)
    desirable = torch.rand(n, generator=gen) < 0.5
    loss, _ = kto_loss(logps, ref, desirable, kl, beta)
    assert 0.0 <= loss.item() <= 1.0
    nudged = logps + torch.where(desirable, 0.1, -0.1).to(F64)
    assert kto_loss(nudged, ref, desirable, kl, beta)[0].item() <= loss.item() + 1e-15


def test_kto_matches_trl_formula_written_out():
    """TRL's KTOTrainer.kto_loss: cat(λ_D(1 - σ(β(r_c - z))), λ_U(1 - σ(β(z - r_r)))).nanmean()."""
    gen = torch.Generator().manual_seed(3)
    logps, ref = rand(gen, 6), rand(gen, 6)
    desirable = torch.tensor([True, False, True, True, False, False])
    z = torch.tensor(0.3, dtype=F64)
    r = logps - ref
    trl = torch.cat(
        (
            1.3 * (1 - torch.sigmoid(0.1 * (r[desirable] - z))),
            0.7 * (1 - torch.sigmoid(0.1 * (z - r[~desirable]))),
        )
    ).nanmean()
    ours, _ = kto_loss(logps, ref, desirable, z, 0.1, desirable_weight=1.3, undesirable_weight=0.7)
    assert ours.item() == pytest.approx(trl.item(), abs=1e-14)
