"""SFT through the padding-free forward (`postrl.lm.packed_sft`, ``padding_free: auto``): the layout by hand,
the loss and its gradients equal to an unpadded one-sequence-at-a-time formulation in float64 and to the padded
forward in float32, the refusals, and a short `postrl sft` run with the same metrics padding-free or not."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from postrl.lm.data import pad
from postrl.lm.packed_sft import sft_padding_free, sft_rollout_layout
from postrl.lm.sft import SFTConfig, run_sft
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig, TrainConfig, sft_step_loss
from tests.lm.test_fast_gpt2 import tiny_gpt2
from tests.lm.test_packed_forward import assert_same_metrics
from tests.lm.test_rollout import tiny_llama

IGNORE = -100


def test_the_layout_by_hand():
    # row 0: prompt [3, 4], completion [5, 6]; row 1: prompt [3, 4], completion [7] (the same prompt);
    # row 2: a pretraining row (every token a target: cut after token 0); L = 4, right-padded with 0
    ids = torch.tensor([[3, 4, 5, 6], [3, 4, 7, 0], [8, 9, 10, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 0]])
    labels = torch.tensor([[IGNORE, IGNORE, 5, 6], [IGNORE, IGNORE, 7, IGNORE], [8, 9, 10, IGNORE]])
    got, got_mask, P, position = sft_rollout_layout(ids, mask, labels)
    assert P == 2
    assert got.tolist() == [[3, 4, 5, 6], [3, 4, 7, 0], [0, 8, 9, 10]]
    assert got_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0], [0, 1, 1, 1]]
    # response column t of row b is token cut_b + t, predicted at position cut_b + t − 1 of [B, L − 1]
    assert position.tolist() == [[1, 2], [1, -1], [0, 1]]


def _batch(rows: list[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
    """Right-padded (ids, labels) rows → the batch `postrl.lm.trainer.make_batches` builds."""
    ids, mask = pad([r[0] for r in rows], 0, side="right")
    labels, _ = pad([r[1] for r in rows], IGNORE, side="right")
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _rows() -> list[tuple[list[int], list[int]]]:
    """Shared prompts, rows of other lengths, a packed block (targets with a gap), a pretraining row."""
    g = torch.Generator().manual_seed(0)

    def tokens(n: int) -> list[int]:
        return torch.randint(3, 48, (n,), generator=g).tolist()

    p1, p2 = tokens(5), tokens(3)
    c = [tokens(n) for n in (4, 1, 6, 2, 3)]
    rows = [(p1 + x, [IGNORE] * len(p1) + x) for x in c[:2]]  # two rows share prompt p1
    rows.append((p2 + c[2], [IGNORE] * len(p2) + c[2]))
    block = p2 + c[3] + p1 + c[4]  # plain packing: two examples in one block
    rows.append((block, [IGNORE] * len(p2) + c[3] + [IGNORE] * len(p1) + c[4]))
    text = tokens(7)
    rows.append((text, text))
    return rows


def _reference_loss(model, rows: list[tuple[list[int], list[int]]]) -> torch.Tensor:
    """Σ −log π over every target token / their count, one unpadded sequence at a time (the model's own
    forward, log-softmax in float64)."""
    total, count = 0.0, 0
    for ids, labels in rows:
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()  # (L, V)
        log_pi = torch.log_softmax(logits, dim=-1)
        for t in range(1, len(ids)):
            if labels[t] != IGNORE:
                total = total - log_pi[t - 1, labels[t]]
                count += 1
    return total / count


def _loss_and_grads(model, compute):
    model.zero_grad(set_to_none=True)
    loss = compute()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def _rms_norm_in_its_dtype(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """`LlamaRMSNorm.forward` without its cast to float32 (which limits a float64 model to ~1e-8)."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


