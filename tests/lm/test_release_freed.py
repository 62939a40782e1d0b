"""``run.memory.release_freed_mb``: glibc's malloc gives freed blocks back to the system (`postrl.lm.memory.
release_freed`), so the resident set follows what is alive."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from postrl.lm.memory import MemoryConfig
from postrl.runtime.config import ConfigError, validate

PROBE = textwrap.dedent(
    """
    import sys, torch
    from postrl.lm.memory import release_freed
    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
    if sys.argv[1] == "1":
        assert release_freed(1)
    warm = torch.ones(1 << 19)  # a freed 2 MB mapping raises glibc's dynamic mmap threshold above 2 MB
    del warm
    blocks = [torch.ones(1 << 19) for _ in range(100)]  # so these 2 MB blocks come from the heap
    before = rss()
    del blocks[::2]  # 50 holes, 100 MB
    print(round(before - rss()))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_holes_leave_the_resident_set_only_with_it():
    """Fifty freed 2 MB blocks between live ones: the heap keeps them resident by default, and gives back all
    100 MB with a threshold of 1 MB (in a fresh process: the setting is process-wide)."""

    def released(on: bool) -> int:
        env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}  # (torch's huge pages)
        probe = [sys.executable, "-c", PROBE, str(int(on))]
        out = subprocess.run(probe, capture_output=True, text=True, check=True, env=env)
        return int(out.stdout.split()[-1])

    assert released(False) < 10
    assert released(True) >= 95


def test_the_threshold_is_checked():
    """glibc's mmap threshold is at most 32 MB: a larger value is a config error naming the key."""
    assert validate(MemoryConfig(release_freed_mb=32)).release_freed_mb == 32
    with pytest.raises(ConfigError, match="release_freed_mb"):
        validate(MemoryConfig(release_freed_mb=33))
