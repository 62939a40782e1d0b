"""``postrl loop``: the preference loop from the command line (`postrl.feedback.rounds`)."""

from __future__ import annotations

import argparse
import json

DESCRIPTION = """\
Rounds of: sample pairs from the current policy, label them (labeller=synthetic, page, or a judge spec),
train the reward model on every label so far, update the policy (policy_stage=dpo or ppo), report the gold
reward, the KL to the start and the reward model's accuracy on the policy's own samples (OUT/rounds.jsonl).
An interrupted loop continues with --resume; with labeller=page it stops at each round's labelling and says
which `postrl label` command to run.

  postrl loop --out runs/loop model=runs/demo/sft/model rounds=3 labels_per_round=200
"""


def add_loop_command(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "loop",
        help="the preference loop: sample pairs → label → reward model → policy, round after round",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default="runs/loop", metavar="DIR", help="the loop's folder (runs/loop)")
    p.add_argument("--config", default=None, metavar="FILE.yaml", help="YAML config")
    p.add_argument("--resume", action="store_true", help="continue the loop in DIR")
    p.add_argument("--overwrite", action="store_true", help="delete DIR's loop and start again")
    p.add_argument("--list-keys", action="store_true", help="print every config key and exit")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    p.set_defaults(handler=_loop)


def _loop(args: argparse.Namespace) -> int:
    from pathlib import Path

    from postrl.api import run_stage
    from postrl.feedback.config import LoopConfig
    from postrl.feedback.rounds import run_loop  # deferred: torch
    from postrl.runtime.config import format_help, load_config

    if args.list_keys:
        print(format_help(LoopConfig))
        return 0
    saved = Path(args.out) / "config.yaml"
    path = args.config or (saved if args.resume and saved.is_file() else None)
    cfg = load_config(LoopConfig, path, args.overrides)
    summary = run_loop(cfg, args.out, run_stage, resume=args.resume, overwrite=args.overwrite)
    if "final" in summary:
        print(json.dumps(summary["final"]))
    return 0
