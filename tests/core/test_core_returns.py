import pytest
import torch
from core_helpers import PROP, rand, t
from hypothesis import given
from hypothesis import strategies as st

from postrl.core import discounted_returns, gae, td_errors


def test_discounted_returns_done_in_the_middle_and_last_value():
    # gamma = 0.5, done after step 1, bootstrap 10 after step 3:
    # G3 = 4 + 0.5*10 = 9;  G2 = 3 + 0.5*9 = 7.5;  G1 = 2 (done);  G0 = 1 + 0.5*2 = 2
    rewards, dones = t([1.0, 2.0, 3.0, 4.0]), t([0.0, 1.0, 0.0, 0.0])
    torch.testing.assert_close(discounted_returns(rewards, dones, 0.5, t(10.0)), t([2.0, 2.0, 7.5, 9.0]))
    # without last_value: G3 = 4, G2 = 3 + 2 = 5, G1 = 2, G0 = 2
    torch.testing.assert_close(discounted_returns(rewards, dones.bool(), 0.5), t([2.0, 2.0, 5.0, 4.0]))


def test_discounted_returns_batched_last_value_has_no_time_dim():
    rewards = t([[1.0, 1.0], [0.0, 2.0]])
    dones = t([[0.0, 0.0], [0.0, 1.0]])
    # row 0: G1 = 1 + 0.9*5 = 5.5, G0 = 1 + 0.9*5.5 = 5.95; row 1: G1 = 2 (done), G0 = 0 + 0.9*2 = 1.8
    out = discounted_returns(rewards, dones, 0.9, last_value=t([5.0, 100.0]))
    torch.testing.assert_close(out, t([[5.95, 5.5], [1.8, 2.0]]))


# 3 steps, gamma = 0.9, lambda = 0.8 (gamma*lambda = 0.72), terminated at the last step:
# delta0 = 1 + 0.9*1.0 - 0.5 = 1.4;  delta1 = 0 + 0.9*1.5 - 1.0 = 0.35;  delta2 = 2 + 0 - 1.5 = 0.5
# A2 = 0.5;  A1 = 0.35 + 0.72*0.5 = 0.71;  A0 = 1.4 + 0.72*0.71 = 1.9112
R3, V3, NV3, TERM3 = t([1.0, 0.0, 2.0]), t([0.5, 1.0, 1.5]), t([1.0, 1.5, 3.0]), t([0.0, 0.0, 1.0])


def test_td_errors_hand_values():
    torch.testing.assert_close(td_errors(R3, V3, NV3, TERM3, 0.9), t([1.4, 0.35, 0.5]))


def test_gae_three_steps_hand_values():
    adv, ret = gae(R3, V3, NV3, TERM3, TERM3, 0.9, 0.8)
    torch.testing.assert_close(adv, t([1.9112, 0.71, 0.5]))
    torch.testing.assert_close(ret, t([2.4112, 1.71, 2.0]))
    adv_b, _ = gae(R3, V3, NV3, TERM3.bool(), TERM3.bool(), 0.9, 0.8)  # bool masks too
    torch.testing.assert_close(adv_b, adv)


# 4 steps, gamma = lambda = 0.5 (gamma*lambda = 0.25); an episode ends after step 1, the next starts at step 2.
# next_values[1] = 10 is V of the final observation of the first episode.
R4, V4, NV4 = t([1.0, 1.0, 1.0, 1.0]), t([1.0, 2.0, 3.0, 4.0]), t([2.0, 10.0, 4.0, 5.0])
END4 = t([0.0, 1.0, 0.0, 0.0])


def test_gae_truncated_step_bootstraps_but_stops_the_lambda_sum():
    # delta = [1 + 0.5*2 - 1, 1 + 0.5*10 - 2, 1 + 0.5*4 - 3, 1 + 0.5*5 - 4] = [1, 4, 0, -0.5]
    # A3 = -0.5;  A2 = 0 + 0.25*(-0.5) = -0.125;  A1 = 4 (sum stops);  A0 = 1 + 0.25*4 = 2
    adv, ret = gae(R4, V4, NV4, torch.zeros(4, dtype=torch.bool), END4, 0.5, 0.5)
    torch.testing.assert_close(adv, t([2.0, 4.0, -0.125, -0.5]))
    torch.testing.assert_close(ret, t([3.0, 6.0, 2.875, 3.5]))


