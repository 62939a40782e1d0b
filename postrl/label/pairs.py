"""The pairs a labelling folder shows, and the preference rows its judgements become.

Two kinds of pairs file (JSONL, one pair a line; a file holds one kind):

    lm        {"prompt", "responses": [a, b]} (or {"prompt", "chosen", "rejected"}, to label an existing
              preferences file again), in TRL's formats: text, or conversational (the prompt a list of
              messages, each response a string or a list holding the assistant's message); a vision-language
              pair adds ``images`` (paths relative to the pairs file, or ``{"path"}``), shown above the prompt
    segments  {"env", "first", "second"}: two Gymnasium segments, each ``{"obs" [L][obs_dim], "actions" [L]
              (or [L][act_dim]), "true_rewards" [L], "alive" [L], "clip"}``, ``clip`` an animation (GIF, WebP,
              PNG) relative to the pairs file: what the person watches (`postrl.label.segments` makes them)

`prepare` copies the pairs into the labelling folder (``DIR/pairs.jsonl``, pictures and clips into
``DIR/media/`` under content-hash names), so the folder holds everything the page serves and a labeller's
request names only a pair's index, never a path.

Judgements become rows (`pair_rows`):

    lm        TRL's preference format, as the reward model and DPO read it (`postrl.lm.data`): ``prompt``,
              ``chosen``, ``rejected``, ``target`` (1 = chosen preferred; a tie is 0.5 with the left response as
              chosen), plus ``images`` when the pair has them, ``labeller`` and ``pair``
    segments  the fields of `postrl.control.prefs_reward.Pairs` (`Pairs.from_rows` reads them): ``first`` and
              ``second`` (obs, actions, true_rewards, alive), ``label`` = P(first ≻ second) in {1, 0, 0.5},
              plus ``env``, ``labeller`` and ``pair``

Which response is shown on the left is drawn once per pair (`swapped`), the same for every labeller, so a
position bias of the person does not favour the file's first response.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path
from typing import Any

from postrl.label.store import TARGETS, Judgement
from postrl.runtime.checkpoint import atomic_write_text
from postrl.runtime.errors import DataError, UserError

PAIRS_FILE = "pairs.jsonl"
MEDIA = "media"
MEDIA_TYPES = {".gif": "image/gif", ".webp": "image/webp", ".png": "image/png", ".jpg": "image/jpeg"}
MEDIA_TYPES[".jpeg"] = "image/jpeg"
SEGMENT_FIELDS = ("obs", "actions", "true_rewards", "alive")


def swapped(index: int) -> bool:
    """Whether pair ``index`` shows its second response on the left (a fixed coin per pair)."""
    return random.Random(f"postrl-label-{index}").random() < 0.5


def kind_of(rows: list[dict[str, Any]]) -> str:
    return "segments" if rows and "first" in rows[0] else "lm"


# ---- reading and checking ----------------------------------------------------------------------------------
def _is_text_or_messages(value: Any) -> bool:
    if isinstance(value, str):
        return bool(value.strip())
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in value)
    )


def _check_lm(record: dict[str, Any], where: str) -> dict[str, Any]:
    if "responses" in record:
        responses = record["responses"]
        if not isinstance(responses, list) or len(responses) != 2:
            raise DataError(f"{where}: field 'responses': expected a list of two responses")
    elif "chosen" in record and "rejected" in record:
        responses = [record["chosen"], record["rejected"]]
    else:
        raise DataError(f"{where}: expected 'responses' (two) or 'chosen' and 'rejected' beside 'prompt'")
    if not _is_text_or_messages(record.get("prompt")):
        raise DataError(f"{where}: field 'prompt': expected non-empty text or a list of messages")
    for k, response in enumerate(responses):
        if not _is_text_or_messages(response):
            raise DataError(f"{where}: response {k + 1}: expected non-empty text or a list of messages")
    if responses[0] == responses[1]:
        raise DataError(f"{where}: the two responses are the same: there is nothing to compare")
    pair = {"prompt": record["prompt"], "responses": responses}
    images = record.get("images", [record["image"]] if record.get("image") is not None else None)
    if images:
        pair["images"] = images if isinstance(images, list) else [images]
    return pair


def _check_segment(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DataError(f"{where}: expected a segment object, got {type(value).__name__}")
    missing = [f for f in (*SEGMENT_FIELDS, "clip") if f not in value]
    if missing:
        raise DataError(f"{where}: missing field(s) {', '.join(missing)}")
    lengths = {f: len(value[f]) if isinstance(value[f], list) else -1 for f in SEGMENT_FIELDS}
    if len(set(lengths.values())) != 1 or -1 in lengths.values() or lengths["obs"] == 0:
        raise DataError(f"{where}: obs, actions, true_rewards and alive must be lists of one length L ≥ 1")
    return {f: value[f] for f in (*SEGMENT_FIELDS, "clip")}


def _check_segments(record: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(record.get("env"), str):
        raise DataError(f"{where}: field 'env': expected the Gymnasium id the segments come from")
    first = _check_segment(record.get("first"), f"{where}: field 'first'")
    second = _check_segment(record.get("second"), f"{where}: field 'second'")
    if len(first["obs"]) != len(second["obs"]):
        raise DataError(f"{where}: the two segments have different lengths")
    return {"env": record["env"], "first": first, "second": second}


def read_pairs(path: Path) -> list[dict[str, Any]]:
    """The checked pairs of a JSONL file; a bad line is a `DataError` naming path:line and field."""
    return [pair for _, pair in read_pairs_at(path)]


def read_pairs_at(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(path:line, pair) for each checked pair of a JSONL file."""
    if not path.is_file():
        raise UserError(f"--pairs {path}: no such file")
    return parse_pairs(path.read_text(encoding="utf-8"), path)


