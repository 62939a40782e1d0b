"""PPO over episodes of a text environment (issue #35 items 3 and 5): the critic at the turn boundaries, GAE over
turns, the advantages and value targets the trainer uses, zero gradient on observation tokens, the run, its
exact resume and its errors before the run folder (and before a model loads)."""

from dataclasses import replace

import pytest
import torch

from postrl.core import masked_whiten, turn_gae
from postrl.lm.agents import ENVS, AgentError, GuessNumberEnv, make_env
from postrl.lm.agents.config import EnvConfig
from postrl.lm.agents.rollout import TurnRollout, sample_episodes
from postrl.lm.models import PolicyWithValueHead
from postrl.lm.ppo import PPOConfig, PPOLossConfig, ppo_loss, run_ppo
from postrl.lm.ppo.advantages import GAEConfig, KLConfig
from postrl.lm.ppo.episodes import make_turn_batch
from postrl.lm.roles import Roles
from postrl.lm.rollout import Rollout, SamplingConfig, score
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig
from postrl.runtime.errors import UserError
from postrl.runtime.logging import read_jsonl
from tests.lm.resume_check import assert_same_weights, interrupt_after

P = 2
# two scripted episodes after a 2-token prompt: actions (1) and observations (0); row 1 ends early (padding)
ACTIONS = torch.tensor([[1, 1, 0, 0, 1, 0, 1, 1], [1, 0, 0, 1, 1, 0, 0, 0]])
ATTENTION = torch.tensor([[1] * 8, [1, 1, 1, 1, 1, 0, 0, 0]])
TURN_REWARDS = torch.tensor([[0.0, -0.1, 1.0], [0.5, -0.2, 0.0]])
TURN_MASK = torch.tensor([[True, True, True], [True, True, False]])


class TokenCritic(torch.nn.Module):
    """V of the state ending at position p = 0.01 · (the token id at p): values the test can read off."""

    def forward(self, input_ids, attention_mask, position_ids=None):
        return 0.01 * input_ids.float()


def scripted(vocab: int) -> tuple[Rollout, TurnRollout]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (2, P + 8), generator=gen)
    mask = torch.cat([torch.ones(2, P, dtype=torch.long), ATTENTION], dim=1)
    log_probs = -torch.rand(2, 8, generator=gen) * ACTIONS
    rollout = Rollout(ids, mask, P, ids[:, P:], ACTIONS, log_probs, torch.tensor([True, False]))
    turns = TurnRollout(ids, mask, P, ACTIONS, log_probs, None, TURN_REWARDS, TURN_MASK, rollout.finished, [])
    return rollout, turns


def hand_gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> tuple[list, list]:
    """A_k = δ_k + γλ A_{k+1}, δ_k = r_k + γ V_{k+1} − V_k, V after the last turn 0: the loop of the notes."""
    adv, next_value, next_adv = [0.0] * len(rewards), 0.0, 0.0
    for k in reversed(range(len(rewards))):
        delta = rewards[k] + gamma * next_value - values[k]
        adv[k] = next_adv = delta + gamma * lam * next_adv
        next_value = values[k]
    return adv, [a + v for a, v in zip(adv, values, strict=True)]


