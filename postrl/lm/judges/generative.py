"""`GenerativeJudge`: a causal LM answers the pairwise prompt (`postrl.lm.judges.prompt`) through the
log-probabilities of its two answers " A" and " B" as the next tokens (teacher-forced; an answer of several
tokens is their summed log-probability), renormalised over the two, with both orders of each pair averaged
(`debiased_probability`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from postrl.lm.data import encode, encode_prompts, join_prompt_response
from postrl.lm.judges.base import debiased_probability, pairwise_probability
from postrl.lm.judges.prompt import ANSWERS, JudgePrompt
from postrl.lm.rollout import response_forward, response_log_probs


class GenerativeJudge:
    """A causal LM as a pairwise judge. For each pair it reads four sequences — (first as A, second as B) and
    (second as A, first as B), each followed by " A" and by " B" — in batches of ``batch_size`` pairs."""

    def __init__(
        self, model: torch.nn.Module, tokenizer: Any, prompt: JudgePrompt | None = None, batch_size: int = 32
    ) -> None:
        self.model, self.tokenizer = model.eval(), tokenizer
        self.prompt, self.batch_size = prompt or JudgePrompt(), batch_size
        self.answer_ids = encode(tokenizer, list(ANSWERS))
        self.forward = response_forward(model, gradients=False)

    @classmethod
    def from_folder(
        cls, path: str, prompt: JudgePrompt | None = None, device: Any = "cpu", batch_size: int = 32
    ) -> GenerativeJudge:
        """The judge of a causal LM folder (a Hugging Face model and its tokenizer)."""
        from postrl.lm.models import load_causal_lm  # deferred: transformers
        from postrl.lm.tokenizer import load_tokenizer

        model = load_causal_lm(path, device=device, what="judge model")
        return cls(model, load_tokenizer(path, what="judge model's tokenizer"), prompt, batch_size)

    @torch.no_grad()
    def answer_log_probs(self, texts: Sequence[str]) -> torch.Tensor:
        """``[N, 2]``: log p(" A" | text) and log p(" B" | text) for each judge prompt ``texts[i]``."""
        prompts = encode_prompts(self.tokenizer, list(texts))
        rows = [p for p in prompts for _ in ANSWERS]  # (2N,): each prompt then " A", " B"
        answers = [a for _ in prompts for a in self.answer_ids]
        batch = join_prompt_response(rows, answers, self.tokenizer.pad_token_id)
        device = next(self.model.parameters()).device
        ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
        P = ids.shape[1] - batch["response_mask"].shape[1]
        logps = response_log_probs(self.forward, ids, mask, P).sum(-1)  # (2N,)
        return logps.double().cpu().view(-1, len(ANSWERS))

    def __call__(self, prompts: Sequence[Any], first: Sequence[str], second: Sequence[str]) -> list[float]:
        out: list[float] = []
        for i in range(0, len(prompts), self.batch_size):
            part = range(i, min(i + self.batch_size, len(prompts)))
            texts = [self.prompt.render(prompts[j], first[j], second[j]) for j in part]
            texts += [self.prompt.render(prompts[j], second[j], first[j]) for j in part]
            logps = self.answer_log_probs(texts).tolist()  # (2b, 2): first as A, then second as A
            b = len(part)
            for k in range(b):
                p_first_as_a = pairwise_probability(*logps[k])
                p_second_as_a = pairwise_probability(*logps[b + k])
                out.append(debiased_probability(p_first_as_a, p_second_as_a))
        return out
