"""grpo_loss(importance_level="sequence_sum"): the response's likelihood ratio (RLOO as REINFORCE on whole
responses, Ahmadian et al. 2024; TRL's RLOOTrainer)."""

import math

import pytest
import torch
from core_helpers import F64, ragged_mask, rand, t

from postrl.core import grpo_loss, rloo_advantages

LOG2 = math.log(2.0)


def _hand_batch():
    """2 responses × 3 tokens, row 1 one real token; old log-probs 0; A = [+1, −1]; ε 0.2, β 0.1."""
    nan = float("nan")
    log_probs = t([[0.0, math.log(1.5), math.log(0.9)], [math.log(0.5), nan, 3.0]])
    old = t([[0.0, 0.0, 0.0], [0.0, 0.0, nan]])
    ref = t([[0.0, math.log(1.5), math.log(0.9) + LOG2], [math.log(0.5) - LOG2, 5.0, nan]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    return log_probs, old, ref, t([1.0, -1.0]), mask


def test_hand_computed_values():
    # s_0 = 1 · 1.5 · 0.9 = 1.35 > 1.2 with A = +1: clipped to 1.2; s_1 = 0.5 with A = −1: clipped to 0.8.
    # Every token carries its response's surrogate; k3 = [0, 0, 1 − log 2] and [log 2 − 0.5] (β 0.1).
    log_probs, old, ref, adv, mask = _hand_batch()
    row0 = -3 * 1.2 + 0.1 * (1.0 - LOG2)
    row1 = 0.8 + 0.1 * (LOG2 - 0.5)
    expected = {"grpo": (row0 / 3 + row1) / 2, "token": (row0 + row1) / 4, "dr_grpo": (row0 + row1) / 6}
    for loss_type, value in expected.items():
        loss, stats = grpo_loss(
            log_probs, old, ref, adv, mask, 0.2, 0.1, loss_type, importance_level="sequence_sum"
        )
        torch.testing.assert_close(loss, t(value), rtol=0, atol=1e-12)
    assert float(stats["clip_fraction"]) == 1.0  # both responses clipped
    torch.testing.assert_close(stats["ratio_mean"], t((1.35 + 0.5) / 2))


@pytest.mark.parametrize("seed", range(5))
def test_equals_rloo_written_as_trl_writes_it(seed):
    """TRL 1.16 RLOOTrainer._compute_loss: logps = Σ_t m log π, coef = exp(logps − old_logps), the loss
    −mean_i min(coef A, clamp(coef, 1 − ε, 1 + ε_high) A); value and gradient, with ratios away from 1."""
    gen = torch.Generator().manual_seed(seed)
    B, T, G = 8, 5, 4
    mask = ragged_mask(gen, B, T)
    log_probs = (rand(gen, B, T, scale=0.5) - 1.0).requires_grad_(True)
    old = log_probs.detach() + rand(gen, B, T, scale=0.1)
    adv = rloo_advantages(rand(gen, B), G)
    loss, _ = grpo_loss(log_probs, old, None, adv, mask, 0.2, 0.0, "grpo", clip_eps_high=0.28,
                        importance_level="sequence_sum")  # fmt: skip
    (ours,) = torch.autograd.grad(loss, log_probs)

    theirs_lp = log_probs.detach().clone().requires_grad_(True)
    m = mask.to(F64)
    coef = torch.exp((theirs_lp * m).sum(1) - (old * m).sum(1))
    trl = -torch.min(coef * adv, torch.clamp(coef, 1 - 0.2, 1 + 0.28) * adv).mean()
    (theirs,) = torch.autograd.grad(trl, theirs_lp)
    torch.testing.assert_close(loss, trl, rtol=0, atol=1e-12)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
