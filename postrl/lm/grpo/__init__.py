"""`postrl grpo`: Group Relative Policy Optimization; the group's own rewards are the baseline, no critic.

    entry.py       `run_grpo`: text policies through the recipe, vision-language models through `postrl.lm.vlm`
    algorithm.py   the batch → loss, `GRPOObjective` (its part of `postrl.lm.onpolicy`), `GRPO`, `GRPORecipe`
    rollouts.py    the prompt stream; sampling, rewards and advantages of a step (`collect`); evaluation
    config.py      `GRPOConfig` and `GRPOLossConfig`
    build.py       everything a run loads and checks before it writes anything

`run_grpo`, `GRPOConfig` and `GRPOLossConfig` (and the loss helpers tests use) are importable from here;
`run_grpo` on first use, because `postrl.lm.vlm` (which `entry.py` dispatches to) imports this package's modules.
"""

from postrl.core import overlong_penalty as overlong_penalty  # re-exported: its name before postrl.core
from postrl.lm.grpo.algorithm import MU_ONE_NOTE as MU_ONE_NOTE
from postrl.lm.grpo.algorithm import backward_grpo_minibatch as backward_grpo_minibatch
from postrl.lm.grpo.algorithm import optimise_grpo as optimise_grpo
from postrl.lm.grpo.algorithm import policy_log_probs as policy_log_probs
from postrl.lm.grpo.config import GRPOConfig as GRPOConfig
from postrl.lm.grpo.config import GRPOLossConfig as GRPOLossConfig


def __getattr__(name: str) -> object:
    """``run_grpo``, imported on first use (PEP 562): see the module docstring."""
    if name == "run_grpo":
        from postrl.lm.grpo.entry import run_grpo

        return run_grpo
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
