"""Data for the LM trainers, reading and validating: a source's records become checked rows of one kind.

Sources: a JSONL file (one object per line), a JSON list, a Parquet file (``pip install 'postrl[parquet]'``),
a built-in task (``task:arithmetic``), a Hugging Face ``datasets`` name (``pip install 'postrl[datasets]'``),
or rows held in memory (a list of dicts or a ``datasets.Dataset``, given to the Python API: `register_records`
names them ``memory:<hash>``). Rows use TRL's columns and formats (https://huggingface.co/docs/trl/dataset_formats);
each kind accepts standard text or conversational messages (``[{"role", "content"}, ...]``):

    sft      {"prompt", "completion"} | {"messages"} (the last message, an assistant's, is the completion; a
             system turn first is kept in the prompt) | {"text"} (language modelling: every token is a target)
    prefs    {"prompt", "chosen", "rejected"} (+ optional "target" in [0, 1]; 1 = chosen preferred, 0.5 = tie),
             or {"chosen", "rejected"} with an implicit prompt: the shared start becomes the prompt, as TRL's
             ``extract_prompt`` does (the leading messages both conversations share; for text, the longest
             common prefix, a space before the split going to the answers)
    prompts  {"prompt"} (+ any columns, passed on to reward functions, e.g. "answer")
    kto      {"prompt", "completion", "label"} (label true: desirable, false: undesirable), TRL's unpaired
             preference format; preference rows are unpaired (`unpair`), as TRL's KTOTrainer does

A bad record raises `DataError` naming the file, the line (row for Parquet, index for rows in memory) and the
field. Then the rows are checked together (`postrl.lm.data.checks`): one format per source (all text or all
conversational), no preference pair whose chosen and rejected are the same answer, and rows whose prompt or
answer is empty or whitespace-only refused (the first named, all counted) or skipped with a warning that
counts them. Each loaded row is a `Row`: a dict that remembers its location for later errors.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from postrl.lm.data.checks import EMPTY_POLICIES as EMPTY_POLICIES
from postrl.lm.data.checks import TEXT_FIELDS as TEXT_FIELDS
from postrl.lm.data.checks import check_distinct_answers, check_one_format, drop_blank
from postrl.lm.tasks import get_task
from postrl.runtime.checkpoint import atomic_write_text
from postrl.runtime.errors import DataError as DataError

log = logging.getLogger(__name__)


class Row(dict):
    """One validated row (a dict of its columns) that remembers where it was read: ``where`` (file:line, a
    Parquet row, an index of rows in memory), so that a later error (a chat template that refuses it) names
    it. The location is an attribute, not a column: reward functions never see it."""

    where: str | None = None

    def __init__(self, record: dict[str, Any], where: str | None = None) -> None:
        super().__init__(record)
        self.where = where


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


# ---- rows in memory (the Python API) -------------------------------------------------------------------
MEMORY_PREFIX = "memory:"
_IN_MEMORY: dict[str, tuple[str, list[Any]]] = {}


def _as_records(rows: Any, label: str) -> list[Any]:
    """A list of rows from a list/tuple of dicts or a ``datasets.Dataset``; anything else is a `DataError`."""
    if type(rows).__name__ in ("DatasetDict", "IterableDatasetDict"):
        raise DataError(f"{label}: a DatasetDict of splits {sorted(rows)}; pass one split, e.g. ds['train']")
    if hasattr(rows, "to_list") and hasattr(rows, "column_names"):  # a datasets.Dataset
        return list(rows.to_list())
    if isinstance(rows, (list, tuple)):
        return list(rows)
    raise DataError(
        f"{label}: expected a file path, task:NAME, a list of dicts or a datasets.Dataset, "
        f"got {type(rows).__name__}"
    )


def register_records(rows: Any, label: str = "data") -> str:
    """The source name (``memory:<hash of the rows>``) under which `load_rows` finds ``rows`` in this process.

    ``rows``: a list of dicts or a ``datasets.Dataset``. ``label`` names them in errors (``data[3]: field
    'chosen': ...``). The name depends on the content only, so passing the same rows again (to resume a run
    whose config.yaml names them) gives the same name. Rows in memory are not saved with a run.
    """
    records = _as_records(rows, label)
    if not records:  # found later, it named the memory:<hash> source and called it an empty file
        raise DataError(f"{label}: no rows (an empty {type(rows).__name__})")
    text = json.dumps(records, sort_keys=True, default=repr, ensure_ascii=False)
    name = MEMORY_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:16]
    _IN_MEMORY[name] = (label, records)
    return name


def release_records(name: str) -> None:
    """Forget the rows registered under ``name`` (the Python API does once its run returns)."""
    _IN_MEMORY.pop(name, None)


def _read_memory(name: str) -> list[tuple[str, dict[str, Any]]]:
    if name not in _IN_MEMORY:
        raise DataError(
            f"{name}: rows that were given in memory (a list of dicts or a datasets.Dataset) to postrl's Python "
            "API; they are not saved with a run: pass the same data= again (e.g. to resume)"
        )
    label, records = _IN_MEMORY[name]
    out = []
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise DataError(f"{label}[{i}]: expected a dict (one row), got {type(record).__name__}")
        out.append((f"{label}[{i}]", dict(record)))
    return out


def read_records(source: str | Path, split: str = "train") -> list[tuple[str, dict[str, Any]]]:
    """Raw ``(location, record)`` pairs from a file, rows in memory or a ``datasets`` name (no schema check)."""
    if str(source).startswith(MEMORY_PREFIX):
        return _read_memory(str(source))
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
    """Check one record of ``kind`` ("sft", "prefs", "prompts", "kto"); raise `DataError` naming ``where``
    and field."""
    if kind not in TEXT_FIELDS:
        raise DataError(f"unknown data kind {kind!r}; expected one of {sorted(TEXT_FIELDS)}")
    pictures = next((k for k in ("images", "image") if record.get(k) not in (None, [])), None)
    if pictures is not None:  # a vision-language model's rows go through `postrl.lm.vlm.data` instead
        raise DataError(
            f"{where}: field '{pictures}': the row has pictures, but it is read for a text-only model, which "
            "would train on the text and ignore them; give a vision-language model (image-text-to-text), or "
            "remove the column"
        )
    if kind == "sft" and "messages" in record and "prompt" not in record:
        _check_text_or_messages(record, "messages", where)
        if isinstance(record["messages"], str) or record["messages"][-1]["role"] != "assistant":
            raise DataError(f"{where}: field 'messages': the last message must be the assistant's")
        return
    if kind == "sft" and "text" in record and "prompt" not in record:
        if not isinstance(record["text"], str):
            raise DataError(f"{where}: field 'text': expected a string, got {type(record['text']).__name__}")
        return
    fields = TEXT_FIELDS[kind]
    if kind == "prefs" and "prompt" not in record and "chosen" in record and "rejected" in record:
        fields = fields[1:]  # an implicit prompt (`explicit_prompt`)
    for field in fields:
        _check_text_or_messages(record, field, where)
    if fields is not TEXT_FIELDS[kind] and type(record["chosen"]) is not type(record["rejected"]):
        raise DataError(
            f"{where}: fields 'chosen' and 'rejected': one is text and the other messages; without a 'prompt' "
            "column both must be the same kind (the shared start is the prompt)"
        )
    _check_labels(record, kind, where)


def _check_labels(record: dict[str, Any], kind: str, where: str) -> None:
    """A preference row's ``target`` and ``margin``, a KTO row's ``label``."""
    if kind == "prefs":
        target = record.get("target", 1.0)
        if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 <= target <= 1:
            raise DataError(f"{where}: field 'target': expected a number in [0, 1], got {target!r}")
        margin = record.get("margin")
        if margin is not None and not _finite_number(margin):
            raise DataError(f"{where}: field 'margin': expected a finite number, got {margin!r}")
    if kind == "kto" and not isinstance(record.get("label"), bool):
        got = repr(record["label"]) if "label" in record else "nothing"
        raise DataError(
            f"{where}: field 'label': expected true (desirable) or false (undesirable), got {got}"
        )


def _finite_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _common_start(a: str | list[Any], b: str | list[Any]) -> int:
    """How many leading characters (or messages) ``a`` and ``b`` share; for text, a space just before the
    split is left to the answers (TRL's ``extract_prompt``)."""
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    if isinstance(a, str) and 0 < k and a[k - 1] == " ":
        k -= 1
    return k


def explicit_prompt(record: dict[str, Any], where: str) -> dict[str, Any]:
    """A preference row with its prompt as a column: a row without one (TRL's implicit prompt) is split at the
    end of what chosen and rejected share (leading messages, or the common text prefix)."""
    if "prompt" in record:
        return record
    chosen, rejected = record["chosen"], record["rejected"]
    k = _common_start(chosen, rejected)
    if k == 0:
        raise DataError(
            f"{where}: no 'prompt' field, and 'chosen' and 'rejected' share no leading "
            f"{'messages' if isinstance(chosen, list) else 'text'} to take as the implicit prompt; add a prompt "
            "column"
        )
    if k >= len(chosen) or k >= len(rejected):
        which = "chosen" if k >= len(chosen) else "rejected"
        raise DataError(
            f"{where}: no 'prompt' field, and '{which}' is all shared start (the implicit prompt) with nothing "
            "after it to be the answer"
        )
    return {**record, "prompt": chosen[:k], "chosen": chosen[k:], "rejected": rejected[k:]}


def load_rows(
    source: str | Path,
    kind: str,
    split: str = "train",
    task_kwargs: dict[str, Any] | None = None,
    *,
    empty: str = "error",
) -> list[dict[str, Any]]:
    """Validated rows of ``kind`` from a file, ``task:NAME`` (a built-in task) or a ``datasets`` name.

    A bad record raises `DataError` naming its file:line and field, as do a source that mixes text and
    conversational rows and a preference pair whose two answers are the same (`postrl.lm.data.checks`). Rows
    with an empty or whitespace-only prompt, completion, chosen or rejected are refused (``empty="error"``:
    the first one and the count are named) or dropped with a warning that counts them (``empty="skip"``).
    The rows are `Row`s (their ``where`` names their file:line); a built-in task's are plain dicts.
    """
    text = str(source)
    if text.startswith("task:"):
        task = get_task(text[len("task:") :], **(task_kwargs or {}))
        return unpair(task.rows("prefs", split)) if kind == "kto" else task.rows(kind, split)
    records = read_records(source, split)
    if not records:
        raise DataError(f"{source}: no records (the file is empty)")
    if kind == "kto" and "label" not in records[0][1] and "chosen" in records[0][1]:
        kind = "prefs"  # preference pairs for KTO: unpaired below, as TRL's KTOTrainer does
        unpaired = True
    else:
        unpaired = False
    for where, record in records:
        validate_record(record, kind, where)
    if kind == "prefs":
        check_distinct_answers(records)
        records = [(where, explicit_prompt(record, where)) for where, record in records]
    kept = drop_blank(records, kind, empty)
    if not kept:
        raise DataError(f"{source}: no records left: every row has an empty text field")
    check_one_format(kept, kind)
    rows = [Row(record, where) for where, record in kept]
    return unpair(rows) if unpaired else rows


def unpair(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Preference rows → KTO's unpaired rows, as TRL's ``unpair_preference_dataset``: every chosen answer a
    desirable row (``label`` true), every rejected one an undesirable row, the desirable ones first (so that a
    row's neighbour, whose answer KTO's KL estimate borrows, answers another prompt). A tie (target 0.5) says
    neither and is dropped (counted in a warning); a target below 0.5 swaps the two answers."""
    good, bad, ties = [], [], 0
    for row in rows:
        target = float(row.get("target", 1.0))
        if target == 0.5:
            ties += 1
            continue
        chosen, rejected = (
            (row["chosen"], row["rejected"]) if target > 0.5 else (row["rejected"], row["chosen"])
        )
        rest = {k: v for k, v in row.items() if k not in ("chosen", "rejected", "target", "margin")}
        where = getattr(row, "where", None)
        good.append(Row({**rest, "completion": chosen, "label": True}, where))
        bad.append(Row({**rest, "completion": rejected, "label": False}, where))
    if ties:
        log.warning("kto: %d of %d preference pairs are ties (target 0.5) and were dropped", ties, len(rows))
    return good + bad


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


def write_jsonl(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write ``rows`` as JSONL (UTF-8, one object per line), atomically."""
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return Path(path)