def test_gae_terminated_step_neither_bootstraps_nor_continues():
    # delta1 = 1 + 0 - 2 = -1;  A1 = -1;  A0 = 1 + 0.25*(-1) = 0.75; steps 2, 3 as above
    adv, _ = gae(R4, V4, NV4, END4, END4, 0.5, 0.5)
    torch.testing.assert_close(adv, t([0.75, -1.0, -0.125, -0.5]))
    # terminated implies episode end, even if the caller passes only the truncation flags
    adv_only_term, _ = gae(R4, V4, NV4, END4, torch.zeros(4), 0.5, 0.5)
    torch.testing.assert_close(adv_only_term, adv)


def test_gae_outputs_are_detached():
    values = V3.clone().requires_grad_()
    adv, ret = gae(R3, values, NV3, TERM3, TERM3, 0.9, 0.8)
    assert not adv.requires_grad and not ret.requires_grad


def naive_gae(rewards, values, next_values, terminated, ended, gamma, lam):
    """Reference: a plain Python loop over floats, written from the paper's definition."""
    T = len(rewards)
    adv = [0.0] * T
    next_adv = 0.0
    for i in reversed(range(T)):
        bootstrap = 0.0 if terminated[i] else gamma * next_values[i]
        delta = rewards[i] + bootstrap - values[i]
        cont = 0.0 if (ended[i] or terminated[i]) else 1.0
        next_adv = delta + gamma * lam * cont * next_adv
        adv[i] = next_adv
    return adv


episode_flags = st.lists(st.sampled_from(["none", "term", "trunc"]), min_size=1, max_size=12)
unit = st.floats(0.0, 1.0)


@PROP
@given(flags=episode_flags, seed=st.integers(0, 2**31 - 1), gamma=unit, lam=unit)
def test_gae_equals_the_loop_form(flags, seed, gamma, lam):
    gen = torch.Generator().manual_seed(seed)
    T = len(flags)
    rewards, values, next_values = rand(gen, T), rand(gen, T), rand(gen, T)
    term = [f == "term" for f in flags]
    trunc = [f == "trunc" for f in flags]
    ended = [a or b for a, b in zip(term, trunc, strict=True)]
    adv, ret = gae(rewards, values, next_values, torch.tensor(term), torch.tensor(ended), gamma, lam)
    expected = naive_gae(rewards.tolist(), values.tolist(), next_values.tolist(), term, ended, gamma, lam)
    torch.testing.assert_close(adv, t(expected))
    torch.testing.assert_close(ret, t(expected) + values)


@PROP
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 3), T=st.integers(1, 10), gamma=unit)
def test_gae_lambda_zero_is_td_errors(seed, batch, T, gamma):
    gen = torch.Generator().manual_seed(seed)
    rewards, values, next_values = rand(gen, batch, T), rand(gen, batch, T), rand(gen, batch, T)
    term = torch.rand(batch, T, generator=gen) < 0.3
    end = term | (torch.rand(batch, T, generator=gen) < 0.3)
    adv, _ = gae(rewards, values, next_values, term, end, gamma, 0.0)
    torch.testing.assert_close(adv, td_errors(rewards, values, next_values, term, gamma))


@PROP
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 3), T=st.integers(1, 10), gamma=unit)
def test_gae_lambda_one_is_monte_carlo_return_minus_value(seed, batch, T, gamma):
    # consistent values (next_values[t] = values[t+1]) and a terminal last step: the TD errors telescope
    gen = torch.Generator().manual_seed(seed)
    rewards, values = rand(gen, batch, T), rand(gen, batch, T)
    next_values = torch.cat([values[:, 1:], rand(gen, batch, 1)], dim=-1)
    term = torch.rand(batch, T, generator=gen) < 0.3
    term[:, -1] = True
    adv, ret = gae(rewards, values, next_values, term, term, gamma, 1.0)
    mc = discounted_returns(rewards, term, gamma)
    torch.testing.assert_close(adv, mc - values)
    torch.testing.assert_close(ret, mc)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_follows_inputs(dtype):
    r = R3.to(dtype)
    assert discounted_returns(r, TERM3, 0.9).dtype == dtype
    assert gae(r, V3.to(dtype), NV3.to(dtype), TERM3.bool(), TERM3.bool(), 0.9, 0.8)[0].dtype == dtype
