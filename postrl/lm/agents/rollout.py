"""Multi-turn rollouts with postrl's sampler: a batch of episodes, each turn sampled for every episode that is
still running, the observations appended as tokens that carry no loss.

The result is one token layout per batch (`TurnRollout`), the `postrl.lm.rollout.Rollout` layout stretched over
the turns: the first prompt left-padded to column P, then everything after it (actions and observations)
right-padded. ``action_mask`` marks the tokens the policy sampled; observation and tool tokens are context only
(the loss multiplies by ``action_mask``, so their gradient is exactly zero). ``log_probs`` are the sampling
log-probs; a teacher-forced forward of ``input_ids`` reproduces them at the action tokens.

Each turn's prompt is the episode so far, encoded once and extended by token concatenation (the observation's
suffix as the chat template renders it after an assistant turn), never re-tokenised, so the sampled tokens are
exactly the ones scored (TRL's GRPOTrainer builds its multi-turn sequences the same way). Because a turn's
prompt always extends the last one token for token, the KV cache of the conversation so far stays exact: with
``kv_cache="reuse"`` (``auto``) it is kept per episode and each turn prefills only its new tokens
(`postrl.lm.rollout.turns.TurnSampler`); ``"prefill"`` prefills the whole conversation at every turn (the
reference the cached path is pinned to: equal tokens and log-probs, tests/lm/test_agents_turns.py).

Concatenation equals the chat template's own rendering of the conversation only where the template renders
earlier turns the same whatever follows (it is "prefix-preserving"); one that rewrites them (Qwen3's drops
the reasoning of earlier assistant turns) trains on a sequence the template would not render.
`template_mismatch` checks it once per template and the rollout logs a warning naming the first difference.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from postrl.core import turn_index
from postrl.lm.agents.env import AgentError, Episode, EpisodeBudget, Message, TextEnv, play_turn, reset_env
from postrl.lm.data import encode_prompts
from postrl.lm.models import context_length
from postrl.lm.rollout import RolloutEngine, SamplingConfig, left_pad
from postrl.lm.rollout.decoders import make_decoder
from postrl.lm.rollout.engine import Draw
from postrl.lm.rollout.turns import TurnSampler, reuse_unsupported_reason

log = logging.getLogger(__name__)

_DUMMY = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]


@dataclass
class TurnRollout:
    """A batch of played episodes as tokens, and their per-turn rewards."""

    input_ids: Tensor
    """[B, P + T] first prompt (left-padded) then actions and observations (right-padded)"""
    attention_mask: Tensor
    """[B, P + T] long"""
    prompt_len: int
    """P"""
    action_mask: Tensor
    """[B, T] long: 1 on the tokens the policy sampled, 0 on observations, tools and padding"""
    log_probs: Tensor
    """[B, T] float32 sampling log π_τ on action tokens, 0 elsewhere"""
    token_turns: Tensor
    """[B, T] int64 turn of each action token, −1 elsewhere (`postrl.core.turn_index` of ``action_mask``)"""
    turn_rewards: Tensor
    """[B, K] float32 reward of each turn (K the most turns of any episode), 0 on padding"""
    turn_mask: Tensor
    """[B, K] bool, 1 on each episode's turns"""
    terminated: Tensor
    """[B] bool: the environment ended the episode (False: cut by the budget or the environment)"""
    episodes: list[Episode]
    """the episodes as messages"""


