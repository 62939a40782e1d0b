"""The `postrl` command: --version, --help on every subcommand, clear errors for bad input."""

import subprocess
import sys

import pytest

from postrl import __version__
from postrl.cli import build_parser, main

SUBCOMMANDS = [
    ["control", "train"],
    ["control", "eval"],
    ["data", "export"],
    ["pretrain"],
    ["sft"],
    ["rm"],
    ["ppo"],
    ["grpo"],
    ["generate"],
    ["demo"],
    ["judge"],
    ["online-dpo"],
]


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"postrl {__version__}"


@pytest.mark.parametrize("words", SUBCOMMANDS, ids=" ".join)
def test_every_subcommand_has_help(words, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*words, "--help"])
    assert exit_.value.code == 0
    assert "usage: postrl " + " ".join(words) in capsys.readouterr().out


def test_unknown_subcommand_suggests_the_closest(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["gpro"])
    assert exit_.value.code == 2
    assert "did you mean 'grpo'" in capsys.readouterr().err


def test_unknown_config_key_is_a_clear_error(tmp_path, capsys):
    code = main(["sft", "--out", str(tmp_path / "r"), "run.stepz=3"])
    err = capsys.readouterr().err
    assert code == 2
    assert "unknown config key 'run.stepz'" in err and "did you mean 'run.steps'" in err
    assert "Traceback" not in err


def test_list_keys_shows_the_help_of_every_field(capsys):
    assert main(["grpo", "--list-keys"]) == 0
    out = capsys.readouterr().out
    assert "grpo.beta" in out and "grpo.loss_type" in out


def test_help_is_fast_and_imports_no_torch():
    code = "import sys, postrl.cli as c; c.build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_parser_lists_all_commands():
    text = build_parser().format_help()
    for name in ("control", "data", "pretrain", "sft", "rm", "ppo", "grpo", "generate", "demo"):
        assert name in text


def _leaves(cfg, prefix=""):
    """Every leaf field of a config instance as {dotted key: value}."""
    import dataclasses

    out = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            out.update(_leaves(value, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = value
    return out


@pytest.mark.parametrize(
    "argv, module, cls",
    [
        (["pretrain"], "postrl.lm.pretrain", "PretrainConfig"),
        (["sft"], "postrl.lm.sft", "SFTConfig"),
        (["rm"], "postrl.lm.reward_model", "RMConfig"),
        (["ppo"], "postrl.lm.ppo", "PPOConfig"),
        (["grpo"], "postrl.lm.grpo", "GRPOConfig"),
        (["demo"], "postrl.demo", "DemoConfig"),
        (["control", "train", "--algo", "trpo"], "postrl.control.trpo", "ControlTRPOConfig"),
    ],
)
def test_list_keys_prints_the_defaults_a_run_uses(argv, module, cls, capsys):
    """`--list-keys` shows, for every key, the value a run with no overrides resolves to (not the nested
    class's own default, e.g. GRPO's optim.lr 2e-4, not OptimConfig's 1e-3)."""
    import importlib
    import re

    from postrl.runtime.config import load_config

    assert main([*argv, "--list-keys"]) == 0
    printed = dict(re.findall(r"^  (\S+) = (.*)$", capsys.readouterr().out, flags=re.M))
    resolved = _leaves(load_config(getattr(importlib.import_module(module), cls)))
    assert printed, "nothing printed"
    for key, value in resolved.items():
        shown = printed[key]
        assert shown == repr(value), key


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["demo", "--out", "D", "--resume", "--bogus"], "`postrl demo --help`"),
        (["sft", "--out"], "`postrl sft --help`"),
        (["gpro"], "`postrl --help`"),
        ([], "`postrl --help`"),
        (["control", "ppo"], "`postrl control --help`"),
    ],
)
def test_a_command_line_error_is_one_line_naming_the_help(argv, hint, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(argv)
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert stop.value.code == 2 and captured.out == "" and len(lines) == 1, lines
    assert lines[0].startswith("postrl: error: ") and lines[0].endswith(f"({hint} lists the options)")
    assert not (tmp_path / "D").exists()


def test_overrides_may_come_after_a_flag(tmp_path, capsys):
    """`--out D a=1 --resume b=2`: argparse leaves b=2 over; it is an override as a=1 is (an unknown key here,
    so the config's own error, not argparse's "unrecognized arguments", shows it was read as one)."""
    code = main(["sft", "--out", str(tmp_path / "r"), "--overwrite", "run.seedz=1"])
    assert code == 2 and "unknown config key 'run.seedz'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["sft", "--out", str(tmp_path / "r"), "run.steps=3", "--bogus"])
    assert stop.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("stage", ["sft", "rm", "ppo", "grpo", "dpo", "kto"])
def test_every_lm_training_stage_takes_model_and_data(stage, tmp_path):
    """#41 item 14: `postrl ppo --data task:reviews` was 'unrecognized arguments: --data' while the other
    stages took it; --data sets the key `data` (ppo: its prompts) in every one."""
    from postrl.lm.stage_commands import stage_config

    argv = [stage, "--model", "some/model", "--data", "task:reviews", "--out", str(tmp_path / "r")]
    cfg = stage_config(stage, build_parser().parse_args(argv))
    assert (cfg.model, cfg.data) == ("some/model", "task:reviews")


def test_verbose_prints_which_path_runs_and_quiet_does_not(tmp_path):
    """postrl logs which backend runs at INFO; without a handler those lines were lost. `-v` shows them."""
    argv = ["control", "train", "--algo", "ppo", "--env", "CartPole-v1", "run.steps=512", "ppo.n_steps=128"]
    cmd = [sys.executable, "-m", "postrl.cli"]
    loud = subprocess.run([*cmd, "-v", *argv, "--out", str(tmp_path / "a")], capture_output=True, text=True)
    quiet = subprocess.run([*cmd, *argv, "--out", str(tmp_path / "b")], capture_output=True, text=True)
    assert loud.returncode == quiet.returncode == 0, loud.stderr + quiet.stderr
    assert "postrl: env.backend=auto:" in loud.stderr
    assert "env.backend=auto" not in quiet.stderr
