import math

import pytest
import torch
from core_helpers import GARBAGE, PROP, ragged_mask, rand, t, with_garbage
from hypothesis import given
from hypothesis import strategies as st

from postrl.core import group_advantages, grpo_loss, ppo_clip_loss

LOG2 = math.log(2.0)


def test_group_advantages_two_groups_one_constant():
    rewards = t([1.0, 2.0, 3.0, 5.0, 5.0, 5.0])
    # group 1: mean 2, Bessel std sqrt((1 + 0 + 1) / 2) = 1 -> (r - 2) / (1 + 1e-4); group 2 constant -> 0
    s = 1.0 / (1.0 + 1e-4)
    torch.testing.assert_close(group_advantages(rewards, 3), t([-s, 0.0, s, 0.0, 0.0, 0.0]))
    # Dr. GRPO: no std scaling
    torch.testing.assert_close(group_advantages(rewards, 3, scale=False), t([-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]))
    # custom eps: std 1 + 0.5
    torch.testing.assert_close(group_advantages(rewards, 3, eps=0.5)[:3], t([-1.0, 0.0, 1.0]) / 1.5)


def test_group_advantages_constant_group_is_exactly_zero():
    # 0.1 * 3 / 3 is not exactly 0.1 in floating point; the result must still be exactly 0
    for scale in (True, False):
        out = group_advantages(t([0.1, 0.1, 0.1, 0.7, 0.7, 0.7]), 3, scale=scale)
        assert torch.all(out == 0)
    assert torch.all(group_advantages(t([1.0, 2.0]), 1) == 0)  # G = 1: every group is constant


def test_group_advantages_bad_group_size():
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(t([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), 4)


@PROP
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 5), G=st.integers(1, 6), scale=st.booleans())
def test_group_advantages_have_zero_mean_per_group(seed, n, G, scale):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (n * G,), generator=gen).to(torch.float64)  # ties and constant groups
    adv = group_advantages(rewards, G, scale=scale).reshape(n, G)
    torch.testing.assert_close(adv.mean(-1), torch.zeros(n, dtype=torch.float64), atol=1e-12, rtol=0)


# 2 responses x 3 tokens, row 1 has a single real token; old log-probs 0 so rho = exp(log_prob).
# eps = 0.2, beta = 0.1, A = [+1, -1]. log r = ref - log_prob is 0, 0, log 2 on row 0 and -log 2 on row 1:
#   k3 = [0, 0, 1 - log 2] and [log 2 - 0.5]      (k3a + k3b = 0.5)
#   surrogate: rho 1.0 -> 1.0; 1.5 -> 1.2 (clipped); 0.9 -> 0.9; row 1: rho 0.5, A = -1 -> -0.8 (clipped)
#   per-token loss = -(surrogate - beta * k3): [-1.0, -1.2, -0.9 + 0.1 k3a] and [0.8 + 0.1 k3b]
K3A, K3B = 1.0 - LOG2, LOG2 - 0.5
ROW0 = -1.0 - 1.2 - 0.9 + 0.1 * K3A
ROW1 = 0.8 + 0.1 * K3B
EXPECTED = {
    "grpo": (ROW0 / 3 + ROW1 / 1) / 2,  # = -0.10189509...
    "token": (ROW0 + ROW1) / 4,  # (-2.3 + 0.05) / 4 = -0.5625
    "dr_grpo": (ROW0 + ROW1) / 6,  # -2.25 / 6 = -0.375
}


