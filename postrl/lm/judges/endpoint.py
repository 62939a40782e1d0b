"""`EndpointJudge`: an OpenAI-compatible chat endpoint (vLLM, `transformers serve`, a hosted API) as a pairwise
judge, through the `openai` client (``pip install 'postrl[judge]'``).

Each pair is asked twice, with the two responses in both orders: the constitution as the system message, the
pair (`JudgePrompt.question`) and "Answer A or B." as the user message, one short greedy answer with its
top log-probabilities. At the first answer token whose alternatives include "A" or "B" (a model whose
tokenizer writes " A" as a space then "A" answers it second), p(A) = σ(log p("A") − log p("B")), the
log-probabilities of every alternative that reads "A" (or "B") once stripped summed as probabilities; an
answer missing from the top list counts as the least likely listed one (an upper bound on its
probability). When neither appears, the answer's text decides: "A" → 1, "B" → 0, anything else 0.5. The two
orders are averaged (`debiased_probability`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from postrl.lm.judges.base import debiased_probability, pairwise_probability
from postrl.lm.judges.prompt import JudgePrompt
from postrl.runtime.errors import UserError

TOP_LOGPROBS = 20
"""Alternatives asked per answer token (the OpenAI API's maximum)."""


def _client(base_url: str, api_key: str | None, timeout: float) -> Any:
    try:
        import openai
    except ImportError:
        raise UserError("the openai: judge needs the openai client: pip install 'postrl[judge]'") from None
    return openai.OpenAI(base_url=base_url, api_key=api_key or "postrl", timeout=timeout, max_retries=0)


def answer_probability(tokens: Sequence[Any], text: str) -> float:
    """p(A) from one answer: ``tokens`` the returned per-token log-probabilities (each with ``top_logprobs``,
    a list of objects with ``token`` and ``logprob``) and ``text`` the answer (see the module's docstring)."""
    for position in tokens:
        top = list(getattr(position, "top_logprobs", None) or [])
        mass = {"A": 0.0, "B": 0.0}
        for alt in top:
            key = alt.token.strip()
            if key in mass:
                mass[key] += math.exp(alt.logprob)
        if mass["A"] or mass["B"]:
            floor = math.exp(min(alt.logprob for alt in top))
            a, b = (mass[k] or floor for k in ("A", "B"))
            return pairwise_probability(math.log(a), math.log(b))
    word = text.strip()[:1]
    return 1.0 if word == "A" else 0.0 if word == "B" else 0.5


class EndpointJudge:
    """A chat model behind ``base_url`` (e.g. ``http://127.0.0.1:8000/v1``) as a judge; ``model``: the name
    the endpoint serves (default: the first of its ``/models`` list)."""

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        prompt: JudgePrompt | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
    ) -> None:
        self.base_url, self.prompt = base_url, prompt or JudgePrompt()
        self.client = _client(base_url, api_key, timeout)
        self.model = model or self._first_model()

    def _call(self, what: str, fn: Any) -> Any:
        import openai

        try:
            return fn()
        except openai.APIConnectionError as err:
            raise UserError(
                f"judge endpoint {self.base_url} cannot be reached ({err.__cause__ or err}); is the server "
                "running?"
            ) from None
        except openai.APIStatusError as err:
            raise UserError(
                f"judge endpoint {self.base_url}: {what} failed with HTTP {err.status_code}: {err.message}"
            ) from None

    def _first_model(self) -> str:
        models = self._call("GET /models", lambda: self.client.models.list()).data
        if not models:
            raise UserError(f"judge endpoint {self.base_url} serves no model")
        return models[0].id

    def probability_a(self, prompt: Any, a: str, b: str) -> float:
        """p(A) of one ordered pair, from one chat completion."""
        messages = [
            {"role": "system", "content": self.prompt.principles()},
            {"role": "user", "content": self.prompt.question(prompt, a, b) + "\nAnswer A or B."},
        ]
        reply = self._call(
            "POST /chat/completions",
            lambda: self.client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=3, temperature=0.0, logprobs=True,
                top_logprobs=TOP_LOGPROBS,
            ),
        )  # fmt: skip
        choice = reply.choices[0]
        content = choice.logprobs.content if choice.logprobs is not None else None
        return answer_probability(content or [], choice.message.content or "")

    def __call__(self, prompts: Sequence[Any], first: Sequence[str], second: Sequence[str]) -> list[float]:
        return [
            debiased_probability(self.probability_a(p, x, y), self.probability_a(p, y, x))
            for p, x, y in zip(prompts, first, second, strict=True)
        ]