def test_the_advantages_are_gae_over_turns_with_the_critic_at_each_turns_first_action_token(tiny_lm):
    rollout, turns = scripted(tiny_lm.config.vocab_size)
    roles = Roles(tiny_lm, TokenCritic(), tiny_lm, None)
    gae = GAEConfig(lam=0.8, whiten_advantages=False)
    batch, metrics = make_turn_batch(
        roles, rollout, turns, temperature=1.0, beta=0.0, gamma=0.9, advantage=gae
    )
    ids = rollout.input_ids
    first = {0: [0, 4, 6], 1: [0, 3]}  # each turn's first action token
    spans = {0: [[0, 1], [4], [6, 7]], 1: [[0], [3, 4]]}
    expected_adv, expected_ret = torch.zeros(2, 8), torch.zeros(2, 8)
    for b in (0, 1):
        # V(s_k): the critic at the position before the turn's first token (the last observation token)
        values = [0.01 * float(ids[b, P - 1 + t]) for t in first[b]]
        adv, ret = hand_gae(TURN_REWARDS[b, : len(values)].tolist(), values, 0.9, 0.8)
        for k, span in enumerate(spans[b]):
            expected_adv[b, span] = adv[k]
            expected_ret[b, first[b][k]] = ret[k]
        # and core.turn_gae on the same numbers
        core_adv, _ = turn_gae(
            TURN_REWARDS[b : b + 1, : len(values)], torch.tensor([values]), TURN_MASK[b : b + 1, : len(values)],
            0.9, 0.8,
        )  # fmt: skip
        torch.testing.assert_close(core_adv[0], torch.tensor(adv))
    torch.testing.assert_close(batch.advantages, expected_adv)
    torch.testing.assert_close(batch.returns, expected_ret)
    starts = torch.zeros(2, 8, dtype=torch.long)
    starts[0, first[0]], starts[1, first[1]] = 1, 1
    assert torch.equal(batch.value_mask, starts)  # the value loss is taken at the turn boundaries only
    assert torch.all(batch.advantages[ACTIONS == 0] == 0)  # observations and padding carry nothing
    assert metrics["env_return"] == pytest.approx(0.6)  # (0.9 + 0.3) / 2
    assert metrics["turns"] == 2.5


def test_the_value_loss_is_taken_at_the_turn_boundaries_only(tiny_lm):
    rollout, turns = scripted(tiny_lm.config.vocab_size)
    roles = Roles(tiny_lm, TokenCritic(), tiny_lm, None)
    gae = GAEConfig(lam=0.8, whiten_advantages=False)
    batch, _ = make_turn_batch(roles, rollout, turns, temperature=1.0, beta=0.0, gamma=0.9, advantage=gae)
    _, stats = ppo_loss(roles, batch, PPOLossConfig(vf_clip=None), 1.0)
    values = 0.01 * rollout.input_ids[:, P - 1 : -1].float()  # the critic before each response token
    boundary = batch.value_mask.bool()
    expected = 0.5 * ((values - batch.returns)[boundary] ** 2).mean()
    torch.testing.assert_close(stats["value_loss"], expected)


def test_the_kl_penalty_goes_into_each_turns_reward_and_advantages_are_whitened_over_actions(tiny_lm):
    rollout, turns = scripted(tiny_lm.config.vocab_size)
    roles = Roles(tiny_lm, TokenCritic(), tiny_lm, None)
    batch, _ = make_turn_batch(
        roles, rollout, turns, temperature=0.7, beta=0.3, gamma=1.0, advantage=GAEConfig(lam=1.0)
    )
    ref = score(tiny_lm, rollout.input_ids, rollout.attention_mask, P, temperature=0.7)
    penalty = -0.3 * (rollout.log_probs - ref) * ACTIONS  # PPO-RLHF's −β k1 on each action token
    shaped = TURN_REWARDS.clone()
    shaped[0] += torch.stack([penalty[0, :2].sum(), penalty[0, 4], penalty[0, 6:].sum()])
    shaped[1, :2] += torch.stack([penalty[1, 0], penalty[1, 3:5].sum()])
    # λ = γ = 1: A_k = the shaped return from turn k − V(s_k)
    values = torch.tensor([[0.01 * float(rollout.input_ids[0, P - 1 + t]) for t in (0, 4, 6)]])
    values = torch.cat(
        [values, torch.tensor([[0.01 * float(rollout.input_ids[1, P - 1 + t]) for t in (0, 3)] + [0]])]
    )
    to_go = shaped.flip(-1).cumsum(-1).flip(-1) * TURN_MASK
    adv = to_go - values
    tokens = torch.zeros(2, 8)
    tokens[0, :2], tokens[0, 4], tokens[0, 6:] = adv[0, 0], adv[0, 1], adv[0, 2]
    tokens[1, 0], tokens[1, 3:5] = adv[1, 0], adv[1, 1]
    torch.testing.assert_close(batch.advantages, masked_whiten(tokens, ACTIONS.float()) * ACTIONS)


