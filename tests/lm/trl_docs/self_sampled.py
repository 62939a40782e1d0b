"""TRL's docs/source/grpo_trainer.md, "Agent Training" > "Environments": the environment that self-samples
its target. Copied verbatim from huggingface/trl at f2cd57710 (the same text as the published v1.9.2 docs);
only the ``from trl import ...`` line and the trainer call below the class are left out (postrl.grpo runs it:
tests/lm/test_agents_trl_example.py)."""

import random


class IncrementEnv:
    # Reserved methods
    def reset(self, **kwargs) -> str | None:  # required; called at the start of each rollout
        self.counter = 0
        self.target = random.randint(1, 6)  # self-sample the task
        return f"Increment the counter by {self.target}."  # returned string becomes the prompt

    def get_reward(self) -> float:  # optional: the environment scores itself from its own state
        return float(self.counter == self.target)

    # Public methods (exposed as tools)
    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter
