"""How a command may use its run folder: new, resumed or overwritten, decided before anything is written.

Every training command validates its whole input first (config, data, model, reward functions), then calls
:func:`open_run`, which is the first thing that writes. The rules, the same for every command:

- a missing or empty folder starts a new run;
- a *finished* run (it has ``summary.json``) is never touched without a flag: ``--resume`` continues it
  (e.g. with more steps), ``--overwrite`` starts over;
- an *interrupted* run (a run folder without ``summary.json``) is continued by ``--resume`` from its last
  intact checkpoint, or started over by ``--overwrite``; with no checkpoint yet it starts from step 0 with
  ``metrics.jsonl`` emptied, so that the log is exactly an uninterrupted run's;
- a non-empty folder that is not a postrl run is refused, flags or not (``--overwrite`` never deletes a
  folder postrl did not write).

``--overwrite`` deletes the previous run once the new input has been validated: the folder is renamed
aside (one atomic step) and then removed, so a crash leaves either the old run or a fresh start.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any, Literal

from postrl.runtime import distributed as dist
from postrl.runtime import notices
from postrl.runtime.checkpoint import clean_leftovers, clean_run_leftovers, delete_folder, latest_checkpoint
from postrl.runtime.config import read_yaml
from postrl.runtime.config_values import changed_keys, to_dict
from postrl.runtime.errors import UserError
from postrl.runtime.logging import RunLogger
from postrl.runtime.run_inputs import INPUTS_FILE, check_inputs, record_inputs

Mode = Literal["new", "resume", "overwrite"]
FINISHED = "summary.json"
# Files a postrl run folder starts with; one of them marks a folder as a run (possibly interrupted).
RUN_MARKERS = ("config.yaml", "metrics.jsonl", "checkpoints", FINISHED)


def run_state(path: str | Path) -> Literal["missing", "empty", "finished", "interrupted", "foreign"]:
    """What is at ``path``: nothing, an empty folder, a finished or interrupted run, or something else."""
    path = Path(path)
    if not path.exists():
        return "missing"
    if not path.is_dir():
        return "foreign"
    if (path / FINISHED).is_file():
        return "finished"
    if any((path / marker).exists() for marker in RUN_MARKERS):
        return "interrupted"
    visible = [p for p in path.iterdir() if not p.name.startswith(".")]
    return "foreign" if visible else "empty"


def check_run_dir(path: str | Path, *, resume: bool = False, overwrite: bool = False) -> Mode:
    """How the command may use ``path`` (reads only); a :class:`UserError` says why it may not."""
    path = Path(path)
    if resume and overwrite:
        raise UserError("--resume and --overwrite exclude each other: continue the run, or start over")
    state = run_state(path)
    if state == "foreign":
        what = "a file" if path.exists() and not path.is_dir() else "a folder that is not a postrl run"
        raise UserError(f"--out {path} is {what}; refusing to write there: choose a new or empty folder")
    if state == "missing":
        check_can_create(path)
    if state in ("missing", "empty"):
        return "new"
    if resume:
        return "resume"
    if overwrite:
        return "overwrite"
    if state == "finished":
        raise UserError(
            f"{path} holds a finished run ({FINISHED}); pass --resume to continue it (e.g. with more "
            "steps) or --overwrite to start over and replace it"
        )
    raise UserError(
        f"{path} holds an interrupted run (no {FINISHED}); pass --resume to continue from its last "
        "checkpoint or --overwrite to start over"
    )


def check_can_create(path: Path, flag: str = "--out") -> None:
    """``path`` can be made: its nearest existing parent is a folder this process may write into."""
    parent = path.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"{flag} {path}: cannot create it, {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK) or _read_only_fs(parent):
        raise UserError(f"{flag} {path}: cannot create it, {parent} is not writable")


def _read_only_fs(folder: Path) -> bool:
    """Whether ``folder`` is on a file system that refuses new entries whatever the permissions (/proc, /sys,
    a read-only mount)."""
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY) or folder.parts[1:2] in (("proc",), ("sys",))
    except OSError:
        return False


def check_inputs_outside(run_dir: Path, config: dict[str, Any], prefix: str = "") -> None:
    """--overwrite deletes ``run_dir``: no input of the run (a model, data or tokenizer path in ``config``)
    may live inside it (e.g. ``--model RUN/model --out RUN --overwrite``)."""
    root = run_dir.resolve()
    for key, value in config.items():
        if isinstance(value, dict):
            check_inputs_outside(run_dir, value, f"{prefix}{key}.")
            continue
        for item in value if isinstance(value, list) else [value]:
            for part in str(item).split(",") if isinstance(item, str) else []:
                candidate = Path(part.strip()).expanduser()
                if (
                    part.strip()
                    and candidate.exists()
                    and root in (candidate.resolve(), *candidate.resolve().parents)
                ):
                    raise UserError(
                        f"--overwrite would delete {prefix}{key}={part.strip()}, which is inside {run_dir}: copy it "
                        "elsewhere first, or choose another --out"
                    )


RESUME_MAY_CHANGE = frozenset(
    {"run.device", "run.threads", "run.tensorboard", "run.max_seconds", "run.steps"}
    | {"run.eval_every", "run.save_every", "run.keep_last", "run.log_every", "run.eval_episodes", "run.gif"}
    | {"labeller.page.host", "labeller.page.port", "labeller.page.serve", "labeller.page.poll_seconds"}
    | {"labeller.page.timeout"}
)
"""Keys a resumed run may change: where it runs (on how many threads), how long (more steps for a finished
run, as TRL's and SB3's resumes allow) and how often it logs, evaluates and saves; not what a step computes
(control prefs: where its labelling page is served and how long it waits for people)."""


def check_resume_config(
    run_dir: Path, now: dict[str, Any], ignore: Collection[str] = (), hint: str = ""
) -> None:
    """A run resumes with the config it started with (``run_dir/config.yaml``, compared with the plain config
    ``now``, `to_dict`): a :class:`UserError` names the keys that differ, except those in ``ignore``."""
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        return
    changed = [k for k in changed_keys(read_yaml(saved), now) if k not in ignore]
    if changed:
        keys = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
        raise UserError(
            f"{run_dir} was started with another config ({keys} {'differs' if len(changed) == 1 else 'differ'} "
            f"from {saved}): resume it with the same flags and overrides{hint}, or pass --overwrite to start over"
        )


def remove_run(path: Path) -> None:
    """Delete run folder ``path`` crash-safely: renamed aside (atomic), then removed."""
    delete_folder(path)


def _latest(root: Path) -> Path | UserError | None:
    try:
        return latest_checkpoint(root)
    except UserError as err:  # raised on every rank, not on rank 0 alone (the others would wait forever)
        return err


def open_run(
    path: str | Path,
    config: Any = None,
    *,
    resume: bool = False,
    overwrite: bool = False,
    tensorboard: bool = False,
) -> tuple[RunLogger, Path | None]:
    """Check, then prepare run folder ``path`` and open its logger: ``(logger, checkpoint to resume from)``.

    Called by every rank after the input is validated; rank 0 writes, the others wait for it. The
    checkpoint is the newest intact one when resuming (None: start from step 0, metrics emptied).

    A resume changes nothing until it is known good: the config is accepted, the inputs are the ones the run
    started with (`check_inputs`) and a checkpoint is intact; the run becomes unfinished (``summary.json``
    removed) and its ``config.yaml`` rewritten only once that checkpoint is loaded (`RunLogger.resume_at`).
    """
    path = Path(path)
    mode = check_run_dir(path, resume=resume, overwrite=overwrite)
    dist.barrier()  # every rank has read the folder's state before rank 0 changes it
    main = dist.is_main()
    plain = to_dict(config) if config is not None else None
    if mode == "overwrite" and plain is not None:
        check_inputs_outside(path, plain)
    checked = True  # the inputs match the ones recorded (False: an older run recorded none)
    if mode == "resume" and plain is not None:  # its checkpoint holds another model, optimiser, schedule
        check_resume_config(path, plain, RESUME_MAY_CHANGE)
        checked = check_inputs(path, plain)
    if main and mode == "resume":  # what a killed write or delete left behind (put back or removed)
        clean_run_leftovers(path)
        clean_leftovers(path / "checkpoints")
    # rank 0 picks (and verifies) the checkpoint; a corrupt one is reported once, the others take its pick
    ckpt = None
    if mode == "resume":
        ckpt = dist.broadcast_object(_latest(path / "checkpoints") if main else None)
        if isinstance(ckpt, UserError):
            raise ckpt
    if main and mode == "overwrite":
        remove_run(path)
        print(f"postrl: --overwrite: removed the previous run in {path}", file=sys.stderr)
    if main and mode == "resume" and ckpt is not None and not checked:
        print(
            f"postrl: {path} has no {INPUTS_FILE} (an older run): its inputs are not checked", file=sys.stderr
        )
    if main and mode == "resume" and ckpt is None:
        print(f"postrl: {path} has no checkpoint yet; starting it from step 0", file=sys.stderr)
        (path / FINISHED).unlink(missing_ok=True)
    logger = RunLogger(path, config, tensorboard=tensorboard, enabled=main, resume=ckpt is not None)
    if main and plain is not None and ckpt is None:  # what this run (from step 0) reads
        record_inputs(path, plain)
    notices.flush()  # the input is accepted: what its checks had to say (e.g. a clipped length)
    dist.barrier()
    return logger, ckpt
