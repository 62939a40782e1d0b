"""The prompts of `postrl online-dpo`: train and held-out, rendered (chat template where conversational),
those that leave no room for a response within ``train.max_length`` dropped."""

from __future__ import annotations

import logging
from typing import Any

from postrl.lm.data import DataError, load_train_heldout, render_rows, tokenize_prompts
from postrl.lm.evaluation import PromptSet
from postrl.lm.tasks import get_task

log = logging.getLogger(__name__)


def load_prompts(cfg: Any, tokenizer: Any) -> tuple[PromptSet, PromptSet, Any]:
    """(train prompts, held-out prompts, the built-in task or None); the recipe checked that the limit
    leaves room for a prompt."""
    limit = cfg.train.max_length - cfg.sampling.max_new_tokens
    what = (
        f"train.max_length ({cfg.train.max_length}) - sampling.max_new_tokens ({cfg.sampling.max_new_tokens})"
    )
    rows, heldout = load_train_heldout(cfg.data, "prompts", cfg.eval_data, cfg.task, empty=cfg.empty_rows)
    sets = []
    for part in (rows, heldout):
        kept, _ = tokenize_prompts(render_rows(part, "prompts", tokenizer), tokenizer, limit)
        if len(kept) < len(part):
            log.warning(
                "online-dpo: %d of %d prompts are longer than %s", len(part) - len(kept), len(part), what
            )
        sets.append(PromptSet(kept))
    if not sets[0].rows:
        raise DataError(f"{cfg.data}: no prompt fits {what}")
    task = get_task(cfg.data[len("task:") :], **cfg.task) if cfg.data.startswith("task:") else None
    return sets[0], sets[1], task
