"""``postrl`` subcommands of the LM world. ``add_data_command(subparsers)`` registers them with the CLI.

    postrl data export --task arithmetic --kind sft --split train --out sft.jsonl [--option digits=3]
    postrl data check --kind prefs FILE.jsonl

Imports of torch happen inside the handlers, so ``postrl --help`` stays instant.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from postrl.lm.tasks import get_task
from postrl.lm.tasks.base import KINDS, SPLITS
from postrl.runtime.errors import UserError

ROW_KINDS = (*KINDS, "kto")
"""The kinds of rows a file can hold: a task's, and KTO's unpaired rows (its preference pairs, unpaired)."""


def _parse_option(text: str) -> tuple[str, Any]:
    """ "key=value" → (key, value), the value read as YAML ("3" → 3, "true" → True, "+-" → "+-")."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        parsed = value
    return key.strip(), value if parsed is None or isinstance(parsed, (dict, list)) else parsed


def run_data_export(args: argparse.Namespace) -> int:
    """Write one task's rows (``--kind``, ``--split``) as JSONL with TRL's columns."""
    from postrl.lm.data import write_jsonl  # deferred: data imports torch, which `postrl --help` must not

    if args.limit is not None and args.limit < 1:
        raise UserError(f"postrl data export --limit must be >= 1, got {args.limit}")
    from postrl.runtime.rundir import check_can_create  # deferred: torch

    out = Path(args.out)
    if out.is_dir():
        raise UserError(
            f"postrl data export --out {out} is a folder; give a file name (e.g. {out}/rows.jsonl)"
        )
    check_can_create(out, "postrl data export --out")
    task = get_task(args.task, **dict(args.option))
    if args.kind == "kto":
        from postrl.lm.data import unpair  # deferred: data imports torch

        rows = unpair(task.rows("prefs", args.split))
    else:
        rows = task.rows(args.kind, args.split)
    if args.limit is not None:
        rows = rows[: args.limit]
    if not rows:
        raise UserError(f"task {args.task!r} has no {args.kind} rows in split {args.split!r}")
    path = write_jsonl(rows, args.out)
    print(f"wrote {len(rows)} {args.kind} rows of {args.task}/{args.split} to {path}")
    return 0


def run_data_check(args: argparse.Namespace) -> int:
    """Validate a data file (or ``task:NAME``) as ``--kind`` rows; a bad record is reported with its line."""
    from postrl.lm.data import load_rows  # deferred: torch

    rows = load_rows(args.source, args.kind, args.split)
    columns = sorted({key for row in rows for key in row})
    print(f"{args.source}: {len(rows)} valid {args.kind} rows; columns: {', '.join(columns)}")
    print("first row: " + json.dumps(rows[0], ensure_ascii=False)[:500])
    return 0


def _add_check_parser(commands: Any) -> None:
    check = commands.add_parser(
        "check",
        help="validate a JSONL/Parquet file (or task:NAME) as sft, prefs or prompts rows",
        description="Read and validate every record; a bad one is reported with its file, line and field.",
    )
    check.add_argument("source", help="a .jsonl/.json/.parquet file, task:NAME, or a datasets name")
    check.add_argument("--kind", required=True, choices=ROW_KINDS, help="which rows the file should hold")
    check.add_argument("--split", default="train", help="split (for task:NAME and datasets names)")
    check.set_defaults(handler=run_data_check)


def _add_data_parser(subparsers: Any) -> None:
    data = subparsers.add_parser("data", help="export the built-in tasks' data, check a data file")
    commands = data.add_subparsers(dest="data_command", metavar="ACTION")
    commands.required = True
    export = commands.add_parser(
        "export",
        help="write a built-in task's rows as JSONL (TRL columns)",
        description="Write a built-in task's rows as JSONL: sft → prompt/completion, prefs → "
        "prompt/chosen/rejected/target, prompts → prompt (+ answer where a verifier exists).",
    )
    export.add_argument("--task", required=True, help="built-in task: arithmetic or reviews")
    export.add_argument("--kind", required=True, choices=ROW_KINDS, help="which rows")
    export.add_argument("--split", default="train", choices=SPLITS, help="train, or the held-out test split")
    export.add_argument("--out", required=True, help="output JSONL file")
    export.add_argument(
        "--option",
        action="append",
        default=[],
        type=_parse_option,
        metavar="KEY=VALUE",
        help="task option, repeatable (e.g. digits=3, ops=+-*, label_noise=0.2, seed=1)",
    )
    export.add_argument("--limit", type=int, default=None, help="write at most this many rows")
    export.set_defaults(handler=run_data_export)
    _add_check_parser(commands)


def add_data_command(subparsers: Any) -> None:
    """Register the LM subcommands on the ``postrl`` command's subparsers."""
    _add_data_parser(subparsers)
