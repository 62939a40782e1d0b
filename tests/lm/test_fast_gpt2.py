"""The GPT-2 fast decode path (`postrl.lm.fast.gpt2`) equals the Hugging Face forward: logits, greedy tokens
and log-probs on left-padded prompts of different lengths; sampling with a fixed seed is reproducible."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from postrl.lm.fast.gpt2 import FastGPT2, gpt2_unsupported_reason
from postrl.lm.models import position_ids_from_mask
from postrl.lm.rollout import generate, left_pad, score
from postrl.lm.rollout.decoders import HFDecoder, make_decoder

PAD, EOS = 0, 1
TOL = 1e-5


def tiny_gpt2(vocab: int = 48, **extra) -> GPT2LMHeadModel:
    """2 blocks, d = 64, 4 heads; LayerNorm weights and biases perturbed so that their use is tested."""
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=64, pad_token_id=PAD, eos_token_id=EOS,
        bos_token_id=EOS, **extra,
    )  # fmt: skip
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def prompts(
    batch: int = 5, width: int = 9, seed: int = 0, vocab: int = 48
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts of lengths 1 … width (row 0 the longest), no pad or EOS inside."""
    g = torch.Generator().manual_seed(seed)
    lengths = [width, *torch.randint(1, width + 1, (batch - 1,), generator=g).tolist()]
    return left_pad([torch.randint(2, vocab, (n,), generator=g).tolist() for n in lengths], PAD)


def run(model, ids, mask, seed: int = 0, **kwargs):
    kwargs = {"max_new_tokens": 12, "eos_token_id": EOS, "pad_token_id": PAD, **kwargs}
    return generate(model, ids, mask, generator=torch.Generator().manual_seed(seed), **kwargs)


VARIANTS = {
    "gelu_new": {},
    "relu_inverse_layer_scale": {"activation_function": "relu", "scale_attn_by_inverse_layer_idx": True},
    "unscaled_attention": {"scale_attn_weights": False, "activation_function": "gelu"},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_prefill_and_decode_log_probs_match_hf_on_a_left_padded_batch(variant):
    model = tiny_gpt2(**VARIANTS[variant])
    assert gpt2_unsupported_reason(model) is None
    ids, mask = prompts(batch=4, width=8)
    g = torch.Generator().manual_seed(1)
    full_ids = torch.cat((ids, torch.randint(2, 48, (4, 6), generator=g)), dim=1)
    full_mask = torch.cat((mask, torch.ones(4, 6, dtype=torch.long)), dim=1)
    pos = position_ids_from_mask(full_mask)
    with torch.no_grad():
        ref = model(input_ids=full_ids, attention_mask=full_mask, position_ids=pos).logits.log_softmax(-1)
        prefill = FastGPT2(model).prefill(ids, mask, pos[:, :8], 14, all_logits=True).log_softmax(-1)
        assert (prefill - ref[:, :8])[mask.bool()].abs().max() < TOL
        fast = FastGPT2(model)
        steps = [fast.prefill(ids, mask, pos[:, :8], 14)]
        steps += [fast.step(full_ids[:, c]) for c in range(8, 13)]
    assert (torch.stack(steps, 1).log_softmax(-1) - ref[:, 7:13]).abs().max() < TOL


def test_make_decoder_picks_the_gpt2_fast_path_and_refuses_what_it_cannot_run():
    model = tiny_gpt2()
    assert isinstance(make_decoder(model), FastGPT2)
    assert isinstance(make_decoder(model, use_fast=False), HFDecoder)
    model.train()  # GPT-2's default dropout 0.1 is active in training mode
    assert "dropout" in gpt2_unsupported_reason(model) and isinstance(make_decoder(model), HFDecoder)
    with pytest.raises(ValueError, match="n_positions"):
        run(tiny_gpt2().eval(), *prompts(width=9), max_new_tokens=60)
    biased = tiny_gpt2()  # GPT-2's lm_head has no bias; one added by a user is not silently dropped
    biased.lm_head = torch.nn.Linear(64, 48, bias=True)
    assert "bias" in gpt2_unsupported_reason(biased) and isinstance(make_decoder(biased), HFDecoder)


def test_greedy_tokens_and_log_probs_equal_hf_generate_and_the_fallback():
    model = tiny_gpt2()
    ids, mask = prompts(batch=6)
    out = run(model, ids, mask, greedy=True, max_new_tokens=10, eos_token_id=None)
    hf = model.generate(
        input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=10, min_new_tokens=10,
        pad_token_id=PAD,
    )  # fmt: skip
    assert torch.equal(out.response_ids, hf[:, ids.shape[1] :])
    slow = run(model, ids, mask, greedy=True, max_new_tokens=10, eos_token_id=None, use_fast=False)
    assert torch.equal(out.response_ids, slow.response_ids)
    assert (out.log_probs - slow.log_probs).abs().max() < TOL


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_log_probs_equal_the_teacher_forced_hf_score(temperature):
    model = tiny_gpt2(vocab=12)  # a small vocabulary: EOS gets sampled, rows end at different lengths
    ids, mask = prompts(batch=8, vocab=12)
    out = run(model, ids, mask, temperature=temperature, max_new_tokens=16)
    assert out.finished.any()
    with torch.no_grad():
        ref = score(model, out.input_ids, out.attention_mask, out.prompt_len, temperature=temperature)
    assert (out.log_probs - ref).abs().max() < TOL


def test_sampling_with_a_fixed_seed_is_reproducible_and_padding_invariant():
    model = tiny_gpt2()
    ids, mask = prompts()
    a, b, c = run(model, ids, mask, seed=7), run(model, ids, mask, seed=7), run(model, ids, mask, seed=8)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.log_probs, b.log_probs)
    assert not torch.equal(a.response_ids, c.response_ids)
    batched = run(model, ids, mask, greedy=True)
    for row in range(ids.shape[0]):
        real = mask[row].bool()
        alone = run(model, ids[row, real][None], mask[row, real][None], greedy=True)
        T = alone.response_ids.shape[1]
        assert alone.response_ids[0].tolist() == batched.response_ids[row, :T].tolist()
        assert (alone.log_probs[0] - batched.log_probs[row, :T]).abs().max() < TOL
