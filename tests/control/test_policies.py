import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from postrl.control.fast.numpy_actor import NumpyActor
from postrl.control.policies import CategoricalActor, GaussianActor, PolicyConfig, make_actor


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.floats(-2.0, 1.0), st.integers(0, 10_000))
def test_gaussian_log_prob_and_entropy_match_torch_distributions(act_dim, n, log_std, seed):
    torch.manual_seed(seed)
    actor = GaussianActor(3, act_dim, PolicyConfig(log_std_init=log_std)).double()
    with torch.no_grad():
        actor.log_std.add_(torch.randn(act_dim, dtype=torch.float64) * 0.3)
    obs = torch.randn(n, 3, dtype=torch.float64)
    actions = torch.randn(n, act_dim, dtype=torch.float64) * 2
    log_probs, entropy = actor.evaluate(obs, actions)
    ref = torch.distributions.Independent(torch.distributions.Normal(actor(obs), actor.log_std.exp()), 1)
    torch.testing.assert_close(log_probs, ref.log_prob(actions))
    torch.testing.assert_close(entropy, ref.entropy())


def test_gaussian_sample_log_prob_is_of_the_unclipped_action():
    torch.manual_seed(0)
    actor = GaussianActor(2, 1, PolicyConfig(log_std_init=1.0))
    obs = torch.zeros(512, 2)
    with torch.no_grad():
        actions, log_probs = actor.act(obs)
    assert actions.abs().max() > 2.0  # σ = e: samples leave Pendulum's [-2, 2]; they are not clipped here
    ref = torch.distributions.Normal(actor(obs), actor.log_std.exp()).log_prob(actions).sum(-1)
    torch.testing.assert_close(log_probs, ref)


def test_categorical_matches_torch_distributions():
    torch.manual_seed(0)
    actor = CategoricalActor(4, 3, PolicyConfig())
    obs = torch.randn(7, 4)
    actions = torch.randint(0, 3, (7,))
    log_probs, entropy = actor.evaluate(obs, actions)
    ref = torch.distributions.Categorical(logits=actor(obs))
    torch.testing.assert_close(log_probs, ref.log_prob(actions))
    torch.testing.assert_close(entropy, ref.entropy())
    with torch.no_grad():
        greedy, _ = actor.act(obs, deterministic=True)
    assert torch.equal(greedy, actor(obs).argmax(-1))


def test_kl_is_zero_at_the_same_policy_and_positive_elsewhere():
    torch.manual_seed(0)
    for actor in (CategoricalActor(4, 3, PolicyConfig()), GaussianActor(4, 2, PolicyConfig())):
        obs = torch.randn(16, 4)
        old = tuple(p.detach() for p in actor.dist_params(obs))
        assert actor.kl(old, obs).abs().max() < 1e-6
        with torch.no_grad():
            for p in actor.parameters():
                p.add_(0.3 * torch.randn_like(p))
        assert (actor.kl(old, obs) > 0).all()


def test_orthogonal_init_gains():
    torch.manual_seed(0)
    actor = CategoricalActor(4, 2, PolicyConfig())
    first, *_, last = actor.net.layers
    w = first.weight.detach()
    # rows of an orthogonal 64×4 matrix times √2: W^T W = 2·I
    torch.testing.assert_close(w.T @ w, 2 * torch.eye(4), atol=1e-5, rtol=0)
    assert last.weight.abs().max() < 0.05 and torch.all(last.bias == 0)


def test_make_actor_rejects_unsupported_spaces():
    box = gym.spaces.Box(-1, 1, (3,), np.float32)
    assert isinstance(make_actor(box, gym.spaces.Discrete(2), PolicyConfig()), CategoricalActor)
    assert isinstance(make_actor(box, gym.spaces.Box(-2, 2, (1,), np.float32), PolicyConfig()), GaussianActor)
    try:
        make_actor(box, gym.spaces.MultiBinary(3), PolicyConfig())
    except ValueError as err:
        assert "unsupported action space" in str(err)
    else:
        raise AssertionError("MultiBinary should be rejected")


def test_categorical_sampling_frequencies_match_the_probabilities():
    actor = CategoricalActor(1, 3, PolicyConfig())
    with torch.no_grad():
        actor.net.layers[-1].bias.copy_(torch.log(torch.tensor([0.2, 0.5, 0.3])))
    obs = torch.zeros(20_000, 1)
    with torch.no_grad():
        actions, log_probs = actor.act(obs, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(actions, minlength=3).double() / len(actions)
    torch.testing.assert_close(freq, torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64), atol=0.015, rtol=0)
    torch.testing.assert_close(log_probs, actor.evaluate(obs, actions)[0])


@pytest.mark.parametrize("activation", ["tanh", "relu", "elu"])
@pytest.mark.parametrize("discrete", [True, False])
def test_numpy_actor_draws_what_act_draws(discrete, activation):
    """`NumpyActor.act` (the rollout loop's) consumes torch's RNG as `act` does: same actions, same log-probs."""
    cfg = PolicyConfig(hidden=(16, 16), activation=activation, log_std_init=-0.5)
    obs_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    act_space = gym.spaces.Discrete(3) if discrete else gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    torch.manual_seed(0)
    actor = make_actor(obs_space, act_space, cfg)
    for p in actor.parameters():
        p.data += 0.5 * torch.randn_like(p)  # logits far from uniform
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    torch.manual_seed(1)
    with torch.no_grad():
        want_actions, want_log_probs = actor.act(torch.from_numpy(obs))
    torch.manual_seed(1)
    actions, log_probs = NumpyActor(actor).act(obs)
    if discrete:
        assert np.array_equal(actions, want_actions.numpy())
    else:
        assert np.allclose(actions, want_actions.numpy(), atol=1e-6)
    assert log_probs.dtype == np.float32 and np.allclose(log_probs, want_log_probs.numpy(), atol=1e-5)


def test_numpy_actor_draws_a_rollouts_uniforms_as_act_would_step_by_step():
    """`NumpyActor.draws` takes a rollout's uniforms in one torch call: the same actions as `act` step by step,
    and torch's generator ends where it would have."""
    cfg = PolicyConfig(hidden=(16,))
    torch.manual_seed(0)
    actor = make_actor(gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(3), cfg)
    for p in actor.parameters():
        p.data += 0.5 * torch.randn_like(p)
    obs = np.random.default_rng(0).normal(size=(5, 8, 4)).astype(np.float32)  # 5 steps × 8 envs
    torch.manual_seed(1)
    with torch.no_grad():
        want = [actor.act(torch.from_numpy(o))[0].numpy() for o in obs]
    after_steps = torch.rand(3)
    torch.manual_seed(1)
    policy = NumpyActor(actor)
    uniforms = policy.draws(5, 8)
    got = [policy.act(o, uniforms[t])[0] for t, o in enumerate(obs)]
    assert torch.equal(torch.rand(3), after_steps)
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    assert len({a for w in want for a in w.tolist()}) == 3  # every action drawn: a real test of the order
    gaussian = make_actor(gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Box(-1, 1, (2,)), cfg)
    assert NumpyActor(gaussian).draws(5, 8) is None
