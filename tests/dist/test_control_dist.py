"""Classic control under torchrun: refused with a message (one process only), not N runs in one folder."""

import pytest

from postrl.control.ppo import Config
from postrl.control.train import train
from postrl.runtime.errors import UserError


def test_control_refuses_torchrun(monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserError, match="one process"):
        train(Config(), tmp_path)
    assert not (tmp_path / "metrics.jsonl").exists()
