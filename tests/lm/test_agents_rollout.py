"""Multi-turn rollouts with postrl's sampler (issue #35 item 2): ragged episodes in one batch, observation
tokens without loss or gradient, sampling log-probs equal to teacher-forced ones over the trajectory."""

import pytest
import torch

from postrl.core import ppo_clip_loss, turn_group_advantages, turns_to_tokens
from postrl.lm.agents import AgentError, EpisodeBudget, TextEnv, make_env
from postrl.lm.agents.rollout import observation_ids, prompt_ids, sample_episodes
from postrl.lm.models import position_ids_from_mask
from postrl.lm.rollout import SamplingConfig


class Countdown(TextEnv):
    """Ends after ``turns`` replies; reward = the turn's index; answers each reply with a line of text."""

    def __init__(self, turns):
        self.turns = turns

    def reset(self, seed=None, options=None):
        self.k = 0
        return [{"role": "user", "content": "count down"}], {}

    def step(self, action):
        self.k += 1
        return f"{self.turns - self.k} to go", float(self.k), self.k == self.turns, False, {}


def teacher_forced(model, rollout, temperature):
    """log π_τ of every token after the prompt, through one plain forward (logits kept for a gradient)."""
    mask = rollout.attention_mask
    logits = model(
        input_ids=rollout.input_ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)
    ).logits  # (B, P + T, V)
    logits.retain_grad()
    P = rollout.prompt_len
    scaled = logits[:, P - 1 : -1] / temperature  # the logits that predict each token after the prompt
    log_probs = torch.log_softmax(scaled, -1).gather(-1, rollout.input_ids[:, P:, None])[..., 0]
    return logits, log_probs


def test_ragged_episodes_batch_together_and_scores_match_teacher_forcing(tiny_lm, tiny_tokenizer):
    envs = [Countdown(3), Countdown(1), Countdown(2), Countdown(3)]
    sampling = SamplingConfig(max_new_tokens=6, temperature=0.9)
    gen = torch.Generator().manual_seed(0)
    out = sample_episodes(
        tiny_lm, tiny_tokenizer, envs, sampling, EpisodeBudget(max_turns=5, max_tokens=64), gen
    )
    assert out.turn_mask.sum(-1).tolist() == [3, 1, 2, 3]
    assert out.turn_rewards.tolist() == [[1, 2, 3], [1, 0, 0], [1, 2, 0], [1, 2, 3]]
    assert out.terminated.all()
    assert (out.token_turns.amax(-1) + 1).tolist() == [3, 1, 2, 3]
    # the observation tokens sit between the actions, and are what the chat template renders
    for i, ep in enumerate(out.episodes):
        after = out.input_ids[i, out.prompt_len :][out.attention_mask[i, out.prompt_len :] == 1]
        obs = after[out.action_mask[i][out.attention_mask[i, out.prompt_len :] == 1] == 0].tolist()
        expected = sum((observation_ids(tiny_tokenizer, [m]) for m in ep.messages[2::2]), [])
        assert obs == expected
    _, tf = teacher_forced(tiny_lm, out, sampling.temperature)
    act = out.action_mask.bool()
    torch.testing.assert_close(tf[act], out.log_probs[act], atol=1e-4, rtol=0)
    assert torch.all(out.log_probs[~act] == 0)


def test_observation_tokens_get_exactly_zero_gradient(tiny_lm, tiny_tokenizer):
    envs = [Countdown(2), Countdown(3)]
    sampling = SamplingConfig(max_new_tokens=5)
    gen = torch.Generator().manual_seed(1)
    out = sample_episodes(tiny_lm, tiny_tokenizer, envs, sampling, EpisodeBudget(), gen)
    rewards = out.turn_rewards + torch.tensor([[0.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    turn_adv = turn_group_advantages(rewards, out.turn_mask, 2, scale=False, leave_one_out=True)
    advantages = turns_to_tokens(turn_adv, out.token_turns)
    advantages = torch.where(out.action_mask.bool(), advantages, torch.full_like(advantages, 1e6))  # garbage
    logits, log_probs = teacher_forced(tiny_lm, out, 1.0)
    loss, _ = ppo_clip_loss(log_probs, out.log_probs, advantages, 0.2, mask=out.action_mask)
    loss.backward()
    P = out.prompt_len
    grad = logits.grad[:, P - 1 : -1].abs().sum(-1)  # (B, T) gradient on the logits predicting each token
    assert torch.all(grad[out.action_mask == 0] == 0)
    assert torch.all(grad[(out.action_mask == 1) & (advantages != 0)] > 0)


def test_tool_results_become_tokens_even_without_a_tool_role_in_the_template(tiny_tokenizer):
    ids = observation_ids(tiny_tokenizer, [{"role": "tool", "name": "add", "content": "85"}])
    text = tiny_tokenizer.decode(ids)
    assert "<tool_response>" in text and "85" in text and text.endswith("<|assistant|>")


def test_budget_cuts_episodes_in_the_batch(tiny_lm, tiny_tokenizer):
    envs = [make_env("guess_number") for _ in range(3)]
    gen = torch.Generator().manual_seed(0)
    budget = EpisodeBudget(max_turns=4, max_tokens=10)
    out = sample_episodes(
        tiny_lm, tiny_tokenizer, envs, SamplingConfig(max_new_tokens=4), budget, gen, seeds=[0, 1, 2]
    )
    for i, ep in enumerate(out.episodes):
        assert ep.tokens == int(out.action_mask[i].sum()) <= 10
        assert len(ep.actions) <= 4 and (ep.terminated or ep.truncated)


def test_episodes_are_cut_where_the_conversation_fills_the_models_context(tiny_lm, tiny_tokenizer):
    budget = EpisodeBudget(max_turns=50, max_tokens=10**4)
    sampling = SamplingConfig(max_new_tokens=4)
    prompt = len(prompt_ids(tiny_tokenizer, Countdown(1), [{"role": "user", "content": "count down"}]))
    tiny_lm.config.max_position_embeddings = prompt + 40
    out = sample_episodes(tiny_lm, tiny_tokenizer, [Countdown(50), Countdown(2)], sampling, budget,
                          torch.Generator().manual_seed(0))  # fmt: skip
    long, short = out.episodes
    assert long.truncated and not long.terminated and long.infos[-1]["cut"] == "context"
    assert long.messages[-1] == {"role": "assistant", "content": long.actions[-1]}
    assert 1 < len(long.actions) < 50
    length = int(out.attention_mask[0].sum())
    dropped = observation_ids(
        tiny_tokenizer, [{"role": "user", "content": f"{50 - len(long.actions)} to go"}]
    )
    assert length <= prompt + 40 < length + len(dropped)  # the last observation did not fit: dropped
    assert out.action_mask[0, length - out.prompt_len - 1] == 1  # the conversation ends with the last reply
    assert int(out.action_mask[0].sum()) == long.tokens
    assert short.terminated and "cut" not in short.infos[-1]  # the short one plays to its end
    tiny_lm.config.max_position_embeddings = prompt
    with pytest.raises(AgentError, match=f"first prompt of Countdown is {prompt} tokens.*takes {prompt}"):
        sample_episodes(tiny_lm, tiny_tokenizer, [Countdown(2)], sampling, budget)
