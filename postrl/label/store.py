"""The labelling folder's record of judgements: an append-only log, and the preferences file made from it.

``judgements.jsonl`` is the truth: one event per line, ``{"labeller", "pair", "choice", "time"}`` with
``choice`` one of left, right, tie, skip, undo. Each event is one ``os.write`` of a whole line, then
``fsync``, before the page hears "saved": a judgement the page acknowledged survives a crash or a power cut.
A process killed in the middle of a write can leave at most a torn last line (no newline): it is cut off
when the folder is opened again (the page never acknowledged it), so the log always reads.

After every event ``preferences.jsonl`` is rewritten from the log through a temp file and ``os.replace``
(`postrl.runtime.checkpoint.atomic_write_text`), so it is at all times either the old or the new complete
file, in the format the trainers read (`pair_rows` in ``pairs.py``). An undo removes the labeller's last
judgement or skip; a labeller's state at any time is the log replayed (`replay`), which is how a restarted
page continues where each labeller left off.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

from postrl.runtime.checkpoint import atomic_write_text
from postrl.runtime.errors import DataError, UserError

log = logging.getLogger(__name__)

LOG_FILE = "judgements.jsonl"
PREFS_FILE = "preferences.jsonl"
CHOICES = ("left", "right", "tie", "skip", "undo")
TARGETS = {"left": 1.0, "right": 0.0, "tie": 0.5}
"""P(left ≻ right) of each judgement; a skip has none."""
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._-]{0,39}")


class StaleJudgement(UserError):
    """A judgement of a pair that is not the labeller's next one (a second tab, a double key press)."""


def check_name(name: Any) -> str:
    """A labeller's name: 1 to 40 letters, digits, spaces, '.', '_' or '-' (it never reaches a path)."""
    if not isinstance(name, str) or not NAME.fullmatch(name.strip()):
        raise UserError(
            f"labeller name {name!r}: use 1 to 40 letters, digits, spaces, '.', '_' or '-', starting with a "
            "letter or digit"
        )
    return name.strip()


@dataclass(frozen=True)
class Judgement:
    """One labeller's standing verdict on one pair: ``choice`` left, right, tie or skip."""

    labeller: str
    pair: int
    choice: str

    @property
    def target(self) -> float | None:
        return TARGETS.get(self.choice)


def replay(events: list[dict[str, Any]]) -> dict[str, list[Judgement]]:
    """Each labeller's judgements in the order made, undos applied (an undo with nothing left is a no-op)."""
    made: dict[str, list[Judgement]] = {}
    for e in events:
        stack = made.setdefault(e["labeller"], [])
        if e["choice"] == "undo":
            if stack:
                stack.pop()
        else:
            stack.append(Judgement(e["labeller"], e["pair"], e["choice"]))
    return made


def read_log(path: Path, n_pairs: int, repair: bool = True) -> list[dict[str, Any]]:
    """The events of ``path``; a torn last line (no newline: a write cut by a crash) is cut off when
    ``repair``. Any other bad line is a `DataError` naming path:line."""
    if not path.is_file():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        log.warning(
            "%s: cut off a torn last line (%d bytes) left by a crash mid-write", path, len(data) - end
        )
        if repair:
            with open(path, "r+b") as f:
                f.truncate(end)
                os.fsync(f.fileno())
    events = []
    for i, line in enumerate(data[:end].decode("utf-8").splitlines(), 1):
        try:
            e = json.loads(line)
            ok = (
                isinstance(e, dict)
                and e.get("choice") in CHOICES
                and isinstance(e.get("labeller"), str)
                and (e["choice"] == "undo" or (isinstance(e.get("pair"), int) and 0 <= e["pair"] < n_pairs))
            )
        except json.JSONDecodeError:
            ok = False
        if not ok:
            raise DataError(
                f"{path}:{i}: not a judgement of this folder's {n_pairs} pairs (expected "
                '{"labeller", "pair", "choice"}); the log was edited by hand or belongs to other pairs'
            )
        events.append(e)
    return events


def agreement(made: dict[str, list[Judgement]]) -> dict[str, dict[str, Any]]:
    """For each two labellers, on the pairs both judged (skips left out): ``n`` shared pairs and ``rate``,
    the fraction on which they chose the same (left, right or tie; None when they share none). Keyed
    ``"a|b"`` with the names sorted."""
    verdicts = {
        name: {j.pair: j.choice for j in judgements if j.choice != "skip"}
        for name, judgements in made.items()
    }
    out = {}
    for a, b in combinations(sorted(verdicts), 2):
        shared = verdicts[a].keys() & verdicts[b].keys()
        same = sum(verdicts[a][p] == verdicts[b][p] for p in shared)
        out[f"{a}|{b}"] = {"n": len(shared), "rate": same / len(shared) if shared else None}
    return out


