import math

import pytest
import torch
from core_helpers import GARBAGE, PROP, ragged_mask, rand, t, with_garbage
from hypothesis import given
from hypothesis import strategies as st

from postrl.core import behaviour_mismatch, grpo_loss, masked_is_weights, truncated_is_weights


def _inputs():
    logps = t([[-1.0, -2.0, -0.5], [-1.0, -1.0, 0.0]])
    behaviour = t([[-1.5, -1.0, -0.5], [-2.0, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    return logps, behaviour, mask


def test_token_level_hand_values():
    w = truncated_is_weights(*_inputs(), cap=2.0)
    # log ratios [[0.5, -1, 0], [1, 0, ·]] -> [[e^0.5, e^-1, 1], [min(e, 2), 1, 0]]
    assert w.tolist()[0] == pytest.approx([math.exp(0.5), math.exp(-1.0), 1.0], abs=1e-12)
    assert w.tolist()[1] == pytest.approx([2.0, 1.0, 0.0], abs=1e-12)


def test_sequence_level_hand_values():
    w = truncated_is_weights(*_inputs(), cap=2.0, level="sequence")
    # sums: row 0: 0.5 - 1 + 0 = -0.5 -> e^-0.5 on every token; row 1: 1 + 0 = 1 -> min(e, 2) = 2 on 2 tokens
    assert w.tolist()[0] == pytest.approx([math.exp(-0.5)] * 3, abs=1e-12)
    assert w.tolist()[1] == pytest.approx([2.0, 2.0, 0.0], abs=1e-12)


def test_weights_are_detached_and_arguments_checked():
    logps, behaviour, mask = _inputs()
    w = truncated_is_weights(logps.requires_grad_(), behaviour, mask, cap=2.0)
    assert not w.requires_grad
    with pytest.raises(ValueError, match="cap"):
        truncated_is_weights(logps, behaviour, mask, cap=0.0)
    with pytest.raises(ValueError, match="level"):
        truncated_is_weights(logps, behaviour, mask, cap=1.0, level="turn")
    with pytest.raises(ValueError, match="shape"):
        truncated_is_weights(logps, behaviour[:, :2], mask, cap=1.0)


@PROP
@given(
    seed=st.integers(0, 2**31 - 1),
    width=st.integers(1, 6),
    level=st.sampled_from(["token", "sequence"]),
    garbage=st.sampled_from(GARBAGE),
    cap=st.floats(0.5, 10),
)
def test_masked_positions_never_change_a_weight_and_weights_lie_in_0_cap(seed, width, level, garbage, cap):
    gen = torch.Generator().manual_seed(seed)
    logps, behaviour = rand(gen, 4, width), rand(gen, 4, width)
    mask = ragged_mask(gen, 4, width)
    w = truncated_is_weights(logps, behaviour, mask, cap, level)
    dirty = truncated_is_weights(
        with_garbage(logps, mask, garbage), with_garbage(behaviour, mask, garbage), mask, cap, level
    )
    assert torch.equal(w, dirty)
    assert bool((w[~mask] == 0).all()) and bool((w[mask] > 0).all()) and bool((w <= cap).all())


@PROP
@given(seed=st.integers(0, 2**31 - 1), width=st.integers(1, 6))
def test_on_policy_samples_weigh_one(seed, width):
    """μ = π: every weight on a response token is exactly 1 at either level (cap ≥ 1)."""
    gen = torch.Generator().manual_seed(seed)
    logps, mask = rand(gen, 3, width), ragged_mask(gen, 3, width)
    for level in ("token", "sequence"):
        w = truncated_is_weights(logps, logps.clone(), mask, 1.0, level)
        assert torch.equal(w, mask.to(w.dtype))


def test_masked_weights_hand_values():
    w = masked_is_weights(*_inputs(), cap=2.0)
    # ratios [[e^0.5, e^-1, 1], [e, 1, ·]]: e^0.5 ≈ 1.65 ≤ 2 stays, e > 2 is masked to 0 (not capped at 2)
    assert w.tolist()[0] == pytest.approx([math.exp(0.5), math.exp(-1.0), 1.0], abs=1e-12)
    assert w.tolist()[1] == pytest.approx([0.0, 1.0, 0.0], abs=1e-12)
    seq = masked_is_weights(*_inputs(), cap=2.0, level="sequence")
    assert seq.tolist()[0] == pytest.approx([math.exp(-0.5)] * 3, abs=1e-12)
    assert seq.tolist()[1] == pytest.approx([0.0, 0.0, 0.0], abs=1e-12)  # the whole response leaves the loss
    with pytest.raises(ValueError, match="masked_is_weights: cap"):
        masked_is_weights(*_inputs(), cap=-1.0)


def test_behaviour_mismatch_hand_values():
    stats = behaviour_mismatch(*_inputs())
    # log r on the 5 masked tokens: 0.5, -1, 0, 1, 0; k3 = e^x - 1 - x
    xs = [0.5, -1.0, 0.0, 1.0, 0.0]
    assert float(stats["kl"]) == pytest.approx(sum(math.exp(x) - 1 - x for x in xs) / 5, abs=1e-12)
    assert float(stats["log_ratio"]) == pytest.approx(sum(abs(x) for x in xs) / 5, abs=1e-12)


def test_grpo_loss_weights_only_the_surrogate():
    """−w·min(ρA, clip(ρ)A) + β·k3 per token, by hand on one response of two tokens (loss_type token)."""
    logps, old, ref = t([[-1.0, -2.0]]), t([[-1.1, -1.5]]), t([[-1.2, -2.0]])
    adv, mask, w = t([2.0]), torch.ones(1, 2), t([[0.5, 3.0]])
    loss, _ = grpo_loss(logps, old, ref, adv, mask, 0.2, 0.1, "token", is_weights=w)
    rho = [math.exp(0.1), math.exp(-0.5)]
    surrogate = [min(r * 2.0, min(max(r, 0.8), 1.2) * 2.0) for r in rho]
    k3 = [math.exp(-0.2) + 0.2 - 1, 0.0]  # exp(ref − π) − (ref − π) − 1
    expected = sum(-wi * s + 0.1 * k for wi, s, k in zip([0.5, 3.0], surrogate, k3, strict=True)) / 2
    assert float(loss) == pytest.approx(expected, abs=1e-12)
    plain, _ = grpo_loss(logps, old, ref, adv, mask, 0.2, 0.1, "token")
    ones, _ = grpo_loss(logps, old, ref, adv, mask, 0.2, 0.1, "token", is_weights=torch.ones(1, 2))
    assert torch.equal(plain, ones)


@PROP
@given(seed=st.integers(0, 2**31 - 1), width=st.integers(1, 6), cap=st.floats(0.5, 10))
def test_masked_weights_agree_with_truncated_under_the_cap_and_mismatch_is_nonnegative(seed, width, cap):
    gen = torch.Generator().manual_seed(seed)
    logps, behaviour = rand(gen, 4, width), rand(gen, 4, width)
    mask = ragged_mask(gen, 4, width)
    for level in ("token", "sequence"):
        masked = masked_is_weights(logps, behaviour, mask, cap, level)
        truncated = truncated_is_weights(logps, behaviour, mask, cap, level)
        kept = masked > 0
        assert torch.equal(masked[kept], truncated[kept])  # below the cap the two weightings are one
        assert bool(
            (truncated[mask & ~kept] == cap).all()
        )  # where MIS drops a token, TIS holds it at the cap
    assert float(behaviour_mismatch(logps, behaviour, mask)["kl"]) >= 0
    assert float(behaviour_mismatch(logps, logps.clone(), mask)["kl"]) == 0


@PROP
@given(seed=st.integers(0, 2**31 - 1), width=st.integers(1, 6), scale=st.sampled_from([1e-7, 1e-5, 1e-3]))
def test_mismatch_of_engines_that_nearly_agree_is_nonnegative_in_float32(seed, width, scale):
    gen = torch.Generator().manual_seed(seed)
    logps = rand(gen, 8, width).float()
    behaviour = (
        logps + scale * torch.randn(8, width, generator=gen).float()
    )  # vLLM vs the trainer: ~1e-5 apart
    mask = ragged_mask(gen, 8, width)
    stats = behaviour_mismatch(logps, behaviour, mask)
    assert float(stats["kl"]) >= 0
