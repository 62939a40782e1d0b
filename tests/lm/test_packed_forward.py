"""The padding-free forward (`postrl.lm.fast.packed`, `postrl.lm.rollout.forwards.PackedForward`): its packing
by hand, its logits and gradients equal to the padded forward's in float64, and DPO's loss, gradients and a
short `postrl dpo` run equal with it on (``dpo.padding_free=auto``) and off."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from postrl.lm.dpo import DPOConfig, DPOLossConfig, run_dpo
from postrl.lm.dpo.build import collate_dpo_batch, dpo_batch_loss
from postrl.lm.fast.gpt2 import FastGPT2
from postrl.lm.fast.llama import FastLlama
from postrl.lm.fast.packed import packed_layout
from postrl.lm.models import position_ids_from_mask
from postrl.lm.rollout.forwards import (
    FusedForward,
    PackedForward,
    forward_log_probs,
    packed_refusal,
)
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig, TrainConfig
from tests.lm.test_fast_gpt2 import tiny_gpt2
from tests.lm.test_forwards import grouped_batch
from tests.lm.test_rollout import tiny_llama


def test_the_layout_by_hand():
    # two distinct prompts [_, 5, 6] and [7, 8, 9]; rows 0, 2 share the first; responses of 2, 3 and 1 tokens
    prompts = torch.tensor([[0, 5, 6], [7, 8, 9]])
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    inverse = torch.tensor([0, 1, 0])
    responses = torch.tensor([[10, 11, 0], [12, 13, 14], [15, 0, 0]])
    response_mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    lay = packed_layout(prompts, prompt_mask, inverse, responses, response_mask)
    # packed: prompt 0 (2 tokens), prompt 1 (3), then the response inputs (all but each row's last column)
    assert lay.tokens.tolist() == [5, 6, 7, 8, 9, 10, 12, 13]
    assert lay.positions.tolist() == [0, 1, 0, 1, 2, 2, 3, 4]  # responses continue their prompt's count
    assert lay.targets.tolist() == [0, 1, 3, 4, 5, 6]  # flat [3, 3] indices of the real response tokens
    # response token 0 is predicted by its prompt's last token, token t by response input t − 1
    assert lay.sources.tolist() == [1, 5, 4, 6, 7, 1]


def test_a_real_token_after_a_pad_is_refused():
    ids, mask = torch.tensor([[5, 6]]), torch.ones(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="right-padded"):
        packed_layout(ids, mask, torch.tensor([0]), torch.tensor([[1, 0, 2]]), torch.tensor([[1, 0, 1]]))


def _logits_and_grads(model, forward, input_ids, attention_mask, P, weights):
    model.zero_grad(set_to_none=True)
    logits = forward.logits(input_ids, attention_mask, P)
    (logits * weights).sum().backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters()]


def _packed_models() -> dict[str, tuple[torch.nn.Module, type]]:
    return {
        "llama": (tiny_llama(vocab=48), FastLlama),
        "llama-gqa": (tiny_llama(vocab=48, n_kv_heads=2), FastLlama),
        "gpt2": (tiny_gpt2(), FastGPT2),
        "gpt2-scaled-by-layer": (tiny_gpt2(scale_attn_by_inverse_layer_idx=True), FastGPT2),
    }


@pytest.mark.parametrize("name", ["llama", "llama-gqa", "gpt2", "gpt2-scaled-by-layer"])
def test_logits_and_gradients_equal_the_padded_forward_in_float64(name):
    """Shared prompts, rows that end early, GQA, GPT-2's learned positions and per-layer score scale: the real
    positions' logits and every gradient equal `FusedForward`'s (the same fused weights, padded) to float64
    rounding."""
    model, fast = _packed_models()[name]
    model = model.double()
    input_ids, attention_mask, P = grouped_batch()
    weights = torch.randn(input_ids.shape[0], input_ids.shape[1] - P, 48, dtype=torch.float64)
    weights *= attention_mask[:, P:, None]
    ref, ref_grads = _logits_and_grads(
        model, FusedForward(model, fast), input_ids, attention_mask, P, weights
    )
    got, grads = _logits_and_grads(model, PackedForward(model), input_ids, attention_mask, P, weights)
    real = attention_mask[:, P:, None].bool()
    assert (got - ref).masked_fill(~real, 0).abs().max() < 1e-12
    assert (got.masked_fill(real, 0) == 0).all()  # pad positions hold 0
    for g, r in zip(grads, ref_grads, strict=True):
        assert (g - r).abs().max() < 1e-12 * max(1.0, r.abs().max())


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_one_token_responses(name):
    """T = 1: every response is its first token alone, predicted by its prompt's last token."""
    model, fast = _packed_models()[name]
    input_ids, attention_mask, P = grouped_batch(T=1, seed=2)
    with torch.no_grad():
        ref = FusedForward(model, fast).logits(input_ids, attention_mask, P)
        got = PackedForward(model).logits(input_ids, attention_mask, P)
    assert got.shape == ref.shape and (got - ref).abs().max() < 1e-5


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_logits_equal_the_hugging_face_forward(name):
    model, _ = _packed_models()[name]
    input_ids, attention_mask, P = grouped_batch(group=2, T=5, seed=3)
    positions = position_ids_from_mask(attention_mask)
    with torch.no_grad():
        ref = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).logits
        got = PackedForward(model).logits(input_ids, attention_mask, P)
    real = attention_mask[:, P:, None]
    assert ((got - ref[:, P - 1 : -1]) * real).abs().max() < 1e-5


