from dataclasses import dataclass, field
from typing import Literal

import pytest

from postrl.runtime.config import (
    ConfigError,
    field_help,
    format_help,
    from_dict,
    load_config,
    parse_override,
    read_yaml,
    to_dict,
)


@dataclass(frozen=True)
class Optim:
    lr: float = 3e-4
    """Adam learning rate."""
    max_grad_norm: float | None = 0.5
    """Global gradient-norm clip; null turns it off."""


@dataclass(frozen=True)
class Outer:
    optim: Optim = field(default_factory=lambda: Optim(lr=1.0, max_grad_norm=2.0))
    """An optimiser whose defaults differ from Optim's own."""


@dataclass(frozen=True)
class Cfg:
    env: str = "CartPole-v1"
    """Gymnasium id."""
    n_envs: int = 8
    """Parallel environments."""
    anneal: bool = True
    """Anneal the learning rate."""
    kind: Literal["grpo", "token"] = "grpo"
    """Aggregation."""
    hidden: tuple[int, ...] = (64, 64)
    """MLP sizes."""
    optim: Optim = field(default_factory=Optim)
    """Optimiser."""


def test_defaults_and_nested_values():
    cfg = from_dict(Cfg, {"n_envs": 4, "optim": {"lr": 1}})
    assert cfg.n_envs == 4 and cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert cfg.optim.max_grad_norm == 0.5 and cfg.hidden == (64, 64)


def test_unknown_key_names_it_and_suggests_the_closest():
    with pytest.raises(ConfigError, match=r"unknown config key 'n_env'.*did you mean 'n_envs'"):
        from_dict(Cfg, {"n_env": 4})
    with pytest.raises(ConfigError, match=r"'optim.learning_rat'.*"):
        from_dict(Cfg, {"optim": {"learning_rat": 1e-3}})
    with pytest.raises(ConfigError, match=r"did you mean 'optim.max_grad_norm'"):
        from_dict(Cfg, {"optim": {"max_grad_nrm": 1.0}})


def test_mistyped_values_name_the_key():
    with pytest.raises(ConfigError, match=r"'n_envs': expected int, got 'four'"):
        from_dict(Cfg, {"n_envs": "four"})
    with pytest.raises(ConfigError, match=r"'n_envs': expected int, got 2.5"):
        from_dict(Cfg, {"n_envs": 2.5})
    with pytest.raises(ConfigError, match=r"'kind'.*not one of"):
        from_dict(Cfg, {"kind": "sum"})
    with pytest.raises(ConfigError, match=r"'anneal': expected bool"):
        from_dict(Cfg, {"anneal": "maybe"})


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("n_envs: 2\noptim:\n  lr: 1e-3\n  max_grad_norm: 1.0\n")
    cfg = load_config(Cfg, path, ["optim.max_grad_norm=null", "hidden=[32, 32]", "env=Pendulum-v1"])
    assert cfg.n_envs == 2
    assert cfg.optim.lr == pytest.approx(1e-3)  # "1e-3" is a YAML string: coerced to float
    assert cfg.optim.max_grad_norm is None
    assert cfg.hidden == (32, 32) and cfg.env == "Pendulum-v1"
    with pytest.raises(ConfigError, match=r"unknown config key 'optim.lrr'") as info:
        load_config(Cfg, path, ["optim.lrr=1"])
    assert "c.yaml" not in str(info.value)  # the override's mistake, not the file's