class LabelStore:
    """The judgements of one labelling folder (thread-safe: the page's requests may arrive together).

    ``to_rows(judgements)`` turns the standing judgements into the preferences file's rows."""

    def __init__(self, folder: Path, n_pairs: int, to_rows: Callable[[list[Judgement]], list[dict]]):
        self.folder, self.n_pairs, self.to_rows = Path(folder), n_pairs, to_rows
        self.log_path, self.prefs_path = self.folder / LOG_FILE, self.folder / PREFS_FILE
        self._lock = threading.Lock()
        self._lines: dict[Judgement, str] = {}
        self.events = read_log(self.log_path, n_pairs)
        self.made = replay(self.events)
        self._write_prefs()  # a crash between the log's fsync and the rename left it one event behind

    def record(self, labeller: str, pair: int | None, choice: str) -> dict[str, Any]:
        """Append one event (fsync'd), rewrite the preferences file, return the labeller's new state."""
        labeller = check_name(labeller)
        if choice not in CHOICES:
            raise UserError(f"choice {choice!r}: expected one of {', '.join(CHOICES)}")
        with self._lock:
            if choice != "undo":
                if not isinstance(pair, int) or not 0 <= pair < self.n_pairs:
                    raise UserError(f"pair {pair!r}: expected 0 to {self.n_pairs - 1}")
                if pair != self.next_pair(labeller):
                    raise StaleJudgement(
                        f"pair {pair} is not the one shown to {labeller} (judged in another tab?); reload the page"
                    )
            event = {"labeller": labeller, "pair": pair, "choice": choice, "time": round(time.time(), 3)}
            self._append(event)
            self.events.append(event)
            self.made = replay(self.events)
            self._write_prefs()
            return self.state(labeller)

    def grow(self, n_pairs: int) -> None:
        """The folder now holds ``n_pairs`` pairs (a running ``control prefs`` appends the pairs it asks for)."""
        with self._lock:
            if n_pairs < self.n_pairs:
                raise DataError(f"{self.folder}: the pairs file lost pairs ({self.n_pairs} → {n_pairs})")
            self.n_pairs = n_pairs

    def _append(self, event: dict[str, Any]) -> None:
        line = (json.dumps(event, ensure_ascii=False) + "\n").encode("utf-8")
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            written = os.write(fd, line)
            if written != len(line):  # a full disk: leave no torn line behind a failed write
                os.ftruncate(fd, os.fstat(fd).st_size - written)
                raise OSError(f"{self.log_path}: short write ({written} of {len(line)} bytes)")
            os.fsync(fd)
        finally:
            os.close(fd)

    def _write_prefs(self) -> None:
        standing = [j for name in sorted(self.made) for j in self.made[name] if j.choice != "skip"]
        missing = [j for j in standing if j not in self._lines]  # each row is made and dumped once
        for j, row in zip(missing, self.to_rows(missing), strict=True):
            self._lines[j] = json.dumps(row, ensure_ascii=False) + "\n"
        atomic_write_text(self.prefs_path, "".join(self._lines[j] for j in standing))

    def next_pair(self, labeller: str) -> int | None:
        """The first pair ``labeller`` has not judged or skipped (None when all are done)."""
        done = {j.pair for j in self.made.get(labeller, [])}
        return next((p for p in range(self.n_pairs) if p not in done), None)

    def state(self, labeller: str) -> dict[str, Any]:
        """What the page shows ``labeller``: the next pair, progress, and agreement with the others."""
        mine = self.made.get(labeller, [])
        pairs = agreement(self.made)
        others = {
            (key.split("|")[1] if key.split("|")[0] == labeller else key.split("|")[0]): value
            for key, value in pairs.items()
            if labeller in key.split("|")
        }
        return {
            "labeller": labeller,
            "pair": self.next_pair(labeller),
            "done": len(mine),
            "skipped": sum(j.choice == "skip" for j in mine),
            "total": self.n_pairs,
            "can_undo": bool(mine),
            "agreement": others,
            "labellers": self.counts(),
        }

    def counts(self) -> dict[str, int]:
        """Judgements and skips standing, per labeller."""
        return {name: len(js) for name, js in sorted(self.made.items())}
