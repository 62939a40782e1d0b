"""Run folders: what a command may do with its --out folder, decided before anything is written."""

import json
from dataclasses import dataclass

import pytest

from postrl.runtime.checkpoint import save_checkpoint
from postrl.runtime.errors import UserError
from postrl.runtime.logging import read_jsonl
from postrl.runtime.rundir import check_run_dir, open_run, run_state


@dataclass(frozen=True)
class Cfg:
    a: int = 1


def _finished(path):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("a: 1\n")
    (path / "metrics.jsonl").write_text('{"step": 1, "time": 0.1, "loss": 2.0}\n')
    (path / "summary.json").write_text("{}\n")
    return path


def _snapshot(path):
    return {p.relative_to(path): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_states(tmp_path):
    assert run_state(tmp_path / "nope") == "missing"
    assert run_state(tmp_path) == "empty"
    _finished(tmp_path / "done")
    assert run_state(tmp_path / "done") == "finished"
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "metrics.jsonl").write_text("")
    assert run_state(tmp_path / "half") == "interrupted"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert run_state(tmp_path / "other") == "foreign"
    (tmp_path / "file").write_text("x")
    assert run_state(tmp_path / "file") == "foreign"


def test_a_finished_run_needs_a_flag_and_is_left_alone(tmp_path):
    run = _finished(tmp_path / "run")
    before = _snapshot(run)
    with pytest.raises(UserError, match=r"finished run.*--resume.*--overwrite"):
        open_run(run, Cfg(2))
    assert _snapshot(run) == before
    assert check_run_dir(run, resume=True) == "resume"
    assert check_run_dir(run, overwrite=True) == "overwrite"
    with pytest.raises(UserError, match="exclude each other"):
        check_run_dir(run, resume=True, overwrite=True)


def test_an_interrupted_run_needs_a_flag(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("a: 1\n")
    with pytest.raises(UserError, match=r"interrupted run.*--resume.*--overwrite"):
        check_run_dir(run)


def test_a_foreign_folder_is_refused_even_with_overwrite(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    for flags in ({}, {"overwrite": True}, {"resume": True}):
        with pytest.raises(UserError, match="not a postrl run"):
            check_run_dir(tmp_path, **flags)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_overwrite_replaces_the_old_run(tmp_path):
    run = _finished(tmp_path / "run")
    logger, ckpt = open_run(run, Cfg(2), overwrite=True)
    assert ckpt is None
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "inputs.json"]
    assert "a: 2" in (run / "config.yaml").read_text()
    assert not any(p.name.startswith(".old-") for p in tmp_path.iterdir())


def test_resume_without_checkpoint_empties_the_metrics(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "time": 0.1}\n{"step": 2, "time": 0.2}\n')
    logger, ckpt = open_run(run, Cfg(1), resume=True)
    assert ckpt is None
    assert not (run / "metrics.jsonl").exists() or read_jsonl(run / "metrics.jsonl") == []
    logger.log(1, {"loss": 1.0})
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1]


def test_resume_cuts_metrics_back_to_the_checkpoints_row_count(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "time": s / 10, "loss": float(s)} for s in (0, 1, 2, 2, 3)]
    # the last line was torn by a kill in the middle of a write
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "ti')
    save_checkpoint(run / "checkpoints", 2, modules={}, extra={"metrics_rows": 4})
    logger, ckpt = open_run(run, Cfg(1), resume=True)
    assert ckpt is not None and ckpt.name == "step_00000002"
    logger.resume_at(2, 4)
    assert read_jsonl(run / "metrics.jsonl") == rows[:4]
    assert logger.rows == 4
    logger.log(3, {"loss": 3.0})
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [0, 1, 2, 2, 3]
    # a checkpoint of an older postrl (no row count): rows up to its step are kept
    logger.resume_at(1)
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [0, 1]


@dataclass(frozen=True)
class RunCfg:
    threads: int = 1


@dataclass(frozen=True)
class Full:
    a: int = 1
    run: RunCfg = RunCfg()


