"""GRPO over episodes of a text environment (`postrl.lm.agents`), through the trainer's `GRPOEngine` seam.

`EpisodeEngine` replaces the prompts of data with environment seeds: a group is G episodes played from one
seed, sampled turn by turn with `postrl.lm.agents.rollout.sample_episodes`; the rollout's response is the
whole trajectory after the first prompt, its ``response_mask`` the tokens the policy wrote (observations and
tool results carry no loss). The reward is the environment's: ``env_return``, the episode's summed reward,
is the one reward function. With ``env.credit=turn`` each token gets its turn's group-relative return-to-go
(`postrl.core.turn_group_advantages`) instead of the episode's advantage. An environment that returns
pictures (``pictures:<id>``) is played by a vision-language model: `postrl.lm.vlm.episodes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from postrl.core import turn_group_advantages, turn_index, turns_to_tokens
from postrl.lm.agents import check_env, make_env
from postrl.lm.agents.config import HELDOUT_SEED
from postrl.lm.agents.registry import returns_pictures
from postrl.lm.agents.rollout import TurnRollout, sample_episodes
from postrl.lm.grpo.config import GRPOConfig
from postrl.lm.grpo.engine import Prompts, Sampled, TextEngine
from postrl.lm.rewards import RewardFunction
from postrl.lm.rollout import Rollout, SamplingConfig
from postrl.lm.tasks.base import stable_hash
from postrl.runtime import distributed as dist
from postrl.runtime.errors import UserError


def env_return(
    prompts: Sequence[Any], completions: Sequence[Any], env_return: Sequence[float], **_: Any
) -> list[float]:
    """The episode's return (the sum of its turns' rewards), as a reward function of TRL's call."""
    return [float(r) for r in env_return]


def check_env_config(cfg: GRPOConfig, vlm: bool = False) -> None:
    """What an episode run refuses before it loads anything: a policy that cannot see the environment's
    observations (``vlm``: the model is a vision-language model), an unknown environment (`AgentError`), and
    keys that do not apply to episodes."""
    pictures = returns_pictures(cfg.env.id)
    if pictures and not vlm:
        raise UserError(
            f"env.id={cfg.env.id} observes pictures but model {cfg.model} is a text causal LM: use a"
            " vision-language model (e.g. the built-in tiny LLaVA) or a text environment"
        )
    if vlm and not pictures:
        raise UserError(
            f"env.id={cfg.env.id} is a text environment but model {cfg.model} is a vision-language model: use"
            " a picture environment (frozenlake_pictures, pictures:<Gymnasium id>) or a text causal LM"
        )
    check_env(cfg.env.id, cfg.env.options)  # an unknown id or option, a step that raises: one AgentError
    g = cfg.grpo
    problems = {
        "env.id with grpo.dynamic_sampling: episodes are not refilled; set grpo.dynamic_sampling=false": (
            g.dynamic_sampling
        ),
        "env.id with lanes.enabled: episodes are sampled in this process; set lanes.enabled=false": getattr(
            getattr(cfg, "lanes", None), "enabled", False
        ),
        f"env.n_train={cfg.env.n_train} is fewer than grpo.prompts_per_step={g.prompts_per_step}; raise it or"
        " set grpo.repeat_prompts=true": cfg.env.n_train < g.prompts_per_step and not g.repeat_prompts,
        f"grpo.overlong_buffer={g.overlong_buffer} must be within [0, env.max_tokens={cfg.env.max_tokens}]": (
            g.overlong_buffer > cfg.env.max_tokens
        ),
        "env.id replaces data and rewards: leave rewards empty (the reward is the environment's)": bool(
            cfg.rewards
        ),
    }
    bad = [message for message, failed in problems.items() if failed]
    if bad:
        raise UserError("; ".join(bad))


