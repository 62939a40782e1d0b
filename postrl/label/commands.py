"""``postrl label``: the labelling page for people (`postrl.label.app`), from a pairs file or from pairs it
samples (two responses per prompt of a model folder, or two segments of a Gymnasium env)."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from postrl.runtime.errors import UserError

DESCRIPTION = """\
Serve a page on which people compare pairs, one at a time: a prompt and two responses (language models), or
two clips of a Gymnasium env's behaviour (segments). Each judgement (left, right, tie, skip; undo takes the
last back) is written to DIR before the page moves on: DIR/judgements.jsonl (the log) and
DIR/preferences.jsonl, in TRL's format (prompt/chosen/rejected, target 0.5 for a tie) that `postrl rm` and
`postrl dpo` read, or for segments the fields `postrl.control.prefs_reward.Pairs.from_rows` reads. Several
labellers, each with a name, can label the same pairs; the page shows their agreement. Rerunning with the
same --out continues where everyone left off.

The pairs come from one of:
  --pairs FILE                  JSONL: {"prompt", "responses": [a, b]} (+ "images"), or segment pairs
  --model DIR --prompts SOURCE  two samples per prompt (a JSONL file or task:reviews)
  --env ID [--policy RUN_DIR]   two segments per pair, rendered as clips (random actions without --policy)
"""


def add_label_command(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "label",
        help="a labelling page for people: compare pairs, write preferences",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, metavar="DIR", help="the labelling folder (made if missing)")
    p.add_argument("--pairs", default=None, metavar="FILE", help="JSONL of pairs to label")
    p.add_argument(
        "--model", default=None, metavar="DIR", help="causal LM folder to sample two responses from"
    )
    p.add_argument(
        "--prompts", default=None, metavar="SOURCE", help="prompts for --model (file or task:NAME)"
    )
    p.add_argument("--env", default=None, metavar="ID", help="Gymnasium id to cut segment pairs from")
    p.add_argument("--policy", default=None, metavar="RUN_DIR", help="control run whose agent acts (--env)")
    p.add_argument("--n", type=int, default=20, help="pairs to make with --model or --env (20)")
    p.add_argument("--length", type=int, default=25, help="steps per segment (--env; 25)")
    p.add_argument("--fps", type=int, default=15, help="frames per second of the clips (--env; 15)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="response length (--model; 48)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (--model; 1.0)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled pairs (0)")
    p.add_argument(
        "--question",
        default=None,
        metavar="TEXT",
        help="what labellers are asked of each pair, e.g. 'Which review is more helpful?' (kept in DIR; default "
        "'Which response is better?' or, for segments, 'Which segment shows the better behaviour?')",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1: this computer only)")
    p.add_argument("--port", type=int, default=8765, help="port (8765)")
    p.add_argument("--no-serve", action="store_true", help="prepare DIR and exit without serving")
    p.set_defaults(handler=_label)


def _check(args: argparse.Namespace) -> None:
    """Refuse a bad command line before DIR is touched."""
    sources = [f for f, v in (("--pairs", args.pairs), ("--model", args.model), ("--env", args.env)) if v]
    if len(sources) > 1:
        raise UserError(f"postrl label: give one of --pairs, --model, --env (got {', '.join(sources)})")
    if bool(args.model) != bool(args.prompts):
        raise UserError("postrl label: --model and --prompts go together (two samples per prompt)")
    if args.policy and not args.env:
        raise UserError("postrl label: --policy needs --env (the env its segments come from)")
    if args.question is not None and not (
        0 < len(args.question.strip()) <= 300 and "\n" not in args.question
    ):
        raise UserError(
            f"postrl label --question {args.question!r}: expected one line of 1 to 300 characters"
        )
    if not 0 < args.port < 65536:
        raise UserError(f"postrl label --port {args.port}: expected 1 to 65535")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"postrl label --out {out}: not a folder")
    if (args.model or args.env) and (out / "pairs.jsonl").is_file():
        raise UserError(
            f"postrl label --out {out} already has pairs; leave out --{'model' if args.model else 'env'} to "
            "continue labelling them, or give a new --out"
        )
    if not sources and not (out / "pairs.jsonl").is_file():
        raise UserError(f"postrl label --out {out}: no pairs there yet; give --pairs, --model or --env")


def _label(args: argparse.Namespace) -> int:
    _check(args)
    try:
        from postrl.label.app import Labelling, serve  # deferred: starlette
    except ImportError as err:
        raise UserError(
            f"postrl label needs the page's web stack ({err}): pip install 'postrl[label]'"
        ) from None
    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="postrl-label-") as tmp:
        pairs_file = Path(args.pairs) if args.pairs else None
        if args.model:
            from postrl.label.sample import sample_lm_pairs  # deferred: torch, transformers

            pairs_file = sample_lm_pairs(
                args.model, args.prompts, Path(tmp) / "pairs.jsonl", args.n, args.max_new_tokens,
                args.temperature, args.seed,
            )  # fmt: skip
        elif args.env:
            from postrl.label.segments import segment_pairs  # deferred: torch, gymnasium

            pairs_file = segment_pairs(
                args.env, Path(tmp) / "pairs.jsonl", args.n, args.length, args.policy, args.seed, args.fps
            )
        labelling = Labelling(out, pairs_file, args.question.strip() if args.question else None)
    if args.no_serve:
        print(f"postrl label: {len(labelling.pairs)} {labelling.kind} pairs ready in {out}")
        return 0
    serve(labelling, args.host, args.port)
    return 0
