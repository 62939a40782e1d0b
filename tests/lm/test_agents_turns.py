"""Multi-turn rollouts that keep each episode's KV cache across turns (issue #35 item 2): the same episodes,
tokens and log-probs as re-prefilling every conversation at every turn, with every decoder; and the check that
a chat template renders a conversation as the turns concatenated."""

import logging

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from postrl.lm import base_model
from postrl.lm.agents import EpisodeBudget, TextEnv, make_env
from postrl.lm.agents.rollout import sample_episodes, template_mismatch
from postrl.lm.models import load_causal_lm, position_ids_from_mask
from postrl.lm.rollout import SamplingConfig
from postrl.lm.tokenizer import load_tokenizer
from postrl.runtime.logging import read_jsonl


class Chatter(TextEnv):
    """Ends after ``turns`` replies; answers each with an observation whose length depends on the turn and
    the reply, so that the episodes' chunks differ in length from turn to turn."""

    def __init__(self, turns):
        self.turns = turns

    def reset(self, seed=None, options=None):
        self.k = 0
        return [{"role": "user", "content": "say something " * (1 + (seed or 0) % 3)}], {}

    def step(self, action):
        self.k += 1
        observation = f"{len(action)} " * (1 + self.k % 3) + "more"
        return observation, float(len(action)), self.k == self.turns, False, {}


def play(model, tokenizer, kv_cache, sampling, budget, seed=0):
    envs = [Chatter(t) for t in (4, 1, 3, 2, 4, 3)]
    gen = torch.Generator().manual_seed(seed)
    seeds = [0, 1, 2, 0, 1, 2]
    return sample_episodes(model, tokenizer, envs, sampling, budget, gen, seeds, kv_cache=kv_cache)


def assert_same(a, b):
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(a.attention_mask, b.attention_mask)
    assert torch.equal(a.action_mask, b.action_mask)
    torch.testing.assert_close(a.log_probs, b.log_probs, atol=2e-5, rtol=0)
    assert torch.equal(a.turn_rewards, b.turn_rewards)
    assert [e.actions for e in a.episodes] == [e.actions for e in b.episodes]


@pytest.fixture(scope="module")
def builtin():
    """The built-in pretrained tiny Llama: it writes EOS, so replies end at different tokens."""
    return load_causal_lm(base_model.path()), load_tokenizer(base_model.path())


def ragged_turns(rollout):
    """How many turns had replies of different lengths in the batch (a row's cache then has holes)."""
    turns = int(rollout.token_turns.max()) + 1
    lengths = [(rollout.token_turns == k).sum(-1) for k in range(turns)]
    return sum(len(set(n[n > 0].tolist())) > 1 for n in lengths)


def tiny_gpt2(vocab, tokenizer):
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=512,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    return GPT2LMHeadModel(cfg).eval()


@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_reusing_the_cache_gives_the_episodes_of_re_prefilling(builtin, backend):
    # replies of every length (rows ending with EOS while others go on) and a token budget that cuts some
    # replies short: both leave holes in the kept cache, which must not be attended
    model, tokenizer = builtin
    sampling = SamplingConfig(max_new_tokens=8, temperature=1.3, backend=backend)
    budget = EpisodeBudget(max_turns=4, max_tokens=22)
    reused = play(model, tokenizer, "reuse", sampling, budget)
    prefilled = play(model, tokenizer, "prefill", sampling, budget)
    assert_same(reused, prefilled)
    assert len(set(reused.turn_mask.sum(-1).tolist())) > 1  # ragged: episodes of different lengths together
    assert any(ep.truncated for ep in reused.episodes) and any(ep.terminated for ep in reused.episodes)
    assert ragged_turns(reused) >= 2


def test_reusing_the_cache_with_fast_gpt2(tiny_tokenizer):
    model = tiny_gpt2(len(tiny_tokenizer), tiny_tokenizer)
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.3, backend="fast")
    budget = EpisodeBudget(max_turns=4, max_tokens=20)
    reused = play(model, tiny_tokenizer, "reuse", sampling, budget, seed=3)
    assert_same(reused, play(model, tiny_tokenizer, "prefill", sampling, budget, seed=3))
    assert ragged_turns(reused) >= 1


