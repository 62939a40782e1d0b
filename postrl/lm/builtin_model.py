"""A model postrl ships as package data: a `save_pretrained` folder named ``base_model`` beside the module
that describes it, with provenance.json saying how it was made and the recipe that makes it again.

There are two, one object each: `postrl.lm.base_model.BASE_LM` (the tiny Llama that `postrl pretrain`
makes) and `postrl.lm.vlm.base_model.BASE_VLM` (the tiny LLaVA that `postrl vlm-pretrain` aligns). What
differs between them is data (the stage that makes it, its recipe, the files it needs, the summary keys
provenance.json keeps); what they do is `BuiltinModel`'s.
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
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from postrl.runtime.config_values import to_dict

PROVENANCE = "provenance.json"
WEIGHTS = "model.safetensors"


@dataclass(frozen=True)
class BuiltinModel:
    """One shipped model: where it lies, how to check it and how to make it again."""

    package: str
    """The package whose ``base_model`` folder holds the files, e.g. ``postrl.lm``."""
    stage: str
    """The `postrl STAGE` command that makes it, e.g. ``pretrain``."""
    recipe: Callable[[int], Any]
    """seed → the stage config that makes it."""
    config_class: type
    """The stage's config class: `command` lists the recipe's changes to its defaults."""
    run: Callable[[Any, Path], dict[str, Any]]
    """The stage's ``run(cfg, run_dir)`` returning its summary."""
    keys: tuple[str, ...]
    """The summary's keys that provenance.json records."""
    files: tuple[str, ...]
    """The files that must be present for the model to load."""
    description: str = ""
    """What ``python -m PACKAGE.base_model --help`` says it makes."""

    def path(self) -> Path:
        """The folder of the shipped model (inside the installed package)."""
        return Path(str(resources.files(self.package) / "base_model"))

    def provenance(self, folder: Path | None = None) -> dict[str, Any]:
        """provenance.json (command, config, held-out loss, seconds, SHA-256), or {} if missing."""
        file = (folder or self.path()) / PROVENANCE
        return json.loads(file.read_text()) if file.is_file() else {}

    def is_available(self, folder: Path | None = None) -> bool:
        """Whether the weights, config, tokenizer (and any processor) files are present."""
        folder = folder or self.path()
        return all((folder / name).is_file() for name in self.files)

    def command(self, cfg: Any) -> str:
        """The `postrl STAGE` command that runs ``cfg``."""
        return stage_command(cfg, self.stage, self.config_class())

    def make(self, out: Path, seed: int = 0) -> dict[str, Any]:
        """Run `recipe(seed)` in a temporary run folder, copy its model into ``out`` with provenance.json."""
        cfg = self.recipe(seed)
        return make_with(out, cfg, self.run, self.command(cfg), self.keys)

    def main(self, argv: list[str] | None = None) -> int:
        """``python -m PACKAGE.base_model [--out DIR] [--seed N]``: make it, print provenance.json's record."""
        parser = argparse.ArgumentParser(
            prog=f"python -m {self.package}.base_model", description=self.description
        )
        parser.add_argument(
            "--out", default=None, help="folder to write (default: the package's base_model folder)"
        )
        parser.add_argument("--seed", type=int, default=0, help=f"{self.stage} seed (the shipped model: 0)")
        args = parser.parse_args(argv)
        record = self.make(Path(args.out) if args.out else self.path(), args.seed)
        print(json.dumps(record, indent=2))
        return 0


def sha256(file: Path) -> str:
    return hashlib.sha256(file.read_bytes()).hexdigest()


def overrides(cfg: Any, defaults: Any) -> list[str]:
    """``key=value`` overrides that turn ``defaults`` (a stage config) into ``cfg`` (nested keys dotted)."""
    changed: list[str] = []

    def walk(ours: dict, defaults: dict, prefix: str) -> None:
        for key, value in ours.items():
            default = defaults.get(key)
            if isinstance(value, dict) and isinstance(default, dict) and default:  # a nested config
                walk(value, default, f"{prefix}{key}.")
            elif value != default:
                changed.append(f"{prefix}{key}={value if isinstance(value, str) else json.dumps(value)}")

    walk(to_dict(cfg), to_dict(defaults), "")
    return changed


def stage_command(cfg: Any, stage: str, defaults: Any) -> str:
    """The shell command `postrl STAGE` that runs ``cfg`` (each override quoted for the shell)."""
    parts = ["postrl", stage, "--out", "RUN_DIR", *overrides(cfg, defaults)]
    return " ".join(shlex.quote(part) for part in parts)


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