def _render(tokenizer: Any, messages: list[Message], **kwargs: Any) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def _as_user(messages: list[Message]) -> list[Message]:
    """Tool results as user messages wrapped in ``<tool_response>`` (Qwen's rendering of the tool role), for a
    chat template that has no tool role."""
    return [
        {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
        if m["role"] == "tool"
        else m
        for m in messages
    ]


def observation_text(tokenizer: Any, observation: list[Message]) -> str:
    """What follows an assistant turn when ``observation`` comes next and the model is to reply: the chat
    template's rendering of (a dummy exchange + the observation, with the generation prompt) minus its
    rendering of the dummy exchange."""
    base = _render(tokenizer, _DUMMY)
    try:
        full = _render(tokenizer, _DUMMY + observation, add_generation_prompt=True)
    except Exception:  # a template without a tool role (the built-in one raises on unknown roles)
        if not any(m["role"] == "tool" for m in observation):
            raise
        log.info("chat template has no tool role: tool results are rendered as <tool_response> user turns")
        full = _render(tokenizer, _DUMMY + _as_user(observation), add_generation_prompt=True)
    if not full.startswith(base):
        raise AgentError("the chat template does not render a conversation as a prefix of its continuation")
    return full[len(base) :]


def observation_ids(tokenizer: Any, observation: list[Message]) -> list[int]:
    """The tokens of `observation_text`."""
    return list(tokenizer(observation_text(tokenizer, observation), add_special_tokens=False)["input_ids"])


def prompt_ids(tokenizer: Any, env: TextEnv, messages: list[Message]) -> list[int]:
    """The first prompt's tokens: the chat template with the environment's tools and the generation prompt."""
    return _rendered_ids(tokenizer, messages, env.tools)


def _rendered_ids(tokenizer: Any, messages: list[Message], tools: list[dict[str, Any]]) -> list[int]:
    text = _render(tokenizer, messages, add_generation_prompt=True, tools=tools or None)
    return encode_prompts(tokenizer, [text])[0]


_PROBE = [
    {"role": "user", "content": "What is 17 + 25?"},
    {"role": "assistant", "content": "Let me think. 17 + 25 = 42"},
    {"role": "user", "content": "Are you sure?"},
    {"role": "assistant", "content": "Yes: 42"},
    {"role": "user", "content": "Thanks."},
]
_CHECKED: dict[tuple[str, str], str | None] = {}


def template_mismatch(tokenizer: Any, tools: list[dict[str, Any]] | None = None) -> str | None:
    """None when the rollout's token concatenation (first prompt, each reply ending in EOS, each observation's
    suffix) equals the chat template's rendering of the same conversation, on a probe conversation of three
    user and two assistant turns; else where they first differ."""
    key = (str(getattr(tokenizer, "chat_template", "")), repr(tools))
    if key in _CHECKED:
        return _CHECKED[key]
    concat = _rendered_ids(tokenizer, _PROBE[:1], tools or [])
    for k in (1, 3):
        reply = tokenizer(_PROBE[k]["content"], add_special_tokens=False)["input_ids"]
        concat += list(reply) + [tokenizer.eos_token_id] + observation_ids(tokenizer, _PROBE[k + 1 : k + 2])
    full = _rendered_ids(tokenizer, _PROBE, tools or [])
    at = next(
        (i for i, (a, b) in enumerate(zip(concat, full, strict=False)) if a != b), min(len(concat), len(full))
    )
    reason = None
    if concat != full:
        reason = (
            f"at token {at} the turns concatenated read {tokenizer.decode(concat[at : at + 8])!r}, the template's"
            f" rendering of the conversation {tokenizer.decode(full[at : at + 8])!r}"
        )
    _CHECKED[key] = reason
    return reason


@dataclass
class EpisodeTokens:
    """One episode being played: its environment, its tokens after the prompt, and its record."""

    env: TextEnv
    prompt: list[int]
    after: list[int]
    action: list[int]
    log_probs: list[float]
    episode: Episode
    fresh: list[int]
    """the tokens since the last reply (the prompt before the first): what a kept KV cache lacks"""

    @property
    def done(self) -> bool:
        return self.episode.terminated or self.episode.truncated

    @property
    def length(self) -> int:
        """the positions the conversation takes so far"""
        return len(self.prompt) + len(self.after)


def _start(tokenizer: Any, env: TextEnv, seed: int | None, options: dict[str, Any] | None) -> EpisodeTokens:
    messages, _ = reset_env(env, seed, options)
    episode = Episode(messages=list(messages), prompt_len=len(messages))
    prompt = prompt_ids(tokenizer, env, messages)
    return EpisodeTokens(env, prompt, [], [], [], episode, prompt)


def take_turn(
    run: EpisodeTokens,
    ids: list[int],
    log_probs: list[float],
    text: str,
    budget: EpisodeBudget,
    encode: Callable[[list[Message]], list[int]],
) -> None:
    """Record one sampled action, step the environment, append the observation's tokens (``encode``: an
    observation's messages → the tokens that follow the reply, `observation_ids` for a text policy)."""
    run.after += ids
    run.action += [1] * len(ids)
    run.log_probs += log_probs
    observation = play_turn(run.env, run.episode, text, len(ids), budget)
    if observation is not None:
        suffix = encode(observation)
        run.fresh = suffix
        run.after += suffix
        run.action += [0] * len(suffix)
        run.log_probs += [0.0] * len(suffix)


KV_CACHES = ("auto", "reuse", "prefill")


@torch.no_grad()
def sample_episodes(
    model: torch.nn.Module,
    tokenizer: Any,
    envs: Sequence[TextEnv],
    sampling: SamplingConfig,
    budget: EpisodeBudget,
    generator: torch.Generator | None = None,
    seeds: Sequence[int | None] | None = None,
    options: Sequence[dict[str, Any] | None] | None = None,
    kv_cache: str = "auto",
) -> TurnRollout:
    """Play one episode in each of ``envs`` (reset with ``seeds[i]`` / ``options[i]``) with ``model``.

    Every turn, the episodes still running are sampled together, each reply is cut to
    ``sampling.max_new_tokens`` and to the tokens left in the episode's budget, and the environments step on
    the decoded replies. ``kv_cache``: ``reuse`` keeps each episode's KV cache across turns (only the new
    tokens are prefilled), ``prefill`` prefills every episode's whole conversation at each turn, ``auto``
    reuses where the decoder can. An exception in a `step` is an `AgentError` naming the environment.

    An episode never runs past the model's positions (its config's context length): a reply gets at most the
    positions left, and an episode whose conversation leaves none is truncated after its last reply (the
    observation that filled them dropped; its last info says ``"cut": "context"``), as the budget would cut
    it; a first prompt that fills them is an `AgentError`.
    """
    runs = [
        _start(tokenizer, env, seeds[i] if seeds else None, options[i] if options else None)
        for i, env in enumerate(envs)
    ]
    context = context_length(model)
    mismatch = template_mismatch(tokenizer, envs[0].tools if envs else None)
    if mismatch is not None:
        log.warning(
            "the chat template re-renders earlier turns: episodes are trained as sampled; %s", mismatch
        )
    turns = _turn_sampler(model, tokenizer, sampling, generator, kv_cache)
    eos = tokenizer.eos_token_id

    def encode(observation: list[Message]) -> list[int]:
        return observation_ids(tokenizer, observation)

    while active := [i for i, r in enumerate(runs) if not (r.done or cut_at_context(r, context))]:
        limits = room(runs, active, budget, context)
        max_new = min(sampling.max_new_tokens, max(limits))
        if turns is None:
            engine = RolloutEngine(model, tokenizer, dataclasses.replace(sampling, max_new_tokens=max_new))
            tokens, log_probs, lengths = _prefilled_turn(engine, runs, active, generator)
            lengths = torch.minimum(lengths, torch.tensor(limits))
        else:
            chunks = [runs[i].fresh for i in active]
            tokens, log_probs, lengths = turns.turn(active, chunks, max_new, limits)
        for j, i in enumerate(active):
            length = int(lengths[j])
            action = tokens[j, :length].tolist()
            text = tokenizer.decode([t for t in action if t != eos], skip_special_tokens=True)
            take_turn(runs[i], action, log_probs[j, :length].tolist(), text, budget, encode)
    return assemble_episodes(runs, tokenizer.pad_token_id)


def cut_at_context(run: EpisodeTokens, context: int | None) -> bool:
    """Truncate ``run`` when its conversation leaves no position of the model's ``context`` for a reply (None:
    unknown, never); whether it was cut. The observation that filled it is dropped from the tokens (context
    only, no loss; kept, it would run past the positions, and cut inside a picture's placeholders it would no
    longer match the picture); an `AgentError` when the first prompt fills it."""
    if context is None or run.length < context:
        return False
    episode = run.episode
    if not episode.actions:
        raise AgentError(
            f"the first prompt of {type(run.env).__name__} is {run.length} tokens: the model takes {context}"
            " positions and has none left for a reply"
        )
    keep = len(run.after) - len(run.fresh)  # the tokens up to the last reply (replies fit: held to the room)
    run.after, run.action, run.log_probs = run.after[:keep], run.action[:keep], run.log_probs[:keep]
    last_reply = max(k for k, m in enumerate(episode.messages) if m["role"] == "assistant")
    del episode.messages[last_reply + 1 :]  # the messages as the tokens: they end with the last reply
    episode.truncated = True
    episode.rewards[-1] += float(run.env.truncation_reward())
    episode.infos[-1]["cut"] = "context"
    return True


def room(
    runs: list[EpisodeTokens], active: list[int], budget: EpisodeBudget, context: int | None
) -> list[int]:
    """The most tokens each of the ``active`` episodes may write this turn: its budget's, and the positions
    left in the model's ``context`` (None: unknown)."""
    limits = [budget.max_tokens - runs[i].episode.tokens for i in active]
    if context is None:
        return limits
    return [min(n, context - runs[i].length) for n, i in zip(limits, active, strict=True)]


def _turn_sampler(
    model: torch.nn.Module, tokenizer: Any, sampling: SamplingConfig, generator: Any, kv_cache: str
) -> TurnSampler | None:
    """The sampler that keeps the episodes' KV caches (``kv_cache`` reuse / auto where the decoder can), or
    None: every turn re-prefilled."""
    if kv_cache not in KV_CACHES:
        raise ValueError(f"kv_cache must be one of {KV_CACHES}, got {kv_cache!r}")
    if kv_cache == "prefill":
        return None
    decoder = make_decoder(model, sampling.use_fast)
    reason = reuse_unsupported_reason(decoder)
    if reason is not None and kv_cache == "auto":
        log.info("episodes re-prefill every turn: %s", reason)
        return None
    draw = Draw(sampling.temperature, sampling.top_k, sampling.top_p, sampling.greedy, generator)
    device = next(model.parameters()).device
    return TurnSampler(decoder, draw, tokenizer.eos_token_id, tokenizer.pad_token_id, device)


def _prefilled_turn(
    engine: RolloutEngine, runs: list[EpisodeTokens], active: list[int], generator: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One turn of the episodes ``active`` with each whole conversation prefilled: (tokens [B, T],
    log-probs [B, T], lengths up to EOS [B])."""
    ids, mask = left_pad([runs[i].prompt + runs[i].after for i in active], engine.tokenizer.pad_token_id)
    device = next(engine.model.parameters()).device
    out = engine.sample(ids.to(device), mask.to(device), generator)
    return out.response_ids, out.log_probs, out.response_lengths.cpu()


def assemble_episodes(runs: list[EpisodeTokens], pad_token_id: int) -> TurnRollout:
    """The played episodes in the one token layout."""
    n = len(runs)
    prompt, prompt_mask = left_pad([r.prompt for r in runs], pad_token_id)
    width = max(len(r.after) for r in runs)
    after = torch.full((n, width), pad_token_id, dtype=torch.long)
    action = torch.zeros((n, width), dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    log_probs = torch.zeros((n, width), dtype=torch.float32)
    turns = max(len(r.episode.rewards) for r in runs)
    rewards = torch.zeros((n, turns), dtype=torch.float32)
    turn_mask = torch.zeros((n, turns), dtype=torch.bool)
    for i, r in enumerate(runs):
        m = len(r.after)
        after[i, :m] = torch.tensor(r.after)
        action[i, :m] = torch.tensor(r.action)
        attention[i, :m] = 1
        log_probs[i, :m] = torch.tensor(r.log_probs)
        k = len(r.episode.rewards)
        rewards[i, :k] = torch.tensor(r.episode.rewards)
        turn_mask[i, :k] = True
    return TurnRollout(
        input_ids=torch.cat([prompt, after], dim=1),
        attention_mask=torch.cat([prompt_mask, attention], dim=1),
        prompt_len=prompt.shape[1],
        action_mask=action,
        log_probs=log_probs,
        token_turns=turn_index(action),
        turn_rewards=rewards,
        turn_mask=turn_mask,
        terminated=torch.tensor([r.episode.terminated for r in runs]),
        episodes=[r.episode for r in runs],
    )
