"""Crash safety of checkpoints: kills during a delete or a replace, corrupt files at resume, file modes.

Each situation is built by hand (a half-deleted folder, a truncated file, a crash injected into ``rmtree`` or
``os.replace``) rather than by killing a process, so that the test is exact and fast."""

import os
import stat

import pytest
import torch

from postrl.runtime import checkpoint as ckpt
from postrl.runtime.checkpoint import (
    atomic_write_text,
    clean_leftovers,
    clean_run_leftovers,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    write_dir_atomically,
)
from postrl.runtime.errors import UserError


def _save(root, step, keep_last=0):
    torch.manual_seed(step)
    model = torch.nn.Linear(3, 2)
    return save_checkpoint(
        root, step, modules={"model": model}, extra={"w": model.weight.detach()}, keep_last=keep_last
    )


def _names(folder):
    return sorted(p.name for p in folder.iterdir())


def _truncate(file, end):
    """Keep the bytes before ``end`` (negative: cut that many from the tail)."""
    file.write_bytes(file.read_bytes()[:end])


# --- kills during a delete ---------------------------------------------------------------------------------


def test_a_half_deleted_folder_is_never_listed_and_is_cleaned(tmp_path):
    _save(tmp_path, 1)
    _save(tmp_path, 2)
    half = tmp_path / "step_00000003"  # rmtree killed after unlinking everything but config.json
    half.mkdir()
    (half / "config.json").write_text("{}")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000001", "step_00000002"]
    assert latest_checkpoint(tmp_path).name == "step_00000002"
    assert clean_leftovers(tmp_path) == [half]
    assert _names(tmp_path) == ["step_00000001", "step_00000002"]
    assert clean_leftovers(tmp_path) == []  # idempotent


def test_a_half_deleted_folder_that_kept_its_state_is_skipped(tmp_path, capsys):
    _save(tmp_path, 1)
    newest = _save(tmp_path, 2)
    (newest / "model.safetensors").unlink()  # rmtree removed the weights first and was killed before state.pt
    assert latest_checkpoint(tmp_path).name == "step_00000001"
    assert "model.safetensors is missing" in capsys.readouterr().err


def test_a_foreign_step_name_is_neither_listed_nor_removed(tmp_path):
    _save(tmp_path, 1)
    (tmp_path / "step_x").mkdir()  # not a name postrl writes: it is the user's
    (tmp_path / "step_x" / "state.pt").write_text("mine")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000001"]
    assert clean_leftovers(tmp_path) == []
    assert (tmp_path / "step_x" / "state.pt").is_file()


def _crashing_rmtree(calls):
    """An ``rmtree`` that removes one file, then dies as a SIGKILL would stop it."""

    def rmtree(path, *args, **kwargs):
        calls.append(path)
        os.unlink(sorted(e.path for e in os.scandir(path) if e.is_file())[0])
        raise KeyboardInterrupt("killed while deleting")

    return rmtree


def test_a_crash_while_pruning_leaves_no_half_checkpoint(tmp_path, monkeypatch):
    _save(tmp_path, 1)
    _save(tmp_path, 2)
    calls = []
    monkeypatch.setattr(ckpt.shutil, "rmtree", _crashing_rmtree(calls))
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 3, keep_last=2)  # deleting step 1 dies half way
    monkeypatch.undo()
    assert len(calls) == 1
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000002", "step_00000003"]
    assert latest_checkpoint(tmp_path).name == "step_00000003"
    leftover = [p for p in tmp_path.iterdir() if p.name.startswith(".del-step_00000001-")]
    assert len(leftover) == 1 and leftover[0] == calls[0]
    assert clean_leftovers(tmp_path) == leftover
    assert _names(tmp_path) == ["step_00000002", "step_00000003"]


def test_a_crash_while_deleting_a_replaced_export_keeps_the_new_one(tmp_path, monkeypatch):
    target = tmp_path / "model"
    write_dir_atomically(target, lambda d: (d / "a.txt").write_text("old"))
    monkeypatch.setattr(ckpt.shutil, "rmtree", _crashing_rmtree([]))
    with pytest.raises(KeyboardInterrupt):
        write_dir_atomically(target, lambda d: [(d / n).write_text("new") for n in ("a.txt", "b.txt")])
    monkeypatch.undo()
    assert (target / "a.txt").read_text() == "new" and (target / "b.txt").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".old-")]  # renamed aside before deleting
    removed = clean_run_leftovers(tmp_path)
    assert len(removed) == 1 and removed[0].name.startswith(".del-")
    assert _names(tmp_path) == ["model"]


# --- kills and errors during a replace ---------------------------------------------------------------------


