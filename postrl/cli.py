"""The ``postrl`` command. Each family of subcommands lives beside its code and registers itself here;
imports of torch (and transformers, gymnasium) happen inside the handlers, so ``--help`` is instant."""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from postrl import __version__
from postrl.control.commands import add_control_command as control
from postrl.feedback.command import add_loop_command as loop
from postrl.label.commands import add_label_command as label
from postrl.lm.commands import add_data_command as data
from postrl.lm.judges.command import add_judge_command as judge
from postrl.lm.stage_commands import add_stage_commands as lm_stages
from postrl.runtime import notices
from postrl.runtime.config import format_help, load_config, to_dict
from postrl.runtime.errors import UserError

# Before torch loads (it reads this once): allocations of 2 MB and more are 2 MB-aligned and advised to the
# kernel's transparent huge pages. A backward allocates its largest gradients afresh (a 49k-token embedding's
# is 113 MB, a 152k-token one's 545 MB): on 4 KB pages each is tens of thousands of page faults, 40-230 ms
# per 113 MB here, 11-23 ms on huge pages; a DPO step on the SmolLM-135M shape 15-25% faster, its peak
# resident memory lower (benchmarks/real_size.py). THP_MEM_ALLOC_ENABLE=0 in the environment turns it off.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one `postrl: error:` line (like every other user error) that points at
    the command's --help instead of printing its usage, with a suggestion for a mistyped subcommand."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        if "invalid choice" in message and self._subparsers is not None:
            choices = [c for a in self._subparsers._group_actions for c in (a.choices or {})]
            bad = message.split("'")[1] if "'" in message else ""
            close = difflib.get_close_matches(bad, choices, n=1)
            if close:
                message += f"; did you mean '{close[0]}'?"
        self.exit(2, f"postrl: error: {message} (`{self.prog} --help` lists the options)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="postrl",
        description="Reinforcement learning from policy gradients to LLM post-training.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"postrl {__version__}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also print postrl's informational lines (which fast path, decoder or backend runs, and why)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for register in _registrars():
        register(sub)
    return parser


def _log_info_to_stderr() -> None:
    """`--verbose`: postrl's INFO records on stderr as ``postrl: …`` lines (warnings print either way)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("postrl: %(message)s"))
    logger = logging.getLogger("postrl")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def _registrars() -> list:
    return [control, data, judge, lm_stages, label, loop, _add_demo]


def _add_demo(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser(
        "demo",
        help="the whole pipeline on the built-in world: pretrain → SFT → RM → PPO → GRPO → report",
        description="Run the notes' pipeline on the built-in tiny LM and tasks, evaluate every checkpoint "
        "on held-out prompts and write RUN_DIR/report.md, report.html and summary.json. Rerunning the "
        "same command skips finished stages and resumes an interrupted one.",
    )
    demo.add_argument("--out", default="runs/demo", metavar="RUN_DIR", help="output folder (runs/demo)")
    demo.add_argument("--quick", action="store_true", help="small budgets, same stages (about a minute)")
    demo.add_argument(
        "--from-scratch",
        action="store_true",
        help="pretrain the tiny LM here (minutes) instead of starting from the built-in base model",
    )
    demo.add_argument(
        "--resume",
        action="store_true",
        help="redo a finished demo's evaluation and report (finished stages are skipped); an interrupted "
        "demo resumes without it",
    )
    demo.add_argument(
        "--overwrite", action="store_true", help="delete the demo in RUN_DIR and run it again from scratch"
    )
    demo.add_argument("--config", default=None, metavar="FILE.yaml", help="YAML config")
    demo.add_argument("--list-keys", action="store_true", help="print every config key and exit")
    demo.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    demo.set_defaults(handler=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    from postrl.demo import DemoConfig, quick, run_demo  # deferred: torch (`postrl --help` has none)

    if args.list_keys:
        print(format_help(DemoConfig))
        return 0
    base = to_dict(quick(DemoConfig())) if args.quick else None
    overrides = [*args.overrides, "from_scratch=true"] if args.from_scratch else args.overrides
    cfg = load_config(DemoConfig, args.config, overrides, base=base)
    run_demo(cfg, args.out, resume=args.resume, overwrite=args.overwrite)  # prints verdicts, report path
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    # transformers' own per-file bars ("Loading weights", "Writing model shards") drown postrl's
    # stage bars; the user can turn them back on by setting the variable to 0.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may also come after a flag (`--out D seed=1 --resume grpo.run.steps=70`), which
    # argparse leaves over once the positional list has been read
    late = [e for e in extra if "=" in e and not e.startswith("-")]
    if late and isinstance(getattr(args, "overrides", None), list):
        args.overrides += late
        extra = [e for e in extra if e not in late]
    if extra:  # the command's own parser says it, so the hint names `postrl COMMAND --help`
        commands = parser._subparsers._group_actions[0].choices if parser._subparsers else {}
        commands.get(getattr(args, "command", None), parser).error(
            f"unrecognized arguments: {' '.join(extra)}"
        )
    if args.verbose:
        _log_info_to_stderr()
    notices.discard()
    try:
        return int(args.handler(args) or 0)
    except UserError as err:
        notices.discard()  # what the checks noticed before the input was refused is moot
        print(f"postrl: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `postrl sft --list-keys | head`
        return 0
    except KeyboardInterrupt:
        print(
            "\npostrl: interrupted; rerun the same command to resume from the last checkpoint",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
