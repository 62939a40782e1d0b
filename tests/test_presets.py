"""Presets ship with the package: a wheel holds them, an installed (non-editable) postrl finds them, and
`--config NAME` loads one by name; a name that is neither a file nor a preset is an error listing them."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from postrl.runtime.config import ConfigError, load_config
from postrl.runtime.presets import preset_names, preset_path

ROOT = Path(__file__).resolve().parents[1]


def test_every_preset_loads_by_name():
    from postrl.control.loop import algorithm
    from postrl.lm.grpo import GRPOConfig
    from postrl.lm.stages import STAGES

    lm = {name: stage.config_class() for name, stage in STAGES.items() if name != "ppo"}
    lm |= {"rloo": GRPOConfig, "gspo": GRPOConfig, "dapo": GRPOConfig}  # GRPO's family: its estimator presets
    lm["online"] = STAGES["online-dpo"].config_class()  # online-dpo-reviews
    assert {"ppo-cartpole", "grpo-arithmetic", "sft-arithmetic", "rm-reviews", "ppo-reviews"} <= set(
        preset_names()
    )
    for name in preset_names():
        kind = name.split("-")[0]
        cls = (
            STAGES["ppo"].config_class()
            if name in ("ppo-reviews", "ppo-guess-number")
            else lm.get(kind) or algorithm(kind).config
        )
        assert load_config(cls, name) == load_config(cls, preset_path(name))


def test_an_unknown_config_name_lists_the_close_presets():
    from postrl.lm.sft import SFTConfig

    with pytest.raises(ConfigError, match="did you mean sft-arithmetic"):
        load_config(SFTConfig, "sft-arithmetc")
    with pytest.raises(ConfigError, match="config file not found: some/dir/x.yaml"):
        load_config(SFTConfig, "some/dir/x.yaml")


def test_a_wheel_installs_the_presets_and_the_control_command_finds_them(tmp_path):
    """A non-editable install used to run CartPole silently with n_steps 128 / 4 epochs: the rl-zoo preset
    (32 / 20) was not in the package."""
    source = tmp_path / "source"  # a copy: setuptools would reuse a stale build/ folder of the checkout
    shutil.copytree(ROOT / "postrl", source / "postrl", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("postrl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(p.name for p in (ROOT / "postrl" / "presets").glob("*.yaml"))
    assert sorted(n.rsplit("/", 1)[1] for n in names if n.startswith("postrl/presets/")) == shipped
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    code = (
        "import argparse, postrl; from postrl.control.commands import resolve_control_config; "
        "a = argparse.Namespace(resume=None, algo='ppo', config=None, env='CartPole-v1', total_steps=None, "
        "seed=None, overrides=[]); c = resolve_control_config(a); print(postrl.__file__, c.ppo.n_steps, c.ppo.epochs)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    where, n_steps, epochs = out.stdout.split()
    assert where.startswith(str(site)) and (n_steps, epochs) == ("32", "20")
