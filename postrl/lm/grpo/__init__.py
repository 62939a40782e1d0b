"""`postrl grpo`: Group Relative Policy Optimization; the group's own rewards are the baseline, no critic.

    algorithm.py   the batch → loss, `GRPOObjective` (its part of `postrl.lm.onpolicy`), `GRPO`, `run_grpo`
    rollouts.py    the prompt stream; sampling, rewards and advantages of a step (`collect`); evaluation
    config.py      `GRPOConfig` and `GRPOLossConfig`
    build.py       everything a run loads and checks before it writes anything

`run_grpo`, `GRPOConfig` and `GRPOLossConfig` (and the loss helpers tests use) are importable from here.
"""

from postrl.core import overlong_penalty as overlong_penalty  # re-exported: its name before postrl.core
from postrl.lm.grpo.algorithm import MU_ONE_NOTE as MU_ONE_NOTE
from postrl.lm.grpo.algorithm import backward_grpo_minibatch as backward_grpo_minibatch
from postrl.lm.grpo.algorithm import optimise_grpo as optimise_grpo
from postrl.lm.grpo.algorithm import policy_log_probs as policy_log_probs
from postrl.lm.grpo.algorithm import run_grpo as run_grpo
from postrl.lm.grpo.config import GRPOConfig as GRPOConfig
from postrl.lm.grpo.config import GRPOLossConfig as GRPOLossConfig
