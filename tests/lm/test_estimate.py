"""The memory estimate (postrl.lm.estimate) and ``--dry-run``: parameter counts of real configs built on the meta
device, the parts that each switch changes, and a config that would not fit refused before its folder exists."""

from __future__ import annotations

from dataclasses import replace

import pytest

from postrl.cli import main
from postrl.lm.estimate import GiB, estimate, model_shape
from postrl.lm.grpo.config import GRPOConfig
from postrl.lm.memory import MemoryConfig
from postrl.lm.spine import LoraConfig


def qwen05b_folder(path):
    """config.json of Qwen2.5-0.5B (its published shape), no weights."""
    from transformers import Qwen2Config

    Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True, rope_theta=1e6,
    ).save_pretrained(path)  # fmt: skip
    return path


def test_qwen_half_billion_counts_like_its_model_card(tmp_path):
    shape = model_shape(str(qwen05b_folder(tmp_path)), LoraConfig())
    assert shape.params == 494_032_768  # Qwen2.5-0.5B: 0.49B parameters, tied embeddings counted once
    assert (shape.vocab, shape.layers, shape.hidden, shape.kv) == (151936, 24, 896, 128)
    lora = model_shape(str(tmp_path), LoraConfig(enabled=True, rank=16))
    # per layer, rank·(in + out) of q, k, v, o, gate, up, down: 16·(1792 + 1024 + 1024 + 1792 + 3·5760)
    assert lora.trained == 24 * 16 * (896 + 896 + 896 + 128 + 896 + 128 + 896 + 896 + 3 * (896 + 4864))


def test_each_switch_shrinks_its_part(tmp_path):
    shape = model_shape(str(qwen05b_folder(tmp_path)), LoraConfig())
    cfg = GRPOConfig()
    cfg = replace(cfg, grpo=replace(cfg.grpo, prompts_per_step=4, beta=0.04))

    def with_memory(**kw):
        return replace(cfg, run=replace(cfg.run, memory=MemoryConfig(**kw)))

    full = estimate("grpo", with_memory(log_probs="full"), shape)
    rows, tokens = full.rows, full.tokens
    assert (rows, tokens) == (32, 512 + 256)
    assert full.parts["logits"] == 3 * rows * 256 * 151936 * 4  # [32 × 256 response tokens, V] float32, ×3
    chunked = estimate("grpo", with_memory(log_probs="auto", chunk_tokens=512), shape)
    assert chunked.parts["logits"] == 2 * 512 * 151936 * 4  # one chunk's logits and their exp
    assert full.parts["weights"] == 2 * 494_032_768 * 4  # policy + reference
    ckpt = estimate("grpo", with_memory(gradient_checkpointing=True), shape)
    assert ckpt.parts["activations"] < full.parts["activations"] / 10
    lora = replace(cfg, run=replace(cfg.run, lora=LoraConfig(enabled=True)))
    assert estimate("grpo", lora, model_shape(str(tmp_path), lora.run.lora)).parts["weights"] < 2 * GiB


def test_dry_run_refuses_what_would_not_fit_before_any_folder(tmp_path, capsys):
    model = qwen05b_folder(tmp_path / "qwen")
    out = tmp_path / "run"
    argv = ["grpo", "--model", str(model), "--out", str(out), "grpo.prompts_per_step=4096", "--dry-run"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("postrl: error: this config would not fit: estimated peak") and "GiB" in err
    assert "available RAM" in err and err.count("\n") == 1 and not out.exists()
    assert main([a for a in argv if a != "--dry-run"]) == 2  # the run itself refuses it the same way
    assert "would not fit" in capsys.readouterr().err and not out.exists()
    assert (
        main(["grpo", "--model", str(model), "grpo.prompts_per_step=1", "grpo.group_size=2", "--dry-run"])
        == 0
    )
    assert "it fits" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["run.memory.chunk_tokens=0", "run.memory.log_probs=some"])
