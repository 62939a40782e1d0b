"""Learning from segment preferences: labeller, segments, reward model, reward flow, resume, CLI."""

import argparse
import json
import shutil

import gymnasium as gym
import numpy as np
import pytest
import torch

from postrl.control import prefs
from postrl.control.commands import add_control_command
from postrl.control.prefs_reward import (
    Pairs,
    RewardEnsemble,
    RewardModelConfig,
    Segments,
    accuracy,
    labels_due,
    synthetic_labels,
    train_reward_model,
)
from postrl.runtime.config import ConfigError, load_config


def test_labeller_ties_give_half_and_the_higher_return_wins():
    r1 = torch.tensor([3.0, 1.0, 2.0, 2.05, 5.0])
    r2 = torch.tensor([1.0, 3.0, 2.0, 2.0, 4.0])
    assert synthetic_labels(r1, r2, tie_tolerance=0.1).tolist() == [1.0, 0.0, 0.5, 0.5, 1.0]
    # a noisy annotator that always flips: non-ties swap, ties stay 0.5
    flipped = synthetic_labels(r1, r2, tie_tolerance=0.1, flip_prob=1.0)
    assert flipped.tolist() == [0.0, 1.0, 0.5, 0.5, 0.0]


def test_labeller_flips_at_the_given_rate():
    g = torch.Generator().manual_seed(0)
    r1, r2 = torch.ones(20_000), torch.zeros(20_000)
    labels = synthetic_labels(r1, r2, flip_prob=0.1, generator=g)
    assert abs(float((labels == 0).float().mean()) - 0.1) < 0.01


def test_segments_pad_after_termination_and_skip_truncation():
    """One env, 8 steps, terminated at t=2, truncated at t=5; segments of 4 steps."""
    n_steps, length = 8, 4
    obs = torch.arange(n_steps, dtype=torch.float32).reshape(1, n_steps, 1)
    actions = torch.zeros(1, n_steps, dtype=torch.long)
    true = torch.ones(1, n_steps)
    terminated = torch.zeros(1, n_steps, dtype=torch.bool)
    truncated = torch.zeros(1, n_steps, dtype=torch.bool)
    terminated[0, 2], truncated[0, 5] = True, True
    seg = prefs.extract_segments(obs, actions, true, terminated, truncated, length, n=10)
    # starts 3 and 4 would run through the truncation at t=5 (not on their last step): not used
    by_start = {int(seg.obs[i, 0, 0]): i for i in range(len(seg))}
    assert sorted(by_start) == [0, 1, 2]
    expected_alive = {0: [1, 1, 1, 0], 1: [1, 1, 0, 0], 2: [1, 0, 0, 0]}
    for start, alive in expected_alive.items():
        i = by_start[start]
        assert seg.alive[i].long().tolist() == alive
        assert seg.true_rewards[i].tolist() == [float(a) for a in alive]  # padding: true reward 0
        assert seg.obs[i, :, 0].tolist() == [float(start + t) for t in range(length)]


def test_label_schedule_decays_and_runs_to_the_end():
    """Initial labels at once, the rest at a rate ∝ τ/(τ + frac): concave, all of the budget at label_until."""
    due = [labels_due(f / 100, 300, 100, until=1.0, decay=0.1) for f in range(101)]
    assert due[0] == 100 and due[-1] == 300
    steps = np.diff(due)
    assert (steps >= 0).all() and steps[-10:].sum() > 0  # labels keep coming to the end of the run
    assert steps[:10].sum() > 3 * steps[-10:].sum()  # at a decaying rate
    # τ = 0: a constant rate; past label_until: the whole budget
    assert [labels_due(f, 300, 100, until=0.5, decay=0.0) for f in (0.25, 0.5, 0.9)] == [200, 300, 300]
    assert labels_due(0.0, 300, 100, until=0.0, decay=0.1) == 300


def _random_segments(n, length, obs_dim, generator):
    obs = torch.randn(n, length, obs_dim, generator=generator)
    actions = torch.rand(n, length, 1, generator=generator) * 4 - 2
    return obs, actions


