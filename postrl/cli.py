"""The ``postrl`` command. Each family of subcommands lives beside its code and registers itself here;
heavy imports (torch, transformers, gymnasium) happen inside the handlers, so ``--help`` is instant."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence

from postrl import __version__
from postrl.runtime.errors import UserError


class _Parser(argparse.ArgumentParser):
    """argparse with a suggestion for a mistyped subcommand."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if "invalid choice" in message and self._subparsers is not None:
            choices = [c for a in self._subparsers._group_actions for c in (a.choices or {})]
            bad = message.split("'")[1] if "'" in message else ""
            close = difflib.get_close_matches(bad, choices, n=1)
            if close:
                message += f"; did you mean '{close[0]}'?"
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="postrl",
        description="Reinforcement learning from policy gradients to LLM post-training.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"postrl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for register in _registrars():
        register(sub)
    return parser


def _registrars() -> list:
    from postrl.control.commands import add_parser as control
    from postrl.lm.commands import add_parser as data
    from postrl.lm.stage_commands import add_parser as lm_stages

    return [control, data, lm_stages]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except UserError as err:
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