def test_bad_yaml_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(Cfg, tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(Cfg, bad)


def test_override_parsing():
    assert parse_override("a.b=0.1") == (["a", "b"], 0.1)
    assert parse_override("--a.b=x") == (["a", "b"], "x")
    with pytest.raises(ConfigError):
        parse_override("novalue")


def test_round_trip_and_help():
    cfg = from_dict(Cfg, {"n_envs": 3})
    assert from_dict(Cfg, to_dict(cfg)) == cfg
    assert field_help(Cfg)["n_envs"] == "Parallel environments."
    text = format_help(Cfg)
    assert "optim.lr = 0.0003" in text and "Adam learning rate." in text


def test_a_nested_override_keeps_the_parents_other_defaults():
    cfg = load_config(Outer, None, ["optim.lr=0.5"])
    assert cfg.optim == Optim(lr=0.5, max_grad_norm=2.0)  # not Optim's own max_grad_norm=0.5
    assert from_dict(Outer, {"optim": {}}).optim == Optim(lr=1.0, max_grad_norm=2.0)


# ---- value ranges (CHECKS) -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ranged:
    lr: float = 1e-3
    """Learning rate."""
    gamma: float = 0.99
    """Discount."""
    batch_size: int = 8
    """Batch."""
    clip: float | None = None
    """Clip (null: off)."""
    hidden: tuple[int, ...] = (64, 64)
    """Widths."""
    free: float = 0.0
    """No range."""

    CHECKS = {"lr": "> 0", "gamma": "[0, 1]", "batch_size": ">= 1", "clip": "(0, 10)", "hidden": ">= 1"}


@dataclass(frozen=True)
class Holder:
    inner: Ranged = field(default_factory=Ranged)
    """Nested."""


@pytest.mark.parametrize(
    "override, message",
    [
        ("inner.lr=0", r"'inner.lr' must be > 0, got 0"),
        ("inner.lr=-1e-3", r"'inner.lr' must be > 0"),
        ("inner.lr=.nan", r"'inner.lr' is NaN"),
        ("inner.gamma=1.5", r"'inner.gamma' must be \[0, 1\], got 1.5"),
        ("inner.batch_size=0", r"'inner.batch_size' must be >= 1, got 0"),
        ("inner.clip=10", r"'inner.clip' must be \(0, 10\)"),
        ("inner.hidden=[64,0]", r"'inner.hidden\[1\]' must be >= 1"),
        ("inner.free=.nan", r"'inner.free' is NaN"),
        ("inner.lr=.inf", r"'inner.lr' is inf; it must be a finite number > 0"),  # inf is > 0
        ("inner.lr=inf", r"'inner.lr' is inf"),
        ("inner.free=-.inf", r"'inner.free' is -inf; it must be a finite number$"),
    ],
)
def test_values_outside_their_range_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(Holder, None, [override])


def test_values_inside_their_range_pass():
    cfg = load_config(Holder, None, ["inner.gamma=1", "inner.gamma=0", "inner.clip=null", "inner.free=-5"])
    assert cfg.inner.gamma == 0 and cfg.inner.clip is None


def test_validate_checks_a_config_built_in_python():
    from postrl.runtime.config import validate

    assert validate(Holder()).inner.lr == 1e-3
    with pytest.raises(ConfigError, match="'inner.gamma'"):
        validate(Holder(inner=Ranged(gamma=-0.1)))
    assert validate(Cfg(kind="token")).kind == "token"
    with pytest.raises(ConfigError, match="'kind': 'tokens' is not one of 'grpo', 'token'"):
        validate(Cfg(kind="tokens"))  # type: ignore[arg-type]


def test_help_shows_the_range():
    assert "(valid: > 0)" in format_help(Holder)


def test_every_shipped_config_default_is_valid():
    """The ranges agree with every default and preset postrl ships."""
    from pathlib import Path

    from postrl.control.loop import algorithm
    from postrl.demo import DemoConfig
    from postrl.lm.grpo import GRPOConfig
    from postrl.lm.ppo import PPOConfig
    from postrl.lm.pretrain import PretrainConfig
    from postrl.lm.reward_model import RMConfig
    from postrl.lm.sft import SFTConfig
    from postrl.runtime.config import validate

    for cls in (DemoConfig, GRPOConfig, PPOConfig, PretrainConfig, RMConfig, SFTConfig):
        validate(cls())
    for algo in ("reinforce", "a2c", "trpo", "ppo", "prefs"):
        validate(algorithm(algo).config())
    configs = Path(__file__).resolve().parents[2] / "configs"
    for path in sorted(configs.glob("*.yaml")):
        kind = path.stem.split("-")[0]
        cls = {
            "grpo": GRPOConfig,
            "ppo": PPOConfig,
            "rm": RMConfig,
            "sft": SFTConfig,
            "pretrain": PretrainConfig,
        }
        # a ppo preset with a model key is `postrl ppo`'s (LM), not `postrl control ppo`'s
        lm_ppo = kind == "ppo" and "model" in read_yaml(path)
        if kind in ("reinforce", "a2c", "trpo", "prefs") or (kind == "ppo" and not lm_ppo):
            load_config(algorithm(kind).config, path)
        elif kind in cls:
            load_config(cls[kind], path)


def test_an_error_is_blamed_on_the_file_only_when_it_is_the_files(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("inner:\n  lr: 0.1\n")
    with pytest.raises(ConfigError) as info:
        load_config(Holder, path, ["inner.gamma=2"])
    assert "'inner.gamma'" in str(info.value) and str(path) not in str(info.value)
    path.write_text("inner:\n  lr: -1\n")
    with pytest.raises(ConfigError, match=r"'inner.lr' must be > 0.*\(in .*c.yaml\)"):
        load_config(Holder, path)


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "a:\n  b: 1\n c: 2\n",
            r"bad\.yaml:3:2: invalid YAML: while parsing a block mapping \(it starts at line 1, column 1\); expected <block end>",
        ),
        ("a: [1, 2\n", r"bad\.yaml:2:1: invalid YAML: .*expected ',' or '\]'"),
        (
            "a: !!python/object:os.system x\n",
            r"bad\.yaml:1:4: invalid YAML: could not determine a constructor",
        ),
        (b"\xff\xfe bad", r"bad\.yaml: not UTF-8 text \(byte 0\)"),
    ],
)
def test_a_broken_yaml_file_is_one_line_naming_file_line_and_column(tmp_path, text, message):
    """PyYAML's own message is several lines and names "<unicode string>"; ours is path:line:column."""
    path = tmp_path / "bad.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match=message) as err:
        load_config(Holder, path)
    assert "\n" not in str(err.value)


def test_a_directory_as_config_says_so(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="is a directory; it takes a YAML file or a preset's name"):
        load_config(Holder, tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sft-arithmetic").mkdir()  # e.g. a run folder named like a preset: the preset wins
    assert read_yaml("sft-arithmetic")


def test_a_yaml_file_with_a_byte_order_mark_reads(tmp_path):
    path = tmp_path / "bom.yaml"
    path.write_bytes("\ufeffinner:\n  lr: 0.5\n".encode())
    assert load_config(Holder, path).inner.lr == 0.5


@dataclass(frozen=True)
class Switch:
    padding_free: Literal["auto", "off"] = "auto"
    """A choice among words that YAML reads as booleans."""
    mode: Literal["auto", "on", "off"] = "auto"
    """Another."""


def test_yaml_booleans_are_the_words_written_for_a_choice_of_words(tmp_path):
    """YAML 1.1 reads ``off``/``on`` as booleans: a choice among words takes the word, from a file or a flag."""
    path = tmp_path / "c.yaml"
    path.write_text("padding_free: off\nmode: on\n")
    assert load_config(Switch, path, []) == Switch("off", "on")
    assert load_config(Switch, None, ["padding_free=off", "mode=off"]) == Switch("off", "off")
    with pytest.raises(ConfigError, match=r"'padding_free': 'on' is not one of 'auto', 'off'"):
        load_config(Switch, None, ["padding_free=on"])
