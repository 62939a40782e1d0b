"""The workspace's input files for the bad-input cases: data files (good and bad), reward-function files,
YAML configs, pictures and a pickled model folder, written under ``ws`` by `write_inputs`."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

from PIL import Image


def _jsonl(path: Path, rows: list[Any]) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def _sft(i: int) -> dict[str, str]:
    return {"prompt": f"What is {i}+{i}?", "completion": f" {2 * i}"}


def _pref(i: int) -> dict[str, str]:
    return {"prompt": f"Review {i}:", "chosen": " great food", "rejected": " bad"}


def _prompt(i: int) -> dict[str, str]:
    return {"prompt": f"What is {i}+1?", "answer": str(i + 1)}


def write_inputs(ws: Path) -> None:
    """Data files (good and bad), reward-function files and YAML configs under ``ws``."""
    data, rewards, configs = ws / "data", ws / "rewards", ws / "configs"
    for folder in (data, rewards, configs):
        folder.mkdir(parents=True)
    sft = [_sft(i) for i in range(40)]
    _jsonl(data / "sft.jsonl", sft)
    _jsonl(data / "prefs.jsonl", [_pref(i) for i in range(40)])
    _jsonl(data / "prompts.jsonl", [_prompt(i) for i in range(40)])
    _jsonl(data / "sft_bad_json.jsonl", [*sft[:2], '{"prompt": "What is 3+3?", "completion": ', *sft[3:10]])
    _jsonl(data / "sft_no_completion.jsonl", [sft[0], {"prompt": "What is 1+1?"}, *sft[2:10]])
    _jsonl(data / "sft_empty_prompt.jsonl", [sft[0], {"prompt": "", "completion": " 2"}, *sft[2:10]])
    _jsonl(
        data / "sft_empty_completion.jsonl",
        [*sft[:3], {"prompt": "What is 3+3?", "completion": ""}, *sft[4:10]],
    )
    _jsonl(
        data / "sft_late_bad.jsonl", [*[_sft(i % 50) for i in range(499)], {"prompt": 5, "completion": " 5"}]
    )
    (data / "empty.jsonl").write_text("")
    prefs = [_pref(i) for i in range(10)]
    _jsonl(data / "prefs_no_rejected.jsonl", [prefs[0], {"prompt": "Review:", "chosen": " good"}, *prefs[2:]])
    _jsonl(data / "prefs_bad_target.jsonl", [*prefs[:2], {**prefs[2], "target": 2.0}, *prefs[3:]])
    _jsonl(data / "prefs_empty_chosen.jsonl", [prefs[0], {**prefs[1], "chosen": ""}, *prefs[2:]])
    prompts = [_prompt(i) for i in range(10)]
    _jsonl(data / "prompts_no_prompt.jsonl", [{"question": "What is 1+1?", "answer": "2"}, *prompts[1:]])
    _jsonl(
        data / "prompts_bad_json.jsonl",
        [prompts[0], '{"prompt": "What is 2+1?", "answer": "3"', *prompts[2:]],
    )
    _jsonl(data / "prompts_empty_prompt.jsonl", [*prompts[:2], {"prompt": "", "answer": "1"}, *prompts[3:]])
    _write_issue_41_inputs(data, prefs, prompts)
    _write_pickled_model(ws / "pickled")
    _write_kto_inputs(data)
    _write_more_issue_41_inputs(data, prefs, prompts)
    long = " great food" * 80  # far more than the tiny model's 128 positions
    _jsonl(data / "sft_long.jsonl", [*sft[:3], {**sft[3], "completion": long}, *sft[4:10]])
    _jsonl(data / "prefs_long.jsonl", [*prefs[:3], {**prefs[3], "chosen": long}, *prefs[4:]])

    (rewards / "good.py").write_text(
        "def reward(prompts, completions, **columns):\n    return [0.0 for _ in completions]\n"
    )
    (rewards / "syntax_error.py").write_text(
        "def reward(prompts, completions, **columns)\n    return [0.0 for _ in completions]\n"
    )
    (rewards / "imports_missing.py").write_text(
        "import postrl_no_such_module\n\n\ndef reward(prompts, completions, **columns):\n"
        "    return [0.0 for _ in completions]\n"
    )
    (rewards / "wrong_sig.py").write_text("def r(x):\n    return [0.0]\n")
    (rewards / "not_callable.py").write_text("reward = 3\n")

    # the keys these set are outside every budget, whose overrides would otherwise mask them
    (configs / "ct_unknown_key.yaml").write_text("ppo:\n  clip_epss: 0.1\n")
    (configs / "not_utf8.yaml").write_bytes(b"\xff\xfe ppo: 1\n")
    (configs / "int_key.yaml").write_text("1: 2\n")
    (configs / "dup_key.yaml").write_text("run:\n  steps: 2\n  steps: 5\n")
    (configs / "broken.yaml").write_text("ppo:\n  lr: [0.1\n")
    (configs / "sft_wrong_type.yaml").write_text("run:\n  log_every: ten\n")
    (configs / "grpo_bad_range.yaml").write_text("grpo:\n  clip_eps: 0\n")
    (configs / "ct_old_key.yaml").write_text("run:\n  keep_checkpoints: 3\n")
    (configs / "sft_old_key.yaml").write_text("train:\n  save_every: 10\n")


def _write_issue_41_inputs(data: Path, prefs: list[dict[str, Any]], prompts: list[dict[str, Any]]) -> None:
    """Data files of the issue #41 cases: one pair with the same answer twice, mixed formats, pictures."""
    chat = [{"prompt": [{"role": "user", "content": p["prompt"]}], "chosen": [{"role": "assistant", "content": p["chosen"]}],
             "rejected": [{"role": "assistant", "content": p["rejected"]}]} for p in prefs]  # fmt: skip
    _jsonl(data / "prefs_same.jsonl", [*prefs[:2], {**prefs[2], "rejected": prefs[2]["chosen"]}, *prefs[3:]])
    _jsonl(data / "prefs_mixed.jsonl", [*prefs[:3], chat[3], *prefs[4:]])
    _jsonl(
        data / "prefs_mixed_row.jsonl", [prefs[0], {**prefs[1], "rejected": chat[1]["rejected"]}, *prefs[2:]]
    )
    _jsonl(data / "prefs_chat.jsonl", chat)
    sft = [_sft(i) for i in range(10)]
    _jsonl(data / "sft_images.jsonl", [sft[0], {**sft[1], "images": ["dots.png"]}, *sft[2:]])
    _jsonl(data / "prompts_image.jsonl", [*prompts[:2], {**prompts[2], "image": "dots.png"}, *prompts[3:]])
    tool = {"prompt": [{"role": "tool", "content": "x"}], "completion": " y"}
    user = [
        {"prompt": [{"role": "user", "content": r["prompt"]}], "completion": r["completion"]} for r in sft
    ]
    _jsonl(data / "sft_tool_role.jsonl", [user[0], tool, *user[2:]])
    Image.new("RGB", (32, 32), "white").save(data / "dots.png")
    _png_claiming(data / "bomb.png", 20000, 20000)
    pictured = [{"prompt": "<image>How many dots?", "completion": " 3", "images": ["dots.png"]}] * 10
    _jsonl(
        data / "vlm_two_slots.jsonl",
        [pictured[0], {**pictured[1], "prompt": "<image><image>How many?"}, *pictured[2:]],
    )
    _jsonl(data / "vlm_bomb.jsonl", [pictured[0], {**pictured[1], "images": ["bomb.png"]}, *pictured[2:]])


