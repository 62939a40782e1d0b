"""VLM stages end to end on tiny budgets: the alignment stage builds a model the Auto classes load, `postrl sft`
and `postrl grpo` take it (task:shapes, or TRL-format JSONL with image paths) and export loadable models."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForImageTextToText, AutoProcessor

from postrl.lm.sft import SFTConfig, run_sft
from postrl.lm.spine import RunConfig
from postrl.lm.tasks import get_task
from postrl.lm.trainer import OptimConfig, TrainConfig
from postrl.lm.vlm import TinyVLMConfig, VLMPretrainConfig, is_vlm, run_vlm_pretrain

TINY = TinyVLMConfig(vision_hidden_size=32, hidden_size=64, intermediate_size=128, vocab_size=300)
SHAPES = {"n_train": 64, "n_test": 16}


def _run(steps: int, **kw) -> RunConfig:
    return RunConfig(steps=steps, eval_every=0, save_every=0, log_every=1, threads=1, **kw)


@pytest.fixture(scope="module")
def aligned(tmp_path_factory):
    out = tmp_path_factory.mktemp("align")
    cfg = VLMPretrainConfig(
        model=TINY, task=SHAPES, tokenizer_lines=300, train=TrainConfig(batch_size=8), run=_run(3)
    )
    summary = run_vlm_pretrain(cfg, out)
    assert summary["steps"] == 3 and summary["heldout_loss"] > 0
    return out / "model"


def test_aligned_model_is_a_hf_vlm(aligned) -> None:
    assert is_vlm(aligned)
    AutoModelForImageTextToText.from_pretrained(aligned)
    assert AutoProcessor.from_pretrained(aligned).image_token == "<image>"


def test_sft_on_task_and_on_trl_jsonl(aligned, tmp_path) -> None:
    common = {"model": str(aligned), "train": TrainConfig(batch_size=4, max_length=128), "eval_size": 8}
    common |= {"optim": OptimConfig(lr=1e-3, warmup_steps=0)}
    summary = run_sft(SFTConfig(data="task:shapes", task=SHAPES, run=_run(2), **common), tmp_path / "a")
    assert summary["steps"] == 2 and 0 <= summary["heldout_accuracy"] <= 1
    assert is_vlm(tmp_path / "a" / "model")
    path = get_task("shapes", **SHAPES).export(tmp_path / "data", "sft", "train", limit=20)
    summary = run_sft(SFTConfig(data=str(path), run=_run(2), **common), tmp_path / "b")
    assert summary["steps"] == 2 and "heldout_accuracy" not in summary  # no verifier for a plain file
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert rows[0]["images"][0].startswith("images/")
