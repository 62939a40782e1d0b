"""Data for the LM trainers: reading, validating, rendering chat, and tokenising.

Sources: a JSONL file (one object per line), a JSON list, a Parquet file (``pip install 'postrl[parquet]'``),
a built-in task (``task:arithmetic``) or a Hugging Face ``datasets`` name (optional extra). Rows use TRL's
columns; each kind accepts plain text or conversational messages (``[{"role", "content"}, ...]``):

    sft      {"prompt", "completion"} | {"messages"} (the last message, an assistant's, is the completion)
             | {"text"} (language modelling: every token is a target)
    prefs    {"prompt", "chosen", "rejected"} (+ optional "target" in [0, 1]; 1 = chosen preferred, 0.5 = tie)
    prompts  {"prompt"} (+ any columns, passed on to reward functions, e.g. "answer")

A bad record raises `DataError` naming the file, the line (row for Parquet) and the field. Rows whose
prompt or answer is empty or whitespace-only are refused (the first named, all counted) or skipped with a
warning that counts them. Prompts longer than a limit are counted and reported with an example row, then
dropped, truncated (from the left: the end of a prompt is next to the answer) or refused, as configured:
never silently.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from postrl.runtime.errors import UserError

log = logging.getLogger(__name__)

IGNORE_INDEX = -100
OVERLONG_POLICIES = ("drop", "truncate", "error")
EMPTY_POLICIES = ("error", "skip")
_TEXT_FIELDS = {
    "sft": ("prompt", "completion"),
    "prefs": ("prompt", "chosen", "rejected"),
    "prompts": ("prompt",),
}


class DataError(UserError, ValueError):
    """A data source or record is unusable; the message names the file, line and field."""


# ---- reading ---------------------------------------------------------------------------------------------
def _read_jsonl(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(location, record) for each non-blank line; malformed JSON, a non-object or bytes that are not
    UTF-8 raise `DataError` naming the line."""
    out = []
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{where}: not UTF-8 text (byte {err.start} of the line)") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: malformed JSON: {err.msg} (column {err.colno})") from None
            if not isinstance(record, dict):
                raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
            out.append((where, record))
    return out


def _item_lines(text: str) -> list[int]:
    """The line on which each item of a (valid) top-level JSON list starts."""
    decoder, skip = json.JSONDecoder(), re.compile(r"[ \t\n\r,]*")
    lines, line, seen = [], 1, 0
    position = skip.match(text, text.index("[") + 1).end()
    while position < len(text) and text[position] != "]":
        line, seen = line + text.count("\n", seen, position), position
        lines.append(line)
        position = skip.match(text, decoder.raw_decode(text, position)[1]).end()
    return lines


def _read_json(path: Path) -> list[tuple[str, dict[str, Any]]]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text (byte {err.start})") from None
    if not text.strip():
        raise DataError(f"{path}: empty file (expected a JSON list of objects)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{err.lineno}: malformed JSON: {err.msg} (column {err.colno})") from None
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of objects (or use JSONL), got {type(data).__name__}")
    out = []
    for i, (line, record) in enumerate(zip(_item_lines(text), data, strict=True)):
        if not isinstance(record, dict):
            raise DataError(f"{path}:{line}: item {i}: expected a JSON object, got {type(record).__name__}")
        out.append((f"{path}:{line}", record))
    return out


