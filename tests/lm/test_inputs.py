"""Bad model inputs: every way a model or tokenizer path, hub name or load setting can be wrong is a
`UserError` (one line from the CLI) that names the config key, the path and what would work, raised before
anything is trained. No test touches the network: hub names are tried with HF_HUB_OFFLINE set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from huggingface_hub import constants as hf_constants

from postrl.lm.models import (
    PolicyWithValueHead,
    ScalarHeadModel,
    load_causal_lm,
    model_source,
    resolve_dtype,
)
from postrl.lm.tokenizer import load_tokenizer
from postrl.runtime.errors import UserError

HUB_NAME = "postrl-test/no-such-model"


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """HF_HUB_OFFLINE=1, also in huggingface_hub's constant (read once at import)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)


def _one_line(err: pytest.ExceptionInfo) -> str:
    assert isinstance(err.value, UserError)
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    "load",
    [
        lambda name: load_causal_lm(name, what="model"),
        lambda name: load_tokenizer(name, what="model"),
        lambda name: ScalarHeadModel.from_pretrained(name, what="model"),
        lambda name: PolicyWithValueHead.from_pretrained(name, what="model"),
    ],
    ids=["causal_lm", "tokenizer", "scalar_head", "value_head"],
)
def test_a_hub_name_while_offline(offline, load) -> None:
    with pytest.raises(UserError) as info:
        load(HUB_NAME)
    message = _one_line(info)
    assert message.startswith(f"model '{HUB_NAME}': no such folder; a hub name needs network access")
    assert "(HF_HUB_OFFLINE is set)" in message


def test_a_path_that_does_not_exist_is_not_tried_on_the_hub(offline, tmp_path: Path) -> None:
    for name in (tmp_path / "no_such_model", "./no_such_model", "~/no_such_model", "a/b/c"):
        with pytest.raises(UserError) as info:
            load_causal_lm(name, what="ref_model")
        assert _one_line(info) == f"ref_model '{name}': no such folder"
    with pytest.raises(UserError, match="not a valid hub name"):
        load_causal_lm("not a name!")


def test_a_folder_or_file_that_is_not_a_model(tmp_path: Path, tiny_lm_dir: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(UserError) as info:
        model_source(tmp_path)
    assert "the folder has no config.json, so it is not a Hugging Face model" in _one_line(info)
    with pytest.raises(UserError, match=r"model '.*notes.txt': a file, not a model folder"):
        load_causal_lm(tmp_path / "notes.txt")
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((tiny_lm_dir / "config.json").read_text())
    with pytest.raises(UserError) as info:
        load_causal_lm(no_weights)
    assert "cannot load it: " in _one_line(info) and "model.safetensors" in str(info.value)
    assert model_source(tiny_lm_dir) == (str(tiny_lm_dir), True)


def test_custom_code_needs_trust_remote_code(tmp_path: Path) -> None:
    config = {"model_type": "postrl_custom", "auto_map": {"AutoConfig": "configuration_custom.CustomConfig"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "configuration_custom.py").write_text("raise RuntimeError('must never run')\n")
    with pytest.raises(UserError) as info:
        load_causal_lm(tmp_path)
    message = _one_line(info)
    assert "ships its own Python code; pass trust_remote_code=true only if you trust" in message


def test_an_architecture_transformers_does_not_know(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "postrl_no_such_architecture"}))
    with pytest.raises(UserError) as info:
        load_causal_lm(tmp_path)
    assert "this transformers version cannot build it" in _one_line(info)


@pytest.mark.parametrize(
    ("dtype", "expected"), [("bf16", "bfloat16"), ("float32", "float32"), ("auto", "auto")]
)
def test_dtype_names(dtype: str, expected: str) -> None:
    assert str(resolve_dtype(dtype)).removeprefix("torch.") == expected


def test_an_unknown_dtype_names_the_key_and_the_valid_ones(tiny_lm_dir: Path) -> None:
    with pytest.raises(UserError) as info:
        resolve_dtype("float8", key="dtype")
    message = _one_line(info)
    for name in ("dtype", "'float8'", "float32", "bfloat16", "float16", "auto"):
        assert name in message
    with pytest.raises(UserError, match="unknown dtype 'fp8'"):  # before the model is read
        load_causal_lm(tiny_lm_dir, dtype="fp8")
