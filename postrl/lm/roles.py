"""`Roles`: the models an LM stage holds, named by what they do (policy, critic, reference, reward model).

PPO-RLHF holds all four; a stage trained against a frozen reference (DPO, KTO) fills the policy and the
reference, which is all the held-out evaluation (`postrl.lm.evaluation.evaluate_heldout`) reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Roles:
    """The four models of PPO-RLHF. ``critic`` is None when the value head shares the actor's trunk (then
    ``actor`` is a `PolicyWithValueHead` returning (logits, values)); ``reward_model`` is None when reward
    functions give the scores."""

    actor: torch.nn.Module
    critic: torch.nn.Module | None
    reference: torch.nn.Module
    reward_model: torch.nn.Module | None

    @property
    def policy(self) -> torch.nn.Module:
        """The causal LM that generates (the actor without a shared value head)."""
        return getattr(self.actor, "lm", self.actor)
