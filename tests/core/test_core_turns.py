import itertools

import pytest
import torch
from core_helpers import F64, PROP, t
from hypothesis import given
from hypothesis import strategies as st

from postrl.core import (
    discounted_returns,
    gae,
    group_advantages,
    rloo_advantages,
    turn_gae,
    turn_group_advantages,
    turn_index,
    turn_start_values,
    turn_sums,
    turns_to_tokens,
)

NAN = float("nan")

# ---- turns ↔ tokens ------------------------------------------------------------------------------------------


def test_turn_index_numbers_the_runs_of_action_tokens():
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 0, 1, 1], [1, 0, 0, 0, 0, 0, 0, 0, 0]])
    expected = torch.tensor([[-1, 0, 0, -1, -1, 1, -1, 2, 2], [0, -1, -1, -1, -1, -1, -1, -1, -1]])
    assert torch.equal(turn_index(mask), expected)
    assert torch.equal(turn_index(mask.bool()), expected)


def test_turn_start_values_reads_the_first_token_of_each_turn():
    turns = torch.tensor([[-1, 0, 0, -1, -1, 1, -1, 2, 2]])
    values = torch.arange(10.0, 19.0, dtype=F64).unsqueeze(0)
    v, present = turn_start_values(values, turns, 4)
    torch.testing.assert_close(v, t([[11.0, 15.0, 17.0, 0.0]]))
    assert present.tolist() == [[True, True, True, False]]


def test_turns_to_tokens_spreads_each_turn_over_its_tokens_only():
    turns = torch.tensor([[-1, 0, 0, -1, -1, 1, -1, 2, 2]])
    out = turns_to_tokens(t([[3.0, -2.0, 5.0, NAN]]), turns)
    torch.testing.assert_close(out, t([[0.0, 3.0, 3.0, 0.0, 0.0, -2.0, 0.0, 5.0, 5.0]]))


def test_turn_sums_adds_each_turns_tokens_and_nothing_else():
    turns = torch.tensor([[-1, 0, 0, -1, -1, 1, -1, 2, 2], [0, 0, 0, -1, -1, -1, -1, -1, -1]])
    x = t([[100.0, 1.0, 2.0, 100.0, 100.0, 4.0, 100.0, 8.0, 16.0], [1.0, 2.0, 3.0] + [NAN] * 6])
    # turn 0: 1 + 2; turn 1: 4; turn 2: 8 + 16; turn 3: absent. Row 2: 1 + 2 + 3, NaN off the actions ignored
    torch.testing.assert_close(turn_sums(x, turns, 4), t([[3.0, 4.0, 24.0, 0.0], [6.0, 0.0, 0.0, 0.0]]))


@PROP
@given(seed=st.integers(0, 2**31 - 1), width=st.integers(1, 12))
def test_turn_sums_is_the_adjoint_of_turns_to_tokens(seed, width):
    """<turns_to_tokens(a), x> = <a, turn_sums(x)> for every a and x."""
    gen = torch.Generator().manual_seed(seed)
    turns = turn_index(torch.randint(0, 2, (3, width), generator=gen))
    k = max(int(turns.max()) + 1, 1)
    a, x = torch.randn(3, k, generator=gen, dtype=F64), torch.randn(3, width, generator=gen, dtype=F64)
    torch.testing.assert_close((turns_to_tokens(a, turns) * x).sum(), (a * turn_sums(x, turns, k)).sum())


@PROP
@given(seed=st.integers(0, 2**31 - 1), width=st.integers(1, 12))
def test_turn_start_values_then_turns_to_tokens_round_trip(seed, width):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.randint(0, 2, (3, width), generator=gen)
    turns = turn_index(mask)
    k = int(turns.max()) + 1
    x = torch.randn(3, max(k, 1), generator=gen, dtype=F64)
    tokens = turns_to_tokens(x, turns)
    back, present = turn_start_values(tokens, turns, max(k, 1))
    torch.testing.assert_close(back, torch.where(present, x, torch.zeros_like(x)))
    assert torch.equal(present.sum(-1), turns.max(-1).values + 1)


# ---- GAE over turns ------------------------------------------------------------------------------------------


