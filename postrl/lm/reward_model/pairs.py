"""Preference pairs for the reward model (`postrl.lm.reward_model`): the rows, their tokens and batches, the
score of each response, and the two Bradley–Terry losses.

r(x, y) is the scalar head on the final hidden state of the LAST REAL token of prompt + response (the EOS
that ends the response; never a pad after it), found from the attention mask, so padding on either side
and pad = EOS tokenizers are safe.

Loss: ``soft`` is the cross-entropy of σ(r_1 − r_2) against the label p (1 chosen preferred, 0.5 a tie;
Christiano et al. 2017); ``pairwise`` is −log σ(r_w − r_l − m) with the optional ``margin`` column m
(Ouyang et al. 2022; Touvron et al. 2023), ties dropped. ``auto`` picks pairwise when the data has
margins, else soft.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from postrl.core import pairwise_loss, preference_loss
from postrl.lm.data import (
    apply_length_limit,
    collate_preferences,
    encode_completions,
    load_train_heldout,
    render_rows,
    tokenize_prompts,
)
from postrl.lm.tasks import get_task
from postrl.runtime.errors import UserError

log = logging.getLogger(__name__)


# ---- data ----------------------------------------------------------------------------------------------
def load_pair_rows(
    data: str, eval_data: str | None, task_options: dict[str, Any], empty: str, tokenizer: Any
) -> tuple[list[dict], list[dict], Any]:
    """(train rows, held-out rows, the built-in task or None) as plain-text preference rows."""
    task = get_task(data[len("task:") :], **task_options) if data.startswith("task:") else None
    rows, heldout = load_train_heldout(data, "prefs", eval_data, task_options, empty=empty)
    return render_rows(rows, "prefs", tokenizer), render_rows(heldout, "prefs", tokenizer), task


def tokenize_pairs(
    rows: Sequence[dict[str, Any]], tokenizer: Any, max_length: int, overlong: str = "drop"
) -> list[dict[str, Any]]:
    """``{"prompt_ids", "chosen_ids", "rejected_ids", "target", "margin"}`` per kept row (responses end with
    EOS). Pairs whose prompt + longer response exceeds ``max_length`` are dropped, have their responses'
    ends cut ("truncate"; prompts that fill the limit are dropped) or refused, and reported."""
    kept, prompt_ids = tokenize_prompts(rows, tokenizer, max_length, overlong)
    chosen = encode_completions(tokenizer, [r["chosen"] for r in kept])
    rejected = encode_completions(tokenizer, [r["rejected"] for r in kept])
    longest = [p + max(c, r, key=len) for p, c, r in zip(prompt_ids, chosen, rejected, strict=True)]
    _, keep = apply_length_limit(longest, max_length, overlong, what="preference pairs")
    out = []
    for i in keep:
        room = max_length - len(prompt_ids[i])
        if room <= 0:
            continue
        margin = kept[i].get("margin")  # a finite number: checked when the rows were read (validate_record)
        out.append(
            {
                "prompt_ids": prompt_ids[i],
                "chosen_ids": chosen[i][:room],
                "rejected_ids": rejected[i][:room],
                "target": float(kept[i].get("target", 1.0)),
                "margin": None if margin is None else float(margin),
                "row": kept[i],
            }
        )
    return out


def collate_pairs(examples: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """2b rows (chosen 0..b−1, rejected b..2b−1) in the rollout layout, plus ``target`` and ``margin`` [b]."""
    batch = collate_preferences(examples, pad_id)
    if examples and examples[0]["margin"] is not None:
        batch["margin"] = torch.tensor([e["margin"] for e in examples], dtype=torch.float32)
    return batch


def gold_pairs(task: Any, examples: Sequence[dict[str, Any]]) -> list[tuple[float, float]] | None:
    """(g_chosen, g_rejected) per pair: a built-in task's hidden gold reward of both responses (None
    without a task)."""
    if task is None:
        return None
    prompts = [e["row"]["prompt"] for e in examples]
    g_c = task.gold_reward(prompts, [e["row"]["chosen"] for e in examples])
    g_r = task.gold_reward(prompts, [e["row"]["rejected"] for e in examples])
    return list(zip(g_c, g_r, strict=True))


# ---- the loss ------------------------------------------------------------------------------------------
def _soft(chosen: torch.Tensor, rejected: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return preference_loss(chosen, rejected, batch["target"])


def _pairwise(chosen: torch.Tensor, rejected: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return pairwise_loss(chosen, rejected, batch.get("margin"))


LOSSES: dict[str, Callable[..., torch.Tensor]] = {"soft": _soft, "pairwise": _pairwise}


def choose_loss(name: str, examples: Sequence[dict[str, Any]]) -> str:
    """Resolve ``auto`` and check that the data fits the loss."""
    has_margin = [e["margin"] is not None for e in examples]
    if any(has_margin) and not all(has_margin):
        raise UserError("some preference rows have a 'margin' and some do not; give it on every row or none")
    if name == "auto":
        name = "pairwise" if any(has_margin) else "soft"
    if name not in LOSSES:
        raise UserError(f"unknown reward-model loss {name!r}; expected auto, soft or pairwise")
    if name == "soft" and any(has_margin):
        raise UserError("loss 'soft' takes no margin; use loss=pairwise (or auto) for rows with 'margin'")
    return name


def drop_ties(examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pairs with target 1 only (the pairwise loss has no tie); reports how many were dropped."""
    kept = [e for e in examples if e["target"] == 1.0]
    if len(kept) < len(examples):
        log.warning(
            "pairwise loss: dropped %d of %d pairs with target != 1", len(examples) - len(kept), len(examples)
        )
    return kept


def pair_scores(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(r_chosen [b], r_rejected [b]): each row's score at its last real token (mask-based, pad-safe)."""
    # deferred: models imports transformers (seconds), and `postrl rm --help` imports this module
    from postrl.lm.models import gather_last

    values = model(batch["input_ids"], batch["attention_mask"])  # (2b, L)
    scores = gather_last(values, batch["attention_mask"])  # (2b,)
    b = scores.shape[0] // 2
    return scores[:b], scores[b:]


def rm_loss(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], loss: str
) -> tuple[torch.Tensor, dict[str, float]]:
    """Batch → (loss, metrics): the preference loss (a mean over the batch's pairs) and the accuracy on its
    non-tie pairs."""
    chosen, rejected = pair_scores(model, batch)
    value = LOSSES[loss](chosen, rejected, batch)
    decided = batch["target"] != 0.5
    correct = ((chosen > rejected) == (batch["target"] > 0.5))[decided]
    return value, {"accuracy": float(correct.float().mean()) if correct.numel() else float("nan")}
