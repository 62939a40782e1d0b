"""Judges (RLAIF): a model labels pairs of responses instead of a person, behind one interface.

A judge is called ``judge(prompts, first, second) -> list[float]``: for each pair, the probability that
``first`` is the better response to its prompt, in [0, 1] (0.5: neither). The labelling page, online DPO
and the ``postrl judge`` command take any object of that shape.

    base.py         `Judge` (the protocol), the pairwise math (`pairwise_probability`, `debiased_probability`,
                    `hard_label`), `preference_rows` (a judge's verdicts as TRL preference rows with a
                    ``target`` column), and, in loading.py, `load_judge` (``rm:PATH``, ``lm:PATH``, ``openai:URL``, a reward spec)
    reward.py       `RewardJudge`: any reward function in TRL's contract, a trained reward model included,
                    pairwise by comparing the two scores: σ(s₁ − s₂) or hard
    prompt.py       the judge's pairwise prompt with a constitution (a list of principles) and the answer
                    tokens " A"/" B"; `judge_sft_rows` (labelled comparisons in that format, to train a judge)
    generative.py   `GenerativeJudge`: a causal LM folder answering the prompt through log p(" A") and
                    log p(" B") as the next tokens, both orders averaged to remove position bias
    endpoint.py     `EndpointJudge`: an OpenAI-compatible chat endpoint (the `openai` client), through the
                    returned log-probabilities of "A"/"B", both orders averaged
"""

from postrl.lm.judges.base import Judge as Judge
from postrl.lm.judges.base import debiased_probability as debiased_probability
from postrl.lm.judges.base import hard_label as hard_label
from postrl.lm.judges.base import pairwise_probability as pairwise_probability
from postrl.lm.judges.base import preference_rows as preference_rows
from postrl.lm.judges.loading import load_judge as load_judge
from postrl.lm.judges.prompt import DEFAULT_CONSTITUTION as DEFAULT_CONSTITUTION
from postrl.lm.judges.prompt import JudgePrompt as JudgePrompt
from postrl.lm.judges.prompt import judge_sft_rows as judge_sft_rows
