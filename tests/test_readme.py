"""Every ```python block of README.md runs, so the README cannot rot.

The blocks run in order, in one fresh Python process in an empty temporary folder, like the cells of a notebook:
a later block may use what an earlier one trained (``runs/sft/model``) or defined. Their budgets are the tiny
ones the README sets itself. A failing block's traceback points at its lines in README.md."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)

RUNNER = """
import sys
import time
from pathlib import Path

namespace = {"__name__": "__main__"}
for line, source in eval(sys.argv[2]):
    start = time.perf_counter()
    exec(compile("\\n" * (line - 1) + source, str(sys.argv[1]), "exec"), namespace)
    print(f"--- README.md:{line} ran in {time.perf_counter() - start:.1f} s", flush=True)
"""


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(first line of the code, code) of every ```python block."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in FENCE.finditer(text)]


def test_the_readme_has_python_blocks_for_each_stage() -> None:
    code = "\n".join(source for _, source in python_blocks(README.read_text(encoding="utf-8")))
    for call in (
        "postrl.pretrain(",
        "postrl.sft(",
        "postrl.rm(",
        "postrl.ppo(",
        "postrl.grpo(",
        "reward_len",
    ):
        assert call in code
    for call in ("postrl.control.train(", ".predict(", "postrl.control.evaluate(", "postrl.control.load("):
        assert call in code


def test_every_python_block_of_the_readme_runs(tmp_path) -> None:
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(README.parent)}
    start, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(README), repr(blocks)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_seconds = after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert done.stdout.count("--- README.md:") == len(blocks)
    print("".join(line + "\n" for line in done.stdout.splitlines() if line.startswith("--- README.md:")))
    print(f"{len(blocks)} README blocks in {seconds:.1f} s ({cpu_seconds:.1f} CPU seconds)")
