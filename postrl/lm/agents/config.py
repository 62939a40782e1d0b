"""The ``env`` section of a trainer's config: episodes in a text environment instead of prompts from data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from postrl.lm.agents.env import EpisodeBudget

CREDITS = ("trajectory", "turn")
HELDOUT_SEED = 1_000_000
"""the held-out episodes' seeds start here (the training seeds are 0 … env.n_train − 1)"""


@dataclass(frozen=True)
class EnvConfig:
    """Episodes in a text environment (`postrl.lm.agents`): each prompt of the stream is an environment seed,
    each group the G episodes played from it."""

    id: str | None = None
    """Environment: calculator, guess_number, frozenlake, cliffwalking, taxi, or gym:<Gymnasium id with
    discrete actions>; observed through pictures (for a vision-language model, GRPO only):
    frozenlake_pictures or pictures:<Gymnasium id>; None: prompts from data."""
    options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the environment (e.g. {digits: 3} for calculator, {high: 20} for guess_number,
    {view: local} for frozenlake or cliffwalking: the agent's row, column and the 3×3 cells around it instead
    of the whole grid)."""
    n_train: int = 1000
    """Training episodes: seeds 0 … n_train − 1 (the prompt stream's prompts)."""
    n_eval: int = 32
    """Held-out episodes: seeds 1,000,000 … 1,000,000 + n_eval − 1."""
    max_turns: int = 8
    """Most replies per episode (then it is truncated)."""
    max_tokens: int = 256
    """Most tokens the policy writes per episode over all its turns (each reply also at most
    sampling.max_new_tokens)."""
    credit: Literal["trajectory", "turn"] = "trajectory"
    """trajectory: every token of an episode gets the advantage of its return (grpo.advantage over the group);
    turn: each turn gets its return-to-go from that turn on, baselined within the group at that turn
    (core.turn_group_advantages): leave-one-out with grpo.advantage=rloo, else the group mean, divided by the
    group std for grpo.advantage=grpo with grpo.scale_rewards. GRPO only: `postrl ppo` credits each turn with
    GAE over turns (its critic at each turn's start)."""
    gamma: float = 1.0
    """Discount γ between turns (GRPO: for credit=turn; PPO: GAE's γ, the turn as the time step)."""

    kv_cache: Literal["auto", "reuse", "prefill"] = "auto"
    """reuse: keep each episode's KV cache across turns, each turn prefills only its new tokens (the
    observation, the tool result); prefill: prefill every episode's whole conversation at every turn (the
    reference path, the same episodes); auto: reuse where the decoder can (postrl's all can)."""

    CHECKS = {
        "n_train": ">= 1",
        "n_eval": ">= 0",
        "max_turns": ">= 1",
        "max_tokens": ">= 1",
        "gamma": "[0, 1]",
    }

    @property
    def budget(self) -> EpisodeBudget:
        return EpisodeBudget(max_turns=self.max_turns, max_tokens=self.max_tokens)
