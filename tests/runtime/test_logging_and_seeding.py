import json
import random

import numpy as np
import pytest
import torch

from postrl.runtime.errors import UserError
from postrl.runtime.logging import RunLogger, read_jsonl
from postrl.runtime.plots import plot_curves
from postrl.runtime.progress import Progress
from postrl.runtime.seeding import get_rng_state, resolve_device, seed_everything, set_rng_state


def test_run_folder(tmp_path):
    from tests.runtime.test_config import Cfg

    log = RunLogger(tmp_path / "run", config=Cfg())
    log.log(1, {"loss": torch.tensor(0.5), "nan": float("nan")})
    log.log(2, {"loss": 0.25})
    summary = log.finish({"score": 1.0})
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and rows[0]["loss"] == 0.5 and rows[0]["nan"] is None
    assert all("time" in r for r in rows)
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved == summary and saved["score"] == 1.0
    assert saved["wall_seconds"] >= 0 and saved["peak_rss_mb"] > 10
    assert "n_envs: 8" in (tmp_path / "run" / "config.yaml").read_text()


def test_resume_keeps_rows_up_to_the_checkpoint(tmp_path):
    log = RunLogger(tmp_path)
    for step in range(1, 5):
        log.log(step, {"x": step})
    log = RunLogger(tmp_path, resume=True)
    log.truncate_after(2)
    log.log(3, {"x": 30})
    assert [r["x"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 30]


def test_disabled_logger_writes_nothing(tmp_path):
    log = RunLogger(tmp_path / "r", enabled=False)
    log.log(1, {"a": 1})
    log.finish({})
    assert not (tmp_path / "r").exists()


def test_read_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"a": 1}\n{bad\n')
    with pytest.raises(ValueError, match=r"m.jsonl:2"):
        read_jsonl(path)


def test_rng_state_round_trip():
    seed_everything(7)
    state = get_rng_state()
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a


def test_seed_offset_per_rank():
    assert seed_everything(10, rank=3) == 13
    x = torch.rand(1)
    seed_everything(13)
    assert torch.equal(x, torch.rand(1))


def test_device_choice():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type in ("cpu", "cuda", "mps")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match=r"run.device='cuda' was asked for but CUDA is not available"):
            resolve_device("cuda")
    with pytest.raises(UserError, match=r"run.device='gpu' is not a device: use auto, cpu, cuda"):
        resolve_device("gpu")


def test_progress_is_quiet_off_tty(capsys):
    with Progress(10, "test") as bar:
        bar.update(5, loss=0.1)
    assert capsys.readouterr().err == ""


def test_plot(tmp_path):
    rows = [{"step": i, "ret": i * 2.0} for i in range(5)]
    assert plot_curves(rows, ["ret", "absent"], tmp_path / "c.png").stat().st_size > 1000
    assert plot_curves(rows, ["absent"], tmp_path / "d.png") is None