def test_bad_memory_keys_are_one_line_errors(tmp_path, bad, capsys):
    assert main(["dpo", "--model", str(qwen05b_folder(tmp_path)), "--dry-run", bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("postrl: error:") and "run.memory." in err and err.count("\n") == 1


def test_dpo_keeps_the_reference_only_for_held_out_samples(tmp_path):
    """DPO stores the reference's log-probs before training: its weights stay only for eval_samples' KL.
    Measured (benchmarks/real_size.py --stage dpo --model qwen0.5b, 4 pairs × 128 tokens, fp32, chunks of 512
    positions, before the chunked forward kept its logits twice instead of three times): peak RSS 10.77 GiB;
    this estimate of that run: 10.42 GiB."""
    from postrl.lm.dpo.config import DPOConfig

    shape = model_shape(str(qwen05b_folder(tmp_path)), LoraConfig())
    cfg = DPOConfig()
    cfg = replace(cfg, train=replace(cfg.train, batch_size=4, max_length=128))
    cfg = replace(cfg, run=replace(cfg.run, memory=MemoryConfig(chunk_tokens=512)))
    stored = estimate("dpo", replace(cfg, eval_samples=0), shape)
    kept = estimate("dpo", replace(cfg, eval_samples=8), shape)
    assert stored.parts["weights"] == 494_032_768 * 4 and kept.parts["weights"] == 2 * 494_032_768 * 4
    assert 10.0 * GiB < stored.total < 12.0 * GiB


def test_ppo_counts_its_four_roles(tmp_path):
    """Actor, reference, reward model and critic (`postrl.lm.ppo.build.build_roles`), by hand for Qwen2.5-0.5B:
    full fp32 is 40 B/parameter before activations (actor 16, reference 4, reward model 4, critic 16): 19.8 GB,
    beyond this 24 GB machine's free memory; LoRA keeps three trunks (the reference is the actor without its
    adapters). Measured: benchmarks/real_size_ppo.py."""
    from postrl.lm.ppo.config import PPOConfig

    P = 494_032_768
    cfg = PPOConfig(model=str(qwen05b_folder(tmp_path)), reward_model=str(tmp_path), batch_size=4)
    shape = model_shape(str(tmp_path), LoraConfig())
    full = estimate("ppo", cfg, shape)
    act = full.parts["activations"]
    assert (full.rows, full.tokens) == (4, 512 + 53)
    assert full.parts["weights"] == 2 * P * 4 and full.parts["reward model"] == P * 4
    assert full.parts["gradients"] == P * 4 and full.parts["optimizer"] == P * 8
    assert full.parts["critic"] == P * (4 + 4 + 8) + act
    assert full.total - 2 * act - full.parts["logits"] - full.parts["kv cache"] == 40 * P
    lora_cfg = replace(cfg, run=replace(cfg.run, lora=LoraConfig(enabled=True)))
    lora_shape = model_shape(str(tmp_path), lora_cfg.run.lora)
    lora = estimate("ppo", lora_cfg, lora_shape)
    assert lora.parts["weights"] == P * 4 and lora.parts["reward model"] == P * 4
    assert lora.parts["critic"] == P * 4 + lora_shape.trained * (4 + 8) + act
    shared = estimate("ppo", replace(cfg, critic="shared"), shape)
    assert shared.parts["critic"] == 0 and shared.total < full.total - 16 * P
    rules = estimate("ppo", replace(cfg, rewards=["task:reviews"], critic="shared"), shape)
    assert rules.parts["reward model"] == 0


def test_ppo_dry_run_refuses_what_would_not_fit(tmp_path, capsys):
    model = qwen05b_folder(tmp_path / "qwen")
    argv = ["ppo", "--model", str(model), "--reward-model", str(model), "--out", str(tmp_path / "run")]
    assert main([*argv, "batch_size=4096", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("postrl: error: this config would not fit: estimated peak") and "critic" in err
    assert err.count("\n") == 1 and not (tmp_path / "run").exists()
    lora = ["run.lora.enabled=true", "batch_size=1", "sampling.max_new_tokens=8", "max_prompt_length=8"]
    assert main([*argv, *lora, "--dry-run"]) == 0
    assert "it fits" in capsys.readouterr().out


def test_bfloat16_optimizer_state_with_and_without_float32_masters(tmp_path):
    """bfloat16 full fine-tuning: 2 B weight + 2 B gradient + 12 B AdamW state (float32 master and moments)
    per trained parameter by default; ``optim.master_weights=false`` keeps bfloat16 moments and no master
    (4 B, what transformers' Trainer holds for a model loaded in bfloat16); float32 and LoRA do not change."""
    P = 494_032_768
    shape = model_shape(str(qwen05b_folder(tmp_path)), LoraConfig())
    cfg = GRPOConfig()
    bf16 = replace(cfg, run=replace(cfg.run, dtype="bfloat16"))
    plain = replace(bf16, optim=replace(bf16.optim, master_weights=False))
    assert estimate("grpo", bf16, shape).parts["optimizer"] == P * 12
    assert estimate("grpo", plain, shape).parts["optimizer"] == P * 4
    assert estimate("grpo", plain, shape).parts["gradients"] == P * 2
    fp32_plain = replace(cfg, optim=replace(cfg.optim, master_weights=False))
    assert estimate("grpo", fp32_plain, shape).parts["optimizer"] == P * 8
    # stepping in the backward holds one gradient at a time: at most the tied [vocab, hidden] one, waiting for
    # the input embedding's part
    in_backward = replace(plain, optim=replace(plain.optim, step_in_backward=True, max_grad_norm=None))
    assert estimate("grpo", in_backward, shape).parts["gradients"] == 151936 * 896 * 2


def test_a_refusal_names_only_the_switches_not_yet_set(tmp_path):
    from postrl.lm.estimate import _levers

    shape = model_shape(str(qwen05b_folder(tmp_path)), LoraConfig())
    cfg = GRPOConfig()
    assert _levers("grpo", cfg, shape) == [
        "run.memory.gradient_checkpointing=true",
        "run.lora.enabled=true",
        "run.dtype=bfloat16",
        "optim.step_in_backward=true optim.max_grad_norm=null",
    ]  # fmt: skip  (chunked log-probs are auto's choice at this vocabulary)
    bf16 = replace(cfg, run=replace(cfg.run, dtype="bfloat16", memory=MemoryConfig(log_probs="full")))
    assert _levers("grpo", bf16, shape) == [
        "run.memory.log_probs=chunked", "run.memory.gradient_checkpointing=true", "run.lora.enabled=true",
        "optim.master_weights=false", "optim.step_in_backward=true optim.max_grad_norm=null",
    ]  # fmt: skip
    plain = replace(bf16, optim=replace(bf16.optim, master_weights=False, step_in_backward=True))
    assert _levers("grpo", plain, shape) == [
        "run.memory.log_probs=chunked", "run.memory.gradient_checkpointing=true", "run.lora.enabled=true",
    ]  # fmt: skip
    assert "optim.step_in_backward=true optim.max_grad_norm=null" not in _levers("ppo", bf16, shape)