def test_a_group_sharing_its_prompt_and_a_built_in_game(builtin):
    tiny_lm, tiny_tokenizer = builtin
    # guess_number: G episodes from one seed (one prompt prefilled once), then diverging replies
    envs = [make_env("guess_number") for _ in range(6)]
    seeds = [5, 5, 5, 9, 9, 9]
    sampling = SamplingConfig(max_new_tokens=5, temperature=1.2)
    budget = EpisodeBudget(max_turns=5, max_tokens=25)
    gens = {kv: torch.Generator().manual_seed(2) for kv in ("reuse", "prefill")}
    out = {
        kv: sample_episodes(tiny_lm, tiny_tokenizer, envs, sampling, budget, gen, seeds, kv_cache=kv)
        for kv, gen in gens.items()
    }
    assert_same(out["reuse"], out["prefill"])
    # and the cached path's sampled log-probs are the teacher-forced ones over the whole trajectory
    r = out["reuse"]
    mask = r.attention_mask
    logits = tiny_lm(
        input_ids=r.input_ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)
    ).logits
    P = r.prompt_len
    tf = torch.log_softmax(logits[:, P - 1 : -1] / 1.2, -1).gather(-1, r.input_ids[:, P:, None])[..., 0]
    act = r.action_mask.bool()
    torch.testing.assert_close(tf[act], r.log_probs[act], atol=1e-4, rtol=0)


def test_an_unknown_kv_cache_mode_is_refused(tiny_lm, tiny_tokenizer):
    with pytest.raises(ValueError, match="kv_cache"):
        play(tiny_lm, tiny_tokenizer, "sometimes", SamplingConfig(), EpisodeBudget())


# Qwen3's rule, reduced: an assistant turn before the last user message loses what precedes its last line
_REWRITING = (
    "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last and loop.index0 < 3 %}"
    "<|assistant|>{{ m['content'].split('. ')[-1] }}{{ eos_token }}"
    "{% else %}<|{{ m['role'] }}|>{{ m['content'] }}{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_the_template_check_finds_a_template_that_rewrites_earlier_turns(tiny_tokenizer, tiny_lm, caplog):
    assert template_mismatch(tiny_tokenizer) is None  # the built-in template renders the concatenation
    rewriting = type(tiny_tokenizer).from_pretrained(tiny_tokenizer.name_or_path)
    rewriting.chat_template = _REWRITING
    reason = template_mismatch(rewriting)
    assert reason is not None and "at token" in reason and "Let me" in reason
    with caplog.at_level(logging.WARNING, logger="postrl.lm.agents.rollout"):
        sample_episodes(
            tiny_lm, rewriting, [Chatter(1)], SamplingConfig(max_new_tokens=2), EpisodeBudget(),
            torch.Generator().manual_seed(0),
        )  # fmt: skip
    assert "re-renders earlier turns" in caplog.text


def test_grpo_on_episodes_is_the_same_run_with_the_cache_kept_or_re_prefilled(tmp_path):
    import postrl

    def run(kv_cache):
        out = tmp_path / kv_cache
        postrl.grpo(
            model=str(base_model.path()), out=str(out),
            env={"id": "guess_number", "options": {"high": 8}, "n_train": 4, "n_eval": 2, "max_turns": 3,
                 "max_tokens": 12, "kv_cache": kv_cache},
            sampling={"max_new_tokens": 5, "temperature": 1.2},
            grpo={"group_size": 4, "prompts_per_step": 2}, eval_at_start=False,
            run={"steps": 2, "eval_every": 2, "save_every": 2, "log_every": 1, "device": "cpu", "threads": 1},
        )  # fmt: skip
        rows = [r for r in read_jsonl(out / "metrics.jsonl") if "loss" in r]
        return [(r["reward_mean"], r["completion_length_mean"]) for r in rows], load_causal_lm(out / "model")

    (rows_a, model_a), (rows_b, model_b) = run("reuse"), run("prefill")
    assert rows_a == rows_b and len(rows_a) == 2
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