def test_observation_tokens_get_exactly_zero_gradient_through_the_ppo_loss(tiny_lm, tiny_tokenizer):
    envs = [make_env("guess_number", high=8) for _ in range(3)]
    sampling = SamplingConfig(max_new_tokens=4)
    cfg = EnvConfig(max_turns=3, max_tokens=12)
    out = sample_episodes(
        tiny_lm, tiny_tokenizer, envs, sampling, cfg.budget, torch.Generator().manual_seed(0)
    )
    assert (
        (out.action_mask == 0).logical_and(out.attention_mask[:, out.prompt_len :] == 1).any()
    )  # observations
    ids, P_ = out.input_ids, out.prompt_len
    rollout = Rollout(
        ids, out.attention_mask, P_, ids[:, P_:], out.action_mask, out.log_probs, out.terminated
    )
    actor = PolicyWithValueHead(tiny_lm, seed=0)  # critic=shared: the value loss runs through the same trunk
    roles = Roles(actor, None, tiny_lm, None)
    batch, _ = make_turn_batch(
        roles, rollout, out, temperature=1.0, beta=0.1, gamma=1.0, advantage=GAEConfig()
    )
    captured = {}

    def keep(module, args, output):
        output.retain_grad()
        captured["logits"] = output

    handle = tiny_lm.lm_head.register_forward_hook(keep)
    loss, _ = ppo_loss(roles, batch, PPOLossConfig(ent_coef=0.01), 1.0)
    loss.backward()
    handle.remove()
    T = batch.response_mask.shape[1]
    grad = captured["logits"].grad[:, :T].abs().sum(-1)  # (B, T): the logits that predict each token
    assert torch.all(grad[batch.response_mask == 0] == 0)
    assert torch.all(grad[batch.response_mask == 1] > 0)
    assert actor.head.weight.grad.abs().sum() > 0  # the critic learns (at the boundaries)


GAME = EnvConfig("guess_number", {"high": 8}, n_train=8, n_eval=2, max_turns=3, max_tokens=12)


def _config(tiny_lm_dir, env=None, **kw) -> PPOConfig:
    """4 episodes of guess-the-number in [1, 8] per step, ≤ 3 turns of ≤ 4 tokens, a new value head, 2 steps."""
    base = dict(
        model=str(tiny_lm_dir),
        reward_model=None,
        critic="sft",
        env=replace(GAME, **(env or {})),
        sampling=SamplingConfig(max_new_tokens=4, temperature=1.0),
        batch_size=4,
        ppo=PPOLossConfig(epochs=2),
        kl=KLConfig(beta=0.05),
        optim=OptimConfig(lr=2e-4, warmup_steps=0, min_lr_ratio=1.0),
        critic_optim=OptimConfig(lr=2e-4, warmup_steps=0, min_lr_ratio=1.0),
        run=RunConfig(steps=2, eval_every=2, save_every=2, log_every=1, device="cpu", threads=1),
        plots=False,
    )
    return PPOConfig(**{**base, **kw})


def test_ppo_trains_on_episodes(tiny_lm_dir, tmp_path):
    summary = run_ppo(_config(tiny_lm_dir, plots=True), tmp_path / "run")
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "env_return" in r]
    assert len(rows) == 2
    for r in rows:
        assert -0.3 - 1e-6 <= r["env_return"] <= 1.0 and 1 <= r["turns"] <= 3
        assert r["response_length"] <= 12 and torch.isfinite(torch.tensor(r["value_loss"]))
    assert summary["heldout_return"] is not None and summary["start_heldout_return"] is not None
    assert (tmp_path / "run" / "model" / "config.json").is_file()
    assert (tmp_path / "run" / "critic").is_dir()
    assert (tmp_path / "run" / "curves.png").is_file() and (tmp_path / "run" / "heldout.png").is_file()