def episode_prompts(cfg: GRPOConfig) -> tuple[Prompts, Prompts, list[RewardFunction]]:
    """The (train, held-out) seeds as prompt rows and the reward function of an episode run (whose config
    `check_env_config` passed)."""
    train = Prompts([{"seed": s} for s in range(cfg.env.n_train)], [])
    heldout = Prompts([{"seed": HELDOUT_SEED + s} for s in range(cfg.env.n_eval)], [])
    return train, heldout, [RewardFunction("env_return", env_return)]


@dataclass
class EpisodeInputs:
    """Per-row data of a step's episodes that the advantages need (`Sampled.inputs`)."""

    turn_rewards: Tensor
    """[N, K] reward of each turn"""
    turn_mask: Tensor
    """[N, K] bool"""


def _text(content: Any) -> Any:
    """A message's text: its content, or the text parts of a content list (TRL's image + text)."""
    if isinstance(content, list):
        return "\n".join(part["text"] for part in content if part.get("type") == "text")
    return content


class EpisodeEngine(TextEngine):
    """A causal LM acting in ``cfg.env``: `TextEngine`'s scoring and forward, episodes instead of prompts."""

    def sample(
        self, split: str, indices: list[int], repeat: int, sampling: SamplingConfig, key: tuple
    ) -> Sampled:
        env = self.cfg.env
        seeds = [int(self.prompts[split].rows[i]["seed"]) for i in indices for _ in range(repeat)]
        envs = [make_env(env.id, **env.options) for _ in seeds]
        seed = stable_hash(":".join(str(p) for p in (self.cfg.run.seed, *key))) % 2**63
        generator = torch.Generator(device=self.device).manual_seed(seed)
        inner = dist.unwrap(self.policy_module)
        was_training = inner.training
        inner.eval()
        with dist.gathered(self.policy_module):  # the sampler reads whole weights
            out = self.play(inner, envs, sampling, generator, seeds)
        inner.train(was_training)
        ids, P = out.input_ids.to(self.device), out.prompt_len
        rollout = Rollout(
            ids, out.attention_mask.to(self.device), P, ids[:, P:], out.action_mask.to(self.device),
            out.log_probs.to(self.device), out.terminated.to(self.device),
        )  # fmt: skip
        rows = [
            {
                "prompt": _text(ep.messages[0]["content"]),
                "seed": s,
                "env_return": ep.total_reward,
                "turns": len(ep.actions),
            }
            for s, ep in zip(seeds, out.episodes, strict=True)
        ]
        texts = [ep.actions[-1] for ep in out.episodes]
        return Sampled(rollout, rows, texts, self.inputs(out))

    def play(
        self,
        model: torch.nn.Module,
        envs: list[Any],
        sampling: SamplingConfig,
        generator: torch.Generator,
        seeds: list[int],
    ) -> TurnRollout:
        """One episode in each of ``envs`` by the (unwrapped, eval-mode) ``model``."""
        env = self.cfg.env
        return sample_episodes(
            model, self.tokenizer, envs, sampling, env.budget, generator, seeds, kv_cache=env.kv_cache
        )

    def inputs(self, out: TurnRollout) -> EpisodeInputs:
        """What the advantages (and the forwards) need of the episodes besides their tokens."""
        return EpisodeInputs(out.turn_rewards.to(self.device), out.turn_mask.to(self.device))

    def credit(self, rollout: Rollout, advantages: Tensor, inputs: EpisodeInputs) -> Tensor:
        """The advantages the loss takes: the episode's ([N], credit=trajectory) or its turns' spread over
        their tokens ([N, T], credit=turn)."""
        if self.cfg.env.credit == "trajectory":
            return advantages
        g = self.cfg.grpo
        per_turn = turn_group_advantages(
            inputs.turn_rewards, inputs.turn_mask, g.group_size, self.cfg.env.gamma, eps=g.adv_eps,
            scale=g.scale_rewards and g.advantage == "grpo", leave_one_out=g.advantage == "rloo",
        )  # fmt: skip
        return turns_to_tokens(per_turn, turn_index(rollout.response_mask)).to(advantages.dtype)