def _png_claiming(path: Path, width: int, height: int) -> None:
    """A 1×1 PNG whose header (IHDR, its CRC fixed) claims ``width`` × ``height`` pixels."""
    Image.new("RGB", (1, 1)).save(path)
    data = bytearray(path.read_bytes())
    start = data.index(b"IHDR")  # type (4) | width, height (4 + 4) | 5 more bytes | crc (4)
    data[start + 4 : start + 12] = struct.pack(">II", width, height)
    data[start + 17 : start + 21] = struct.pack(">I", zlib.crc32(bytes(data[start : start + 17])))
    path.write_bytes(bytes(data))


def _write_pickled_model(path: Path) -> None:
    """A tiny Llama folder whose weights are a pickled ``pytorch_model.bin`` that holds a Python object besides
    its tensors (training arguments, as old checkpoints often do): ``torch.load(weights_only=True)`` refuses it."""
    import argparse

    import torch

    path.mkdir()
    config = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 400}  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    weights = {"model.embed_tokens.weight": torch.zeros(400, 32), "args": argparse.Namespace(lr=1e-4)}
    torch.save(weights, path / "pytorch_model.bin")


def _kto(i: int) -> dict[str, Any]:
    return {
        "prompt": f"Review {i}:",
        "completion": " great food" if i % 2 == 0 else " bad",
        "label": i % 2 == 0,
    }