def parse_pairs(text: str, path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(path:line, pair) for each checked pair of the JSONL ``text`` read from ``path``."""
    pairs, kind = [], None
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{i}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: not JSON ({err.msg})") from None
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected an object, got {type(record).__name__}")
        this = "segments" if "first" in record or "second" in record else "lm"
        if kind is not None and this != kind:
            raise DataError(f"{where}: a {this} pair in a file of {kind} pairs (one kind per file)")
        kind = this
        pair = _check_segments(record, where) if this == "segments" else _check_lm(record, where)
        pairs.append((where, pair))
    if not pairs:
        raise DataError(f"{path}: no pairs")
    return pairs


# ---- the labelling folder --------------------------------------------------------------------------------
def _media_name(source: Path, where: str) -> str:
    if source.suffix.lower() not in MEDIA_TYPES:
        raise DataError(f"{where}: {source}: expected one of {', '.join(MEDIA_TYPES)}")
    if not source.is_file():
        raise DataError(f"{where}: no such file {source}")
    return hashlib.sha256(source.read_bytes()).hexdigest()[:16] + source.suffix.lower()


def _localise(pairs: list[tuple[str, dict]], base: Path, folder: Path | None) -> list[dict[str, Any]]:
    """Pairs whose pictures and clips are named ``media/<hash>.<ext>``; copied into ``folder`` unless None."""

    def local(value: Any, at: str) -> str:
        raw = value.get("path") if isinstance(value, dict) else value
        if not isinstance(raw, str):
            raise DataError(f"{at}: expected a file path (relative to the pairs file), got {value!r}")
        source = Path(raw).expanduser()
        source = source if source.is_absolute() else base / source
        name = _media_name(source, at)
        if folder is not None and not (folder / MEDIA / name).is_file():
            (folder / MEDIA).mkdir(parents=True, exist_ok=True)
            tmp = folder / MEDIA / f".{name}.tmp"
            shutil.copyfile(source, tmp)
            tmp.replace(folder / MEDIA / name)
        return f"{MEDIA}/{name}"

    out = []
    for at, pair in pairs:
        pair = json.loads(json.dumps(pair))
        if "images" in pair:
            pair["images"] = [local(v, f"{at}: field 'images'") for v in pair["images"]]
        for side in ("first", "second"):
            if side in pair:
                pair[side]["clip"] = local(pair[side]["clip"], f"{at}: field '{side}.clip'")
        out.append(pair)
    return out


def prepare(folder: Path, pairs_file: Path | None) -> list[dict[str, Any]]:
    """The labelling folder's pairs: copied in from ``pairs_file`` on the first start; on a restart read back
    (``pairs_file`` may be left out, and must otherwise be the same pairs)."""
    stored = folder / PAIRS_FILE
    if pairs_file is None:
        if not stored.is_file():
            raise UserError(f"--out {folder}: no {PAIRS_FILE} there yet; give --pairs (or make pairs)")
        return read_pairs(stored)
    pairs = read_pairs_at(pairs_file)
    checked = _localise(pairs, pairs_file.parent, None)  # every picture and clip found before DIR is touched
    if stored.is_file():
        if checked != read_pairs(stored):
            raise UserError(
                f"--out {folder} already labels other pairs ({stored}); give a new --out, or leave out --pairs "
                "to continue there"
            )
        return read_pairs(stored)
    folder.mkdir(parents=True, exist_ok=True)
    _localise(pairs, pairs_file.parent, folder)
    atomic_write_text(stored, "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in checked))
    return checked


def media_path(folder: Path, name: str) -> Path:
    """The file of a ``media/<name>`` entry, refusing anything that would leave ``folder/media``."""
    root = (folder / MEDIA).resolve()
    path = (folder / name).resolve()
    if path.parent != root or path.suffix not in MEDIA_TYPES:
        raise UserError(f"{name!r} is not a file of {root}")
    return path


# ---- judgements → preference rows --------------------------------------------------------------------------
def shown(pair: dict[str, Any], index: int) -> tuple[Any, Any]:
    """(left, right) as the page shows pair ``index``: responses for lm, segments for segments."""
    a, b = (pair["first"], pair["second"]) if "first" in pair else pair["responses"]
    return (b, a) if swapped(index) else (a, b)


def _segment(seg: dict[str, Any]) -> dict[str, Any]:
    return {f: seg[f] for f in SEGMENT_FIELDS}


def pair_rows(pairs: list[dict[str, Any]], judgements: list[Judgement]) -> list[dict[str, Any]]:
    """The preference rows of the standing judgements (skips excluded), in the format of the pairs' kind."""
    rows = []
    for j in judgements:
        pair, target = pairs[j.pair], TARGETS[j.choice]
        left, right = shown(pair, j.pair)
        meta = {"labeller": j.labeller, "pair": j.pair}
        if "first" in pair:  # label = P(first ≻ second), first being the file's first segment
            label = 1.0 - target if swapped(j.pair) else target
            row = {"env": pair["env"], "first": _segment(pair["first"]), "second": _segment(pair["second"])}
            rows.append({**row, "label": label, **meta})
            continue
        chosen, rejected = (right, left) if j.choice == "right" else (left, right)
        row = {
            "prompt": pair["prompt"],
            "chosen": chosen,
            "rejected": rejected,
            "target": 0.5 if j.choice == "tie" else 1.0,
        }
        if "images" in pair:
            row["images"] = pair["images"]
        rows.append({**row, **meta})
    return rows
