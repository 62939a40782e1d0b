"""LoRA through peft (`postrl.lm.models.lora`): adapters start as the base model and are all that trains, the
reference with adapters disabled is the base model exactly, the fast decoder samples from the merged weights
(or says why not), merged exports load in plain transformers with the adapter model's log-probs (and the adapter
folder loads in peft itself), LoRA SFT and GRPO learn while the base weights never change, resume is exact, and
the config's mistakes are one-line errors."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch

peft = pytest.importorskip("peft")

from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel  # noqa: E402

from postrl.lm.data import tokenize_sft  # noqa: E402
from postrl.lm.fast import gpt2 as fast_gpt2  # noqa: E402
from postrl.lm.fast import llama as fast_llama  # noqa: E402
from postrl.lm.grpo import GRPOLossConfig, optimise_grpo, run_grpo  # noqa: E402
from postrl.lm.models import (  # noqa: E402
    AdapterFreeReference,
    ScalarHeadModel,
    adapters_disabled,
    apply_lora,
    load_causal_lm,
    save_adapter,
    save_merged,
    trainable_share,
)
from postrl.lm.models.layout import position_ids_from_mask  # noqa: E402
from postrl.lm.rollout.forwards import FusedForward, response_forward  # noqa: E402
from postrl.lm.rollout.sampling import token_log_probs  # noqa: E402
from postrl.lm.sft import SFTConfig, run_sft  # noqa: E402
from postrl.lm.spine import LoraConfig, RunConfig  # noqa: E402
from postrl.lm.trainer import (  # noqa: E402
    OptimConfig,
    Supervised,
    TrainConfig,
    heldout_loss,
    make_batches,
    run_training,
)
from postrl.runtime.config import load_config  # noqa: E402
from postrl.runtime.errors import ConfigError, UserError  # noqa: E402
from postrl.runtime.logging import RunLogger, read_jsonl  # noqa: E402
from tests.lm.test_grpo import _config as grpo_config  # noqa: E402
from tests.lm.test_grpo import _fixed_batch, _sequence_log_probs  # noqa: E402
from tests.lm.test_sft import ROWS  # noqa: E402

LORA = RunConfig(device="cpu", lora=LoraConfig(enabled=True, rank=4, alpha=8.0))
# The random tiny test model's logits are bounded by its frozen output layer (weights ~0.02, so |logit| < 1):
# adapters on the blocks alone cannot make it memorise anything, so the learning tests adapt lm_head too
# (on a pretrained model, all-linear suffices). lm_head is tied to the embedding: exports must untie it.
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
LORA_HEAD = RunConfig(device="cpu", lora=LoraConfig(enabled=True, rank=4, alpha=8.0, target_modules=TARGETS))
IDS = torch.tensor([[0, 0, 5, 17, 42, 9, 3, 11], [7, 8, 9, 10, 11, 12, 13, 14]])
MASK = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]])


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        out = model(input_ids=IDS, attention_mask=MASK, position_ids=position_ids_from_mask(MASK))
    return out.logits


def _perturbed(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Non-zero B matrices (B starts at 0), as after some training."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return model


def _base_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


# ---- the adapters ----------------------------------------------------------------------------------------
def test_adapters_start_as_the_base_model_and_only_they_train(tiny_lm_dir: Path) -> None:
    base = load_causal_lm(tiny_lm_dir)
    model = apply_lora(load_causal_lm(tiny_lm_dir), LORA)
    assert type(model) is type(base)  # injected in place: still a LlamaForCausalLM
    assert torch.equal(_logits(model), _logits(base))  # B = 0: ΔW = 0 exactly
    for name, p in model.named_parameters():
        assert p.requires_grad == ("lora_" in name), name
        if "lora_" in name:
            assert p.dtype == torch.float32
    assert 0.0 < trainable_share(model) < 0.15


def test_adapters_stay_float32_on_a_bfloat16_base(tiny_lm_dir: Path) -> None:
    model = apply_lora(load_causal_lm(tiny_lm_dir, dtype="bfloat16"), LORA)
    dtypes = {("lora_" in n, p.dtype) for n, p in model.named_parameters()}
    assert dtypes == {(True, torch.float32), (False, torch.bfloat16)}
    assert torch.isfinite(_logits(_perturbed(model))).all()


def test_the_reference_is_the_base_model_exactly(tiny_lm_dir: Path) -> None:
    base = load_causal_lm(tiny_lm_dir)
    policy = _perturbed(apply_lora(load_causal_lm(tiny_lm_dir), LORA))
    adapted = _logits(policy)
    assert not torch.allclose(adapted, _logits(base))
    reference = AdapterFreeReference(policy)
    assert list(reference.parameters()) == []  # no second copy, nothing to freeze by mistake
    P = 2
    ref_lp = token_log_probs(_logits(reference)[:, P - 1 : -1], IDS[:, P:], 0.7)
    base_lp = token_log_probs(_logits(base)[:, P - 1 : -1], IDS[:, P:], 0.7)
    assert torch.equal(ref_lp, base_lp)
    # the adapters are back on, and trainable, after every reference forward
    assert torch.equal(_logits(policy), adapted)
    assert all(p.requires_grad for n, p in policy.named_parameters() if "lora_" in n)
    with adapters_disabled(policy):
        assert torch.equal(_logits(policy), _logits(base))


def test_the_fast_decoder_samples_from_the_merged_weights(tiny_lm_dir: Path) -> None:
    policy = _perturbed(apply_lora(load_causal_lm(tiny_lm_dir), LORA_HEAD))
    assert fast_llama.llama_unsupported_reason(policy) is None
    P = 4
    forward = response_forward(policy, use_fast=True)
    assert isinstance(forward, FusedForward)
    fast = forward.logits(IDS, MASK, P)  # (B, T, V) through FastLlama
    full = _logits(policy)[:, P - 1 : -1]
    torch.testing.assert_close(fast, full, rtol=0, atol=2e-5)
    # gradients reach the adapters through the merged weights
    forward.logits(IDS, MASK, P).square().mean().backward()
    assert all(p.grad is not None for n, p in policy.named_parameters() if "lora_B" in n)


def test_the_fast_decoders_say_why_they_refuse_an_adapter() -> None:
    run = RunConfig(lora=LoraConfig(enabled=True, rank=2, dropout=0.1, target_modules=["c_attn"]))
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=32))
    gpt2 = apply_lora(gpt2.eval(), run)
    assert "LoRA" in fast_gpt2.gpt2_unsupported_reason(gpt2)
    llama_run = RunConfig(lora=LoraConfig(enabled=True, rank=2, dropout=0.1))
    from postrl.lm.models import TinyLMConfig, build_tiny_lm

    llama = apply_lora(build_tiny_lm(50, TinyLMConfig(n_layers=1, hidden_size=16, n_heads=2)), llama_run)
    assert "LoRA dropout is active" in fast_llama.llama_unsupported_reason(llama.train())
    assert fast_llama.llama_unsupported_reason(llama.eval()) is None


# ---- exports ---------------------------------------------------------------------------------------------
def test_merged_weights_load_in_plain_transformers_with_the_same_log_probs(
    tiny_lm_dir: Path, tmp_path: Path
) -> None:
    policy = _perturbed(apply_lora(load_causal_lm(tiny_lm_dir), LORA_HEAD))
    save_merged(policy, tmp_path / "merged")
    names = load_file(str(tmp_path / "merged" / "model.safetensors"))
    assert not any("lora_" in k or "base_layer" in k for k in names)
    plain = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"))
    torch.testing.assert_close(_logits(plain), _logits(policy), rtol=0, atol=1e-5)
    # the adapter folder: peft's own PeftModel and postrl's loader (base + adapter merged) agree
    save_adapter(policy, tmp_path / "adapter")
    in_peft = peft.PeftModel.from_pretrained(load_causal_lm(tiny_lm_dir), str(tmp_path / "adapter"))
    torch.testing.assert_close(_logits(in_peft), _logits(policy), rtol=0, atol=1e-5)
    loaded = load_causal_lm(tmp_path / "adapter")
    assert not any("lora_" in n for n, _ in loaded.named_parameters())
    torch.testing.assert_close(_logits(loaded), _logits(policy), rtol=0, atol=1e-5)


def test_a_scalar_head_model_trains_its_head_and_exports_merged(tiny_lm_dir: Path, tmp_path: Path) -> None:
    rm = apply_lora(ScalarHeadModel.from_pretrained(tiny_lm_dir, new_head=True), LORA)
    assert all(p.requires_grad for p in rm.head.parameters())
    _perturbed(rm)
    with torch.no_grad():
        before = rm.score(IDS, MASK)
    rm.save_pretrained(tmp_path / "rm")
    again = ScalarHeadModel.from_pretrained(tmp_path / "rm")
    with torch.no_grad():
        torch.testing.assert_close(again.score(IDS, MASK), before, rtol=0, atol=1e-5)


# ---- training --------------------------------------------------------------------------------------------
def test_a_lora_grpo_step_raises_the_best_response_and_leaves_the_base(tiny_lm_dir, tiny_tokenizer) -> None:
    model = apply_lora(load_causal_lm(tiny_lm_dir), LORA_HEAD)
    frozen = _base_weights(model)
    batch = _fixed_batch(model, tiny_tokenizer, rewards=[1.0, 0.0, 0.0, 0.0])
    before = _sequence_log_probs(model, batch)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3)
    for _ in range(3):
        optimise_grpo(
            model, opt, batch, GRPOLossConfig(group_size=4), temperature=1.0, max_len=8, max_grad_norm=1.0
        )
    after = _sequence_log_probs(model, batch)
    assert after[0] - after[1:].mean() > before[0] - before[1:].mean() + 0.05
    for name, p in model.named_parameters():
        if name in frozen:
            assert torch.equal(p, frozen[name]), name


def _sft_config(tiny_lm_dir: Path, steps: int, **lora) -> SFTConfig:
    return SFTConfig(
        model=str(tiny_lm_dir),
        task={"n_train": 64, "n_test": 8},
        train=TrainConfig(batch_size=8, max_length=64, eval_examples=32),
        optim=OptimConfig(lr=3e-2, warmup_steps=0, min_lr_ratio=1.0),
        run=RunConfig(
            steps=steps, eval_every=steps // 2, save_every=2, log_every=1, device="cpu", threads=1,
            lora=LoraConfig(enabled=True, rank=8, alpha=16.0, target_modules=TARGETS, **lora),
        ),
        eval_size=4,
    )  # fmt: skip


def test_lora_sft_lowers_the_loss_and_leaves_the_base(
    tiny_lm_dir: Path, tiny_tokenizer, tmp_path: Path
) -> None:
    model = apply_lora(load_causal_lm(tiny_lm_dir), LORA_HEAD)
    frozen = _base_weights(model)
    examples = tokenize_sft(ROWS, tiny_tokenizer, max_length=64)
    batches = [make_batches(examples[:4], tiny_tokenizer.pad_token_id)]
    before = heldout_loss(model, batches)
    algo = Supervised(
        model, tiny_tokenizer, examples, examples[:4], TrainConfig(batch_size=8),
        OptimConfig(lr=3e-2, warmup_steps=3), RunConfig(steps=30, eval_every=0, save_every=0),
        device=torch.device("cpu"),
    )  # fmt: skip
    result = run_training(algo, tmp_path, RunLogger(tmp_path))
    assert result["heldout_loss"] < 0.6 * before
    for name, p in model.named_parameters():
        if name in frozen:
            assert torch.equal(p, frozen[name]), name


def test_lora_sft_resumes_exactly_and_exports_the_adapter(tiny_lm_dir: Path, tmp_path: Path) -> None:
    cfg = _sft_config(tiny_lm_dir, steps=6)
    run_sft(cfg, tmp_path / "a")
    checkpoint = load_file(str(tmp_path / "a" / "checkpoints" / "step_00000006" / "model.safetensors"))
    assert checkpoint and all("lora_" in k for k in checkpoint)  # the adapters only
    assert sorted(p.name for p in (tmp_path / "a" / "model").iterdir() if "adapter" in p.name) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    # interrupted after the step-4 checkpoint, then resumed
    half = _sft_config(tiny_lm_dir, steps=4)
    run_sft(half, tmp_path / "b")
    torch.manual_seed(123)
    run_sft(cfg, tmp_path / "b", resume=True)
    a = load_file(str(tmp_path / "a" / "model" / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "b" / "model" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = [[r.get("loss") for r in read_jsonl(tmp_path / x / "metrics.jsonl") if "loss" in r] for x in "ab"]
    assert rows[0] == rows[1]


def test_merge_on_export_writes_a_plain_model_and_the_adapter(tiny_lm_dir: Path, tmp_path: Path) -> None:
    run_sft(_sft_config(tiny_lm_dir, steps=2, merge_on_export=True), tmp_path / "run")
    model_dir, adapter_dir = tmp_path / "run" / "model", tmp_path / "run" / "adapter"
    assert (model_dir / "config.json").is_file() and not (model_dir / "adapter_config.json").exists()
    plain = AutoModelForCausalLM.from_pretrained(str(model_dir))
    from_adapter = load_causal_lm(adapter_dir)
    torch.testing.assert_close(_logits(plain), _logits(from_adapter), rtol=0, atol=1e-5)
    assert not torch.allclose(_logits(plain), _logits(load_causal_lm(tiny_lm_dir)))


def test_lora_grpo_with_a_reference_runs_resumes_exactly(tiny_lm_dir: Path, tmp_path: Path, caplog) -> None:
    lora = {"lora": LoraConfig(enabled=True, rank=4, alpha=8.0), "keep_last": 5, "eval_every": 0}
    cfg = grpo_config(
        tiny_lm_dir, run=lora, grpo={"epochs": 2, "beta": 0.04}, eval_at_start=False, eval_size=2
    )
    with caplog.at_level(logging.INFO, logger="postrl"):
        run_grpo(cfg, tmp_path / "a")
    assert "runs through FastLlama" in caplog.text  # sampling from the merged weights
    rows = [r for r in read_jsonl(tmp_path / "a" / "metrics.jsonl") if "kl" in r]
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6) and rows[-1]["kl"] > 0  # π starts as π_ref
    half = grpo_config(
        tiny_lm_dir,
        run={**lora, "steps": 2},
        grpo={"epochs": 2, "beta": 0.04},
        eval_at_start=False,
        eval_size=2,
    )
    run_grpo(half, tmp_path / "b")
    run_grpo(cfg, tmp_path / "b", resume=True)
    a = load_file(str(tmp_path / "a" / "model" / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "b" / "model" / "adapter_model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_a_short_lora_grpo_run_raises_the_reward(tiny_lm_dir: Path, tmp_path: Path) -> None:
    cfg = grpo_config(
        tiny_lm_dir,
        rewards=["tests.lm.test_grpo:digits_reward"],
        run={"steps": 40, "eval_every": 0, "save_every": 0, "lora": replace(LORA_HEAD.lora, rank=8)},
        eval_at_start=False,
        grpo={"group_size": 8, "prompts_per_step": 4, "beta": 0.0},
        optim=OptimConfig(lr=3e-2, warmup_steps=0, min_lr_ratio=1.0),
    )
    run_grpo(cfg, tmp_path / "run")
    rewards = [r["reward_mean"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "reward_mean" in r]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.2


# ---- mistakes --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("run.lora.rank=0", r"'run\.lora\.rank' must be >= 1"),
        ("run.lora.r=8", r"'run\.lora\.r' was renamed: use 'run\.lora\.rank'"),
        ("run.lora.dropout=1", r"'run\.lora\.dropout' must be \[0, 1\)"),
    ],
)
def test_config_mistakes_name_the_key(override: str, message: str) -> None:
    from postrl.runtime.config import validate

    with pytest.raises(ConfigError, match=message):
        validate(load_config(SFTConfig, None, [override]))


def test_unmatched_targets_and_dropout_in_rl_are_refused(tiny_lm_dir: Path) -> None:
    bad = RunConfig(lora=LoraConfig(enabled=True, target_modules=["no_such_proj"]))
    with pytest.raises(ConfigError, match=r"run\.lora\.target_modules=\['no_such_proj'\]"):
        apply_lora(load_causal_lm(tiny_lm_dir), bad)
    dropout = RunConfig(lora=LoraConfig(enabled=True, dropout=0.05))
    with pytest.raises(ConfigError, match=r"run\.lora\.dropout=0\.05: PPO and GRPO need 0"):
        apply_lora(load_causal_lm(tiny_lm_dir), dropout, rl=True)


def test_pretraining_refuses_lora(tmp_path: Path) -> None:
    from postrl.lm.pretrain import PretrainConfig, run_pretrain

    cfg = load_config(PretrainConfig, None, ["run.lora.enabled=true"])
    with pytest.raises(UserError, match="pretraining builds a new model"):
        run_pretrain(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_lora_dpo_trains_adapters_against_the_adapter_free_reference(
    tiny_lm_dir: Path, tmp_path: Path
) -> None:
    from postrl.lm.dpo import run_dpo
    from tests.lm.test_dpo import _cfg as dpo_config

    run = RunConfig(steps=2, eval_every=0, save_every=2, log_every=1, device="cpu", lora=LORA_HEAD.lora)
    summary = run_dpo(dpo_config(tiny_lm_dir, run=run, eval_samples=0), tmp_path / "run")
    assert summary["steps"] == 2
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert rows[0]["loss"] == pytest.approx(0.6931, abs=1e-3)  # π = π_ref at the start: h = 0, loss ln 2
    assert (tmp_path / "run" / "model" / "adapter_model.safetensors").is_file()
    checkpoint = load_file(str(tmp_path / "run" / "checkpoints" / "step_00000002" / "model.safetensors"))
    assert all("lora_" in k for k in checkpoint)