def test_turn_gae_hand_values():
    # episode 0: 3 turns, terminated. δ = [1 + .9·1 − .5, 0 + .9·1.5 − 1, 2 − 1.5] = [1.4, .35, .5]
    # A2 = .5, A1 = .35 + .45·.5 = .575, A0 = 1.4 + .45·.575 = 1.65875
    # episode 1: 2 turns, truncated by its budget, bootstrap V = 4: δ1 = 1 + .9·4 − 3 = 1.6,
    # δ0 = 1 + .9·3 − 2 = 1.7; A1 = 1.6, A0 = 1.7 + .45·1.6 = 2.42; its third slot is padding (garbage in)
    rewards = t([[1.0, 0.0, 2.0], [1.0, 1.0, NAN]])
    values = t([[0.5, 1.0, 1.5], [2.0, 3.0, NAN]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = turn_gae(
        rewards, values, mask, 0.9, 0.5, terminated=torch.tensor([True, False]), last_values=t([7.0, 4.0])
    )
    torch.testing.assert_close(adv, t([[1.65875, 0.575, 0.5], [2.42, 1.6, 0.0]]))
    torch.testing.assert_close(ret, t([[2.15875, 1.575, 2.0], [4.42, 4.6, 0.0]]))


def _episodes(gen, n, width):
    lengths = torch.randint(1, width + 1, (n,), generator=gen)
    mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    rewards = torch.randn(n, width, generator=gen, dtype=F64)
    values = torch.randn(n, width, generator=gen, dtype=F64)
    return rewards, values, mask, lengths


@PROP
@given(seed=st.integers(0, 2**31 - 1), width=st.integers(1, 6), gamma=st.floats(0.0, 1.0))
def test_turn_gae_with_lambda_one_is_the_return_minus_the_value(seed, width, gamma):
    gen = torch.Generator().manual_seed(seed)
    rewards, values, mask, _ = _episodes(gen, 4, width)
    adv, ret = turn_gae(rewards, values, mask, gamma, 1.0)
    g = discounted_returns(torch.where(mask, rewards, 0.0), torch.zeros_like(mask), gamma)
    torch.testing.assert_close(adv, torch.where(mask, g - values, 0.0), atol=1e-10, rtol=0)
    torch.testing.assert_close(ret, torch.where(mask, g, 0.0), atol=1e-10, rtol=0)


@PROP
@given(seed=st.integers(0, 2**31 - 1), width=st.integers(1, 6), lam=st.floats(0.0, 1.0))
def test_turn_gae_is_gae_on_each_unpadded_episode(seed, width, lam):
    gen = torch.Generator().manual_seed(seed)
    rewards, values, mask, lengths = _episodes(gen, 4, width)
    terminated = torch.randint(0, 2, (4,), generator=gen).bool()
    last = torch.randn(4, generator=gen, dtype=F64)
    adv, _ = turn_gae(rewards, values, mask, 0.95, lam, terminated=terminated, last_values=last)
    for i, n in enumerate(lengths.tolist()):
        v = values[i, :n]
        next_v = torch.cat([v[1:], last[i : i + 1]])
        term = torch.zeros(n, dtype=torch.bool)
        term[-1] = terminated[i]
        end = torch.zeros(n, dtype=torch.bool)
        end[-1] = True
        expected, _ = gae(rewards[i, :n], v, next_v, term, end, 0.95, lam)
        torch.testing.assert_close(adv[i, :n], expected, atol=1e-10, rtol=0)
        assert torch.all(adv[i, n:] == 0)


# ---- group-relative credit per turn --------------------------------------------------------------------------


def test_turn_group_advantages_hand_values():
    # returns-to-go (γ = 1): a [1, 1], b [2, pad], c [3, 3]
    rewards = t([[0.0, 1.0], [2.0, NAN], [0.0, 3.0]])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1]])
    # turn 0: {1, 2, 3}: mean 2, std 1; turn 1: {1, 3}: mean 2, std √2; b has no turn 1
    plain = turn_group_advantages(rewards, mask, 3, scale=False)
    torch.testing.assert_close(plain, t([[-1.0, -1.0], [0.0, 0.0], [1.0, 1.0]]))
    scaled = turn_group_advantages(rewards, mask, 3, eps=0.0)
    s = 2**0.5
    torch.testing.assert_close(scaled, t([[-1.0, -1.0 / s], [0.0, 0.0], [1.0, 1.0 / s]]))
    # leave one out: turn 0: 1 − 2.5, 2 − 2, 3 − 1.5; turn 1: 1 − 3, 3 − 1
    loo = turn_group_advantages(rewards, mask, 3, scale=False, leave_one_out=True)
    torch.testing.assert_close(loo, t([[-1.5, -2.0], [0.0, 0.0], [1.5, 2.0]]))
    # γ = .5: a [.5, 1], b [2], c [1.5, 3]: turn 0 mean 4/3
    disc = turn_group_advantages(rewards, mask, 3, gamma=0.5, scale=False)
    torch.testing.assert_close(disc, t([[0.5 - 4 / 3, -1.0], [2 - 4 / 3, 0.0], [1.5 - 4 / 3, 1.0]]))


