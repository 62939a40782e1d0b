"""The results file of a benchmark: ``benchmarks/results/<name>.json``, the result with what it takes to rerun it
and judge it (the command, the commit, the date, the machine and its load).

Every benchmark that ends with a JSON line calls ``record(name, result)`` just before printing it, so that a
table quoted in the docs can be rendered from these files and each number traced to the run that made it. The
command is written relative to the repository (``python benchmarks/dpo.py --steps 60``), so the file names no
path of the machine it ran on.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _relative(word: str) -> str:
    """``word`` with the repository's absolute path made relative (a script path, ``--out`` inside the repo)."""
    root = str(ROOT)
    if word == root:
        return "."
    return word.replace(root + os.sep, "")


def portable(value: object) -> object:
    """``value`` (a result: dicts, lists, strings, numbers) with every path inside the repository made relative,
    so that a results file names no folder of the machine that wrote it (tests/test_no_absolute_paths.py)."""
    if isinstance(value, str):
        return _relative(value)
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v) for v in value]
    return value


def command(argv: list[str] | None = None) -> str:
    """The command line that reran this process, from the repository root: ``python benchmarks/x.py ...``."""
    script, *args = sys.argv if argv is None else argv
    return shlex.join(["python", _relative(str(Path(script).resolve())), *map(_relative, args)])


def machine() -> dict:
    """What the numbers ran on: CPU model and cores, memory, OS, Python and the torch build."""
    cpu = platform.processor() or platform.machine()
    memory_gb = None
    if Path("/proc/cpuinfo").is_file():
        names = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("model name")]  # fmt: skip
        cpu = names[0] if names else cpu
    if Path("/proc/meminfo").is_file():
        total_kb = Path("/proc/meminfo").read_text().split("MemTotal:", 1)[1].split()[0]
        memory_gb = round(int(total_kb) / 2**20, 1)
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = None
    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "memory_gb": memory_gb,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": torch,
    }


def record(name: str, result: dict, argv: list[str] | None = None) -> Path:
    """Write ``result`` to ``benchmarks/results/<name>.json`` (temp file + rename: a killed run leaves the
    previous file whole) with the command, commit (``dirty`` when tracked files other than results differ from it), UTC date,
    machine and 1/5/15-minute load averages at the end of the run; returns the path."""
    commit = _git("rev-parse", "HEAD")
    # result files are outputs, not code: a previous run's file left uncommitted does not make this one dirty
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results")
    record_ = {
        "benchmark": name,
        "command": command(argv),
        "commit": commit,
        "dirty": bool(status) if status is not None else None,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "result": portable(result),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record_, indent=1) + "\n")
    os.replace(tmp, path)
    print(f"results: {_relative(str(path))}", file=sys.stderr)
    return path
