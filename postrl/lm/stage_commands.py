"""``postrl <stage>`` for every stage of the registry (`postrl.lm.stages`), and ``postrl generate``.

Config precedence: the stage's defaults, then ``--config FILE.yaml``, then the flags (``--model``,
``--data``, ...), then ``key=value`` overrides. ``--list-keys`` prints every key with its help.
Imports of torch and transformers happen inside the handlers, so ``postrl --help`` stays instant.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from postrl.lm.stages import STAGES
from postrl.runtime.config import format_help, load_config
from postrl.runtime.errors import UserError


def stage_config(name: str, args: argparse.Namespace) -> Any:
    """The resolved config of stage ``name`` from its command line (or the run folder on --resume)."""
    stage = STAGES[name]
    cls, flags = stage.config_class(), stage.flags
    path = args.config
    if args.resume and path is None and (Path(args.out) / "config.yaml").is_file():
        path = Path(args.out) / "config.yaml"
    overrides = [
        f"{key}={getattr(args, _dest(flag))}"
        for flag, key in flags.items()
        if getattr(args, _dest(flag)) is not None
    ]
    overrides += ["trust_remote_code=true"] if getattr(args, "trust_remote_code", False) else []
    cfg = load_config(cls, path, [*overrides, *args.overrides])
    own = path is not None and Path(path).resolve() == (Path(args.out) / "config.yaml").resolve()
    if args.resume and own:  # the run folder's config: trusted no more
        from postrl.runtime.config import to_dict  # than a script (deferred, as every torch import here)
        from postrl.runtime.run_inputs import check_resume

        given = {item.split("=", 1)[0].split(".", 1)[0].strip() for item in [*overrides, *args.overrides]}
        check_resume(Path(args.out), to_dict(cfg), given, name)
    return cfg


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _run_stage(name: str):
    def handler(args: argparse.Namespace) -> int:
        stage = STAGES[name]
        if args.list_keys:
            print(format_help(stage.config_class()))
            return 0
        if args.dry_run:  # the config and the memory estimate only: nothing loaded, nothing written
            from postrl.lm.estimate import check_fits  # deferred, as every torch import here

            line = check_fits(name, stage_config(name, args), dry_run=True)
            print(f"postrl {name}: " + (f"{line}: it fits" if line else "no memory estimate for this stage"))
            return 0
        if args.out is None:
            raise UserError(f"postrl {name}: --out RUN_DIR is required (a new folder, or a run to --resume)")
        from postrl.lm.estimate import check_fits  # deferred, as every torch import here
        from postrl.runtime import distributed as dist

        cfg = stage_config(name, args)
        check_fits(name, cfg)  # refuses, with the estimate, a run that would not fit (run.memory.check)
        run = stage.run_function()
        summary = run(cfg, args.out, resume=args.resume, overwrite=args.overwrite)
        if dist.is_main():  # under torchrun, one summary line
            print(json.dumps(summary))
        dist.cleanup()
        return 0

    return handler


def add_stage_parser(subparsers: Any, name: str) -> argparse.ArgumentParser:
    """One training stage's parser: its flags, --config, --out, --resume, --list-keys, key=value."""
    help_text, flags = STAGES[name].help, STAGES[name].flags
    parser = subparsers.add_parser(
        name,
        help=help_text,
        description=help_text[0].upper()
        + help_text[1:]
        + ". Any config key can be overridden as key=value (--list-keys).",
    )
    for flag, key in flags.items():
        parser.add_argument(flag, default=None, help=f"sets the config key '{key}'")
    parser.add_argument("--out", default=None, metavar="RUN_DIR", help="run folder (required)")
    parser.add_argument("--config", default=None, metavar="FILE.yaml", help="YAML config")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in RUN_DIR from its last intact checkpoint, with its config.yaml and any "
        "key=value overrides (e.g. more steps); a run killed before its first checkpoint starts over",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start over in a RUN_DIR that holds a run: the old run is deleted once the new input is checked",
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run the model folder's own code (trust_remote_code=true); a resume needs it again",
    )
    parser.add_argument("--list-keys", action="store_true", help="print every config key and exit")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check the config, print its peak-memory estimate against the available memory and exit "
        "(an error if it would not fit); nothing is loaded or written",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    parser.set_defaults(handler=_run_stage(name))
    return parser


def _chat_prompts(tokenizer: Any, prompts: Sequence[str], system: str | None, flag: str) -> list[str]:
    """Each prompt as a user turn (after a ``system`` turn when given) through the tokenizer's chat template,
    with the generation prompt: the rendering the trainers use for conversational data (`render_rows`).
    ``flag`` names the option in the error a tokenizer without a chat template gets."""
    from postrl.lm.data import DataError, render_rows

    if getattr(tokenizer, "chat_template", None) is None:
        raise UserError(
            f"postrl generate {flag}: the tokenizer has no chat template, so prompts cannot be rendered as "
            f"chat turns; drop {flag}, or give --tokenizer a tokenizer that has one"
        )
    turns = [{"role": "system", "content": system}] if system is not None else []
    rows = [{"prompt": [*turns, {"role": "user", "content": p}]} for p in prompts]
    try:
        return [r["prompt"] for r in render_rows(rows, "prompts", tokenizer)]
    except DataError as err:  # e.g. a template that refuses a system turn
        raise UserError(f"postrl generate {flag}: {err}") from None


def _generate(args: argparse.Namespace) -> int:
    from postrl.lm.evaluation import complete
    from postrl.lm.models import check_vocab, load_causal_lm
    from postrl.lm.tokenizer import load_tokenizer

    if args.max_new_tokens < 1:
        raise UserError(f"postrl generate --max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise UserError(f"postrl generate --temperature must be a finite number >= 0, got {args.temperature}")
    tokenizer = load_tokenizer(args.tokenizer or args.model, trust_remote_code=args.trust_remote_code)
    prompts: Sequence[str] = args.prompt
    if args.chat or args.system is not None:
        flag = "--system" if args.system is not None and not args.chat else "--chat"
        prompts = _chat_prompts(tokenizer, prompts, args.system, flag)
    model = load_causal_lm(args.model, trust_remote_code=args.trust_remote_code)
    check_vocab(model, tokenizer, "--tokenizer" if args.tokenizer else "--model")
    texts = complete(
        model,
        tokenizer,
        prompts,
        max_new_tokens=args.max_new_tokens,
        greedy=args.temperature == 0,
        temperature=args.temperature or 1.0,
        seed=args.seed,
    )
    for prompt, text in zip(prompts, texts, strict=True):
        print(f"{prompt}{text}")
    return 0


def add_stage_commands(subparsers: Any) -> None:
    """Register pretrain, sft and generate."""
    for name in STAGES:
        add_stage_parser(subparsers, name)
    gen = subparsers.add_parser("generate", help="complete prompts with a causal LM")
    gen.add_argument("--model", required=True, help="model folder or hub name")
    gen.add_argument("--tokenizer", default=None, help="tokenizer (default: the model's)")
    gen.add_argument("--prompt", action="append", required=True, help="a prompt (repeatable)")
    gen.add_argument(
        "--chat",
        action="store_true",
        help="send each prompt as a user turn through the tokenizer's chat template (generation prompt added); "
        "the output shows the rendered prompt",
    )
    gen.add_argument(
        "--system", default=None, metavar="TEXT", help="a system turn before each prompt (implies --chat)"
    )
    gen.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate (default 32)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--seed", type=int, default=0, help="sampling seed")
    gen.add_argument("--trust-remote-code", action="store_true", help="run the model repo's own code")
    gen.set_defaults(handler=_generate)