def test_turn_group_advantages_constant_turns_and_lone_episodes_are_zero():
    rewards = t([[1.0, 5.0], [1.0, NAN], [0.0, 7.0], [0.0, 7.0]])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]])
    out = turn_group_advantages(rewards, mask, 2)
    # group 1: returns [6, 5] vs [1]: turn 0 differs, turn 1 has one episode; group 2 identical episodes
    assert out[0, 1] == 0 and out[1, 1] == 0 and torch.all(out[2:] == 0)
    assert out[0, 0] > 0 > out[1, 0]
    # leave one out: the episode alone at turn 1 has baseline 0, so it is credited with its return 5
    loo = turn_group_advantages(rewards, mask, 2, scale=False, leave_one_out=True)
    assert loo[0, 1] == 5.0 and loo[1, 1] == 0 and torch.all(loo[2:] == 0)


@PROP
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 3), G=st.integers(1, 5), scale=st.booleans())
def test_one_turn_episodes_reduce_to_group_advantages(seed, n, G, scale):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (n * G,), generator=gen).to(F64)  # ties and constant groups
    out = turn_group_advantages(rewards.unsqueeze(-1), torch.ones(n * G, 1), G, scale=scale)
    expected = group_advantages(rewards, G, scale=scale)
    torch.testing.assert_close(out.squeeze(-1), expected, atol=1e-12, rtol=0)


@PROP
@given(seed=st.integers(0, 2**31 - 1), G=st.integers(2, 5), width=st.integers(1, 4))
def test_leave_one_out_with_every_turn_present_is_rloo_of_each_turns_return(seed, G, width):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(2 * G, width, generator=gen, dtype=F64)
    mask = torch.ones(2 * G, width, dtype=torch.bool)
    out = turn_group_advantages(rewards, mask, G, gamma=0.9, scale=False, leave_one_out=True)
    g = discounted_returns(rewards, torch.zeros_like(mask), 0.9)
    for k in range(width):
        torch.testing.assert_close(out[:, k], rloo_advantages(g[:, k], G), atol=1e-12, rtol=0)


