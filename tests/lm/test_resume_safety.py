"""Issue #41 items 1, 3 and 9 on real runs: the iteration callback sees every step (the last one too) and is
checked before the run folder is touched; a resume refuses inputs changed since the run started and runs no
code its run folder names (trust_remote_code, reward files) unless the user names it again. Every refusal is
one ``postrl: error:`` line, exit 2, the run folder byte-identical."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import postrl
from postrl.cli import main

SFT = {"train": {"batch_size": 2, "max_length": 48}, "eval_size": 2, "eval_max_new_tokens": 2}
SFT_RUN = {"steps": 3, "eval_every": 0, "log_every": 1, "save_every": 0, "device": "cpu", "threads": 1}
ROWS = [{"prompt": f"{a}+{a}=", "completion": str(2 * a)} for a in range(8)]
LM = ["run.device=cpu", "run.threads=1", "run.eval_every=0", "run.log_every=1", "eval_size=2"]
GRPO = [*LM, "max_prompt_length=32", "sampling.max_new_tokens=4", "grpo.group_size=2"]
GRPO += ["grpo.prompts_per_step=2", "optim.warmup_steps=0"]
DPO = [*LM, "train.batch_size=2", "train.max_length=48", "optim.warmup_steps=0"]
PAIRS = [{"prompt": f"{a}+{a}=", "chosen": str(2 * a), "rejected": str(2 * a + 1)} for a in range(8)]


def _snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _sft(model: Path, out: Path, **kwargs):
    return postrl.sft(model=model, data=ROWS, out=out, run=SFT_RUN, **SFT, **kwargs)


def _refused(argv: list[str], capsys) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err and err[-1].startswith("postrl: error: "), err
    return err[-1]


@pytest.fixture(scope="module")
def finished_sft(tiny_lm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """A 3-step SFT run with on_iteration, and the steps the callback saw."""
    seen: list[int] = []
    out = tmp_path_factory.mktemp("sft") / "run"
    _sft(tiny_lm_dir, out, on_iteration=lambda info: seen.append(info["step"]))
    return out, seen


def test_on_iteration_is_called_after_every_step_the_last_one_too(finished_sft) -> None:
    """README: "called after every step"; a 3-step run used to call it for steps 1 and 2 only."""
    _, seen = finished_sft
    assert seen == [1, 2, 3]


def test_control_on_iteration_sees_the_last_iteration(tmp_path: Path) -> None:
    import postrl.control as control

    seen: list[int] = []
    control.train(
        "ppo",
        "CartPole-v1",
        total_steps=128,
        n_envs=2,
        out=tmp_path / "run",
        on_iteration=lambda info: seen.append(info["iteration"]),
        ppo={"n_steps": 32, "epochs": 1},
        run={"eval_episodes": 1, "save_every": 0},
    )
    assert seen == [1, 2]


def test_a_callback_without_its_argument_is_refused_before_the_run_is_touched(
    finished_sft, tiny_lm_dir: Path
) -> None:
    """It used to be found at step 1, after overwrite=True had removed the finished run (config.yaml left)."""
    out, _ = finished_sft
    before = _snapshot(out)
    with pytest.raises(postrl.UserError, match=r"on_iteration=.*cannot be called with one argument, info"):
        _sft(tiny_lm_dir, out, overwrite=True, on_iteration=lambda: None)
    assert _snapshot(out) == before


def test_a_callback_that_raises_names_itself_and_the_step_and_the_run_resumes(
    finished_sft, tiny_lm_dir: Path, tmp_path: Path
) -> None:
    def boom(info):
        if info["step"] == 2:
            raise ValueError("my bug")

    out = tmp_path / "run"
    with pytest.raises(postrl.UserError, match=r"on_iteration=.*boom raised ValueError at step 2: my bug"):
        _sft(tiny_lm_dir, out, on_iteration=boom)
    assert (out / "checkpoints" / "step_00000002").is_dir() and not (out / "summary.json").exists()
    assert _sft(tiny_lm_dir, out, resume=True).summary["steps"] == 3
    straight, _ = finished_sft  # the same run uninterrupted: same weights
    assert (out / "model" / "model.safetensors").read_bytes() == (
        straight / "model" / "model.safetensors"
    ).read_bytes()


def test_a_dpo_resume_after_the_pairs_changed_in_place_is_refused(
    tiny_lm_dir: Path, tmp_path: Path, capsys
) -> None:
    """Swapping chosen and rejected in the file used to resume on the stored reference log-probs (held-out
    loss 0.69 → 9.66) without a word."""
    data, out = tmp_path / "prefs.jsonl", tmp_path / "run"
    data.write_text("".join(json.dumps(r) + "\n" for r in PAIRS))
    argv = ["dpo", "--model", str(tiny_lm_dir), "--data", str(data), "--out", str(out), *DPO]
    assert main([*argv, "run.steps=2", "run.save_every=1"]) == 0
    swapped = [{**r, "chosen": r["rejected"], "rejected": r["chosen"]} for r in PAIRS]
    data.write_text("".join(json.dumps(r) + "\n" for r in swapped))
    before = _snapshot(out)
    line = _refused(["dpo", "--out", str(out), "--resume", "run.steps=4"], capsys)
    assert f"data={data} changed since {out} started" in line
    assert _snapshot(out) == before


REWARD = "def reward(completions, **kwargs):\n    return [float(len(c)) for c in completions]\n"


def test_a_resume_runs_no_code_its_run_folder_names_unless_named_again(
    tiny_lm_dir: Path, tmp_path: Path, capsys
) -> None:
    """Item 9: config.yaml pointing rewards: at another file, or setting trust_remote_code: true, must not
    run that code on a bare --resume."""
    (tmp_path / "good.py").write_text(REWARD)
    (tmp_path / "evil.py").write_text("raise SystemExit('evil code ran')\n")
    out, rewards = tmp_path / "run", f"rewards=[{tmp_path / 'good.py'}:reward]"
    argv = ["grpo", "--model", str(tiny_lm_dir), "--out", str(out), *GRPO, rewards]
    assert main([*argv, "run.steps=1"]) == 0
    config = out / "config.yaml"
    saved = yaml.safe_load(config.read_text())
    # the run's own reward file: named again, it resumes; not named, it is refused with what to type
    line = _refused(["grpo", "--out", str(out), "--resume", "run.steps=2"], capsys)
    assert "names reward code" in line and f"'rewards=[{tmp_path / 'good.py'}:reward]'" in line
    # an edited config.yaml: the other file's code does not run
    config.write_text(yaml.safe_dump({**saved, "rewards": [f"{tmp_path / 'evil.py'}:reward"]}))
    before = _snapshot(out)
    assert "evil.py:reward" in _refused(["grpo", "--out", str(out), "--resume"], capsys)
    config.write_text(yaml.safe_dump({**saved, "trust_remote_code": True}))
    before = _snapshot(out)
    line = _refused(["grpo", "--out", str(out), "--resume", rewards], capsys)
    assert "trust_remote_code: true" in line and "--trust-remote-code" in line
    assert _snapshot(out) == before
    config.write_text(yaml.safe_dump(saved))
    # a reward file changed since the run started: refused, though named again
    (tmp_path / "good.py").write_text(REWARD.replace("len(c)", "-len(c)"))
    line = _refused(["grpo", "--out", str(out), "--resume", "run.steps=2", rewards], capsys)
    assert f"rewards={tmp_path / 'good.py'} changed since" in line
    (tmp_path / "good.py").write_text(REWARD)
    assert main(["grpo", "--out", str(out), "--resume", "run.steps=2", rewards]) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