def _hand_batch():
    nan = float("nan")
    log_probs = t([[0.0, math.log(1.5), math.log(0.9)], [math.log(0.5), nan, 3.0]])
    old = t([[0.0, 0.0, 0.0], [0.0, 0.0, nan]])
    ref = t([[0.0, math.log(1.5), math.log(0.9) + LOG2], [math.log(0.5) - LOG2, 5.0, nan]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    return log_probs, old, ref, t([1.0, -1.0]), mask


@pytest.mark.parametrize("loss_type", ["grpo", "token", "dr_grpo"])
def test_grpo_loss_hand_values(loss_type):
    log_probs, old, ref, adv, mask = _hand_batch()
    loss, stats = grpo_loss(log_probs, old, ref, adv, mask, 0.2, 0.1, loss_type)
    assert loss.item() == pytest.approx(EXPECTED[loss_type], abs=1e-12)
    assert stats["clip_fraction"].item() == pytest.approx(0.5)
    assert stats["kl"].item() == pytest.approx(0.5 / 4, abs=1e-12)
    assert stats["ratio_mean"].item() == pytest.approx((1.0 + 1.5 + 0.9 + 0.5) / 4, abs=1e-12)


def test_grpo_loss_spot_values_and_options():
    log_probs, old, ref, adv, mask = _hand_batch()
    assert EXPECTED["token"] == pytest.approx(-0.5625) and EXPECTED["dr_grpo"] == pytest.approx(-0.375)
    dr, _ = grpo_loss(log_probs, old, ref, adv, mask, 0.2, 0.1, "dr_grpo", max_len=5)
    assert dr.item() == pytest.approx(-2.25 / 10, abs=1e-12)
    # clip-higher 0.6: rho 1.5 is no longer clipped (+0.3 to the surrogate, -0.3 to row 0's loss)
    hi, stats = grpo_loss(log_probs, old, ref, adv, mask, 0.2, 0.1, "token", clip_eps_high=0.6)
    assert hi.item() == pytest.approx((ROW0 - 0.3 + ROW1) / 4, abs=1e-12)
    assert stats["clip_fraction"].item() == pytest.approx(0.25)
    # beta = 0 needs no reference model
    no_ref, stats = grpo_loss(log_probs, old, None, adv, mask, 0.2, 0.0, "token")
    assert no_ref.item() == pytest.approx((-3.1 + 0.8) / 4, abs=1e-12)
    assert stats["kl"].item() == 0.0


@pytest.mark.parametrize("unbiased", [False, True])
def test_kl_gradient_in_expectation_is_reverse_kl_only_when_unbiased(unbiased):
    """Every token y of a categorical π_θ = softmax(θ) as a one-token response, weighted by π(y) (the exact
    expectation over on-policy samples, ρ = 1, A = 0): Σ_y π(y) ∇ℓ_y = β ∇KL(π‖π_ref) with unbiased_kl (TRL's
    use_bias_correction_kl), and β ∇KL(π_ref‖π) with plain k3, which is what it estimates."""
    theta = t([0.5, -1.0, 2.0, 0.0]).requires_grad_()
    ref = torch.log_softmax(t([0.0, 0.3, -0.2, 1.0]), -1)
    beta, V = 0.1, theta.shape[0]
    log_pi = torch.log_softmax(theta, -1)
    grad = torch.zeros(V, dtype=torch.float64)
    for y in range(V):
        loss, _ = grpo_loss(
            log_pi[y].view(1, 1), log_pi[y].detach().view(1, 1), ref[y].view(1, 1), t([0.0]),
            torch.ones(1, 1, dtype=torch.bool), 0.2, beta, unbiased_kl=unbiased,
        )  # fmt: skip
        (g,) = torch.autograd.grad(loss, theta, retain_graph=True)
        grad += log_pi[y].exp().detach() * g
    pi = log_pi.exp()
    reverse = (pi * (log_pi - ref)).sum()  # KL(π‖π_ref)
    forward = (ref.exp() * (ref - log_pi)).sum()  # KL(π_ref‖π)
    (expected,) = torch.autograd.grad(beta * (reverse if unbiased else forward), theta, retain_graph=True)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-12)
    (other,) = torch.autograd.grad(beta * (forward if unbiased else reverse), theta)
    assert (grad - other).abs().max() > 1e-3  # the two KL directions differ here


def test_unbiased_kl_keeps_the_loss_value_on_policy():
    log_probs, _, ref, adv, mask = _hand_batch()
    old = log_probs.clone()  # ρ = 1
    plain, _ = grpo_loss(log_probs, old, ref, adv, mask, 0.2, 0.1)
    weighted, _ = grpo_loss(log_probs, old, ref, adv, mask, 0.2, 0.1, unbiased_kl=True)
    torch.testing.assert_close(weighted, plain, rtol=0, atol=1e-15)


def test_grpo_loss_errors():
    log_probs, old, ref, adv, mask = _hand_batch()
    with pytest.raises(ValueError, match="dr_grpo.*grpo.*token"):
        grpo_loss(log_probs, old, ref, adv, mask, 0.2, 0.1, "sequence")
    with pytest.raises(ValueError, match="ref_log_probs"):
        grpo_loss(log_probs, old, None, adv, mask, 0.2, 0.1)


def test_grpo_token_loss_without_kl_is_ppo_clip_loss():
    gen = torch.Generator().manual_seed(11)
    mask = ragged_mask(gen, 4, 5)
    log_probs, old, adv = rand(gen, 4, 5, scale=0.3), rand(gen, 4, 5, scale=0.3), rand(gen, 4)
    grpo, _ = grpo_loss(log_probs, old, None, adv, mask, 0.2, 0.0, "token")
    ppo, _ = ppo_clip_loss(log_probs, old, adv, 0.2, mask)
    torch.testing.assert_close(grpo, ppo)


@PROP
@given(
    seed=st.integers(0, 2**31 - 1),
    width=st.integers(1, 5),
    g=st.sampled_from(GARBAGE),
    loss_type=st.sampled_from(["grpo", "token", "dr_grpo"]),
)
def test_masked_positions_never_change_grpo_loss(seed, width, g, loss_type):
    gen = torch.Generator().manual_seed(seed)
    mask = ragged_mask(gen, 3, width)
    tensors = [rand(gen, 3, width, scale=0.4) for _ in range(3)]
    adv = rand(gen, 3)
    results = []
    for fill in (0.0, g):
        lp, old, ref = (with_garbage(x, mask, fill) for x in tensors)
        lp = lp.requires_grad_()
        loss, stats = grpo_loss(lp, old, ref, adv, mask, 0.2, 0.05, loss_type)
        loss.backward()
        results.append((loss, lp.grad, stats))
    (loss, grad, stats), (loss_d, grad_d, stats_d) = results
    torch.testing.assert_close(loss_d, loss)
    torch.testing.assert_close(grad_d, grad)
    assert torch.all(grad[~mask] == 0)
    for k in stats:
        torch.testing.assert_close(stats_d[k], stats[k])


def _global_normalizer(loss_type, mask):
    return {"grpo": mask.shape[0], "token": mask.sum(), "dr_grpo": mask.shape[0] * mask.shape[1]}[loss_type]


@PROP
@given(
    seed=st.integers(0, 2**31 - 1),
    width=st.integers(1, 6),
    loss_type=st.sampled_from(["grpo", "token", "dr_grpo"]),
    beta=st.sampled_from([0.0, 0.04]),
)
def test_micro_batches_with_the_global_normalizer_sum_to_the_full_batch(seed, width, loss_type, beta):
    gen = torch.Generator().manual_seed(seed)
    B = 8
    mask = ragged_mask(gen, B, width)
    log_probs = rand(gen, B, width, scale=0.3).requires_grad_()
    old, ref, adv = rand(gen, B, width, scale=0.3), rand(gen, B, width, scale=0.3), rand(gen, B)
    full, _ = grpo_loss(log_probs, old, ref, adv, mask, 0.2, beta, loss_type)
    (full_grad,) = torch.autograd.grad(full, log_probs)
    norm = _global_normalizer(loss_type, mask)
    total = torch.zeros((), dtype=torch.float64)
    for rows in torch.arange(B).chunk(4):  # 4 micro-batches of 2 responses
        part, _ = grpo_loss(
            log_probs[rows],
            old[rows],
            ref[rows],
            adv[rows],
            mask[rows],
            0.2,
            beta,
            loss_type,
            normalizer=norm,
        )
        total = total + part
    (micro_grad,) = torch.autograd.grad(total, log_probs)
    torch.testing.assert_close(total, full)
    torch.testing.assert_close(micro_grad, full_grad)
