"""Checks across the rows of one source, once each record is valid on its own (`sources.validate_record`).

    one format   a file's rows are all TRL's standard (text) format or all conversational (messages): mixed, the
                 prompts would reach the model rendered two ways (raw text, and through the chat template);
                 within a preference row, prompt, chosen and rejected are likewise all text or all messages
    distinct     a preference pair whose two answers are the same text carries no preference: its loss term
                 is a constant (DPO's and the reward model's: log 2) with zero gradient, so such a row is
                 refused, even one among many, naming its file:line and the count (TRL trains on it silently)
    not blank    rows with an empty or whitespace-only prompt or answer are refused (the first named, all
                 counted) or dropped with a warning that counts them (``empty="skip"``)

Every refusal is a `DataError` naming the row's location (file:line, row or index) and the field.
"""

from __future__ import annotations

import logging
from typing import Any

from postrl.runtime.errors import DataError

log = logging.getLogger(__name__)

EMPTY_POLICIES = ("error", "skip")
TEXT_FIELDS = {
    "sft": ("prompt", "completion"),
    "prefs": ("prompt", "chosen", "rejected"),
    "prompts": ("prompt",),
    "kto": ("prompt", "completion"),
}
"""The text fields of each kind of row (a prompt, then its answers)."""

Located = list[tuple[str, dict[str, Any]]]
"""(location, record) pairs: the location is file:line, a Parquet row or an index of rows in memory."""


def _is_lm_row(record: dict[str, Any], kind: str, column: str) -> bool:
    return kind == "sft" and column in record and "prompt" not in record


# ---- one format ------------------------------------------------------------------------------------------
def _format(value: Any) -> str:
    return "conversational (a list of messages)" if isinstance(value, list) else "text"


def row_format(record: dict[str, Any], kind: str) -> tuple[str, str]:
    """(the field that decides, its format) of a valid record: its prompt's, else its ``messages`` (SFT,
    conversational) or ``text`` (SFT, text)."""
    if _is_lm_row(record, kind, "messages"):
        return "messages", _format(record["messages"])
    if _is_lm_row(record, kind, "text"):
        return "text", _format(record["text"])
    return "prompt", _format(record["prompt"])


def check_one_format(records: Located, kind: str) -> None:
    """Refuse a source whose rows mix the standard and the conversational format (and, in a preference
    row, a text prompt with message answers or the reverse); the first row that differs is named. Run on
    the rows kept after `drop_blank` (a blank row is refused or skipped for that), preference rows with
    their prompt explicit (`sources.explicit_prompt`)."""
    if kind == "prefs":
        for where, record in records:
            _check_pair_format(record, where)
    if not records:
        return
    first_where, first = records[0]
    _, expected = row_format(first, kind)
    for where, record in records[1:]:
        field, found = row_format(record, kind)
        if found != expected:
            raise DataError(
                f"{where}: field '{field}': {found}, but the first row ({first_where}) is {expected}; the rows "
                "of one source are all text or all conversational (mixed, prompts would be rendered two "
                "ways): convert them, or split the file"
            )


def _check_pair_format(record: dict[str, Any], where: str) -> None:
    expected = _format(record["prompt"])
    for field in ("chosen", "rejected"):
        if _format(record[field]) != expected:
            raise DataError(
                f"{where}: field '{field}': {_format(record[field])}, but 'prompt' is {expected}; a preference "
                "row is all text or all messages (TRL's standard or conversational format)"
            )


# ---- distinct answers ----------------------------------------------------------------------------------
def _trained_text(value: str | list[dict[str, str]]) -> str:
    """The text an answer trains on: itself, or its last message's content (`tokens.render_rows`)."""
    return value if isinstance(value, str) else value[-1]["content"]


def _same_answer(record: dict[str, Any]) -> bool:
    """Whether a preference row's two answers are one text (blank answers are `drop_blank`'s to judge)."""
    chosen, rejected = record["chosen"], record["rejected"]
    if "prompt" not in record:  # an implicit prompt: the two whole texts (or conversations) are one
        return chosen == rejected and not _is_blank(chosen, last_only=False)
    text = _trained_text(chosen)
    return text == _trained_text(rejected) and bool(text.strip())


def check_distinct_answers(records: Located) -> None:
    """Refuse preference rows whose chosen and rejected answers train on the same text: log π(y_w|x) −
    log π(y_l|x) is then 0 whatever the weights, so the pair's loss has no gradient. The first is named."""
    same = [where for where, record in records if _same_answer(record)]
    if same:
        raise DataError(
            f"{same[0]}: fields 'chosen' and 'rejected' are the same answer ({len(same)} of {len(records)} "
            "preference rows): such a pair states no preference, and its loss term is a constant (log 2) with "
            "zero gradient; fix or remove them"
        )


# ---- not blank -----------------------------------------------------------------------------------------
def _is_blank(value: str | list[dict[str, str]], last_only: bool) -> bool:
    """An empty or whitespace-only text; for messages, the last one's content (an answer) or all of them."""
    if isinstance(value, str):
        return not value.strip()
    contents = [value[-1]["content"]] if last_only else [m["content"] for m in value]
    return not any(c.strip() for c in contents)


def _blank_fields(record: dict[str, Any], kind: str) -> list[str]:
    """The text fields of a validated record of ``kind`` that are empty or whitespace-only."""
    if _is_lm_row(record, kind, "messages"):
        return ["messages[-1].content"] if _is_blank(record["messages"], last_only=True) else []
    if _is_lm_row(record, kind, "text"):
        return ["text"] if _is_blank(record["text"], last_only=True) else []
    return [f for f in TEXT_FIELDS[kind] if _is_blank(record[f], last_only=f != "prompt")]


def drop_blank(records: Located, kind: str, empty: str) -> Located:
    """Records without an empty text field; the others are refused ("error") or dropped and counted."""
    if empty not in EMPTY_POLICIES:
        raise DataError(f"empty must be one of {EMPTY_POLICIES}; got {empty!r}")
    blank = {where: fields for where, record in records if (fields := _blank_fields(record, kind))}
    if not blank:
        return records
    where, fields = next(iter(blank.items()))
    count = f"{len(blank)} of {len(records)} {kind} rows have an empty or whitespace-only text field"
    if empty == "error":
        lm_hint = "; a row without a prompt is a {'text': ...} row" if fields[0] == "prompt" else ""
        raise DataError(
            f"{where}: field '{fields[0]}': empty or whitespace-only ({count}); fix or remove them, "
            f"or skip them with empty_rows=skip{lm_hint}"
        )
    log.warning("%s (e.g. %s: field '%s'); skipped", count, where, fields[0])
    return [(where, record) for where, record in records if where not in blank]
