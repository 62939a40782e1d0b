"""Every LM trainer runs with ``run.dtype=bfloat16`` (weights stored in bfloat16) on the CPU, with and without
LoRA, on tiny budgets: the run finishes, its metrics are finite, its export is bfloat16 (adapters float32), and
PPO's critic and actor take LoRA together with the reference as the adapter-free base."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from postrl.lm.grpo import run_grpo
from postrl.lm.models import ScalarHeadModel, load_causal_lm
from postrl.lm.ppo import run_ppo
from postrl.lm.reward_model import run_rm
from postrl.lm.sft import SFTConfig, run_sft
from postrl.lm.spine import LoraConfig, RunConfig
from postrl.lm.trainer import OptimConfig, TrainConfig
from postrl.runtime.logging import read_jsonl
from tests.lm.test_grpo import _config as grpo_config
from tests.lm.test_ppo import _cfg as ppo_config
from tests.lm.test_ppo import tiny_rm_dir  # noqa: F401  (a fixture)
from tests.lm.test_reward_model import _cfg as rm_config

LORA = LoraConfig(enabled=True, rank=4, alpha=8.0)


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _finite_rows(run_dir: Path) -> list[dict]:
    rows = read_jsonl(run_dir / "metrics.jsonl")
    for row in rows:
        for key, value in row.items():
            if isinstance(value, float) and key not in ("heldout_accuracy", "gold_reward", "lr"):
                assert math.isfinite(value), (key, row)
    return rows


def _dtypes(folder: Path) -> set[torch.dtype]:
    return {t.dtype for f in folder.glob("*.safetensors") for t in load_file(str(f)).values()}


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_sft_in_bfloat16(tiny_lm_dir: Path, tmp_path: Path, lora: bool) -> None:
    cfg = SFTConfig(
        model=str(tiny_lm_dir),
        task={"n_train": 32, "n_test": 4},
        train=TrainConfig(batch_size=4, max_length=48, eval_examples=8),
        optim=OptimConfig(lr=1e-3, warmup_steps=0),
        run=RunConfig(steps=2, eval_every=0, save_every=0, log_every=1, device="cpu", dtype="bfloat16", lora=LoraConfig(enabled=lora)),
        eval_size=2,
    )  # fmt: skip
    summary = run_sft(cfg, tmp_path / "run")
    assert math.isfinite(summary["heldout_loss"]) and len(_finite_rows(tmp_path / "run")) >= 2
    assert _dtypes(tmp_path / "run" / "model") == ({torch.float32} if lora else {torch.bfloat16})


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_rm_in_bfloat16(tiny_lm_dir: Path, tmp_path: Path, lora: bool) -> None:
    cfg = rm_config(tiny_lm_dir, dtype="bfloat16", lora=LoraConfig(enabled=lora, rank=4))
    cfg = replace(cfg, run=replace(cfg.run, steps=2, eval_every=0, save_every=0))
    summary = run_rm(cfg, tmp_path / "run")
    assert math.isfinite(summary["heldout_accuracy"])
    _finite_rows(tmp_path / "run")
    rm = ScalarHeadModel.from_pretrained(tmp_path / "run" / "model", dtype="bfloat16")  # exported merged
    assert next(rm.backbone.parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize("critic", ["reward_model", pytest.param("shared", marks=pytest.mark.slow)])
def test_ppo_in_bfloat16_with_lora_on_actor_and_critic(
    tiny_lm_dir: Path,
    tiny_rm_dir: Path,  # noqa: F811
    tmp_path: Path,
    critic: str,
) -> None:
    run = RunConfig(
        steps=2, log_every=1, eval_every=0, save_every=1, device="cpu", dtype="bfloat16", lora=LORA
    )
    cfg = ppo_config(tiny_lm_dir, tiny_rm_dir, run=run, critic=critic, eval_size=4)
    summary = run_ppo(cfg, tmp_path / "run")
    assert summary["steps"] == 2 and math.isfinite(summary["kl_to_ref"])
    rows = [r for r in _finite_rows(tmp_path / "run") if "kl_to_ref" in r]
    # π starts as the (adapter-free) reference: 0 up to bfloat16 rounding between the sampling forward (KV
    # cache, one token at a time) and the reference's teacher-forced one
    assert rows[0]["kl_to_ref"] == pytest.approx(0.0, abs=5e-3)
    ckpt = tmp_path / "run" / "checkpoints" / "step_00000002"
    assert all("lora_" in k for k in load_file(str(ckpt / "actor.safetensors")))
    if critic == "reward_model":  # its adapters and its head
        names = list(load_file(str(ckpt / "critic.safetensors")))
        assert any("lora_" in k for k in names) and any(k.startswith("head.") for k in names)
        critic_model = ScalarHeadModel.from_pretrained(tmp_path / "run" / "critic", dtype="bfloat16")
        assert not any("lora_" in n for n, _ in critic_model.named_parameters())
    config = json.loads((tmp_path / "run" / "model" / "adapter_config.json").read_text())
    assert Path(config["base_model_name_or_path"]) == tiny_lm_dir.resolve()
    assert load_causal_lm(tmp_path / "run" / "model").dtype == torch.float32  # base + adapter, merged


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_grpo_in_bfloat16(tiny_lm_dir: Path, tmp_path: Path, lora: bool) -> None:
    cfg = grpo_config(
        tiny_lm_dir,
        run={
            "steps": 2,
            "eval_every": 0,
            "save_every": 0,
            "dtype": "bfloat16",
            "lora": LoraConfig(enabled=lora),
        },
        eval_at_start=False,
        eval_size=2,
    )
    summary = run_grpo(cfg, tmp_path / "run")
    assert summary["steps"] == 2
    rows = [r for r in _finite_rows(tmp_path / "run") if "loss" in r]
    assert len(rows) == 2 and all(math.isfinite(r["kl"]) for r in rows)
