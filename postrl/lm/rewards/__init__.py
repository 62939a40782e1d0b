"""Reward functions for the RL trainers (GRPO, PPO-RLHF): loading them from specs, calling them the way TRL's
`GRPOTrainer` does, and checking what they return.

A reward function follows TRL's contract: it is called with keyword arguments only,

    fn(prompts=..., completions=..., completion_ids=..., trainer_state=..., **columns) -> list[float | None]

``prompts`` as the data holds them (strings, or message lists for conversational data); ``completions`` the
decoded completions, as strings, or for conversational prompts as one-message lists
``[{"role": "assistant", "content": text}]``; ``completion_ids`` the token ids of each completion; every other
column of the sample's dataset row by its name (e.g. ``answer``, ``ground_truth``), as lists aligned with the
completions. The easiest signature that takes all of it is TRL's ``def fn(completions, **kwargs)``. ``None``
means "this function has no reward for this sample" (e.g. a math reward on a coding prompt): the sample's
reward is the weighted sum of the other functions' values. An ``async def`` function is awaited; several run
concurrently. Three kinds of spec name a function:

    task:NAME              the built-in task's reward (`postrl.lm.tasks`), e.g. ``task:arithmetic`` (a verifier)
    module:function        any importable function (``my_pkg.rewards:length_penalty``), or a file
                           (``path/to/rewards.py:fn``); looked up by attribute name, never ``eval``-ed
    rm:PATH                a trained reward model (a `ScalarHeadModel` folder written by ``postrl rm``),
                           scoring prompt + completion + EOS at the last real token, as it was trained

Several functions combine as a weighted sum. Whatever a function returns is checked before it is used: an
exception, a wrong length, a value that is neither a number nor None, NaN or inf stops the run with a
`RewardError`, one line, that names the function (its spec and file:function), the step and the offending
prompt and completion.

    contract.py   the call's keywords, `RewardFunction`, `TrainerState`, `RewardError`, `check_signature`
    loading.py    specs → `RewardFunction`s (`load_reward_fn`, `load_reward_fns`)
    scorer.py     `RewardModelScorer`: a trained reward model as a reward function
    calling.py    `reward_terms`, `combine`, `compute_rewards`: calling the functions, checking their values;
                  `columns_of`: the data rows' other columns, as the functions get them
"""

from postrl.lm.rewards.calling import Phase as Phase
from postrl.lm.rewards.calling import columns_of as columns_of
from postrl.lm.rewards.calling import combine as combine
from postrl.lm.rewards.calling import completion_ids_of as completion_ids_of
from postrl.lm.rewards.calling import compute_rewards as compute_rewards
from postrl.lm.rewards.calling import is_conversational as is_conversational
from postrl.lm.rewards.calling import reward_kwargs as reward_kwargs
from postrl.lm.rewards.calling import reward_terms as reward_terms
from postrl.lm.rewards.calling import unscored as unscored
from postrl.lm.rewards.contract import CALL_KEYWORDS as CALL_KEYWORDS
from postrl.lm.rewards.contract import RewardCallable as RewardCallable
from postrl.lm.rewards.contract import RewardError as RewardError
from postrl.lm.rewards.contract import RewardFunction as RewardFunction
from postrl.lm.rewards.contract import TrainerState as TrainerState
from postrl.lm.rewards.contract import check_signature as check_signature
from postrl.lm.rewards.loading import load_reward_fn as load_reward_fn
from postrl.lm.rewards.loading import load_reward_fns as load_reward_fns
from postrl.lm.rewards.scorer import RewardModelScorer as RewardModelScorer
