"""The built-in aligned VLM: the tiny LLaVA that `postrl vlm-pretrain` builds and aligns on captions of the
shapes pictures with `recipe()`, shipped as package data beside this file so that `postrl demo` starts its
vision branch from an aligned model in a second instead of aligning it for minutes. `postrl demo
--from-scratch` runs the same recipe itself.

The files here (config.json, model.safetensors, tokenizer.json, processor_config.json, ...) are a
`save_pretrained` folder with its processor: `AutoModelForImageTextToText.from_pretrained(folder)` and
`AutoProcessor.from_pretrained(folder)` load it. provenance.json records how it was made: the `postrl
vlm-pretrain` command, the resolved config, the held-out caption loss, the time and the weights' SHA-256.
To make it again:

    OMP_NUM_THREADS=1 python -m postrl.lm.vlm.base_model            # writes into this folder
    OMP_NUM_THREADS=1 python -m postrl.lm.vlm.base_model --out DIR  # elsewhere, to compare

On one thread of the same torch build the run is deterministic, so the weights' checksum repeats.

What it knows: captions ("Describe the picture." → "3 red dots"), so its vision features and projector are
tied to the language model, but never a question of the task: it scores near chance on task:shapes until
SFT shows it the questions and their answers.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from postrl.lm import base_model as text_base_model
from postrl.lm.vlm.train import VLMPretrainConfig

PROVENANCE = text_base_model.PROVENANCE
WEIGHTS = text_base_model.WEIGHTS
FILES = ("config.json", WEIGHTS, "tokenizer.json", "processor_config.json")


def recipe(seed: int = 0) -> VLMPretrainConfig:
    """The alignment config of the built-in VLM (and of `postrl demo --from-scratch`'s vlm-align stage):
    `postrl vlm-pretrain`'s defaults (600 steps; held-out caption loss 1.24 at 100, 0.41 at 200, 0.13 at
    600) on one thread."""
    default = VLMPretrainConfig()
    return replace(default, run=replace(default.run, seed=seed, threads=1))


def path() -> Path:
    """The folder of the shipped aligned VLM (inside the installed package)."""
    return Path(str(resources.files("postrl.lm.vlm") / "base_model"))


def provenance(folder: Path | None = None) -> dict[str, Any]:
    """provenance.json (command, config, held-out loss, seconds, SHA-256), or {} if missing."""
    return text_base_model.provenance(folder or path())


def is_available(folder: Path | None = None) -> bool:
    """Whether the weights, config, tokenizer and processor files are present."""
    folder = folder or path()
    return all((folder / name).is_file() for name in FILES)


def command(cfg: VLMPretrainConfig) -> str:
    """The `postrl vlm-pretrain` command that runs ``cfg``."""
    return text_base_model.command(cfg, "vlm-pretrain", VLMPretrainConfig())


def make(out: Path, seed: int = 0) -> dict[str, Any]:
    """Align `recipe(seed)` in a temporary run folder, copy its model into ``out`` with provenance.json."""
    from postrl.lm.vlm.train import run_vlm_pretrain  # deferred: torch and transformers

    cfg = recipe(seed)
    keys = ("heldout_loss", "steps", "train_examples", "peak_rss_mb")
    return text_base_model.make_with(out, cfg, run_vlm_pretrain, command(cfg), keys)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m postrl.lm.vlm.base_model", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", default=None, help="folder to write (default: the package's folder)")
    parser.add_argument("--seed", type=int, default=0, help="alignment seed (the shipped model: 0)")
    args = parser.parse_args(argv)
    record = make(Path(args.out) if args.out else path(), args.seed)
    print(json.dumps(record, indent=2))
    return 0