def test_reward_model_recovers_the_ranking_of_a_linear_reward():
    """Labels from r(o, a) = w·o + c·a; the ensemble's r̂ must rank fresh steps and segments like r."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    obs_dim, length, n_pairs = 3, 5, 300
    w, c = torch.tensor([1.0, -2.0, 0.5]), 0.7

    def true_reward(obs, actions):
        return obs @ w + c * actions.clamp(-1, 1)[..., 0]

    def segments(n):
        obs, actions = _random_segments(n, length, obs_dim, g)
        alive = torch.ones(n, length, dtype=torch.bool)
        return Segments(obs, actions, true_reward(obs, actions), alive)

    first, second = segments(n_pairs), segments(n_pairs)
    labels = synthetic_labels(first.true_returns(), second.true_returns())
    pairs = Pairs(first, second, labels, torch.zeros(n_pairs, dtype=torch.bool))
    space = gym.spaces.Box(-1.0, 1.0, (1,))
    model = RewardEnsemble(obs_dim, space, RewardModelConfig(ensemble=3, hidden=(32, 32)))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    train_reward_model(model, opt, pairs, steps=100, batch_size=64)

    test_first, test_second = segments(400), segments(400)
    test_labels = synthetic_labels(test_first.true_returns(), test_second.true_returns())
    test_pairs = Pairs(test_first, test_second, test_labels, torch.ones(400, dtype=torch.bool))
    assert accuracy(model, test_pairs, test_labels) > 0.9
    obs, actions = _random_segments(1, 500, obs_dim, g)
    with torch.no_grad():
        learned = model(obs[0], actions[0]).mean(0)
    true = true_reward(obs[0], actions[0])
    rank = lambda x: x.argsort().argsort().double()  # noqa: E731
    spearman = torch.corrcoef(torch.stack([rank(learned), rank(true)]))[0, 1]
    assert spearman > 0.9


def tiny_cartpole_cfg(*overrides):
    tiny = [
        "env.n_envs=2",
        "ppo.n_steps=32",
        "ppo.batch_size=32",
        "ppo.epochs=2",
        "run.steps=256",
        "run.eval_episodes=2",
        "run.eval_every=0",
        "prefs.segment_length=10",
        "prefs.label_budget=40",
        "prefs.initial_labels=20",
        "prefs.label_until=0.5",
        "prefs.segments_per_rollout=16",
        "reward_model.pretrain_steps=20",
        "reward_model.steps_per_iteration=4",
    ]
    return load_config(prefs.ControlPrefsConfig, "configs/prefs-cartpole.yaml", [*tiny, *overrides])


def _iterate(cfg, iterations):
    """Build the agent on a fresh seeded env and run ``iterations`` PPO iterations on the learned reward."""
    from postrl.control.envs import VecEnv
    from postrl.runtime.seeding import seed_everything

    seed_everything(cfg.run.seed)
    env = VecEnv(cfg.env, cfg.run.seed)
    agent = prefs.build_prefs(cfg, env)
    env.reset(seed=cfg.run.seed)
    metrics = [agent.iteration(env, it, it / iterations) for it in range(iterations)]
    return agent, metrics


def test_true_reward_never_reaches_the_policy_update(monkeypatch):
    """The env reward the agent sees is replaced by garbage (NaN, then huge noise): the policy and the
    critic come out bit-identical and finite, while the labeller, reading the true reward off its own
    channel (the tap), still labels correctly."""
    cfg = tiny_cartpole_cfg()
    params = []
    for fill in (float("nan"), 1e6):
        monkeypatch.setattr(prefs.RewardTap, "fill", fill)
        agent, metrics = _iterate(cfg, iterations=2)
        params.append(
            [p.detach().clone() for m in (agent.ppo.actor, agent.ppo.critic) for p in m.parameters()]
        )
        assert agent.labels_used == 40 - 20 + 20  # initial 20, then the rest by label_until
        row, episodes, _ = metrics[-1]
        assert np.isfinite(row["policy_loss"]) and np.isfinite(row["value_loss"])
        assert all(np.isfinite(ret) for _, ret, _ in episodes)  # the logged return is the true one
        # the labels are the labeller's on the true returns (+1 a step, padding 0), not on the fill
        pairs = agent.pairs
        expect = synthetic_labels(pairs.first.true_returns(), pairs.second.true_returns())
        assert torch.equal(pairs.labels, expect)
        assert set(pairs.first.true_rewards.unique().tolist()) <= {0.0, 1.0}
    for a, b in zip(params[0], params[1], strict=True):
        assert torch.isfinite(a).all()
        assert torch.equal(a, b)


def test_normalize_returns_scales_by_the_std_of_the_discounted_return():
    """prefs.normalize_returns divides r̂ by the std of its discounted return, reset at episode ends, and
    clips; computed here independently: returns by hand, their population variance with numpy."""
    cfg = tiny_cartpole_cfg("prefs.normalize_returns=true", "env.reward_gamma=0.9", "env.clip_reward=0.5")
    agent, _ = _iterate(cfg, iterations=0)
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(2, 40, generator=gen) * 3 + 1
    ends = torch.rand(2, 40, generator=gen) < 0.1
    returns, disc = [], np.zeros(2)
    for t in range(40):
        disc = 0.9 * disc + rewards[:, t].double().numpy()
        returns.append(disc.copy())
        disc[ends[:, t].numpy()] = 0.0
    std = np.sqrt(np.var(np.concatenate(returns)))  # the running statistics' prior weighs 1e-4 of a sample
    scaled = agent._scale_by_returns(rewards, ends)
    expect = (rewards / std).clamp(-0.5, 0.5)
    assert (expect.abs() == 0.5).any() and (expect.abs() < 0.5).any()  # both branches checked
    assert torch.allclose(scaled, expect, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(agent.disc_return, disc)


@pytest.mark.slow
def test_run_folder_and_exact_resume(tmp_path):
    cfg = tiny_cartpole_cfg("run.save_every=1", "run.keep_last=20", "prefs.normalize_returns=true")
    straight = tmp_path / "straight"
    summary = prefs.run(cfg, straight)
    for key in (
        "true_return",
        "labels_used",
        "rm_accuracy",
        "reward_correlation",
        "wall_seconds",
        "peak_rss_mb",
    ):
        assert key in summary
    assert (straight / "true_return_vs_labels.png").is_file() and (straight / "curves.png").is_file()
    assert json.loads((straight / "summary.json").read_text())["labels_used"] == 40
    interrupted = interrupted_copy(straight, tmp_path / "interrupted")
    prefs.run(cfg, interrupted, resume=True)
    assert_same_weights(straight, interrupted)


def interrupted_copy(straight, interrupted, after_step=128):
    """A copy of the finished run ``straight`` as if killed after the checkpoint of ``after_step``."""
    shutil.copytree(straight, interrupted)
    for ckpt in (interrupted / "checkpoints").iterdir():
        if int(ckpt.name.split("_")[1]) > after_step:
            shutil.rmtree(ckpt)
    (interrupted / "summary.json").unlink()
    return interrupted


def assert_same_weights(straight, resumed, last="step_00000256"):
    """The two runs' last checkpoints hold the same actor, critic and reward model, bit for bit."""
    for name in ("actor", "critic", "reward_model"):
        a = (straight / "checkpoints" / last / f"{name}.safetensors").read_bytes()
        b = (resumed / "checkpoints" / last / f"{name}.safetensors").read_bytes()
        assert a == b, name


