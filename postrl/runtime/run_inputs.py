"""What a run read, recorded in its folder, and what a resume may run: the checks that make ``--resume`` safe.

A run's inputs are the local files and folders its config names (data, eval data, reward files, models,
tokenizers; `input_paths`). :func:`record_inputs` writes each one's content hash to ``RUN_DIR/inputs.json``
when the run starts; :func:`check_inputs` refuses a resume whose inputs changed since (a preference file edited
in place would otherwise train on the checkpoint's stale state, e.g. DPO's stored reference log-probs), naming
the file, before anything in the run folder changes.

A run folder may come from someone else, so its ``config.yaml`` is no more trusted than a script:
:func:`check_resume_code` refuses to resume a config that runs code (``trust_remote_code: true``, reward
functions from files or modules) unless the user names it again on the command line
(``--trust-remote-code``, ``rewards=[...]``). The hashes cannot vouch for that code: whoever edited
``config.yaml`` could edit ``inputs.json`` too; they guard against a change by mistake, and a reward file named
again that differs from the one the run started with is refused as any changed input is.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from postrl.runtime.errors import UserError

INPUTS_FILE = "inputs.json"
BIG_FILE = 256 * 2**20
"""Files larger than this (a big model's weights) are fingerprinted by size and modification time, not read:
hashing gigabytes at every start and resume would cost more than it guards."""
SAFE_REWARDS = ("task:", "rm:", "callable:")
"""Reward specs that run no code from a file or module the config names (a built-in task, a reward model's
weights, a Python function the API caller passes again)."""


def _candidates(value: str) -> Iterator[str]:
    """The local paths ``value`` may name: itself, each part of a comma-separated list, a reward spec's file
    (``file.py:fn``) and a reward model's folder (``rm:PATH``)."""
    for part in value.split(","):
        part = part.strip()
        if part.startswith("rm:"):
            part = part[3:]
        elif ":" in part and part.rsplit(":", 1)[0].endswith(".py"):
            part = part.rsplit(":", 1)[0]
        if part:
            yield part


def input_paths(config: dict[str, Any], run_dir: Path, prefix: str = "") -> list[tuple[str, str]]:
    """``(key, path)`` for every value of plain ``config`` that names an existing local file or folder outside
    ``run_dir`` (what the run writes is no input)."""
    root, found = run_dir.resolve(), []
    for key, value in config.items():
        if isinstance(value, dict):
            found += input_paths(value, run_dir, f"{prefix}{key}.")
            continue
        for item in value if isinstance(value, list) else [value]:
            for part in _candidates(item) if isinstance(item, str) else []:
                path = Path(part).expanduser()
                if path.exists() and root not in (path.resolve(), *path.resolve().parents):
                    found.append((f"{prefix}{key}", part))
    return found


def _file_digest(path: Path, digest: Any) -> None:
    stat = path.stat()
    if stat.st_size > BIG_FILE:
        digest.update(f"size {stat.st_size} mtime_ns {stat.st_mtime_ns}".encode())
        return
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            digest.update(block)


def content_hash(path: Path) -> str:
    """sha256 of a file's bytes, or of a folder's files (names and bytes, hidden ones skipped); files over
    `BIG_FILE` count by size and modification time."""
    digest = hashlib.sha256()
    if path.is_file():
        _file_digest(path, digest)
        return digest.hexdigest()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        name = file.relative_to(path)
        if any(part.startswith(".") for part in name.parts):
            continue
        digest.update(f"\0{name.as_posix()}\0".encode())
        _file_digest(file, digest)
    return digest.hexdigest()


def record_inputs(run_dir: Path, config: dict[str, Any]) -> None:
    """Write ``run_dir/inputs.json``: the content hash of every input of plain ``config`` (`input_paths`)."""
    from postrl.runtime.checkpoint import atomic_write_text  # deferred: torch

    entries = [
        {"key": key, "path": path, "sha256": content_hash(Path(path).expanduser())}
        for key, path in input_paths(config, run_dir)
    ]
    atomic_write_text(run_dir / INPUTS_FILE, json.dumps({"inputs": entries}, indent=2) + "\n")


def _recorded(run_dir: Path) -> list[dict[str, str]] | None:
    try:
        return list(json.loads((run_dir / INPUTS_FILE).read_text(encoding="utf-8"))["inputs"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserError(
            f"{run_dir / INPUTS_FILE} is damaged ({type(err).__name__}: {err}): the run's inputs cannot be "
            "checked, so it cannot be resumed (--overwrite starts it over)"
        ) from None


def check_inputs(run_dir: Path, config: dict[str, Any]) -> bool:
    """A resume of ``run_dir`` reads the inputs its run started with: a :class:`UserError` names the first one
    of plain ``config`` whose content differs from the hash in ``inputs.json`` (or that is gone). Reads only.
    Returns False for a run started before postrl kept ``inputs.json`` (its inputs cannot be checked)."""
    recorded = _recorded(run_dir)
    if recorded is None:
        return False
    wanted = {(key, path) for key, path in _named(config)}
    for entry in recorded:
        key, path = entry.get("key"), entry.get("path")
        if (key, path) not in wanted:  # a key the resume changed: check_resume_config names it
            continue
        where = Path(str(path)).expanduser()
        now = content_hash(where) if where.exists() else None
        if now != entry.get("sha256"):
            what = "is gone" if now is None else "changed"
            raise UserError(
                f"{key}={path} {what} since {run_dir} started (its content hash differs from the one in "
                f"{run_dir / INPUTS_FILE}): resuming would train the checkpoint on other inputs; restore it, "
                "or pass --overwrite to start over"
            )
    return True


def _named(config: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """Every ``(key, part)`` of plain ``config`` that could name a path (`_candidates`), existing or not."""
    for key, value in config.items():
        if isinstance(value, dict):
            yield from _named(value, f"{prefix}{key}.")
            continue
        for item in value if isinstance(value, list) else [value]:
            for part in _candidates(item) if isinstance(item, str) else []:
                yield f"{prefix}{key}", part


def code_specs(rewards: Any) -> list[str]:
    """The reward specs in ``rewards`` that import code from a file or a module (not `SAFE_REWARDS`)."""
    specs = rewards if isinstance(rewards, list) else [rewards] if rewards else []
    return [str(s) for s in specs if not str(s).startswith(SAFE_REWARDS)]


def check_resume_code(run_dir: Path, saved: dict[str, Any], given: Collection[str], stage: str = "") -> None:
    """Resuming ``run_dir`` from its ``config.yaml`` (plain ``saved``) runs no code the folder names unless
    the user named it again: ``given`` holds the top-level keys set on the command line (or as the Python
    API's arguments). A :class:`UserError` says what to pass."""
    command = f"postrl {stage}".strip()
    if saved.get("trust_remote_code") is True and "trust_remote_code" not in given:
        raise UserError(
            f"{run_dir / 'config.yaml'} sets trust_remote_code: true, which runs the model folder's own code; "
            f"a run folder's config does not run code on its own: if you trust the model, pass "
            f"--trust-remote-code again ({command} --out {run_dir} --resume --trust-remote-code)"
        )
    specs = code_specs(saved.get("rewards"))
    if specs and "rewards" not in given:
        listing = ", ".join(specs)
        raise UserError(
            f"{run_dir / 'config.yaml'} names reward code ({listing}); a run folder's config does not run code "
            f"on its own: name the reward functions again to resume ({command} --out {run_dir} --resume "
            f"'rewards=[{listing}]')"
        )


def check_resume(run_dir: Path, config: dict[str, Any], given: Collection[str], stage: str = "") -> None:
    """Before a stage resumes ``run_dir`` from its own ``config.yaml`` (resolved to plain ``config``) and loads
    anything: the code it names was named again (`check_resume_code`) and its inputs are unchanged
    (`check_inputs`; `postrl.runtime.rundir.open_run` checks them again for every command)."""
    check_resume_code(run_dir, config, given, stage)
    check_inputs(run_dir, config)
