"""On a CUDA device (skipped without one): LoRA in bfloat16, the adapter-free reference, the fast decoder's
agreement with the Hugging Face forward in float32, its refusal in bfloat16 (falling back to the Hugging Face
forward with SDPA attention, logged), and a GRPO run with LoRA in bfloat16. ``benchmarks/gpu.py`` measures
speed and memory; this module only checks that the code runs and agrees with itself there."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

IDS = torch.tensor([[0, 0, 5, 17, 42, 9, 3, 11], [7, 8, 9, 10, 11, 12, 13, 14]])
MASK = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]])


def _tiny(dtype: str = "float32"):
    from postrl.lm.models import TinyLMConfig, build_tiny_lm

    model = build_tiny_lm(
        64, TinyLMConfig(n_layers=2, hidden_size=64, n_heads=4, intermediate_size=128), seed=0
    )
    return model.to("cuda", dtype=getattr(torch, dtype)).eval()


def _logits(model):
    from postrl.lm.models.layout import position_ids_from_mask

    ids, mask = IDS.cuda(), MASK.cuda()
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits


def _lora(model, **kw):
    pytest.importorskip("peft")
    from postrl.lm.models import apply_lora
    from postrl.lm.spine import LoraConfig, RunConfig

    model = apply_lora(model, RunConfig(lora=LoraConfig(enabled=True, rank=4, alpha=8.0, **kw)))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.2)
    return model


def test_lora_in_bfloat16_and_the_reference_is_the_base():
    from postrl.lm.models import AdapterFreeReference

    base = _logits(_tiny("bfloat16"))
    policy = _lora(_tiny("bfloat16"))
    assert {p.dtype for n, p in policy.named_parameters() if "lora_" in n} == {torch.float32}
    assert not torch.equal(_logits(policy), base)
    assert torch.equal(_logits(AdapterFreeReference(policy)), base)
    loss = policy(input_ids=IDS.cuda(), attention_mask=MASK.cuda()).logits.float().square().mean()
    loss.backward()
    assert all(p.grad is not None for n, p in policy.named_parameters() if "lora_B" in n)


def test_the_fast_decoder_agrees_with_the_hf_forward_in_float32():
    from postrl.lm.rollout.forwards import FusedForward, response_forward

    for model in (_tiny(), _lora(_tiny())):
        forward = response_forward(model, use_fast=True)
        assert isinstance(forward, FusedForward)
        fast = forward.logits(IDS.cuda(), MASK.cuda(), 4)
        torch.testing.assert_close(fast, _logits(model)[:, 3:-1], rtol=0, atol=1e-4)


def test_bfloat16_falls_back_to_the_hf_forward_with_sdpa(caplog):
    from postrl.lm.rollout.decoders import HFDecoder, make_decoder

    model = _tiny("bfloat16")
    with caplog.at_level(logging.INFO, logger="postrl.lm.rollout.decoders"):
        assert isinstance(make_decoder(model), HFDecoder)
    assert "Hugging Face forward (sdpa attention)" in caplog.text and "bfloat16" in caplog.text


def test_a_lora_grpo_run_in_bfloat16(tmp_path: Path):
    pytest.importorskip("peft")
    from postrl.lm.grpo import GRPOConfig, run_grpo
    from postrl.lm.models import TinyLMConfig, build_tiny_lm
    from postrl.lm.tasks import build_corpus
    from postrl.lm.tokenizer import build_tokenizer, load_tokenizer
    from postrl.runtime.config import load_config

    build_tokenizer(build_corpus(n_lines=500, seed=0), vocab_size=300).save_pretrained(str(tmp_path / "m"))
    tok = load_tokenizer(tmp_path / "m")
    model = build_tiny_lm(len(tok), TinyLMConfig(n_layers=2, hidden_size=64, n_heads=4, intermediate_size=128),
                          seed=0, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                          bos_token_id=tok.bos_token_id)  # fmt: skip
    model.save_pretrained(str(tmp_path / "m"))
    overrides = [
        f"model={tmp_path / 'm'}", "task={n_train: 40, n_test: 4}", "max_prompt_length=64",
        "sampling.max_new_tokens=8", "grpo.group_size=4", "grpo.prompts_per_step=4", "grpo.beta=0.04",
        "run.steps=2", "run.device=cuda", "run.dtype=bfloat16", "run.lora.enabled=true", "eval_size=4",
    ]  # fmt: skip
    summary = run_grpo(load_config(GRPOConfig, None, overrides), tmp_path / "run")
    assert summary["steps"] == 2
    assert json.loads((tmp_path / "run" / "model" / "adapter_config.json").read_text())["r"] == 16
