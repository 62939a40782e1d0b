"""The workspace the bad-input cases point into: tiny models (a Llama with and without its tokenizer, a reward
model, a tokenizer without a chat template, a vision-language model) and a run folder of each command
(finished, interrupted with a corrupt checkpoint, and a folder that is not a run), built by `build_workspace`."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import yaml

from tests.bad_input.case import BUDGETS, COMMANDS, FLAGS
from tests.bad_input.inputs import write_inputs

REPO = Path(__file__).resolve().parents[2]
TINY_VOCAB = 400
LM_STAGES = ("pretrain", "sft", "rm", "ppo", "grpo")
CONFIG_CLASSES = {  # command → (module, config class, preset YAML giving the base); LM stages: the CLI's own
    "control train": ("postrl.control.ppo", "ControlPPOConfig", "ppo-cartpole.yaml"),
    "control prefs": ("postrl.control.prefs", "ControlPrefsConfig", "prefs-cartpole.yaml"),
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
    _issue_41_models(ws, tokenizer)


def _tiny_vlm(ws: Path) -> None:
    """A tiny vision-language model (the built-in LLaVA) at ``ws/vlm``, for the issue #41 item 5 cases."""
    from postrl.lm.tasks import get_task
    from postrl.lm.vlm import TinyVLMConfig, build_tiny_vlm, build_vlm_tokenizer, save_vlm

    config = TinyVLMConfig(vision_hidden_size=32, hidden_size=64, intermediate_size=128, vocab_size=300)
    tokenizer = build_vlm_tokenizer(get_task("shapes", n_train=50, n_test=10).corpus_lines(300), 300)
    save_vlm(*build_tiny_vlm(tokenizer, config, seed=0), ws / "vlm")


def _issue_41_models(ws: Path, tokenizer: Any) -> None:
    """Item 13: a sequence classifier with 3 labels (not a reward model) at ``ws/rm_3labels``; item 12: LoRA
    adapter folders whose base model is gone (``ws/adapter_nobase``) or whose weights do not fit their base
    (``ws/adapter_misfit``)."""
    import torch
    from peft import LoraConfig
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(ws / "model", num_labels=3)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(str(ws / "rm_3labels"))
    tokenizer.save_pretrained(str(ws / "rm_3labels"))
    for name, base in (("adapter_nobase", ws / "no_such_base"), ("adapter_misfit", ws / "model")):
        lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], task_type="CAUSAL_LM")
        lora.base_model_name_or_path = str(base)
        lora.save_pretrained(str(ws / name))
        prefix = "base_model.model.model.layers.0.self_attn.q_proj"
        weights = {f"{prefix}.lora_A.weight": torch.zeros(2, 7), f"{prefix}.lora_B.weight": torch.zeros(7, 2)}
        save_file(weights, str(ws / name / "adapter_model.safetensors"))


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
        from postrl.lm.stages import STAGES

        if cmd in STAGES:
            module, cls_name = STAGES[cmd].module, STAGES[cmd].config_name
        cls = getattr(importlib.import_module(module), cls_name)
        if cmd == "demo":
            from postrl.demo import quick

            base = to_dict(quick(cls()))
        return yaml.safe_dump(to_dict(load_config(cls, None, texts, base=base)), sort_keys=False)
    except Exception:  # the code is changing under this test; a plain mapping still names the budget
        return yaml.safe_dump({**(base or {}), **_nested(dict(t.split("=", 1) for t in texts))})


def _fake_run(path: Path, config: str, lm: bool, finished: bool = True, corrupt: bool | None = None) -> None:
    """A run folder as a training command leaves it: finished, or interrupted with a corrupt checkpoint
    (``corrupt``: every checkpoint cut in half; by default when not finished)."""
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
    if not (not finished if corrupt is None else corrupt):
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
    _issue_41_runs(ws)
    notarun = ws / "runs" / "notarun"
    (notarun / "sub").mkdir(parents=True)
    (notarun / "notes.txt").write_text("not a run\n")
    (notarun / "sub" / "data.csv").write_text("a,b\n1,2\n")


RUN_KINDS = {
    "damaged": ("control train", "sft", "grpo", "dpo", "kto"),
    "changed": ("sft", "dpo", "kto"),
    "inputs-damaged": ("dpo",),
    "trusting": ("sft", "kto"),
    "entry-point": ("control train",),
}
"""Run folders of issue #41 items 2, 3 and 9 (``{cmd}-{kind}`` under ``ws/runs``): damaged, a finished run whose
every checkpoint is corrupt (a refused resume must not make it look interrupted); changed, an interrupted run
whose inputs.json records another content of its data file (the file changed in place since it started);
inputs-damaged, inputs.json that is not JSON; trusting, a config.yaml that sets trust_remote_code: true;
entry-point, a control run whose env.id is a module:Env entry point (importing it runs the module)."""


def _issue_41_runs(ws: Path) -> None:
    for kind, commands in RUN_KINDS.items():
        for cmd in commands:
            config, path = (
                yaml.safe_load(_config_yaml(cmd, ws)),
                ws / "runs" / f"{cmd.replace(' ', '-')}-{kind}",
            )
            if kind == "trusting":
                config["trust_remote_code"] = True
            if kind == "entry-point":
                config["env"]["id"] = "postrl_bad_input_envs:Corridor"
            lm = cmd in LM_STAGES
            _fake_run(
                path, yaml.safe_dump(config, sort_keys=False), lm, finished=kind == "damaged", corrupt=True
            )
            if kind == "changed":
                entry = {"key": "data", "path": config["data"], "sha256": "0" * 64}
                (path / "inputs.json").write_text(json.dumps({"inputs": [entry]}, indent=2) + "\n")
            if kind == "inputs-damaged":
                (path / "inputs.json").write_text('{"inputs": [\n')


def build_workspace(ws: Path) -> Path:
    """Inputs, tiny models and run folders under ``ws``; returns ``ws``."""
    write_inputs(ws)
    _tiny_models(ws)
    _runs(ws)
    return ws