def test_log_probs_and_entropy_equal_the_padded_forward():
    model = tiny_llama(vocab=48)
    input_ids, attention_mask, P = grouped_batch(T=4, seed=1)
    with torch.no_grad():
        ref, ref_ent = forward_log_probs(
            FusedForward(model, FastLlama), input_ids, attention_mask, P, 0.7, entropy=True
        )
        got, ent = forward_log_probs(PackedForward(model), input_ids, attention_mask, P, 0.7, entropy=True)
    real = attention_mask[:, P:]
    assert ((got - ref) * real).abs().max() < 1e-5 and ((ent - ref_ent) * real).abs().max() < 1e-5


def test_dpo_loss_and_gradients_equal_with_and_without_padding():
    """The DPO loss of a batch of pairs (chosen and rejected share their prompt) in float64."""
    model = tiny_llama(vocab=48).double()
    g = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(2, 48, (n,), generator=g).tolist()

    pairs = [
        {"prompt_ids": ids(p), "chosen_ids": ids(c), "rejected_ids": ids(r), "target": 1.0}
        for p, c, r in ((3, 5, 2), (6, 1, 7), (4, 4, 4), (2, 9, 3))
    ]
    batch = collate_dpo_batch(pairs, 0, torch.device("cpu"))
    ref = torch.randn(4, 2, generator=g) - 20.0
    out = []
    for forward in (FusedForward(model, FastLlama), PackedForward(model)):
        model.zero_grad(set_to_none=True)
        loss, _ = dpo_batch_loss(forward, batch, ref, DPOLossConfig(beta=0.5))
        loss.backward()
        out.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (loss_a, grads_a), (loss_b, grads_b) = out
    # the sequence log-probs are summed in float32 (`token_log_probs`): float32 rounding of the loss
    assert abs(float(loss_a - loss_b)) < 1e-6
    for a, b in zip(grads_a, grads_b, strict=True):
        assert (a - b).abs().max() < 1e-6 * max(1.0, a.abs().max())


def test_refusals_name_their_reason():
    assert packed_refusal(tiny_gpt2()) is None
    assert "dropout" in packed_refusal(tiny_gpt2(resid_pdrop=0.1).train())
    assert "not a LlamaForCausalLM" in packed_refusal(torch.nn.Linear(2, 2))
    llama = tiny_llama(vocab=48)
    assert packed_refusal(llama) is None
    llama.activation_checkpointing_enable()
    assert "checkpointing" in packed_refusal(llama)
    assert packed_refusal(llama, gradients=False) is None


def _cfg(model: Path, **kw) -> DPOConfig:
    base = DPOConfig(
        model=str(model),
        data="task:reviews",
        task={"n_pairs_train": 48, "n_pairs_test": 16},
        train=TrainConfig(batch_size=8, max_length=64),
        optim=OptimConfig(lr=1e-3, warmup_steps=0, min_lr_ratio=1.0),
        run=RunConfig(steps=4, eval_every=2, save_every=0, keep_last=0, log_every=1, device="cpu", threads=1),
        eval_size=16,
        eval_samples=0,
        plots=False,
    )
    return replace(base, **kw)


def test_a_dpo_run_has_the_same_metrics_padding_free_or_not(
    tiny_lm_dir: Path, tmp_path: Path, caplog
) -> None:
    """Four steps with the padded forward (``dpo.padding_free=off``, the path before it) and the padding-free
    one: every logged loss, accuracy, margin and gradient norm equal to float32 rounding."""
    with caplog.at_level(logging.INFO, logger="postrl.lm.dpo.algorithm"):
        run_dpo(_cfg(tiny_lm_dir), tmp_path / "packed")
    assert "padding-free forward" in caplog.text
    run_dpo(_cfg(tiny_lm_dir, dpo=DPOLossConfig(padding_free="off")), tmp_path / "padded")
    packed = assert_same_metrics(tmp_path / "packed", tmp_path / "padded")
    assert packed[0]["heldout_reward_margin"] == 0.0  # π = π_ref: the reference pass runs the same forward


def assert_same_metrics(run_a: Path, run_b: Path) -> list[dict]:
    """Two run folders logged the same rows, every float equal to float32 rounding (times, rates and memory aside);
    returns the rows of ``run_a``."""

    def rows(run: Path) -> list[dict]:
        lines = (run / "metrics.jsonl").read_text().splitlines()
        timing = ("time", "rss", "per_second")
        return [{k: v for k, v in json.loads(x).items() if not any(t in k for t in timing)} for x in lines]

    a_rows, b_rows = rows(run_a), rows(run_b)
    assert [r.keys() for r in a_rows] == [r.keys() for r in b_rows] and len(a_rows) >= 4
    for a, b in zip(a_rows, b_rows, strict=True):
        for key, value in a.items():
            if isinstance(value, float):
                assert value == pytest.approx(b[key], rel=1e-4, abs=1e-5), key
            else:
                assert value == b[key], key
    return a_rows
