"""LoRA on mixture-of-experts models (issue #41 item 12): peft's ``all-linear`` also wraps transformers' fused
expert tensors (``[E, d_out, d_in]``, through ``ParamWrapper``, two stacked on one module) and the routers;
a LoRA SFT step on tiny random Qwen3-MoE, Mixtral and DeepSeek-V3 models exports, and both exports (merged
weights and the adapter folder) give the logits of the adapter model as peft itself runs it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

peft = pytest.importorskip("peft")

import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from postrl.lm.models import load_causal_lm  # noqa: E402
from postrl.lm.models.layout import position_ids_from_mask  # noqa: E402
from postrl.lm.sft import SFTConfig, run_sft  # noqa: E402
from postrl.lm.spine import LoraConfig, RunConfig  # noqa: E402
from postrl.lm.trainer import OptimConfig, TrainConfig  # noqa: E402

COMMON = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "max_position_embeddings": 128}  # fmt: skip
MOE = {
    "qwen3_moe": ("Qwen3MoeConfig", {"moe_intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2,
                                     "head_dim": 8}),
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "deepseek_v3": ("DeepseekV3Config", {"moe_intermediate_size": 16, "n_routed_experts": 4, "num_experts_per_tok": 2,
                                         "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
                                         "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8,
                                         "qk_nope_head_dim": 8, "v_head_dim": 8, "num_key_value_heads": 4}),
}  # fmt: skip
IDS = torch.tensor([[0, 0, 5, 17, 42, 9, 3, 11], [7, 8, 9, 10, 11, 12, 13, 14]])
MASK = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]])


def _moe_dir(kind: str, tokenizer, path: Path) -> Path:
    """A random tiny ``kind`` model built from its config class, saved with the tiny tokenizer."""
    name, extra = MOE[kind]
    ids = {f"{k}_token_id": getattr(tokenizer, f"{k}_token_id") for k in ("pad", "bos", "eos")}
    config = getattr(transformers, name)(vocab_size=len(tokenizer), **{**COMMON, **extra}, **ids)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS, attention_mask=MASK, position_ids=position_ids_from_mask(MASK)).logits


@pytest.mark.parametrize("kind", sorted(MOE))
def test_lora_on_experts_trains_exports_and_reloads_to_the_adapter_models_logits(
    kind: str, tiny_tokenizer, tmp_path: Path
) -> None:
    base = _moe_dir(kind, tiny_tokenizer, tmp_path / "base")
    cfg = SFTConfig(
        model=str(base),
        task={"n_train": 16, "n_test": 4},
        train=TrainConfig(batch_size=4, max_length=64, eval_examples=4),
        optim=OptimConfig(lr=5e-2, warmup_steps=0),
        run=RunConfig(
            steps=1, eval_every=0, save_every=0, device="cpu", threads=1,
            lora=LoraConfig(enabled=True, rank=4, alpha=8.0, merge_on_export=True),  # all-linear
        ),
        eval_size=2,
    )  # fmt: skip
    run_sft(cfg, tmp_path / "run")
    assert (tmp_path / "run" / "summary.json").is_file()
    adapter = load_file(str(tmp_path / "run" / "adapter" / "adapter_model.safetensors"))
    assert any(".experts." in k for k in adapter), "all-linear no longer reaches the experts"
    # the adapter model as peft runs it (adapters beside the frozen base, not merged)
    in_peft = peft.PeftModel.from_pretrained(load_causal_lm(base), str(tmp_path / "run" / "adapter"))
    expected = _logits(in_peft)
    assert not torch.allclose(expected, _logits(load_causal_lm(base)), atol=1e-4)  # the step changed it
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "run" / "model"))
    torch.testing.assert_close(_logits(merged), expected, rtol=0, atol=1e-5)
    from_adapter = load_causal_lm(tmp_path / "run" / "adapter")
    assert not any("lora_" in n or "base_layer" in n for n, _ in from_adapter.named_parameters())
    torch.testing.assert_close(_logits(from_adapter), expected, rtol=0, atol=1e-5)
