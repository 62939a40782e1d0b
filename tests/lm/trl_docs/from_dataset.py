"""TRL's docs/source/grpo_trainer.md, "Agent Training" > "Providing an external dataset (optional)": the
dataset whose ``target`` column reaches ``reset(target=...)`` and its environment. Copied verbatim from
huggingface/trl at f2cd57710 (the same text as the published v1.9.2 docs); only the ``from trl import ...``
line and the trainer call are left out (postrl.grpo runs it: tests/lm/test_agents_trl_example.py).

One change, the one the docs ask for: ``increment`` is written there without its docstring, with the comment
"see the full docstring above" (a tool needs one: TRL and postrl both refuse it without); the full docstring of
the first example (`tests.lm.trl_docs.self_sampled`) is put in. `AS_PRINTED` is the class as printed.
(And a second blank line before the class, as ruff format wants.)"""

from datasets import Dataset

# Each row carries the prompt and the task data (here, the counter target to reach).
dataset = Dataset.from_dict(
    {
        "prompt": [[{"role": "user", "content": f"Increment the counter to {i}."}] for i in range(1, 7)],
        "target": list(range(1, 7)),
    }
)


class IncrementEnv:
    def reset(self, target, **kwargs) -> None:  # the row's `target` column arrives as a keyword argument
        self.counter = 0
        self.target = target

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:  # exposed as a tool (see the full docstring above)
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


class AS_PRINTED:
    def reset(self, target, **kwargs) -> None:  # the row's `target` column arrives as a keyword argument
        self.counter = 0
        self.target = target

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:  # exposed as a tool (see the full docstring above)
        self.counter += step
        return self.counter