def _write_kto_inputs(data: Path) -> None:
    """TRL's unpaired format (prompt, completion, label), good and bad."""
    rows = [_kto(i) for i in range(40)]
    _jsonl(data / "kto.jsonl", rows)
    _jsonl(data / "kto_label_string.jsonl", [*rows[:2], {**rows[2], "label": "yes"}, *rows[3:10]])
    _jsonl(data / "kto_no_label.jsonl", [rows[0], {"prompt": "Review 1:", "completion": " bad"}, *rows[2:10]])
    _jsonl(data / "kto_no_completion.jsonl", [rows[0], {"prompt": "Review 1:", "label": False}, *rows[2:10]])
    _jsonl(data / "kto_one_kind.jsonl", [{**r, "label": True} for r in rows[:10]])
    chat = [{"prompt": [{"role": "user", "content": r["prompt"]}],
             "completion": [{"role": "assistant", "content": r["completion"]}], "label": r["label"]}
            for r in rows[:10]]  # fmt: skip
    _jsonl(data / "kto_chat.jsonl", chat)
    _jsonl(data / "kto_mixed.jsonl", [*rows[:3], chat[3], *rows[4:10]])
    _jsonl(data / "kto_images.jsonl", [rows[0], {**rows[1], "images": ["dots.png"]}, *rows[2:10]])


def _write_more_issue_41_inputs(
    data: Path, prefs: list[dict[str, Any]], prompts: list[dict[str, Any]]
) -> None:
    """Issue #41 items 5, 6 and 15 beyond the first cases: pictures a processor cannot take (not a picture, cut
    short, missing), pictures in preference pairs for a text-only model, conversational prompts for GRPO."""
    (data / "not_a_picture.png").write_text("this is text, not a PNG\n")
    whole = (data / "dots.png").read_bytes()
    (data / "cut_short.png").write_bytes(whole[: len(whole) // 2])
    pictured = {"prompt": "<image>How many dots?", "completion": " 3", "images": ["dots.png"]}
    for name, picture in (("not_picture", "not_a_picture.png"), ("cut_short", "cut_short.png"),
                          ("missing_picture", "no_such.png")):  # fmt: skip
        _jsonl(data / f"vlm_{name}.jsonl", [pictured, {**pictured, "images": [picture]}, *[pictured] * 8])
    _jsonl(data / "prefs_images.jsonl", [*prefs[:2], {**prefs[2], "images": ["dots.png"]}, *prefs[3:]])
    chat = [{"prompt": [{"role": "user", "content": p["prompt"]}], "answer": p["answer"]} for p in prompts]
    _jsonl(data / "prompts_chat.jsonl", chat)
