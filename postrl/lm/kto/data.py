"""The examples of a `postrl kto` run: unpaired rows, their tokens, the mismatched pairs of the KL reference
point, and batches in the rollout layout.

Rows are TRL's unpaired preference format, ``{"prompt", "completion", "label"}`` (label true: desirable); a
preference file or a built-in preference task is unpaired as TRL's ``unpair_preference_dataset`` does
(`postrl.lm.data.unpair`: every chosen answer a desirable row, every rejected one an undesirable row).

The KL reference point z0 of a step is estimated on mismatched pairs (x_i, y_j), as TRL's KTOTrainer builds them:
the rows are cut into consecutive chunks of ``train.batch_size`` and each row's mismatched completion is the
previous row's in its chunk (the last row's for the first). Unpaired rows put every chosen answer before every
rejected one, so the neighbour is another prompt's answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from postrl.lm.data import (
    DataError,
    apply_length_limit,
    encode_completions,
    join_prompt_response,
    load_rows,
    render_rows,
    tokenize_prompts,
)
from postrl.lm.tasks import get_task


def load_kto_rows(source: str, split: str, task: dict[str, Any], empty: str) -> list[dict[str, Any]]:
    """Validated unpaired rows of ``source`` (a file, ``task:NAME`` or a `datasets` name): TRL's unpaired format,
    or preference pairs unpaired (`postrl.lm.data.unpair`)."""
    return load_rows(source, "kto", split, task_kwargs=task, empty=empty)


def load_train_heldout_kto(
    data: str, eval_data: str | None, task_options: dict[str, Any], empty: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Any]:
    """(train rows, held-out rows, the built-in task or None); held-out as every stage: ``eval_data``, a task's
    test split, else the last 5% of the rows."""
    task = get_task(data[len("task:") :], **task_options) if data.startswith("task:") else None
    rows = load_kto_rows(data, "train", task_options, empty)
    if eval_data is not None:
        return rows, load_kto_rows(eval_data, "test", task_options, empty), task
    if task is not None:
        return rows, load_kto_rows(data, "test", task_options, empty), task
    cut = max(1, len(rows) // 20)
    return rows[:-cut], rows[-cut:], task


def tokenize(
    rows: Sequence[dict[str, Any]], tokenizer: Any, max_length: int, overlong: str, chunk: int
) -> list[dict[str, Any]]:
    """``{"prompt_ids", "completion_ids", "kl_completion_ids", "label", "row"}`` per kept row (completions end
    with EOS). Rows longer than ``max_length`` are dropped, cut at the completion's end ("truncate") or refused.
    The mismatched completion is the previous kept row's in each chunk of ``chunk`` rows, cut to fit."""
    rendered = render_rows(rows, "sft", tokenizer)
    kept, prompt_ids = tokenize_prompts(rendered, tokenizer, max_length, overlong)
    completions = encode_completions(tokenizer, [r["completion"] for r in kept])
    full = [p + c for p, c in zip(prompt_ids, completions, strict=True)]
    _, keep = apply_length_limit(full, max_length, overlong, what="KTO rows")
    keep = [
        i for i in keep if len(prompt_ids[i]) < max_length
    ]  # a prompt that fills the limit leaves no room
    out = []
    for i in keep:
        room = max_length - len(prompt_ids[i])
        out.append(
            {
                "prompt_ids": prompt_ids[i],
                "completion_ids": completions[i][:room],
                "label": bool(kept[i]["label"]),
                "row": kept[i],
            }
        )
    for start in range(0, len(out), chunk):
        part = out[start : start + chunk]
        for k, e in enumerate(part):
            room = max_length - len(e["prompt_ids"])
            e["kl_completion_ids"] = part[k - 1]["completion_ids"][:room]
    return out


def check_labels(examples: Sequence[dict[str, Any]], what: str) -> None:
    """KTO needs both kinds in the training rows: with one kind the loss has no counterweight."""
    kinds = {e["label"] for e in examples}
    if kinds != {True, False}:
        only = "desirable" if True in kinds else "undesirable"
        raise DataError(f"{what}: every row is {only}; KTO needs desirable (label true) and undesirable rows")


def collate_kto_rows(
    examples: Sequence[dict[str, Any]], pad_id: int, mismatched: bool = False
) -> dict[str, torch.Tensor]:
    """b rows in the rollout layout (`join_prompt_response`): each prompt with its completion, or with its
    mismatched completion (``mismatched``), plus ``desirable`` [b] bool."""
    key = "kl_completion_ids" if mismatched else "completion_ids"
    batch = join_prompt_response([e["prompt_ids"] for e in examples], [e[key] for e in examples], pad_id)
    batch["desirable"] = torch.tensor([e["label"] for e in examples], dtype=torch.bool)
    return batch
