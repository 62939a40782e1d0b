"""The table of bad inputs for `tests/test_bad_input.py`, and the workspace they point into.

- `case`: the `Case` type, each command's valid tiny command line (`FLAGS`) and budget (`BUDGETS`);
- one module of cases per command family: `control_cases`, `supervised_cases` (pretrain, sft),
  `preference_cases` (rm, dpo, kto), `rl_cases` (ppo, grpo), `demo_cases`;
- `inputs`: the data, reward and config files the cases point at (`write_inputs`);
- `workspace`: the tiny models and the run folders ``--out`` points at (`build_workspace`).
"""

from __future__ import annotations

from tests.bad_input import control_cases, demo_cases, preference_cases, rl_cases, supervised_cases
from tests.bad_input.case import BUDGETS, COMMANDS, FINISHED, FLAGS, C, Case
from tests.bad_input.inputs import write_inputs

CASES: list[Case] = [
    *control_cases.CASES,
    *supervised_cases.CASES,
    *preference_cases.CASES,
    *rl_cases.CASES,
    *demo_cases.CASES,
    # a valid command pointed at a finished run, without --resume or --overwrite
    *[C(f"{cmd.replace(' ', '-')}-finished-run", cmd, *FINISHED, overwrite=False) for cmd in COMMANDS],
]

# end to end through a real process as well: exit status 2 and no traceback
SUBPROCESS_CASES = ("ct-unknown-env", "sft-hub-name-offline", "grpo-reward-wrong-signature")

__all__ = ["BUDGETS", "CASES", "COMMANDS", "FLAGS", "SUBPROCESS_CASES", "Case", "write_inputs"]