def test_bad_config_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="prefs.center"):
        prefs.run(tiny_cartpole_cfg("prefs.center=median"), tmp_path / "a")
    with pytest.raises(ConfigError, match="segment_length"):
        prefs.run(tiny_cartpole_cfg("prefs.segment_length=64"), tmp_path / "b")
    with pytest.raises(ConfigError, match="normalize_reward"):
        prefs.run(tiny_cartpole_cfg("env.normalize_reward=true"), tmp_path / "c")


def _parser():
    parser = argparse.ArgumentParser(prog="postrl")
    add_control_command(parser.add_subparsers(dest="command"))
    return parser


def test_cli_lists_keys(capsys):
    args = _parser().parse_args(["control", "prefs", "--list-keys"])
    assert args.handler(args) == 0
    assert "prefs.label_budget" in capsys.readouterr().out


@pytest.mark.slow
def test_cli_run(tmp_path):
    out = tmp_path / "run"
    argv = ["control", "prefs", "--env", "CartPole-v1", "--labels", "30", "--noise", "0.1", "--out", str(out)]
    args = _parser().parse_args([*argv, "env.n_envs=2", "run.steps=64", "run.eval_episodes=1"])
    args.overrides += ["prefs.segment_length=10", "prefs.initial_labels=10", "reward_model.pretrain_steps=5"]
    assert args.handler(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["label_noise"] == 0.1 and summary["labels_used"] > 0
    assert (out / "true_return_vs_labels.png").is_file()


@pytest.mark.slow
def test_learns_cartpole_from_preferences(tmp_path):
    cfg = load_config(
        prefs.ControlPrefsConfig, "configs/prefs-cartpole.yaml", ["run.steps=30000", "run.eval_every=0"]
    )
    summary = prefs.run(cfg, tmp_path / "run")
    assert summary["true_return"] > 150  # random ≈ 22


def test_observation_only_reward_model_ignores_the_action():
    """``use_actions=false``: r̂(o) — the same reward for every action, and a first layer on o alone."""
    space = gym.spaces.Discrete(3)
    model = RewardEnsemble(4, space, RewardModelConfig(ensemble=2, hidden=(8,), use_actions=False))
    assert model.weights[0].shape == (2, 4, 8)
    obs = torch.randn(5, 4)
    with torch.no_grad():
        rewards = [model(obs, torch.full((5,), a)) for a in range(3)]
    assert all(torch.equal(rewards[0], r) for r in rewards[1:])
    with_actions = RewardEnsemble(4, space, RewardModelConfig(ensemble=2, hidden=(8,)))
    assert with_actions.weights[0].shape == (2, 7, 8)