def _exact_gradient_check(leave_one_out: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A two-turn bandit: turn 0 'stop' (p) pays .5 and ends; 'go' pays 0 and a second turn follows, whose
    action 1 (q) pays 2. J = .5p + 2(1 − p)q. The estimator's expectation over every pair of episodes (G = 2)
    against ∇J, both exact (enumeration, no sampling)."""
    theta = torch.tensor([0.3, -0.4], dtype=F64, requires_grad=True)
    p, q = torch.sigmoid(theta[0]), torch.sigmoid(theta[1])
    # episodes: (actions, rewards, probability) with log-prob of each turn's action
    episodes = [
        ([torch.log(p)], [0.5], p),
        ([torch.log(1 - p), torch.log(q)], [0.0, 2.0], (1 - p) * q),
        ([torch.log(1 - p), torch.log(1 - q)], [0.0, 0.0], (1 - p) * (1 - q)),
    ]
    objective = 0.5 * p + 2 * (1 - p) * q
    (exact,) = torch.autograd.grad(objective, theta, retain_graph=True)
    expected = torch.zeros(2, dtype=F64)
    for a, b in itertools.product(episodes, repeat=2):
        rewards = t([[*a[1], 0.0][:2], [*b[1], 0.0][:2]])
        mask = torch.tensor([[k < len(a[1]) for k in range(2)], [k < len(b[1]) for k in range(2)]])
        adv = turn_group_advantages(rewards, mask, 2, scale=False, leave_one_out=leave_one_out)
        surrogate = sum(adv[i, k] * e[0][k] for i, e in enumerate((a, b)) for k in range(len(e[0]))) / 2
        (grad,) = torch.autograd.grad(surrogate, theta, retain_graph=True)
        expected += (a[2] * b[2]).detach() * grad
    return expected, exact


def test_leave_one_out_per_turn_credit_is_unbiased_and_the_group_mean_is_not():
    expected, exact = _exact_gradient_check(leave_one_out=True)
    torch.testing.assert_close(expected, exact, atol=1e-12, rtol=0)
    biased, _ = _exact_gradient_check(leave_one_out=False)
    assert not torch.allclose(biased, exact, atol=1e-3)


def test_turn_group_advantages_is_detached_and_leaves_its_input():
    rewards = t([[1.0, 2.0], [0.0, 1.0]]).requires_grad_()
    before = rewards.detach().clone()
    out = turn_group_advantages(rewards, torch.ones(2, 2), 2)
    assert not out.requires_grad and torch.equal(rewards.detach(), before)
    adv, ret = turn_gae(rewards, rewards, torch.ones(2, 2), 0.9, 0.9)
    assert not adv.requires_grad and not ret.requires_grad


def test_turn_group_advantages_bad_group_size():
    with pytest.raises(ValueError, match="3 episodes cannot be split into groups of 2"):
        turn_group_advantages(torch.zeros(3, 2), torch.ones(3, 2), 2)


def _two_turn_moments(credit: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A two-turn bandit whose turns are independent: turn 0 pays a0 ~ Bernoulli(p), turn 1 pays 2·a1 with
    a1 ~ Bernoulli(q); J = p + 2q. Exact mean and variance (enumerating every pair of episodes, G = 2) of the
    leave-one-out estimator's gradient, with per-turn credit or with the episode's return on both turns."""
    theta = torch.tensor([0.2, -0.3], dtype=F64, requires_grad=True)
    p, q = torch.sigmoid(theta[0]), torch.sigmoid(theta[1])
    (exact,) = torch.autograd.grad(p + 2 * q, theta, retain_graph=True)
    episodes = [
        (
            (a0, a1),
            (torch.log(p if a0 else 1 - p), torch.log(q if a1 else 1 - q)),
            (p if a0 else 1 - p) * (q if a1 else 1 - q),
        )
        for a0 in (0, 1)
        for a1 in (0, 1)
    ]
    mean, square = torch.zeros(2, dtype=F64), torch.zeros(2, dtype=F64)
    for a, b in itertools.product(episodes, repeat=2):
        rewards = t([[float(a[0][0]), 2.0 * a[0][1]], [float(b[0][0]), 2.0 * b[0][1]]])
        mask = torch.ones(2, 2, dtype=torch.bool)
        if credit == "turn":
            adv = turn_group_advantages(rewards, mask, 2, scale=False, leave_one_out=True)
        else:
            adv = rloo_advantages(rewards.sum(-1), 2).unsqueeze(-1).expand(2, 2)
        surrogate = sum(adv[i, k] * e[1][k] for i, e in enumerate((a, b)) for k in range(2)) / 2
        (grad,) = torch.autograd.grad(surrogate, theta, retain_graph=True)
        weight = (a[2] * b[2]).detach()
        mean += weight * grad
        square += weight * grad**2
    return mean, square - mean**2, exact


def test_per_turn_credit_keeps_the_gradient_and_removes_the_other_turns_noise():
    turn_mean, turn_var, exact = _two_turn_moments("turn")
    traj_mean, traj_var, _ = _two_turn_moments("trajectory")
    torch.testing.assert_close(turn_mean, exact, atol=1e-12, rtol=0)  # both unbiased
    torch.testing.assert_close(traj_mean, exact, atol=1e-12, rtol=0)
    # turn 0's gradient gets the same credit either way (its return-to-go is the episode's return) ...
    torch.testing.assert_close(turn_var[0], traj_var[0], atol=1e-12, rtol=0)
    # ... turn 1's no longer carries turn 0's reward, which its action cannot change (0.250 vs 0.310 here)
    assert turn_var[1] < traj_var[1] - 0.05
