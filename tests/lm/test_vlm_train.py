"""VLM stages end to end on tiny budgets: the alignment stage builds a model the Auto classes load, `postrl sft`
and `postrl grpo` take it (task:shapes, or TRL-format JSONL with image paths) and export loadable models."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from postrl.lm.sft import SFTConfig, run_sft
from postrl.lm.spine import RunConfig
from postrl.lm.tasks import get_task
from postrl.lm.trainer import OptimConfig, TrainConfig
from postrl.lm.vlm import TinyVLMConfig, VLMPretrainConfig, is_vlm, run_vlm_pretrain

TINY = TinyVLMConfig(vision_hidden_size=32, hidden_size=64, intermediate_size=128, vocab_size=300)
SHAPES = {"n_train": 64, "n_test": 16}
# conversational prompts: completions are assistant turns
LENGTH_REWARD = (
    "def reward(completions, **kw):\n    return [float(len(c[-1]['content'])) for c in completions]\n"
)


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


def _grpo_cfg(model, data, **kw):
    from postrl.lm.grpo import GRPOConfig
    from postrl.lm.grpo.config import GRPOLossConfig
    from postrl.lm.rollout import SamplingConfig

    grpo = GRPOLossConfig(group_size=4, prompts_per_step=4, **kw)
    return GRPOConfig(
        model=str(model), data=data, task=SHAPES, grpo=grpo, sampling=SamplingConfig(max_new_tokens=4),
        optim=OptimConfig(lr=1e-3, warmup_steps=0), run=_run(2), eval_size=8, max_prompt_length=64,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("options", "freeze"),
    [({}, False), ({"epochs": 2, "beta": 0.04, "grad_accum": 3, "advantage": "rloo"}, True)],
)
def test_grpo_on_task_shapes(aligned, tmp_path, options, freeze) -> None:
    from postrl.lm.grpo import run_grpo
    from postrl.lm.vlm import run_vlm_grpo

    (tmp_path / "length.py").write_text(LENGTH_REWARD)
    cfg = _grpo_cfg(aligned, "task:shapes", **options)  # a 3-step model: the verifier alone gives all zeros
    cfg = replace(cfg, rewards=["task:shapes", f"{tmp_path / 'length.py'}:reward"], verifier="task:shapes")
    if freeze:
        summary = run_vlm_grpo(cfg, tmp_path / "run", freeze_vision=True)
    else:
        summary = run_grpo(cfg, tmp_path / "run")  # as TRL: the whole model trains
    assert summary["steps"] == 2 and 0 <= summary["heldout_accuracy"] <= 1
    assert "heldout_accuracy_start" in summary and summary["tokens_per_second"] > 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {"reward_mean", "accuracy", "clip_fraction", "entropy"} <= set(rows[1])
    trained = AutoModelForImageTextToText.from_pretrained(tmp_path / "run" / "model").state_dict()
    start = AutoModelForImageTextToText.from_pretrained(aligned).state_dict()
    changed = {k for k in start if not torch.equal(start[k], trained[k])}
    language = {k for k in changed if ".language_model." in k or k.startswith("lm_head")}
    vision = {k for k in changed if ".vision_tower." in k or ".multi_modal_projector." in k}
    assert language and (not vision if freeze else vision) and changed == language | vision


def test_grpo_on_trl_jsonl_needs_a_reward(aligned, tmp_path) -> None:
    from postrl.lm.grpo import run_grpo
    from postrl.runtime.errors import UserError

    path = get_task("shapes", **SHAPES).export(tmp_path / "data", "prompts", "train", limit=20)
    with pytest.raises(UserError, match="no reward function"):
        run_grpo(_grpo_cfg(aligned, str(path)), tmp_path / "run")
    cfg = _grpo_cfg(aligned, str(path))

    summary = run_grpo(replace(cfg, rewards=["task:shapes"]), tmp_path / "run")  # reads the answer column
    assert summary["steps"] == 2 and 0 <= summary["heldout_accuracy"] <= 1
    with pytest.raises(UserError, match="dynamic_sampling"):
        run_grpo(_grpo_cfg(aligned, "task:shapes", dynamic_sampling=True), tmp_path / "other")


def _weights(folder):
    return AutoModelForImageTextToText.from_pretrained(folder).state_dict()


@pytest.mark.parametrize("stage", ["sft", "grpo"])
def test_resume_continues_exactly(aligned, tmp_path, stage) -> None:
    # 4 steps straight == 2 steps, then --resume with run.steps=4: same weights and metrics rows (a constant
    # lr: the cosine schedule's length is run.steps, which the resume changes)
    from postrl.lm.grpo import run_grpo

    optim = OptimConfig(lr=1e-3, warmup_steps=0, min_lr_ratio=1.0)

    def config(steps: int):
        run = RunConfig(steps=steps, eval_every=0, save_every=2, log_every=1, threads=1)
        if stage == "sft":
            return SFTConfig(
                model=str(aligned), data="task:shapes", task=SHAPES, run=run, eval_size=4,
                train=TrainConfig(batch_size=4, max_length=128), optim=optim,
            )  # fmt: skip
        rewards = ["task:shapes", f"{tmp_path / 'length.py'}:reward"]  # a signal a 3-step model can get
        return replace(_grpo_cfg(aligned, "task:shapes"), run=run, eval_size=4, optim=optim, rewards=rewards)

    (tmp_path / "length.py").write_text(LENGTH_REWARD)
    trainer = run_sft if stage == "sft" else run_grpo
    trainer(config(4), tmp_path / "straight")
    trainer(config(2), tmp_path / "resumed")
    trainer(config(4), tmp_path / "resumed", resume=True)
    a, b = _weights(tmp_path / "straight" / "model"), _weights(tmp_path / "resumed" / "model")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], v) for k, v in _weights(aligned).items())  # it trained
    rows = [(tmp_path / r / "metrics.jsonl").read_text().splitlines() for r in ("straight", "resumed")]
    # the training rows (the 2-step invocation also evaluated at its end, step 2)
    strip = [
        [{k: v for k, v in json.loads(x).items() if "time" not in k and "per_second" not in k} for x in r]
        for r in rows
    ]
    assert [r for r in strip[0] if "loss" in r] == [r for r in strip[1] if "loss" in r]
