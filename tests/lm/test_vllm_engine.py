"""vLLM as GRPO's rollout engine (sampling.engine=vllm, `postrl.lm.rollout.vllm_engine`).

The tests marked ``vllm`` need vLLM (``make vllm-venv`` then ``make test-vllm``; the normal suite skips them):
vLLM's samples arrive in postrl's layout with the log-probs of π_τ (teacher-forced by postrl's own scoring of
the same tokens, at τ ≠ 1, so raw log-probs would fail), weights pushed after a change are the ones vLLM
samples from, and a GRPO run with vLLM logs a small engine–trainer mismatch with tis on by default. The
others check the config without vLLM: auto resolves per engine, and what the engine cannot run is one error
before the run folder exists.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from postrl.lm import base_model
from postrl.lm.grpo import GRPOConfig, GRPOLossConfig, run_grpo
from postrl.lm.grpo.config import GRPOSamplingConfig, LanesConfig, is_correction
from postrl.lm.models import load_causal_lm
from postrl.lm.rollout import SamplingConfig, left_pad, score
from postrl.lm.rollout.sampling import mask_after_eos
from postrl.lm.tokenizer import load_tokenizer
from postrl.lm.trainer import OptimConfig
from postrl.runtime.logging import read_jsonl
from tests.lm.test_grpo import _config

G, T = 4, 8


def test_is_correction_auto_is_tis_for_vllm_only():
    vllm = GRPOConfig(sampling=GRPOSamplingConfig(engine="vllm"))
    assert is_correction(vllm) == "tis"
    assert is_correction(GRPOConfig()) == "none"
    assert is_correction(GRPOConfig(sampling=SamplingConfig())) == "none"  # a plain config: postrl's engine
    assert is_correction(GRPOConfig(sampling=GRPOSamplingConfig(engine="vllm"), grpo=GRPOLossConfig(
        is_correction="none"))) == "none"  # fmt: skip


def test_what_vllm_cannot_run_is_one_error_before_the_run_folder(tiny_lm_dir, tmp_path):
    out = tmp_path / "run"
    args = [sys.executable, "-m", "postrl.cli", "grpo", "--model", str(tiny_lm_dir), "--out", str(out),
            "sampling.engine=vllm", "run.lora.enabled=true"]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("postrl: error:"), proc.stderr
    assert "sampling.engine=vllm pushes whole weights: set run.lora.enabled=false" in lines[0]
    assert not out.exists()


def test_vllm_options_follow_the_config():
    from postrl.lm.grpo.engine import vllm_options

    sampling = GRPOSamplingConfig(
        engine="vllm", max_new_tokens=16, vllm_dtype="bfloat16", vllm_kv_cache_gib=2
    )
    cfg = GRPOConfig(model="m", sampling=sampling, max_prompt_length=48)
    options = vllm_options(cfg, torch.float32)
    assert options["dtype"] == torch.bfloat16 and options["max_model_len"] == 64
    assert options["model_dir"] == "m" and options["kv_cache_gib"] == 2
    auto = GRPOConfig(sampling=GRPOSamplingConfig(engine="vllm"))
    assert vllm_options(auto, torch.float32)["dtype"] == torch.float32  # auto: the policy's


def test_a_vision_language_model_is_refused_with_vllm():
    from postrl.lm.vlm.grpo import VLMGRPORecipe
    from postrl.runtime.errors import UserError

    with pytest.raises(UserError, match="sampling.engine=vllm does not sample vision-language models"):
        VLMGRPORecipe().check(GRPOConfig(sampling=GRPOSamplingConfig(engine="vllm")))
    VLMGRPORecipe().check(GRPOConfig())  # postrl's engine: fine


# ---- with vLLM: on the built-in tiny Llama (head_dim 32; vLLM's CPU attention has no kernel for the test
# models' head_dim 8) --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def base():
    """The built-in base model's folder, model (float32, eval) and tokenizer."""
    folder = base_model.path()
    return folder, load_causal_lm(str(folder), dtype=torch.float32).eval(), load_tokenizer(str(folder))


@pytest.fixture(scope="module")
def sampler(base):
    pytest.importorskip("vllm")
    from postrl.lm.rollout.vllm_engine import VLLMSampler

    return VLLMSampler(str(base[0]), base[2], max_model_len=64, seed=0)


def _prompts(tokenizer):
    return [tokenizer.encode("12+7=")[:6], tokenizer.encode("3+4=")[:3]]  # two widths: left padding shows


def _check_layout(rollout, prompts, tokenizer):
    ids, mask = left_pad([p for p in prompts for _ in range(G)], tokenizer.pad_token_id)
    P = ids.shape[1]
    assert rollout.prompt_len == P and rollout.input_ids.shape[0] == len(prompts) * G
    assert torch.equal(rollout.input_ids[:, :P], ids) and torch.equal(rollout.attention_mask[:, :P], mask)
    assert torch.equal(rollout.response_mask, mask_after_eos(rollout.response_ids, tokenizer.eos_token_id))
    off = rollout.response_mask == 0
    assert bool((rollout.response_ids[off] == tokenizer.pad_token_id).all())
    assert bool((rollout.log_probs[off] == 0).all()) and rollout.log_probs.dtype == torch.float32
    assert rollout.response_ids.shape[1] <= T


