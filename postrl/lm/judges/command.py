"""``postrl judge``: label a file of response pairs with a judge, writing TRL preference rows.

    postrl judge --judge rm:runs/rm/model --pairs pairs.jsonl --out prefs.jsonl
    postrl judge --judge lm:runs/judge/model --pairs pairs.jsonl --out prefs.jsonl --constitution rules.txt
    postrl judge --judge openai:http://127.0.0.1:8000/v1 --model NAME --pairs pairs.jsonl --out prefs.jsonl

The pairs file (JSONL) holds ``prompt`` and two responses, as ``first``/``second`` or as a preference file's
``chosen``/``rejected`` (relabelled). The output holds ``prompt``, ``chosen`` (the judge's preferred),
``rejected`` and ``target`` = P(chosen ≻ rejected) ∈ [0.5, 1], as `postrl rm` and `postrl dpo` read it.
Everything is read and checked, and the judge loaded, before the output is written (atomically).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from postrl.runtime.errors import UserError


def read_pairs(path: str) -> list[dict[str, Any]]:
    """``{"prompt", "first", "second", ...}`` per record of ``path``; a record without a prompt and two
    non-empty text responses is a `UserError` naming its file:line."""
    from postrl.lm.data import read_records  # deferred: torch

    if not Path(path).expanduser().is_file():
        raise UserError(f"--pairs {path}: no such file")
    rows = []
    for where, record in read_records(path):
        names = ("first", "second") if "first" in record or "second" in record else ("chosen", "rejected")
        for key in ("prompt", *names):
            value = record.get(key)
            if not isinstance(value, str) or (key != "prompt" and not value.strip()):
                raise UserError(
                    f"{where}: field {key!r}: expected a non-empty string (a pair is prompt + first/second "
                    "or prompt + chosen/rejected)"
                )
        rest = {k: v for k, v in record.items() if k not in ("prompt", *names, "target", "margin")}
        rows.append(
            {"prompt": record["prompt"], "first": record[names[0]], "second": record[names[1]], **rest}
        )
    if not rows:
        raise UserError(f"--pairs {path}: no pairs in the file")
    return rows


def read_constitution(value: str | None) -> list[str] | None:
    """The principles: a file with one per line, or the text itself with principles separated by ``;``."""
    if value is None:
        return None
    path = Path(value).expanduser()
    lines = path.read_text().splitlines() if path.is_file() else value.split(";")
    principles = [line.strip() for line in lines if line.strip()]
    if not principles:
        raise UserError(f"--constitution {value!r}: no principle in it")
    return principles


def run_judge(args: argparse.Namespace) -> int:
    """Judge every pair of ``--pairs`` and write ``--out``."""
    from postrl.lm.data import write_jsonl  # deferred: torch
    from postrl.lm.judges.base import check_probabilities, preference_rows
    from postrl.lm.judges.loading import load_judge
    from postrl.runtime.rundir import check_can_create

    if args.batch_size < 1:
        raise UserError(f"postrl judge --batch-size must be >= 1, got {args.batch_size}")
    out = Path(args.out)
    if out.is_dir():
        raise UserError(f"postrl judge --out {out} is a folder; give a file name (e.g. {out}/prefs.jsonl)")
    check_can_create(out, "postrl judge --out")
    rows = read_pairs(args.pairs)
    judge = load_judge(
        args.judge, device=args.device, constitution=read_constitution(args.constitution), model=args.model,
        batch_size=args.batch_size,
    )  # fmt: skip
    p = check_probabilities(
        judge([r["prompt"] for r in rows], [r["first"] for r in rows], [r["second"] for r in rows]),
        len(rows),
        args.judge,
    )
    labelled = preference_rows(rows, p, hard=args.hard)
    write_jsonl(labelled, out)
    firsts = sum(x >= 0.5 for x in p)
    print(f"judged {len(rows)} pairs with {args.judge}: first preferred in {firsts}; wrote {out}")
    return 0


def add_judge_command(subparsers: Any) -> None:
    """Register ``postrl judge``."""
    judge = subparsers.add_parser(
        "judge",
        help="label response pairs with a judge (reward model, causal LM, OpenAI-compatible endpoint)",
        description=__doc__.split("\n\n")[0] + " Judges: rm:PATH (a postrl rm folder, σ(s1 − s2)), "
        "lm:PATH (a causal LM folder answering A or B, both orders averaged), openai:URL (a chat endpoint), "
        "or a reward function (task:NAME, module:function).",
    )
    judge.add_argument(
        "--judge", required=True, metavar="SPEC", help="rm:PATH, lm:PATH, openai:URL, task:NAME"
    )
    judge.add_argument("--pairs", required=True, metavar="FILE", help="JSONL: prompt + first/second")
    judge.add_argument("--out", required=True, metavar="FILE", help="the preference rows (JSONL) to write")
    judge.add_argument(
        "--constitution", default=None, metavar="FILE_OR_TEXT",
        help="generative judges' principles: a file (one per line) or 'p1; p2'",
    )  # fmt: skip
    judge.add_argument("--model", default=None, help="openai: the served model's name (default: the first)")
    judge.add_argument(
        "--hard", action="store_true", help="reward judges: targets 1/0.5 instead of σ(s1 − s2)"
    )
    judge.add_argument("--device", default="cpu", help="where rm: and lm: judges run (cpu, cuda)")
    judge.add_argument("--batch-size", type=int, default=32, help="pairs per forward of an lm: judge")
    judge.set_defaults(handler=run_judge)
