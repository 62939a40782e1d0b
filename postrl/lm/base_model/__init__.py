"""The built-in base model: the tiny Llama that `postrl pretrain` makes from scratch with `recipe()`, shipped
as package data beside this file so that `postrl demo` starts from a pretrained LM in a second instead of
pretraining for minutes (and without the luck of one pretraining seed). `postrl demo --from-scratch` runs the
same recipe itself.

The files here (config.json, model.safetensors, tokenizer.json, ...) are a `save_pretrained` folder that any
Hugging Face tool loads; provenance.json records how they were made: the `postrl pretrain` command, the
resolved config, the held-out loss, the time and the weights' SHA-256. To make them again:

    OMP_NUM_THREADS=1 python -m postrl.lm.base_model            # writes into this folder
    OMP_NUM_THREADS=1 python -m postrl.lm.base_model --out DIR  # elsewhere, to compare

On one thread of the same torch build the run is deterministic, so the weights' checksum repeats.

What it knows: the corpus (`postrl.lm.tasks.corpus`) holds the arithmetic task's train problems as bare
equations, "41+38: 79" (every one once per round, a random sign before the result), beside review text and
generic sentences, but not the sums that carry from their units digits (47+38). The base model has learnt
to add 2-digit numbers without carrying and the reviews' language, but has never seen the task's question
format ("What is 47+38?" → " 85"), so it scores about 0 on the task until SFT shows it the format, and the
sums that carry are left for SFT and RL to teach: pretraining does not already solve the task that SFT and
RL are measured on.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from postrl.lm.pretrain import PretrainConfig
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig, TrainConfig
from postrl.runtime.config_values import to_dict

PROVENANCE = "provenance.json"
WEIGHTS = "model.safetensors"


def recipe(seed: int = 0) -> PretrainConfig:
    """The pretraining config of the built-in base model (and of `postrl demo --from-scratch`)."""
    return PretrainConfig(
        arithmetic={"digits": 2, "ops": "+"},
        equations="rounds",
        carries=False,
        train=TrainConfig(batch_size=32, max_length=128, packing=True),
        optim=OptimConfig(lr=3e-3, warmup_steps=50, weight_decay=0.1),
        run=RunConfig(steps=800, eval_every=200, save_every=200, seed=seed, threads=1),
    )


def path() -> Path:
    """The folder of the shipped base model (inside the installed package)."""
    return Path(str(resources.files("postrl.lm") / "base_model"))


def provenance(folder: Path | None = None) -> dict[str, Any]:
    """The base model's provenance.json (command, config, held-out loss, seconds, SHA-256), or {} if missing."""
    file = (folder or path()) / PROVENANCE
    return json.loads(file.read_text()) if file.is_file() else {}


def is_available(folder: Path | None = None) -> bool:
    """Whether the base model's weights, config and tokenizer are present."""
    folder = folder or path()
    return all((folder / name).is_file() for name in ("config.json", WEIGHTS, "tokenizer.json"))


def sha256(file: Path) -> str:
    return hashlib.sha256(file.read_bytes()).hexdigest()


def overrides(cfg: Any, defaults: Any = None) -> list[str]:
    """``key=value`` overrides that turn ``defaults`` (a stage config; default: `postrl pretrain`'s) into
    ``cfg`` (nested keys dotted)."""
    changed: list[str] = []

    def walk(ours: dict, defaults: dict, prefix: str) -> None:
        for key, value in ours.items():
            default = defaults.get(key)
            if isinstance(value, dict) and isinstance(default, dict) and default:  # a nested config
                walk(value, default, f"{prefix}{key}.")
            elif value != default:
                changed.append(f"{prefix}{key}={value if isinstance(value, str) else json.dumps(value)}")

    walk(to_dict(cfg), to_dict(PretrainConfig() if defaults is None else defaults), "")
    return changed


def command(cfg: Any, stage: str = "pretrain", defaults: Any = None) -> str:
    """The shell command `postrl STAGE` that runs ``cfg`` (each override quoted for the shell)."""
    parts = ["postrl", stage, "--out", "RUN_DIR", *overrides(cfg, defaults)]
    return " ".join(shlex.quote(part) for part in parts)


def make(out: Path, seed: int = 0) -> dict[str, Any]:
    """Pretrain `recipe(seed)` in a temporary run folder, copy its model into ``out`` with provenance.json."""
    from postrl.lm.pretrain import run_pretrain  # deferred: torch and transformers

    cfg = recipe(seed)
    return make_with(
        out, cfg, run_pretrain, command(cfg), ("heldout_loss", "steps", "n_params", "peak_rss_mb")
    )


def make_with(
    out: Path, cfg: Any, run: Callable[[Any, Path], dict[str, Any]], made_by: str, keys: tuple[str, ...]
) -> dict[str, Any]:
    """Run ``run(cfg, run_dir)`` in a temporary folder, copy its ``model`` into ``out`` and write
    provenance.json: the command ``made_by``, the config, the summary's ``keys``, the time, the weights'
    SHA-256. Returns the record."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="postrl-base-") as tmp:
        started = time.perf_counter()
        summary = run(cfg, Path(tmp) / "run")
        seconds = time.perf_counter() - started
        for file in (Path(tmp) / "run" / "model").iterdir():
            shutil.copy2(file, out / file.name)
    record = {"command": made_by, "config": to_dict(cfg), **{k: summary.get(k) for k in keys}}
    record |= {"seconds": round(seconds, 1), "torch": __import__("torch").__version__}
    record["sha256"] = sha256(out / WEIGHTS)
    (out / PROVENANCE).write_text(json.dumps(record, indent=2) + "\n")
    return record


def install(source: Path, run_dir: Path) -> None:
    """Copy a shipped model folder ``source`` (its data files) to ``run_dir/model``, replacing any there."""
    tmp = run_dir / ".tmp-model"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(run_dir / "model", ignore_errors=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, tmp, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    tmp.rename(run_dir / "model")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m postrl.lm.base_model", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--out", default=None, help="folder to write (default: the package's base_model folder)"
    )
    parser.add_argument("--seed", type=int, default=0, help="pretraining seed (the shipped model: 0)")
    args = parser.parse_args(argv)
    record = make(Path(args.out) if args.out else path(), args.seed)
    print(json.dumps(record, indent=2))
    return 0