@pytest.mark.parametrize("name", ["llama", "llama-gqa", "gpt2"])
def test_loss_and_gradients_equal_unpadded_sequences_in_float64(name, monkeypatch):
    """The loss of a micro-batch (shared prompts, other lengths, a packed block, a pretraining row) and every
    gradient equal those of the Hugging Face forward run on each sequence alone, without padding."""
    monkeypatch.setattr(LlamaRMSNorm, "forward", _rms_norm_in_its_dtype)
    models = {"llama": lambda: tiny_llama(vocab=48), "llama-gqa": lambda: tiny_llama(vocab=48, n_kv_heads=2)}
    model = models.get(name, tiny_gpt2)().double()
    rows = _rows()
    batch = _batch(rows)
    n_tokens = int((batch["labels"][:, 1:] != IGNORE).sum())
    ref, ref_grads = _loss_and_grads(model, lambda: _reference_loss(model, rows))
    got, grads = _loss_and_grads(model, lambda: sft_step_loss(model, batch, n_tokens, packed=True))
    assert got.dtype == torch.float64
    assert abs(float(got - ref)) < 1e-12
    for g, r in zip(grads, ref_grads, strict=True):
        assert (g - r).abs().max() < 1e-12 * max(1.0, float(r.abs().max()))


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_loss_and_gradients_equal_the_padded_forward_in_float32(name):
    """The same micro-batch through the padded forward (``padding_free: off``, the path before) and the
    padding-free one: loss and gradients equal to float32 rounding."""
    model = tiny_llama(vocab=48, n_kv_heads=2) if name == "llama" else tiny_gpt2()
    batch = _batch(_rows())
    n_tokens = 40  # a share of a larger step: both divide by the step's count
    ref, ref_grads = _loss_and_grads(model, lambda: sft_step_loss(model, batch, n_tokens))
    got, grads = _loss_and_grads(model, lambda: sft_step_loss(model, batch, n_tokens, packed=True))
    assert float(got) == pytest.approx(float(ref), rel=1e-6)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)


def test_the_choice_and_the_refusals_are_logged(caplog):
    llama = tiny_llama()
    with caplog.at_level(logging.INFO, logger="postrl.lm.packed_sft"):
        assert sft_padding_free(llama, "auto")
        assert not sft_padding_free(llama, "off")
        assert sft_padding_free(tiny_gpt2(), "auto")
        assert not sft_padding_free(llama.double(), "auto")
        assert not sft_padding_free(tiny_gpt2(resid_pdrop=0.1).train(), "auto")
        assert not sft_padding_free(torch.nn.Linear(2, 2), "auto")
    assert "sft: padding-free forward (padding_free=auto)" in caplog.text
    assert "refused: Linear is not a LlamaForCausalLM" in caplog.text
    assert "refused: dtype torch.float64 is not float32" in caplog.text
    assert "refused: dropout is active" in caplog.text


def _cfg(model: Path, **kw) -> SFTConfig:
    base = SFTConfig(
        model=str(model),
        data="task:arithmetic",
        train=TrainConfig(batch_size=8, grad_accum=2, max_length=64, eval_examples=16),
        optim=OptimConfig(lr=1e-3, warmup_steps=0, min_lr_ratio=1.0),
        run=RunConfig(steps=4, eval_every=2, save_every=0, keep_last=0, log_every=1, device="cpu", threads=1),
        eval_size=0,
    )
    return replace(base, **kw)


def test_an_sft_run_has_the_same_metrics_padding_free_or_not(tiny_lm_dir: Path, tmp_path: Path, caplog):
    """Four steps of two micro-batches with the padded forward (``padding_free=off``) and the padding-free
    one: every logged loss, gradient norm and held-out loss equal to float32 rounding."""
    with caplog.at_level(logging.INFO, logger="postrl.lm.packed_sft"):
        run_sft(_cfg(tiny_lm_dir), tmp_path / "packed")
    assert "padding-free forward" in caplog.text
    run_sft(_cfg(tiny_lm_dir, padding_free="off"), tmp_path / "padded")
    packed = assert_same_metrics(tmp_path / "packed", tmp_path / "padded")
    assert sum("heldout_loss" in r for r in packed) >= 2 and sum("grad_norm" in r for r in packed) == 4
