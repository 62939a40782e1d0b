import json
import os
import random

import numpy as np
import pytest
import torch

from postrl.runtime import checkpoint as ckpt
from postrl.runtime.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from postrl.runtime.seeding import seed_everything


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _train(model, opt, sched, steps):
    for _ in range(steps):
        x = torch.randn(8, 4)  # the data stream comes from the global RNG: resume must restore it
        noise = float(np.random.rand()) + random.random()
        loss = ((model(x) - x.sum(-1, keepdim=True) - noise) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def _setup():
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / 40)
    return model, opt, sched


def test_resume_is_bit_for_bit(tmp_path):
    seed_everything(123)
    model, opt, sched = _setup()
    _train(model, opt, sched, 20)
    straight = [p.detach().clone() for p in model.parameters()]

    seed_everything(123)
    model, opt, sched = _setup()
    _train(model, opt, sched, 10)
    save_checkpoint(
        tmp_path,
        10,
        modules={"model": model},
        optimizers={"opt": opt},
        schedulers={"sched": sched},
        extra={"np": np.arange(3), "note": "x"},
    )
    torch.manual_seed(999)  # disturb every RNG: the checkpoint must put them back
    np.random.seed(999)
    random.seed(999)
    model, opt, sched = _setup()
    state = load_checkpoint(
        latest_checkpoint(tmp_path),
        modules={"model": model},
        optimizers={"opt": opt},
        schedulers={"sched": sched},
    )
    assert state["step"] == 10 and state["extra"]["note"] == "x"
    assert torch.equal(state["extra"]["np"], torch.arange(3))
    _train(model, opt, sched, 10)
    for a, b in zip(straight, model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_interrupted_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
    model, opt, _ = _setup()
    save_checkpoint(tmp_path, 1, modules={"model": model}, optimizers={"opt": opt})
    before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed before rename")

    monkeypatch.setattr(ckpt.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, modules={"model": model}, optimizers={"opt": opt})
    monkeypatch.undo()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000001"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]  # temp folder removed
    fresh = _model(seed=5)
    load_checkpoint(latest_checkpoint(tmp_path), modules={"model": fresh})
    for a, b in zip(before, fresh.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_half_written_folder_is_never_the_latest(tmp_path):
    model, _, _ = _setup()
    save_checkpoint(tmp_path, 1, modules={"model": model})
    (tmp_path / "step_00000002").mkdir()  # e.g. a copy cut short: no state.pt
    assert latest_checkpoint(tmp_path).name == "step_00000001"


def test_keep_last_and_resave(tmp_path):
    model, _, _ = _setup()
    for step in range(1, 6):
        save_checkpoint(tmp_path, step, modules={"model": model}, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000004", "step_00000005"]
    save_checkpoint(
        tmp_path,
        5,
        modules={"model": model},
        keep_last=2,
        write_files=lambda d: (d / "meta.json").write_text(json.dumps({"a": 1})),
    )
    assert (tmp_path / "step_00000005" / "meta.json").is_file()


def test_state_loads_with_weights_only(tmp_path):
    model, opt, _ = _setup()
    path = save_checkpoint(tmp_path, 3, modules={"model": model}, optimizers={"opt": opt})
    state = torch.load(path / "state.pt", weights_only=True)
    assert state["step"] == 3
    assert (path / "model.safetensors").is_file()
    assert not any(name.endswith((".bin", ".pkl")) for name in os.listdir(path))


def test_missing_weights_are_named(tmp_path):
    model, _, _ = _setup()
    path = save_checkpoint(tmp_path, 1, modules={"model": model})
    with pytest.raises(FileNotFoundError, match="critic"):
        load_checkpoint(path, modules={"critic": _model()})


def test_an_export_folder_is_replaced_whole_or_not_at_all(tmp_path):
    target = tmp_path / "model"
    ckpt.write_dir_atomically(target, lambda d: (d / "weights.txt").write_text("old"))

    def broken(d):
        (d / "weights.txt").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        ckpt.write_dir_atomically(target, broken)
    assert (target / "weights.txt").read_text() == "old"
    ckpt.write_dir_atomically(target, lambda d: (d / "config.txt").write_text("new"))
    assert [p.name for p in target.iterdir()] == ["config.txt"]  # the old folder's files are gone
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no temp or moved-aside leftovers
