"""Every command refuses bad input with one line, exit status 2, and touches nothing.

The cases are in `tests/bad_input_cases.py`. Each runs in-process through `postrl.cli.main` with ``--out``
pointing at a copy of a run folder of that command, twice (as typed, and with ``--overwrite``, which starts
over but must still refuse the bad input first), and must:

- return 2 with exactly one non-empty stderr line, ``postrl: error: …``, that names what is at fault;
- let no exception escape (in a real process that is a traceback);
- leave the run folder and every input (models, data, reward files, configs) byte-identical, modes included.

Three cases also run as a real process (``python -m postrl.cli``), end to end.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import stat
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.bad_input_cases import BUDGETS, CASES, COMMANDS, FLAGS, SUBPROCESS_CASES, Case, write_inputs

REPO = Path(__file__).resolve().parents[1]
TINY_VOCAB = 400
LM_STAGES = ("pretrain", "sft", "rm", "ppo", "grpo")
CONFIG_CLASSES = {  # command → (module, config class, preset YAML giving the base); LM stages: the CLI's own
    "control train": ("postrl.control.ppo", "Config", "ppo-cartpole.yaml"),
    "control prefs": ("postrl.control.prefs", "Config", "prefs-cartpole.yaml"),
    "demo": ("postrl.demo", "DemoConfig", None),
}
FLAG_KEYS = {
    "--model": "model",
    "--data": "data",
    "--reward-model": "reward_model",
    "--env": "env.id",
    "--total-steps": "run.steps",
}


# ---- the workspace ---------------------------------------------------------------------------------------
def _tiny_models(ws: Path) -> None:
    """A tiny Llama with its tokenizer, the same without the tokenizer, and a reward model on its trunk."""
    from postrl.lm.models import ScalarHeadModel, TinyLMConfig, build_tiny_lm, load_causal_lm
    from postrl.lm.tasks import build_corpus
    from postrl.lm.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(build_corpus(n_lines=400, seed=0), vocab_size=TINY_VOCAB)
    config = TinyLMConfig(
        n_layers=1, hidden_size=32, n_heads=4, intermediate_size=64, max_position_embeddings=128
    )
    ids = {k: getattr(tokenizer, f"{k}_id") for k in ("pad_token", "eos_token", "bos_token")}
    model = build_tiny_lm(len(tokenizer), config, seed=0, **{f"{k}_id": v for k, v in ids.items()})
    model.save_pretrained(str(ws / "model"))
    tokenizer.save_pretrained(str(ws / "model"))
    model.save_pretrained(str(ws / "model_notok"))
    rm = ScalarHeadModel.from_causal_lm(load_causal_lm(ws / "model"), seed=1)
    rm.save_pretrained(ws / "rm")
    tokenizer.save_pretrained(str(ws / "rm"))
    (ws / "rm" / "reward_norm.json").write_text(json.dumps({"mean": 0.0, "std": 1.0, "n": 8}))
    tokenizer.chat_template = None  # issue #41 item 6: conversational rows with a tokenizer without one
    tokenizer.save_pretrained(str(ws / "tok_nochat"))
    _tiny_vlm(ws)


def _tiny_vlm(ws: Path) -> None:
    """A tiny vision-language model (the built-in LLaVA) at ``ws/vlm``, for the issue #41 item 5 cases."""
    from postrl.lm.tasks import get_task
    from postrl.lm.vlm import TinyVLMConfig, build_tiny_vlm, build_vlm_tokenizer, save_vlm

    config = TinyVLMConfig(vision_hidden_size=32, hidden_size=64, intermediate_size=128, vocab_size=300)
    tokenizer = build_vlm_tokenizer(get_task("shapes", n_train=50, n_test=10).corpus_lines(300), 300)
    save_vlm(*build_tiny_vlm(tokenizer, config, seed=0), ws / "vlm")


