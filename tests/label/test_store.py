"""The labelling folder's store: judgements → TRL preference rows, resume, undo, agreement, and crash safety
(a process SIGKILLed while it writes never leaves a log or preferences file that does not read)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from postrl.label.pairs import pair_rows, prepare, swapped
from postrl.label.store import LOG_FILE, PREFS_FILE, Judgement, LabelStore, agreement, replay
from postrl.runtime.errors import DataError, UserError

PAIRS = [
    {"prompt": "Review of the soup:", "responses": [" was great .", " was cold ."]},
    {"prompt": [{"role": "user", "content": "Hi"}], "responses": [
        [{"role": "assistant", "content": "Hello!"}], [{"role": "assistant", "content": "Go away."}]]},
    {"prompt": "Review of the tea:", "responses": [" was fine .", " was bad ."]},
]  # fmt: skip


def _folder(tmp_path: Path, pairs=PAIRS) -> tuple[Path, list[dict]]:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    out = tmp_path / "lab"
    return out, prepare(out, src)


def _store(out: Path, pairs: list[dict]) -> LabelStore:
    return LabelStore(out, len(pairs), lambda js: pair_rows(pairs, js))


def _prefs(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / PREFS_FILE).read_text().splitlines()]


def test_rows_are_trl_preferences_with_tie_targets(tmp_path):
    out, pairs = _folder(tmp_path)
    store = _store(out, pairs)
    store.record("ada", 0, "left")
    store.record("ada", 1, "right")
    store.record("ada", 2, "tie")
    rows = _prefs(out)
    shown = [(p["responses"][::-1] if swapped(i) else p["responses"]) for i, p in enumerate(PAIRS)]
    # pair 0, "left": the response shown on the left is chosen, target 1
    assert (rows[0]["chosen"], rows[0]["rejected"], rows[0]["target"]) == (shown[0][0], shown[0][1], 1.0)
    # pair 1, "right": the right one chosen, target 1 (conversational answers stay messages)
    assert (rows[1]["chosen"], rows[1]["rejected"], rows[1]["target"]) == (shown[1][1], shown[1][0], 1.0)
    assert rows[2]["target"] == 0.5 and {rows[2]["chosen"], rows[2]["rejected"]} == set(PAIRS[2]["responses"])
    assert [r["prompt"] for r in rows] == [p["prompt"] for p in PAIRS]
    assert [r["labeller"] for r in rows] == ["ada"] * 3

    # the trainers read the file as it is: a tie's 0.5 reaches the reward model's and DPO's batches
    from postrl.lm import base_model
    from postrl.lm.data import load_rows, tokenize_preferences
    from postrl.lm.tokenizer import load_tokenizer

    text = [r for r in rows if isinstance(r["prompt"], str)]
    (out / "text.jsonl").write_text("".join(json.dumps(r) + "\n" for r in text))
    loaded = load_rows(str(out / "text.jsonl"), "prefs")
    tok = load_tokenizer(base_model.path())
    assert [e["target"] for e in tokenize_preferences(loaded, tok, 64)] == [1.0, 0.5]


def test_skip_undo_and_resume(tmp_path):
    out, pairs = _folder(tmp_path)
    store = _store(out, pairs)
    assert store.state("ada")["pair"] == 0
    store.record("ada", 0, "skip")
    store.record("ada", 1, "left")
    state = store.record("ada", None, "undo")  # takes back the judgement of pair 1
    assert (state["pair"], state["done"], state["skipped"]) == (1, 1, 1)
    assert _prefs(out) == []  # a skip writes no row
    store.record("ada", 1, "tie")
    with pytest.raises(UserError, match="not the one shown"):
        store.record("ada", 1, "left")  # a double press: pair 1 is judged already
    store.record("bob", 0, "right")

    again = _store(out, prepare(out, None))  # a restart: the log is replayed
    assert again.state("ada") == store.state("ada") and again.state("bob")["pair"] == 1
    assert _prefs(out) == pair_rows(pairs, [Judgement("ada", 1, "tie"), Judgement("bob", 0, "right")])
    again.record("ada", None, "undo")
    again.record("ada", None, "undo")  # back to before the skip
    assert again.state("ada")["pair"] == 0


def test_agreement_hand_computed():
    made = replay([
        {"labeller": "a", "pair": 0, "choice": "left"}, {"labeller": "b", "pair": 0, "choice": "left"},
        {"labeller": "a", "pair": 1, "choice": "tie"}, {"labeller": "b", "pair": 1, "choice": "right"},
        {"labeller": "a", "pair": 2, "choice": "skip"}, {"labeller": "b", "pair": 2, "choice": "left"},
        {"labeller": "a", "pair": 3, "choice": "right"}, {"labeller": "b", "pair": 3, "choice": "right"},
        {"labeller": "c", "pair": 4, "choice": "left"}, {"labeller": "b", "pair": 3, "choice": "undo"},
    ])  # fmt: skip
    # a and b share pairs 0 and 1 (a skipped 2, b's 3 was undone): same on 0 only
    assert agreement(made) == {
        "a|b": {"n": 2, "rate": 0.5},
        "a|c": {"n": 0, "rate": None},
        "b|c": {"n": 0, "rate": None},
    }


def test_torn_last_line_is_cut_and_bad_lines_named(tmp_path):
    out, pairs = _folder(tmp_path)
    _store(out, pairs).record("ada", 0, "left")
    log = out / LOG_FILE
    whole = log.read_bytes()
    log.write_bytes(whole + b'{"labeller": "ada", "pair": 1, "cho')  # a write cut by a crash
    store = _store(out, pairs)
    assert log.read_bytes() == whole and store.state("ada")["pair"] == 1
    log.write_bytes(whole + b'{"labeller": "ada", "pair": 99, "choice": "left"}\n')
    with pytest.raises(DataError, match=r"judgements.jsonl:2: not a judgement"):
        _store(out, pairs)


def test_other_pairs_in_the_same_folder_are_refused(tmp_path):
    out, _ = _folder(tmp_path)
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"prompt": "x", "responses": ["a", "b"]}) + "\n")
    with pytest.raises(UserError, match="already labels other pairs"):
        prepare(out, other)


WRITER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from postrl.label.pairs import pair_rows, read_pairs
    from postrl.label.store import LabelStore
    out = Path(sys.argv[1])
    pairs = read_pairs(out / "pairs.jsonl")
    store = LabelStore(out, len(pairs), lambda js: pair_rows(pairs, js))
    print("ready", flush=True)
    for k in range(10**6):
        name = f"l{k % 3}"
        nxt = store.next_pair(name)
        store.record(name, nxt, "left" if k % 4 else "tie") if nxt is not None else store.record(name, None, "undo")
""")


def test_sigkill_mid_write_never_corrupts(tmp_path):
    """SIGKILL a process that records judgements as fast as it can, at several moments; after each kill the
    log replays, and the preferences file is complete and equals the rows of the log (or of the log one event
    short: the kill fell between the log's fsync and the rename)."""
    pairs = [{"prompt": f"p{i}", "responses": [f"a{i} " * 50, f"b{i} " * 50]} for i in range(40)]
    out, pairs = _folder(tmp_path, pairs)
    for delay in (0.05, 0.17, 0.3):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(out)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        from postrl.label.store import read_log

        events = read_log(out / LOG_FILE, len(pairs), repair=False)  # as the kill left it
        rows = _prefs(out)  # parses: never half a file
        made = replay(events)
        standing = lambda m: [j for n in sorted(m) for j in m[n] if j.choice != "skip"]  # noqa: E731
        expected = [pair_rows(pairs, standing(made)), pair_rows(pairs, standing(replay(events[:-1])))]
        assert rows in expected
        _store(out, pairs)  # reopens (and would cut a torn line)
    assert len(events) > 20  # the kills fell among many writes
