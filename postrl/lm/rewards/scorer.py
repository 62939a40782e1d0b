"""A trained reward model (``rm:PATH``) as a reward function."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from postrl.lm.data import encode_completions, encode_prompts, join_prompt_response, render_rows
from postrl.lm.tasks.base import completion_text


class RewardModelScorer:
    """A trained reward model as a reward function: the score of prompt + completion + EOS at its last token.

    The layout is the reward model's training layout (`postrl.lm.data.collate_preferences`): the prompt as
    `encode_prompts` makes it (chat template for conversational prompts), the completion's tokens, then EOS.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, batch_size: int = 64) -> None:
        self.model, self.tokenizer, self.batch_size = model.eval(), tokenizer, batch_size

    @torch.no_grad()
    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        rows = render_rows([{"prompt": p} for p in prompts], "prompts", self.tokenizer)
        prompt_ids = encode_prompts(self.tokenizer, [r["prompt"] for r in rows])
        # re-encoded from the text (not kwargs["completion_ids"]): the RM may have another tokenizer
        completion_ids = encode_completions(self.tokenizer, [completion_text(c) for c in completions])
        device = next(self.model.parameters()).device
        scores: list[float] = []
        for i in range(0, len(prompt_ids), self.batch_size):
            batch = join_prompt_response(
                prompt_ids[i : i + self.batch_size],
                completion_ids[i : i + self.batch_size],
                self.tokenizer.pad_token_id,
            )
            ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
            scores += self.model.score(ids, mask).float().tolist()  # (b,)
        return scores
