"""`load_judge`: a judge from its spec (``rm:PATH``, ``lm:PATH``, ``openai:URL``, a reward-function spec). Apart
from `base` so that the judges' modules import the pairwise math without importing each other back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from postrl.lm.judges.base import SPEC_KINDS, Judge
from postrl.runtime.errors import UserError


def load_judge(
    spec: str,
    *,
    device: Any = "cpu",
    constitution: Sequence[str] | None = None,
    model: str | None = None,
    hard: bool = False,
    batch_size: int = 32,
) -> Judge:
    """A judge from its spec: ``rm:PATH`` (a `postrl rm` folder), ``lm:PATH`` (a causal LM folder, generative),
    ``openai:URL`` (an OpenAI-compatible endpoint serving ``model``), or any reward-function spec
    (``task:NAME``, ``module:function``: `postrl.lm.rewards`) compared pairwise. ``constitution``: the
    generative judges' principles (default `DEFAULT_CONSTITUTION`); ``hard``: reward judges answer 1/0/0.5."""
    from postrl.lm.judges.prompt import DEFAULT_CONSTITUTION, JudgePrompt

    prompt = JudgePrompt(tuple(constitution) if constitution is not None else DEFAULT_CONSTITUTION)
    if spec.startswith("lm:"):
        from postrl.lm.judges.generative import GenerativeJudge

        return GenerativeJudge.from_folder(spec[3:], prompt, device=device, batch_size=batch_size)
    if spec.startswith("openai:"):
        from postrl.lm.judges.endpoint import EndpointJudge

        return EndpointJudge(spec[len("openai:") :], model=model, prompt=prompt)
    if ":" not in spec:
        raise UserError(f"judge spec {spec!r}: expected one of {', '.join(SPEC_KINDS)}")
    from postrl.lm.judges.reward import RewardJudge
    from postrl.lm.rewards import load_reward_fn

    return RewardJudge(load_reward_fn(spec, device=device).fn, name=spec, hard=hard)