def perturbed(model):
    """A copy of ``model`` (eval) with every parameter moved by 0.05·N(0, 1) noise of a fixed seed."""
    changed = type(model)(model.config)
    changed.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return changed.eval()


def _teacher_forced(model, rollout, temperature):
    lp = score(model, rollout.input_ids, rollout.attention_mask, rollout.prompt_len, temperature=temperature)
    return lp * rollout.response_mask


@pytest.mark.vllm
@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_samples_in_postrls_layout_with_the_log_probs_of_pi_tau(sampler, base, temperature):
    _, tiny_lm, tiny_tokenizer = base
    sampler.push(tiny_lm)  # the module's weights: the folder's, pushed through the same path training uses
    prompts = _prompts(tiny_tokenizer)
    sampling = SamplingConfig(max_new_tokens=T, temperature=temperature)
    rollout = sampler.sample(prompts, G, sampling, seed=5)
    _check_layout(rollout, prompts, tiny_tokenizer)
    assert len({tuple(r) for r in rollout.response_ids[:G].tolist()}) > 1  # a group is G draws, not copies
    expected = _teacher_forced(tiny_lm, rollout, temperature)
    torch.testing.assert_close(rollout.log_probs, expected, atol=2e-3, rtol=0)  # vLLM's kernels, not ours
    at_one = _teacher_forced(tiny_lm, rollout, 1.0)
    assert float((at_one - expected).abs().max()) > 0.05  # raw (τ = 1) log-probs would fail the check above
    again = sampler.sample(prompts, G, sampling, seed=5)
    assert torch.equal(again.response_ids, rollout.response_ids)  # the seed decides the samples


@pytest.mark.vllm
def test_pushed_weights_are_the_ones_vllm_samples_from(sampler, base):
    _, tiny_lm, tiny_tokenizer = base
    changed = perturbed(tiny_lm)
    sampler.push(changed)
    prompts, sampling = _prompts(tiny_tokenizer), SamplingConfig(max_new_tokens=T, temperature=1.0)
    rollout = sampler.sample(prompts, G, sampling, seed=1)
    torch.testing.assert_close(rollout.log_probs, _teacher_forced(changed, rollout, 1.0), atol=2e-3, rtol=0)
    assert float((rollout.log_probs - _teacher_forced(tiny_lm, rollout, 1.0)).abs().max()) > 0.05
    sampler.push(tiny_lm)


@pytest.mark.vllm
def test_grpo_with_vllm_logs_a_small_mismatch_and_corrects_it(base, tmp_path):
    pytest.importorskip("vllm")
    sampling = GRPOSamplingConfig(max_new_tokens=4, engine="vllm")
    optim = OptimConfig(lr=1e-2, warmup_steps=0, min_lr_ratio=1.0)  # large steps: unpushed weights would show
    cfg = _config(base[0], run={"steps": 3}, sampling=sampling, optim=optim)
    summary = run_grpo(cfg, tmp_path / "run")
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert len(rows) == 3 and summary
    for row in rows:  # tis is on (auto): the fraction capped is logged; the engines agree closely
        assert 0 <= row["behaviour_kl"] < 1e-3 and row["is_capped_fraction"] == 0.0
        assert row["is_weight_mean"] == pytest.approx(1.0, abs=1e-2)
    # after the first optimiser steps the weights moved; without a push vLLM's samples would be π_0's and the
    # mismatch would grow with the steps: it stays at float rounding
    assert rows[-1]["behaviour_log_ratio"] < 1e-2


@pytest.mark.vllm
def test_a_generation_lane_samples_with_its_own_vllm_as_the_trainer_would(base, tmp_path):
    pytest.importorskip("vllm")
    sampling = GRPOSamplingConfig(max_new_tokens=4, engine="vllm")
    optim = OptimConfig(lr=1e-2, warmup_steps=0, min_lr_ratio=1.0)
    run = {"steps": 3, "eval_every": 0}
    run_grpo(_config(base[0], run=run, sampling=sampling, optim=optim), tmp_path / "sync")
    lanes = LanesConfig(enabled=True, max_staleness=0)
    run_grpo(_config(base[0], run=run, sampling=sampling, optim=optim, lanes=lanes), tmp_path / "lane")

    def rows(name):  # without the timings
        return [{k: v for k, v in r.items() if not k.startswith("time") and k != "tokens_per_second"}
                for r in read_jsonl(tmp_path / name / "metrics.jsonl") if "loss" in r]  # fmt: skip

    assert rows("sync") == rows("lane")  # k = 0: the same vLLM samples, the same steps
    assert all(r["behaviour_kl"] < 1e-3 for r in rows("lane"))  # the lane pushed the published weights
