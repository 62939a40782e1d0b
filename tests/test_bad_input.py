"""Every command refuses bad input with one line, exit status 2, and touches nothing.

The cases are in `tests/bad_input/` (one module per command family). Each runs in-process through
`postrl.cli.main` with ``--out`` pointing at a copy of a run folder of that command, twice (as typed, and with
``--overwrite``, which starts over but must still refuse the bad input first), and must:

- return 2 with exactly one non-empty stderr line, ``postrl: error: …``, that names what is at fault;
- let no exception escape (in a real process that is a traceback);
- leave the run folder and every input (models, data, reward files, configs) byte-identical, modes included.

Three cases also run as a real process (``python -m postrl.cli``), end to end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from tests.bad_input import CASES, COMMANDS, SUBPROCESS_CASES, Case
from tests.bad_input.checks import changes, snapshot
from tests.bad_input.workspace import build_workspace


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_workspace(tmp_path_factory.mktemp("bad_input"))


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No hub access and no hub progress bars in any case, as in a fresh ``postrl`` process (the hub library
    reads its variables at import, so set its constants too), and a scratch working directory, so that a
    default run folder never lands in the repository."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_PROGRESS_BARS", True)
    # `postrl.cli.main` turns transformers' bars off before it imports transformers; in this process
    # transformers is already imported, so do what the variable would have done
    hf_logging = sys.modules.get("transformers.utils.logging")
    if hf_logging is not None:
        monkeypatch.setattr(hf_logging, "_tqdm_active", False)
    monkeypatch.chdir(tmp_path)


# ---- the checks ------------------------------------------------------------------------------------------
def run_in_process(argv: list[str]) -> tuple[int, str, str | None]:
    """(exit status, extra stderr, escaped exception) of ``postrl.cli.main(argv)``."""
    from postrl.cli import main

    try:
        return main(argv), "", None
    except SystemExit as err:  # argparse and `raise SystemExit(text)` exit without a traceback
        if err.code is None or isinstance(err.code, int):
            return err.code or 0, "", None
        return 1, f"{err.code}\n", None
    except BaseException as err:  # noqa: BLE001 - any escaping exception is a traceback in a real process
        frame = traceback.extract_tb(err.__traceback__)[-1]
        where = f"{Path(frame.filename).name}:{frame.lineno}"
        return -1, "", f"{type(err).__name__}: {err} (at {where})"


def problems(case: Case, code: int, err: str, fill: dict[str, str]) -> list[str]:
    """What is wrong with the exit status and stderr of ``case``."""
    found = []
    lines = [line for line in err.splitlines() if line.strip()]
    if code != 2:
        found.append(f"exit status {code}, not 2")
    if len(lines) != 1:
        found.append(f"{len(lines)} stderr lines, not 1")
    line = lines[-1] if lines else ""
    if lines and not lines[0].startswith("postrl: error:"):
        found.append("stderr does not start with 'postrl: error:'")
    for want in case.expect:
        options = (want,) if isinstance(want, str) else want
        if not any(opt.format(**fill) in line for opt in options):
            found.append(f"the error does not name {' or '.join(repr(o) for o in options)}")
    return found


def _fill(ws: Path, out: Path) -> dict[str, str]:
    return {
        "ws": str(ws),
        "model": str(ws / "model"),
        "model_notok": str(ws / "model_notok"),
        "rm": str(ws / "rm"),
        "out": str(out),
    }


def _copy_run(ws: Path, case: Case, tmp_path: Path) -> Path:
    name = "notarun" if case.out == "notarun" else f"{case.cmd.replace(' ', '-')}-{case.out}"
    out = tmp_path / "run"
    if case.out == "none":
        return out
    shutil.copytree(ws / "runs" / name, out, symlinks=True)
    return out


PARAMS = [
    pytest.param(case, overwrite, id=case.id + ("+overwrite" if overwrite else ""))
    for case in CASES
    for overwrite in ((False, True) if case.overwrite else (False,))
]


def test_the_table_is_big_enough() -> None:
    assert len(CASES) >= 45
    assert len({case.id for case in CASES}) == len(CASES)
    assert {c.cmd for c in CASES if c.id.endswith("finished-run")} == set(COMMANDS)


@pytest.mark.parametrize(("case", "overwrite"), PARAMS)
def test_bad_input_is_one_line_exit_2_and_touches_nothing(
    case: Case, overwrite: bool, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    for key, value in case.env.items():
        monkeypatch.setenv(key, value)
    out = _copy_run(workspace, case, tmp_path)
    run_before, inputs_before = snapshot(out), snapshot(workspace)
    argv = case.argv(workspace, out, overwrite=overwrite)
    capsys.readouterr()
    code, extra, escaped = run_in_process(argv)
    err = capsys.readouterr().err + extra
    found = [f"exception escaped: {escaped}"] if escaped else problems(case, code, err, _fill(workspace, out))
    if diff := changes(run_before, snapshot(out)):
        found.append(f"run folder changed: {diff}")
    if diff := changes(inputs_before, snapshot(workspace)):
        found.append(f"inputs changed: {diff}")
    tail = " | ".join(line for line in err.splitlines() if line.strip())[-400:]
    assert not found, f"{'; '.join(found)}; stderr: {tail!r}"


@pytest.mark.parametrize("case", [c for c in CASES if c.id in SUBPROCESS_CASES], ids=lambda c: c.id)
def test_bad_input_end_to_end_in_a_process(case: Case, workspace: Path, tmp_path: Path) -> None:
    out = _copy_run(workspace, case, tmp_path)
    before = snapshot(out)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **case.env}
    argv = [sys.executable, "-m", "postrl.cli", *case.argv(workspace, out)]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    found = problems(case, proc.returncode, proc.stderr, _fill(workspace, out))
    assert not found, f"{'; '.join(found)}; stderr: {proc.stderr[-400:]!r}"
    assert not changes(before, snapshot(out))