def _read_parquet(path: Path) -> list[tuple[str, dict[str, Any]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow: pip install 'postrl[parquet]'") from None
    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise DataError(f"{path}: not a readable Parquet file: {err}") from None
    return [(f"{path}: row {i}", r) for i, r in enumerate(table.to_pylist())]


def _read_hub(name: str, split: str) -> list[tuple[str, dict[str, Any]]]:
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"{name!r} is not a file; loading it as a Hugging Face dataset needs: pip install 'postrl[datasets]'"
        ) from None
    try:
        rows = datasets.load_dataset(name, split=split)
    except (OSError, ValueError, KeyError) as err:  # not found, offline, unknown split
        raise DataError(
            f"{name!r}: no such data file, and loading it as a Hugging Face dataset (split {split!r}) failed "
            f"(a hub name needs network access): {type(err).__name__}: {err}"
        ) from None
    return [(f"{name}[{split}]: row {i}", dict(r)) for i, r in enumerate(rows)]


def read_records(source: str | Path, split: str = "train") -> list[tuple[str, dict[str, Any]]]:
    """Raw ``(location, record)`` pairs from a file or a ``datasets`` name (no schema check)."""
    path = Path(source).expanduser()
    suffix = path.suffix.lower()
    if path.is_file():
        reader = {".parquet": _read_parquet, ".json": _read_json}.get(suffix, _read_jsonl)
        try:
            return reader(path)
        except PermissionError:
            raise DataError(f"{path}: cannot read the file (permission denied)") from None
    if path.is_dir():
        raise DataError(f"{path}: a folder, not a data file (.jsonl, .json or .parquet)")
    if suffix in (".jsonl", ".json", ".parquet") or str(source).startswith(("/", ".", "~")):
        raise DataError(f"{source}: no such data file")
    return _read_hub(str(source), split)


# ---- validation ------------------------------------------------------------------------------------------
def _check_messages(value: list[Any], where: str, field: str) -> None:
    for k, message in enumerate(value):
        if not isinstance(message, dict):
            raise DataError(
                f"{where}: field '{field}[{k}]': expected a message object, got {type(message).__name__}"
            )
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                got = type(message.get(key)).__name__ if key in message else "nothing"
                raise DataError(f"{where}: field '{field}[{k}].{key}': expected a string, got {got}")


def _check_text_or_messages(record: dict[str, Any], field: str, where: str) -> None:
    if field not in record:
        raise DataError(f"{where}: missing field '{field}' (has: {', '.join(sorted(record)) or 'nothing'})")
    value = record[field]
    if isinstance(value, str):
        return
    if isinstance(value, list) and value:
        _check_messages(value, where, field)
        return
    raise DataError(
        f"{where}: field '{field}': expected a string or a list of messages, got {type(value).__name__}"
    )


def validate_record(record: dict[str, Any], kind: str, where: str) -> None:
    """Check one record of ``kind`` ("sft", "prefs", "prompts"); raise `DataError` naming ``where`` and field."""
    if kind not in _TEXT_FIELDS:
        raise DataError(f"unknown data kind {kind!r}; expected one of {sorted(_TEXT_FIELDS)}")
    if kind == "sft" and "messages" in record and "prompt" not in record:
        _check_text_or_messages(record, "messages", where)
        if isinstance(record["messages"], str) or record["messages"][-1]["role"] != "assistant":
            raise DataError(f"{where}: field 'messages': the last message must be the assistant's")
        return
    if kind == "sft" and "text" in record and "prompt" not in record:
        if not isinstance(record["text"], str):
            raise DataError(f"{where}: field 'text': expected a string, got {type(record['text']).__name__}")
        return
    for field in _TEXT_FIELDS[kind]:
        _check_text_or_messages(record, field, where)
    target = record.get("target", 1.0)
    if kind == "prefs" and (
        isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 <= target <= 1
    ):
        raise DataError(f"{where}: field 'target': expected a number in [0, 1], got {target!r}")


def _is_blank(value: str | list[dict[str, str]], last_only: bool) -> bool:
    """An empty or whitespace-only text; for messages, the last one's content (an answer) or all of them."""
    if isinstance(value, str):
        return not value.strip()
    contents = [value[-1]["content"]] if last_only else [m["content"] for m in value]
    return not any(c.strip() for c in contents)


def _blank_fields(record: dict[str, Any], kind: str) -> list[str]:
    """The text fields of a validated record of ``kind`` that are empty or whitespace-only."""
    if kind == "sft" and "messages" in record and "prompt" not in record:
        return ["messages[-1].content"] if _is_blank(record["messages"], last_only=True) else []
    if kind == "sft" and "text" in record and "prompt" not in record:
        return ["text"] if _is_blank(record["text"], last_only=True) else []
    return [f for f in _TEXT_FIELDS[kind] if _is_blank(record[f], last_only=f != "prompt")]


def _drop_blank(
    records: list[tuple[str, dict[str, Any]]], kind: str, empty: str
) -> list[tuple[str, dict[str, Any]]]:
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


def load_rows(
    source: str | Path,
    kind: str,
    split: str = "train",
    task_kwargs: dict[str, Any] | None = None,
    *,
    empty: str = "error",
) -> list[dict[str, Any]]:
    """Validated rows of ``kind`` from a file, ``task:NAME`` (a built-in task) or a ``datasets`` name.

    A bad record raises `DataError` naming its file:line and field. Rows with an empty or whitespace-only
    prompt, completion, chosen or rejected are refused (``empty="error"``: the first one and the count are
    named) or dropped with a warning that counts them (``empty="skip"``).
    """
    text = str(source)
    if text.startswith("task:"):
        from postrl.lm.tasks import get_task

        return get_task(text[len("task:") :], **(task_kwargs or {})).rows(kind, split)
    records = read_records(source, split)
    if not records:
        raise DataError(f"{source}: no records (the file is empty)")
    for where, record in records:
        validate_record(record, kind, where)
    kept = _drop_blank(records, kind, empty)
    if not kept:
        raise DataError(f"{source}: no records left: every row has an empty text field")
    return [record for _, record in kept]


def load_train_heldout(
    data: str,
    kind: str,
    eval_data: str | None = None,
    task_kwargs: dict[str, Any] | None = None,
    *,
    empty: str = "error",
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, held-out rows) of ``kind``: held-out from ``eval_data`` when given, else the test split
    of a built-in task (``task:NAME``), else the last 5% of ``data`` (taken out of the train rows).
    ``empty``: see `load_rows`."""
    rows = load_rows(data, kind, "train", task_kwargs=task_kwargs, empty=empty)
    if eval_data is not None:
        return rows, load_rows(eval_data, kind, "test", task_kwargs=task_kwargs, empty=empty)
    if str(data).startswith("task:"):
        return rows, load_rows(data, kind, "test", task_kwargs=task_kwargs)
    cut = max(1, len(rows) // 20)
    return rows[:-cut], rows[-cut:]


# ---- chat rendering --------------------------------------------------------------------------------------
def _last_content(value: str | list[dict[str, str]]) -> str:
    return value if isinstance(value, str) else value[-1]["content"]


def _render_prompt(value: str | list[dict[str, str]], tokenizer: Any, index: int) -> str:
    if isinstance(value, str):
        return value
    if getattr(tokenizer, "chat_template", None) is None:
        raise DataError(f"row {index}: conversational data needs a tokenizer with a chat template")
    try:
        return tokenizer.apply_chat_template(value, tokenize=False, add_generation_prompt=True)
    except Exception as err:  # raised by the tokenizer's own Jinja template (jinja2's types are optional)
        raise DataError(
            f"row {index}: field 'prompt': the tokenizer's chat template refused it: {err}"
        ) from None


def render_rows(rows: Sequence[dict[str, Any]], kind: str, tokenizer: Any) -> list[dict[str, Any]]:
    """Plain-text rows: conversational prompts through the chat template (with the generation prompt),
    conversational answers as their last message's content; ``messages`` and ``text`` rows become
    prompt/completion. Other columns are kept."""
    out = []
    for i, row in enumerate(rows):
        row = dict(row)
        if kind == "sft" and "messages" in row and "prompt" not in row:
            messages = row.pop("messages")
            row["prompt"], row["completion"] = messages[:-1] or "", messages[-1]["content"]
        elif kind == "sft" and "text" in row and "prompt" not in row:
            row["prompt"], row["completion"] = "", row.pop("text")
        row["prompt"] = _render_prompt(row["prompt"], tokenizer, i) if row["prompt"] else ""
        for field in _TEXT_FIELDS[kind][1:]:
            row[field] = _last_content(row[field])
        out.append(row)
    return out


# ---- length limits ---------------------------------------------------------------------------------------
def _report_overlong(
    lengths: Sequence[int], max_length: int, overlong: str, what: str, action: str
) -> list[int]:
    """Indices of rows longer than ``max_length``; warns with a count and an example (raises for "error")."""
    if overlong not in OVERLONG_POLICIES:
        raise DataError(f"overlong must be one of {OVERLONG_POLICIES}; got {overlong!r}")
    long_rows = [i for i, n in enumerate(lengths) if n > max_length]
    if long_rows:
        first = long_rows[0]
        message = (
            f"{len(long_rows)} of {len(lengths)} {what} are longer than {max_length} tokens "
            f"(e.g. row {first}: {lengths[first]} tokens)"
        )
        if overlong == "error":
            raise DataError(message + "; raise the limit or set overlong to 'drop' or 'truncate'")
        log.warning("%s; %s", message, "dropped" if overlong == "drop" else action)
    return long_rows


def apply_length_limit(
    ids: Sequence[list[int]], max_length: int, overlong: str = "drop", what: str = "prompts"
) -> tuple[list[list[int]], list[int]]:
    """Enforce ``max_length`` tokens: returns (kept sequences, their row indices).

    "drop" removes overlong rows, "truncate" keeps their last ``max_length`` tokens, "error" raises
    `DataError`. Any overlong row is reported (count and an example row) in a warning.
    """
    long_rows = set(
        _report_overlong([len(s) for s in ids], max_length, overlong, what, "truncated from the left")
    )
    keep = [i for i in range(len(ids)) if overlong == "truncate" or i not in long_rows]
    return [list(ids[i][-max_length:]) for i in keep], keep


# ---- tokenisation ----------------------------------------------------------------------------------------
def encode(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, without special tokens (an empty text gives [])."""
    texts = list(texts)
    return tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []


def special_prefix(tokenizer: Any) -> list[int]:
    """The ids a tokenizer puts before any text on its own: ``[bos]`` for Llama-style tokenizers, ``[]``
    for postrl's, GPT-2's or Qwen's."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return full[:start]
    return []


def encode_prompts(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Prompt ids as the model expects them: the tokenizer's own prefix (e.g. Llama's ``<s>``) plus the
    text's tokens, but no second BOS when the text already starts with it (a rendered chat template).
    An empty prompt becomes ``[bos]`` (or the prefix) so a language-modelling row has a first target.

    The rollout engine and every trainer should encode prompts with this one function.
    """
    prefix = special_prefix(tokenizer)
    bos_text, bos_id = getattr(tokenizer, "bos_token", None), getattr(tokenizer, "bos_token_id", None)
    out = []
    for text, ids in zip(texts, encode(tokenizer, texts), strict=True):
        if not text:
            out.append(list(prefix) or ([bos_id] if bos_id is not None else []))
        elif bos_text and text.startswith(bos_text):
            out.append(list(ids))
        else:
            out.append(list(prefix) + list(ids))
    return out


def encode_completions(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Completion ids: the text's tokens (no special prefix) followed by EOS."""
    return [list(ids) + [tokenizer.eos_token_id] for ids in encode(tokenizer, texts)]


def tokenize_sft(
    rows: Sequence[dict[str, Any]], tokenizer: Any, max_length: int, overlong: str = "drop"
) -> list[dict[str, list[int]]]:
    """SFT examples ``{"input_ids", "attention_mask", "labels"}`` from plain prompt/completion rows.

    input_ids = `encode_prompts` + `encode_completions` (text + EOS); labels = −100 on the prompt, the token
    ids elsewhere. The prompt is encoded exactly as generation encodes it (a Llama-style tokenizer's BOS
    included), so training and sampling see the same inputs; an empty prompt (``text`` rows) becomes
    ``[bos]``, so the first token is a target.
    Overlong examples (prompt + completion + EOS > max_length) are dropped, truncated (the completion's end
    is cut; examples whose prompt alone fills the limit are dropped) or refused, and reported.
    """
    prompts = encode_prompts(tokenizer, [r["prompt"] for r in rows])
    completions = encode_completions(tokenizer, [r["completion"] for r in rows])
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions, strict=True)]
    action = "completions cut at the limit (examples whose prompt fills it are dropped)"
    long_rows = set(_report_overlong(lengths, max_length, overlong, "SFT examples", action))
    examples = []
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        if i in long_rows and (overlong == "drop" or len(p) >= max_length):
            continue
        ids = (p + c)[:max_length]
        labels = ([IGNORE_INDEX] * len(p) + c)[:max_length]
        examples.append({"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels})
    return examples


def pack_examples(examples: Sequence[dict[str, list[int]]], max_length: int) -> list[dict[str, list[int]]]:
    """Greedy packing of whole examples, in order, into blocks of at most ``max_length`` tokens.

    Examples are never split; within a block they attend to each other (plain packing, no document mask).
    """
    blocks: list[dict[str, list[int]]] = []
    for e in examples:
        if not blocks or len(blocks[-1]["input_ids"]) + len(e["input_ids"]) > max_length:
            blocks.append({"input_ids": [], "attention_mask": [], "labels": []})
        for key in ("input_ids", "attention_mask", "labels"):
            blocks[-1][key] += e[key]
    return blocks


def tokenize_prompts(
    rows: Sequence[dict[str, Any]], tokenizer: Any, max_prompt_length: int, overlong: str = "drop"
) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """(kept rows, their prompt ids) for RL; rows keep every column for the reward functions.

    With ``overlong="truncate"`` the ids (not the row's text) are the truncated prompt: generate from them.
    """
    prompt_ids = encode_prompts(tokenizer, [r["prompt"] for r in rows])
    ids, keep = apply_length_limit(prompt_ids, max_prompt_length, overlong)
    return [rows[i] for i in keep], ids


def tokenize_preferences(
    rows: Sequence[dict[str, Any]], tokenizer: Any, max_prompt_length: int, overlong: str = "drop"
) -> list[dict[str, Any]]:
    """``{"prompt_ids", "chosen_ids", "rejected_ids", "target"}`` per kept row; responses end with EOS."""
    kept, prompt_ids = tokenize_prompts(rows, tokenizer, max_prompt_length, overlong)
    chosen = encode_completions(tokenizer, [r["chosen"] for r in kept])
    rejected = encode_completions(tokenizer, [r["rejected"] for r in kept])
    return [
        {"prompt_ids": p, "chosen_ids": c, "rejected_ids": r, "target": float(row.get("target", 1.0))}
        for p, c, r, row in zip(prompt_ids, chosen, rejected, kept, strict=True)
    ]


# ---- padding ---------------------------------------------------------------------------------------------
def pad(seqs: Sequence[Sequence[int]], pad_id: int, side: str = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """Pad lists of ids to one width: (ids [B, T] long, mask [B, T] long), padding on ``side``."""
    width = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        cols = slice(width - len(s), width) if side == "left" else slice(0, len(s))
        ids[i, cols] = torch.tensor(list(s), dtype=torch.long)
        mask[i, cols] = 1
    return ids, mask


def join_prompt_response(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int
) -> dict[str, torch.Tensor]:
    """The rollout layout: prompts LEFT-padded to P, responses RIGHT-padded to T, side by side.

    Returns ``input_ids`` and ``attention_mask`` [B, P+T], ``response_mask`` [B, T] (1 on response tokens).
    """
    prompt_ids, prompt_mask = pad(prompts, pad_id, side="left")  # (B, P)
    response_ids, response_mask = pad(responses, pad_id, side="right")  # (B, T)
    return {
        "input_ids": torch.cat([prompt_ids, response_ids], dim=1),
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
        "response_mask": response_mask,
    }


def collate_preferences(examples: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """One batch of 2B rows for a reward model: chosen rows 0..B−1, rejected rows B..2B−1, in the rollout
    layout of `join_prompt_response` (score each row at its last real token), plus ``target`` [B]."""
    prompts = [e["prompt_ids"] for e in examples] * 2
    responses = [e["chosen_ids"] for e in examples] + [e["rejected_ids"] for e in examples]
    batch = join_prompt_response(prompts, responses, pad_id)
    batch["target"] = torch.tensor([float(e["target"]) for e in examples], dtype=torch.float32)
    return batch


def write_jsonl(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write ``rows`` as JSONL (UTF-8, one object per line), atomically."""
    from postrl.runtime.checkpoint import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return Path(path)
