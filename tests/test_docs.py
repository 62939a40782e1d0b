"""The documentation site builds with ``mkdocs build --strict`` (broken links, missing API references and
docstrings griffe cannot parse fail it), and its configuration page lists every key of every stage."""

from __future__ import annotations

import html
import os
import subprocess
import sys
from pathlib import Path

import postrl.core
from postrl.lm.stages import STAGES
from postrl.runtime.config_help import describe

ROOT = Path(__file__).resolve().parents[1]


def test_the_site_builds_strictly_with_every_config_key(tmp_path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    page = html.unescape((site / "configuration" / "index.html").read_text(encoding="utf-8"))
    for stage in STAGES.values():
        assert f"postrl {stage.name}" in page
        missing = [key for key, _, _ in describe(stage.config_class()) if f"<code>{key}</code>" not in page]
        assert not missing, f"postrl {stage.name}: keys missing from the configuration page: {missing[:5]}"
    for name in ("core", "api", "control"):
        assert (site / "reference" / name / "index.html").is_file()
    core_page = (site / "reference" / "core" / "index.html").read_text(encoding="utf-8")
    missing = [n for n in postrl.core.__all__ if not n.isupper() and f'id="postrl.core.{n}"' not in core_page]
    assert not missing, f"postrl.core functions missing from docs/reference/core.md: {missing}"