def test_a_resume_with_another_config_is_refused_before_anything_changes(tmp_path):
    """Its checkpoint holds another model, optimiser or schedule: a traceback (or worse, a silent mix) and a
    rewritten config.yaml that breaks every later resume. Where and how fast it runs may change."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("a: 1\nrun:\n  threads: 1\n")
    (run / "metrics.jsonl").write_text('{"step": 1, "time": 0.1, "loss": 2.0}\n')
    save_checkpoint(run / "checkpoints", 1, modules={}, extra={"metrics_rows": 1})
    before = _snapshot(run)
    with pytest.raises(UserError, match=r"started with another config \(a differs from .*config.yaml\)"):
        open_run(run, Full(a=2), resume=True)
    assert _snapshot(run) == before
    logger, ckpt = open_run(run, Full(run=RunCfg(threads=2)), resume=True)
    assert ckpt is not None and _snapshot(run) == before  # nothing changes until the checkpoint is loaded
    logger.resume_at(1, 1)
    assert "threads: 2" in (run / "config.yaml").read_text()


def test_a_malformed_metrics_line_before_the_last_is_a_user_error(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("a: 1\n")
    (run / "metrics.jsonl").write_text(
        '{"step": 1, "time": 0.1}\n{"step": 2, oops\n{"step": 3, "time": 0.3}\n'
    )
    save_checkpoint(run / "checkpoints", 1, modules={}, extra={"metrics_rows": 1})
    with pytest.raises(UserError, match=r"metrics.jsonl:2: malformed JSON"):
        open_run(run, Cfg(1), resume=True)


def test_a_finished_run_being_resumed_is_unfinished_until_it_ends_again(tmp_path):
    """A kill while it re-exports its model must leave a run the same command resumes, not a finished one
    without its model."""
    run = _finished(tmp_path / "run")
    save_checkpoint(run / "checkpoints", 1, modules={}, extra={"metrics_rows": 1})
    logger, ckpt = open_run(run, Cfg(1), resume=True)
    assert ckpt is not None and run_state(run) == "finished"  # until its checkpoint is loaded
    logger.resume_at(1, 1)
    assert run_state(run) == "interrupted"
    logger.finish({"loss": 1.0})
    assert run_state(run) == "finished"


def test_a_resume_refused_for_its_checkpoints_leaves_a_finished_run_finished(tmp_path):
    """#41 item 2: with every checkpoint damaged the resume is refused, and the run is byte-identical (it
    used to lose its summary.json first, so a finished run looked interrupted)."""
    run = _finished(tmp_path / "run")
    save_checkpoint(run / "checkpoints", 1, modules={}, extra={"metrics_rows": 1})
    (run / "checkpoints" / "step_00000001" / "state.pt").write_bytes(b"not a zip")
    before = _snapshot(run)
    with pytest.raises(UserError, match=r"state.pt is truncated.*cannot be resumed"):
        open_run(run, Cfg(1), resume=True)
    assert _snapshot(run) == before and run_state(run) == "finished"


def test_inputs_are_recorded_and_a_resume_with_changed_ones_is_refused(tmp_path):
    """#41 item 3: a data file changed in place since the run started is named, and nothing changes."""
    data = tmp_path / "prefs.jsonl"
    data.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n')
    run = tmp_path / "run"
    logger, _ = open_run(run, Data(data=str(data)))
    logger.log(1, {"loss": 1.0})
    save_checkpoint(run / "checkpoints", 1, modules={}, extra={"metrics_rows": 1})
    logger.finish({})
    assert json.loads((run / "inputs.json").read_text())["inputs"][0]["path"] == str(data)
    data.write_text('{"prompt": "a", "chosen": "c", "rejected": "b"}\n')  # chosen and rejected swapped
    before = _snapshot(run)
    with pytest.raises(UserError, match=rf"data={data} changed since {run} started"):
        open_run(run, Data(data=str(data)), resume=True)
    assert _snapshot(run) == before
    data.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n')
    logger, ckpt = open_run(run, Data(data=str(data)), resume=True)
    assert ckpt is not None


@dataclass(frozen=True)
class Data:
    data: str = "task:arithmetic"
