"""Presets: the YAML configs postrl ships for its built-in tasks and Gymnasium envs (package data).

They live in the package (``postrl/presets/*.yaml``), so a wheel or a non-editable install has them too, and
are found through ``importlib.resources``. ``--config NAME`` (or ``NAME.yaml``) loads the preset of that name
when no file of that name exists; a name that is neither is an error that lists the presets.
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path

from postrl.runtime.errors import ConfigError, UserError


def presets_dir() -> Path:
    """The folder of the shipped presets; an install without it is broken, and says so."""
    folder = Path(str(resources.files("postrl") / "presets"))
    if not folder.is_dir():
        raise UserError(
            f"postrl's presets are missing ({folder}): the package was installed without its data files; "
            "reinstall it (pip install --force-reinstall postrl)"
        )
    return folder


def preset_names() -> list[str]:
    """Every shipped preset's name (its file name without .yaml), sorted."""
    return sorted(p.stem for p in presets_dir().glob("*.yaml"))


def preset_path(name: str) -> Path:
    """The file of preset ``name`` (with or without .yaml); a :class:`UserError` lists the close ones."""
    stem = name.removesuffix(".yaml")
    path = presets_dir() / f"{stem}.yaml"
    if path.is_file():
        return path
    close = difflib.get_close_matches(stem, preset_names(), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; presets: {', '.join(preset_names())}"
    raise ConfigError(f"config '{name}': no such file, and no preset of that name{hint}")


def config_file(value: str | Path) -> Path:
    """``--config VALUE``: an existing file, else a shipped preset of that name (``sft-arithmetic``)."""
    path = Path(value).expanduser()
    if path.is_file():
        return path
    if path.is_dir() and path.name.removesuffix(".yaml") not in preset_names():
        raise ConfigError(f"--config {value} is a directory; it takes a YAML file or a preset's name")
    if path.parent != Path(".") and path.parent.name != "configs":
        raise ConfigError(f"config file not found: {value}")
    return preset_path(path.name)
