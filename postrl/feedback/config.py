"""The config of `postrl loop` (`postrl.loop`): rounds of preference collection, reward learning and policy
learning."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class LoopConfig:
    """`postrl loop --out DIR`: K rounds of sample pairs → label → reward model → policy update."""

    model: str = "runs/demo/sft/model"
    """The policy the first round starts from (an SFT model); also the reference every round's KL is measured
    against and the reward model's initial trunk."""
    data: str = "task:reviews"
    """Prompts to sample pairs for: a built-in task (its gold reward is then the report's yardstick) or a file."""
    task: dict[str, Any] = field(default_factory=dict)
    """Options of a built-in task."""
    rounds: int = 3
    """K: rounds of collection and learning (1: the offline pipeline, all labels collected up front)."""
    labels_per_round: int = 200
    """Pairs labelled in each round (the label budget is rounds × labels_per_round)."""
    labeller: str = "synthetic"
    """Who labels: synthetic (the task's noisy labeller from its gold reward), page (people: the loop stops
    at the round's labelling and prints the `postrl label` command; `postrl loop --resume` goes on once the
    round is labelled), or a judge spec: rm:PATH, lm:PATH, openai:URL, or a reward function spec
    (`postrl judge`)."""
    policy_stage: Literal["dpo", "ppo"] = "dpo"
    """How the policy learns each round: dpo (on the round's new pairs, from the current policy, which is also
    DPO's reference: iterative DPO) or ppo (against the round's reward model, KL to the starting model)."""
    rm_config: str = "rm-reviews"
    """Preset or YAML file of the reward-model stage (`postrl rm`)."""
    policy_config: str | None = None
    """Preset or YAML file of the policy stage (default: dpo-reviews or ppo-reviews)."""
    rm: dict[str, Any] = field(default_factory=dict)
    """Overrides of the reward-model stage, e.g. {run: {steps: 100}}."""
    policy: dict[str, Any] = field(default_factory=dict)
    """Overrides of the policy stage, e.g. {run: {steps: 50}}."""
    max_new_tokens: int = 24
    """Response length of the sampled pairs and of the report's samples."""
    temperature: float = 1.0
    """Sampling temperature of the pairs and of the report."""
    eval_size: int = 256
    """Held-out prompts sampled for each round's report (gold reward, KL, the reward model's accuracy)."""
    seed: int = 0
    """Seed of the pairs, the synthetic labeller and every stage."""

    CHECKS = {  # valid ranges (postrl.runtime.config)
        "rounds": ">= 1",
        "labels_per_round": ">= 2",
        "max_new_tokens": ">= 1",
        "temperature": "> 0",
        "eval_size": ">= 2",
    }