def test_an_episode_run_resumes_exactly(tiny_lm_dir, tmp_path):
    cfg = _config(tiny_lm_dir, run=RunConfig(steps=4, save_every=2, log_every=1, device="cpu", threads=1))
    run_ppo(cfg, tmp_path / "a")
    run_ppo(cfg, tmp_path / "b")
    interrupt_after(tmp_path / "b", 2)  # as if killed after its step-2 checkpoint
    torch.manual_seed(123)  # nothing may depend on the RNG state left behind
    run_ppo(cfg, tmp_path / "b", resume=True)
    assert_same_weights(tmp_path / "a", tmp_path / "b")
    returns = [
        [r["env_return"] for r in read_jsonl(tmp_path / x / "metrics.jsonl") if "env_return" in r]
        for x in "ab"
    ]
    assert returns[0] == returns[1] and len(returns[0]) == 4


class BrokenStep(GuessNumberEnv):
    def step(self, action):
        raise RuntimeError("the oracle is asleep")


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"env": {"id": "guess_numbr"}}, AgentError, "unknown environment 'guess_numbr'.*did you mean guess_number"),
        ({"env": {"id": "broken"}}, AgentError, r"BrokenStep \(.*test_agents_ppo.py:\d+\): step raised RuntimeError"),
        ({"env": {"id": "frozenlake_pictures"}}, UserError, "observes pictures: postrl ppo trains text policies"),
        ({"rewards": ["task:arithmetic"]}, UserError, "leave rewards empty"),
        ({"critic": "reward_model", "reward_model": "runs/rm/model"}, UserError, "set critic=sft"),
        ({"batch_size": 16}, UserError, "env.n_train=8 is fewer than batch_size=16"),
        ({"gae": GAEConfig(gamma=0.9)}, UserError, "set env.gamma"),
    ],
)  # fmt: skip
def test_a_bad_env_run_is_one_error_before_a_model_loads(
    tiny_lm_dir, tmp_path, monkeypatch, change, error, match
):
    monkeypatch.setitem(ENVS, "broken", BrokenStep)
    loads = []
    monkeypatch.setattr("postrl.lm.ppo.build.load_causal_lm", lambda *a, **k: loads.append(a))
    env = change.pop("env", None)
    with pytest.raises(error, match=match):
        run_ppo(_config(tiny_lm_dir, env=env, **change), tmp_path / "run")
    assert not loads and not (tmp_path / "run").exists()


def test_the_cli_and_python_api_take_the_env_id(tiny_lm_dir, tmp_path):
    import postrl
    from postrl.cli import main

    with pytest.raises(AgentError, match="unknown environment 'frozenlak'"):
        postrl.ppo(model=str(tiny_lm_dir), env="frozenlak", out=str(tmp_path / "run"))
    assert (
        main(["ppo", "--env", "frozenlak", "--model", str(tiny_lm_dir), "--out", str(tmp_path / "run")]) == 2
    )
    assert not (tmp_path / "run").exists()


def test_a_grpo_env_run_whose_step_raises_is_one_error_before_a_model_loads(
    tiny_lm_dir, tmp_path, monkeypatch
):
    from postrl.lm.grpo import GRPOConfig, GRPOLossConfig, run_grpo

    monkeypatch.setitem(ENVS, "broken", BrokenStep)
    loads = []
    monkeypatch.setattr("postrl.lm.grpo.build.load_causal_lm", lambda *a, **k: loads.append(a))
    cfg = GRPOConfig(
        model=str(tiny_lm_dir),
        env=replace(GAME, id="broken"),
        grpo=GRPOLossConfig(group_size=2, prompts_per_step=2),
    )
    with pytest.raises(
        AgentError, match=r"BrokenStep \(.*\): step raised RuntimeError: the oracle is asleep"
    ):
        run_grpo(cfg, tmp_path / "run")
    assert not loads and not (tmp_path / "run").exists()