def test_an_error_between_the_two_renames_puts_the_old_folder_back(tmp_path, monkeypatch):
    target = tmp_path / "model"
    write_dir_atomically(target, lambda d: (d / "a.txt").write_text("old"))
    real_replace = os.replace
    calls = []

    def replace(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # old copy moved aside; the new one is not in place yet
            raise KeyboardInterrupt("killed between the renames")
        return real_replace(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        write_dir_atomically(target, lambda d: (d / "a.txt").write_text("new"))
    monkeypatch.undo()
    assert (target / "a.txt").read_text() == "old"
    assert _names(tmp_path) == ["model"]


def test_a_kill_between_the_two_renames_is_repaired_at_start(tmp_path, capsys):
    old = tmp_path / f".old-reward-model-{os.getpid() + 1}"  # what the killed process left: no "reward-model"
    old.mkdir()
    (old / "weights.txt").write_text("old")
    tmp = tmp_path / ".tmp-reward-model-0a1b2c3d"
    tmp.mkdir()
    (tmp / "weights.txt").write_text("ne")  # maybe complete, maybe not: it cannot be trusted
    assert clean_run_leftovers(tmp_path) == [tmp]
    assert (tmp_path / "reward-model" / "weights.txt").read_text() == "old"
    assert _names(tmp_path) == ["reward-model"]
    assert "restored" in capsys.readouterr().err
    assert clean_run_leftovers(tmp_path) == []


def test_run_leftovers_are_temp_files_and_folders_only(tmp_path):
    for name in ("metrics.jsonl", "config.yaml", ".keep", ".config.yaml.x1_z9ab3.tmp", "notes.tmp"):
        (tmp_path / name).write_text("x")
    for name in (".tmp-model-12345678", ".del-model-1-2", ".old-model-3", "model", "checkpoints"):
        (tmp_path / name).mkdir()
    removed = clean_run_leftovers(tmp_path)
    assert sorted(p.name for p in removed) == [
        ".config.yaml.x1_z9ab3.tmp",
        ".del-model-1-2",
        ".old-model-3",
        ".tmp-model-12345678",
    ]
    assert _names(tmp_path) == [".keep", "checkpoints", "config.yaml", "metrics.jsonl", "model", "notes.tmp"]


def test_cleaning_a_missing_folder_is_fine(tmp_path):
    assert clean_leftovers(tmp_path / "nope") == []
    assert clean_run_leftovers(tmp_path / "nope") == []


# --- corrupt checkpoints at resume -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "file, damage",
    [
        ("model.safetensors", lambda f: _truncate(f, -7)),  # cut inside the tensor data
        ("model.safetensors", lambda f: _truncate(f, 20)),  # cut inside the header
        ("model.safetensors", lambda f: f.write_bytes(b"\xff" * 64)),
        ("state.pt", lambda f: _truncate(f, -30)),
        ("state.pt", lambda f: _truncate(f, 0)),
        ("state.pt", lambda f: f.write_bytes(b"not a checkpoint" * 8)),
    ],
)
def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous(tmp_path, capsys, file, damage):
    _save(tmp_path, 1)
    _save(tmp_path, 2)
    damage(_save(tmp_path, 3) / file)
    found = latest_checkpoint(tmp_path)
    assert found.name == "step_00000002"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(tmp_path / "step_00000003" / file) in err
    model = torch.nn.Linear(3, 2)
    state = load_checkpoint(found, modules={"model": model}, restore_rng=False)
    assert state["step"] == 2 and torch.equal(model.weight, state["extra"]["w"])


def test_the_truncation_is_measured(tmp_path, capsys):
    _save(tmp_path, 1)
    weights = _save(tmp_path, 2) / "model.safetensors"
    size = weights.stat().st_size
    _truncate(weights, -8)
    latest_checkpoint(tmp_path)
    assert f"({size - 8:,} of the {size:,} bytes its header promises)" in capsys.readouterr().err


def test_no_intact_checkpoint_is_a_user_error_naming_the_newest(tmp_path):
    _truncate(_save(tmp_path, 1) / "state.pt", 10)
    _truncate(_save(tmp_path, 2) / "model.safetensors", -1)
    with pytest.raises(UserError, match="step_00000002/model.safetensors is truncated.*--overwrite"):
        latest_checkpoint(tmp_path)


def test_a_damaged_checkpoint_is_kept_for_the_user_to_see(tmp_path, capsys):
    """A step folder whose state file is damaged is corruption, not a leftover of a kill (writes are atomic):
    the cleanup keeps it and latest_checkpoint names it and falls back."""
    good = _save(tmp_path, 1)
    bad = _save(tmp_path, 2)
    (bad / "state.pt").write_bytes(b"")
    assert clean_leftovers(tmp_path) == []
    assert bad.is_dir()
    assert latest_checkpoint(tmp_path) == good
    assert f"{bad / 'state.pt'}" in capsys.readouterr().err


def test_an_empty_root_has_no_checkpoint(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    assert latest_checkpoint(tmp_path / "missing") is None


# --- modes follow the umask --------------------------------------------------------------------------------


@pytest.fixture
def umask():
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


def _mode(path):
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(
    "mask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700), (0o002, 0o664, 0o775)]
)
def test_modes_follow_the_umask(tmp_path, umask, mask, file_mode, dir_mode):
    umask(mask)
    atomic_write_text(tmp_path / "config.yaml", "a: 1\n")
    atomic_write_text(tmp_path / "config.yaml", "a: 2\n")  # a rewrite too
    export = write_dir_atomically(tmp_path / "model", lambda d: (d / "config.json").write_text("{}"))
    step = _save(tmp_path / "checkpoints", 1)
    assert _mode(tmp_path / "config.yaml") == file_mode
    assert _mode(export) == dir_mode and _mode(export / "config.json") == file_mode
    assert _mode(step) == dir_mode
    assert {_mode(f) for f in step.iterdir()} == {file_mode}
