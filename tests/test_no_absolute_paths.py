"""No tracked file names a path of one machine: a clone anywhere runs the same commands (the benchmarks find their
peers in benchmarks/peers/, their scratch folders under runs/)."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# a home or work folder at the start of a path (not inside a URL or a relative path: `github.com/home/` is fine)
MACHINE_PATH = re.compile(r"(?<![\w.~/:-])/(?:work|home|root|Users)/")


def tracked_files() -> list[Path]:
    try:
        done = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, timeout=60)
    except OSError:
        pytest.skip("git is not installed")
    if done.returncode != 0:
        pytest.skip("not a git checkout")
    return [ROOT / name for name in done.stdout.decode().split("\0") if name]


def absolute_paths(path: Path, own: list[str], root: Path = ROOT) -> list[str]:
    """``file:line: text`` for every line of a text file that names a machine's folder or this checkout's."""
    with path.open("rb") as f:
        if b"\0" in f.read(8192):
            return []  # binary (weights, images)
    hits = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if MACHINE_PATH.search(line) or any(p in line for p in own):
            hits.append(f"{path.relative_to(root)}:{number}: {line.strip()[:120]}")
    return hits


def test_no_tracked_file_names_an_absolute_path_of_this_machine():
    own = [f"{ROOT}/", f"{Path.home()}/"] if Path.home() != Path("/") else [f"{ROOT}/"]
    hits = [hit for path in tracked_files() if path.is_file() for hit in absolute_paths(path, own)]
    assert not hits, "absolute paths in tracked files:\n" + "\n".join(hits)


def test_the_check_finds_a_planted_path(tmp_path):
    good, bad = tmp_path / "good.py", tmp_path / "bad.md"
    good.write_text("see https://github.com/home/x and runs/bench-dpo\nPath.home() / 'x'\n")
    bad.write_text("first line\nPEERS = '/" + "work/shared/peers'\n")
    binary = tmp_path / "w.safetensors"
    binary.write_bytes(b"\0\0/" + b"home/x/")
    assert absolute_paths(good, [], tmp_path) == [] and absolute_paths(binary, [], tmp_path) == []
    assert absolute_paths(bad, [], tmp_path) == ["bad.md:2: PEERS = '/" + "work/shared/peers'"]
    own = absolute_paths(good, ["runs/bench"], tmp_path)
    assert own == ["good.py:1: see https://github.com/home/x and runs/bench-dpo"]