def _nested(overrides: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        *parents, last = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = yaml.safe_load(value) if isinstance(value, str) else value
    return out


def _config_yaml(cmd: str, ws: Path) -> str:
    """The resolved config of the command's valid, tiny command line (what a real run's config.yaml holds)."""
    from postrl.runtime.config import load_config, read_yaml, to_dict

    fill = {"ws": str(ws), "model": str(ws / "model"), "rm": str(ws / "rm")}
    overrides = {key: FLAGS[cmd][flag] for flag, key in FLAG_KEYS.items() if flag in FLAGS[cmd]}
    overrides.update(BUDGETS[cmd])
    texts = [f"{k}={v}".format(**fill) for k, v in overrides.items() if "{out}" not in str(v)]
    module, cls_name, preset = CONFIG_CLASSES.get(cmd, ("", "", None))
    base = read_yaml(REPO / "configs" / preset) if preset else None
    try:
        if cmd in LM_STAGES:
            from postrl.lm.stages import STAGES

            module, cls_name = STAGES[cmd].module, STAGES[cmd].config_name
        cls = getattr(importlib.import_module(module), cls_name)
        if cmd == "demo":
            from postrl.demo import quick

            base = to_dict(quick(cls()))
        return yaml.safe_dump(to_dict(load_config(cls, None, texts, base=base)), sort_keys=False)
    except Exception:  # the code is changing under this test; a plain mapping still names the budget
        return yaml.safe_dump({**(base or {}), **_nested(dict(t.split("=", 1) for t in texts))})


def _fake_run(path: Path, config: str, lm: bool, finished: bool = True) -> None:
    """A run folder as a training command leaves it: finished, or interrupted with a corrupt checkpoint."""
    import torch
    from safetensors.torch import save_file

    ckpt = path / "checkpoints" / "step_00000001"
    ckpt.mkdir(parents=True)
    (path / "config.yaml").write_text(config)
    (path / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    (path / "metrics.jsonl").chmod(0o600)
    torch.save({"step": 1, "rng": torch.arange(64)}, ckpt / "state.pt")
    save_file({"w": torch.zeros(64)}, str(ckpt / "model.safetensors"))
    if finished:
        (path / "summary.json").write_text('{"wall_seconds": 1.0, "peak_rss_mb": 1.0}\n')
        if lm:
            (path / "model").mkdir()
            (path / "model" / "config.json").write_text('{"model_type": "llama"}\n')
        return
    for name in ("state.pt", "model.safetensors"):  # cut in half: no intact checkpoint is left
        data = (ckpt / name).read_bytes()
        (ckpt / name).write_bytes(data[: len(data) // 2])


def _runs(ws: Path) -> None:
    for cmd in COMMANDS:
        config, key = _config_yaml(cmd, ws), cmd.replace(" ", "-")
        if cmd == "demo":
            root = ws / "runs" / "demo-finished"
            for stage in LM_STAGES:
                _fake_run(root / stage, "{}\n", lm=True)
            (root / "config.yaml").write_text(config)
            (root / "summary.json").write_text('{"stages": {}}\n')
            (root / "report.md").write_text("# demo\n")
            continue
        lm = cmd in LM_STAGES
        _fake_run(ws / "runs" / f"{key}-finished", config, lm)
        _fake_run(ws / "runs" / f"{key}-interrupted", config, lm, finished=False)
    notarun = ws / "runs" / "notarun"
    (notarun / "sub").mkdir(parents=True)
    (notarun / "notes.txt").write_text("not a run\n")
    (notarun / "sub" / "data.csv").write_text("a,b\n1,2\n")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = tmp_path_factory.mktemp("bad_input")
    write_inputs(ws)
    _tiny_models(ws)
    _runs(ws)
    return ws


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No hub access and no hub progress bars in any case, as in a fresh ``postrl`` process (the hub library
    reads its variables at import, so set its constants too), and a scratch working directory, so that a
    default run folder never lands in the repository."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_PROGRESS_BARS", True)
    # `postrl.cli.main` turns transformers' bars off before it imports transformers; in this process
    # transformers is already imported, so do what the variable would have done
    hf_logging = sys.modules.get("transformers.utils.logging")
    if hf_logging is not None:
        monkeypatch.setattr(hf_logging, "_tqdm_active", False)
    monkeypatch.chdir(tmp_path)


# ---- the checks ------------------------------------------------------------------------------------------
def snapshot(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under ``root`` (and ``root``) → (mode, bytes); byte-code caches of imported files aside."""
    out = {}
    for path in [root, *root.rglob("*")]:
        if "__pycache__" in path.parts:
            continue
        st = path.lstat()
        out[path.relative_to(root).as_posix()] = (
            st.st_mode,
            path.read_bytes() if stat.S_ISREG(st.st_mode) else None,
        )
    return out


def changes(before: dict[str, Any], after: dict[str, Any]) -> str:
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    parts = [
        f"{name} {paths[:4]}"
        for name, paths in (("added", added), ("removed", removed), ("changed", changed))
        if paths
    ]
    return "; ".join(parts)


def run_in_process(argv: list[str]) -> tuple[int, str, str | None]:
    """(exit status, extra stderr, escaped exception) of ``postrl.cli.main(argv)``."""
    from postrl.cli import main

    try:
        return main(argv), "", None
    except SystemExit as err:  # argparse and `raise SystemExit(text)` exit without a traceback
        if err.code is None or isinstance(err.code, int):
            return err.code or 0, "", None
        return 1, f"{err.code}\n", None
    except BaseException as err:  # noqa: BLE001 - any escaping exception is a traceback in a real process
        frame = traceback.extract_tb(err.__traceback__)[-1]
        where = f"{Path(frame.filename).name}:{frame.lineno}"
        return -1, "", f"{type(err).__name__}: {err} (at {where})"


def problems(case: Case, code: int, err: str, fill: dict[str, str]) -> list[str]:
    """What is wrong with the exit status and stderr of ``case``."""
    found = []
    lines = [line for line in err.splitlines() if line.strip()]
    if code != 2:
        found.append(f"exit status {code}, not 2")
    if len(lines) != 1:
        found.append(f"{len(lines)} stderr lines, not 1")
    line = lines[-1] if lines else ""
    if lines and not lines[0].startswith("postrl: error:"):
        found.append("stderr does not start with 'postrl: error:'")
    for want in case.expect:
        options = (want,) if isinstance(want, str) else want
        if not any(opt.format(**fill) in line for opt in options):
            found.append(f"the error does not name {' or '.join(repr(o) for o in options)}")
    return found


def _fill(ws: Path, out: Path) -> dict[str, str]:
    return {
        "ws": str(ws),
        "model": str(ws / "model"),
        "model_notok": str(ws / "model_notok"),
        "rm": str(ws / "rm"),
        "out": str(out),
    }


def _copy_run(ws: Path, case: Case, tmp_path: Path) -> Path:
    name = "notarun" if case.out == "notarun" else f"{case.cmd.replace(' ', '-')}-{case.out}"
    out = tmp_path / "run"
    shutil.copytree(ws / "runs" / name, out, symlinks=True)
    return out


PARAMS = [
    pytest.param(case, overwrite, id=case.id + ("+overwrite" if overwrite else ""))
    for case in CASES
    for overwrite in ((False, True) if case.overwrite else (False,))
]


def test_the_table_is_big_enough() -> None:
    assert len(CASES) >= 45
    assert len({case.id for case in CASES}) == len(CASES)
    assert {c.cmd for c in CASES if c.id.endswith("finished-run")} == set(COMMANDS)


@pytest.mark.parametrize(("case", "overwrite"), PARAMS)
def test_bad_input_is_one_line_exit_2_and_touches_nothing(
    case: Case, overwrite: bool, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    for key, value in case.env.items():
        monkeypatch.setenv(key, value)
    out = _copy_run(workspace, case, tmp_path)
    run_before, inputs_before = snapshot(out), snapshot(workspace)
    argv = case.argv(workspace, out, overwrite=overwrite)
    capsys.readouterr()
    code, extra, escaped = run_in_process(argv)
    err = capsys.readouterr().err + extra
    found = [f"exception escaped: {escaped}"] if escaped else problems(case, code, err, _fill(workspace, out))
    if diff := changes(run_before, snapshot(out)):
        found.append(f"run folder changed: {diff}")
    if diff := changes(inputs_before, snapshot(workspace)):
        found.append(f"inputs changed: {diff}")
    tail = " | ".join(line for line in err.splitlines() if line.strip())[-400:]
    assert not found, f"{'; '.join(found)}; stderr: {tail!r}"


@pytest.mark.parametrize("case", [c for c in CASES if c.id in SUBPROCESS_CASES], ids=lambda c: c.id)
def test_bad_input_end_to_end_in_a_process(case: Case, workspace: Path, tmp_path: Path) -> None:
    out = _copy_run(workspace, case, tmp_path)
    before = snapshot(out)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **case.env}
    argv = [sys.executable, "-m", "postrl.cli", *case.argv(workspace, out)]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    found = problems(case, proc.returncode, proc.stderr, _fill(workspace, out))
    assert not found, f"{'; '.join(found)}; stderr: {proc.stderr[-400:]!r}"
    assert not changes(before, snapshot(out))
