"""The table of bad inputs for `tests/test_bad_input.py`, and the workspace they point into.

- `case`: the `Case` type, each command's valid tiny command line (`FLAGS`) and budget (`BUDGETS`);
- one module of cases per command family: `control_cases`, `supervised_cases` (pretrain, sft),
  `preference_cases` (rm, dpo, kto), `rl_cases` (ppo, grpo), `demo_cases`;
- `inputs`: the data, reward and config files the cases point at (`write_inputs`);
- `workspace`: the tiny models and the run folders ``--out`` points at (`build_workspace`).

Issue #41's classes and where each is covered (ids of this table unless a file is named):
1. on_iteration: tests/test_bad_input_api.py (sft-on-iteration-*, control on-iteration-*), and
   tests/lm/test_resume_safety.py (every step called, a finished run with overwrite=True, a callback that raises);
2. a refused resume changes nothing: *-resume-damaged-finished-run (control train, sft, grpo, dpo, kto);
3. changed inputs on resume: sft/dpo/kto-resume-data-changed, dpo-resume-inputs-json-damaged,
   tests/test_bad_input_api.py::test_a_resume_after_the_data_file_changed..., tests/lm/test_resume_safety.py (DPO);
4. DPO data: dpo/rm-data-same-answer, dpo/rm/kto-data-mixed-formats, dpo-data-text-prompt-chat-answers;
5. VLM data: sft-vlm-two-placeholders-one-picture, sft-vlm-picture-over-pillows-limit, *-images-text-model;
6. errors with a location: sft-data-chat-template-refuses, dpo/kto-data-no-chat-template,
   grpo-data-chat-no-template; reward functions at run time: tests/test_bad_input_rewards.py and
   tests/lm/test_reward_errors.py;
7. control predict: tests/control/test_api.py, tests/test_bad_input_api.py (an agent of control.load);
8. a pickled pytorch_model.bin: sft/grpo/kto-model-pickled-bin;
9. code a run folder names: grpo-resume-reward-code-not-named, sft/kto-resume-trust-remote-code,
   ct-resume-env-entry-point, tests/lm/test_resume_safety.py;
12. LoRA adapter folders as --model: sft-lora-adapter-base-gone, sft-lora-adapter-weights-misfit,
   grpo-lora-adapter-base-gone (a good one, on MoE models too, loads: tests/lm/test_lora_moe.py);
13. reward models: ppo-reward-model-three-labels (a TRL-style one-label classifier is good input:
   tests/lm/test_reward_export.py runs PPO with it as reward model and critic);
14. lengths: sft-row-over-context, dpo-pair-over-context, ppo-max-new-tokens-over-context,
   grpo-prompt-plus-new-tokens-over-context (the defaults on a small model run: tests/lm/test_context_defaults.py);
15. pictures the processor cannot take: sft-vlm-not-a-picture, sft-vlm-picture-cut-short, sft-vlm-picture-missing.
Items 10, 11 and 16 are no bad input (evaluation's trainer state, README seeds, a test tolerance).
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
