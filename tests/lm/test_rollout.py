"""The rollout engine: sampling log-probs equal teacher-forced ones, the fast path equals the HF forward,
EOS masking, greedy equals HF ``generate``, reproducibility and padding invariance."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from postrl.lm.fast.llama import FastLlama, llama_unsupported_reason
from postrl.lm.models import (
    PolicyWithValueHead,
    ScalarHeadModel,
    TinyLMConfig,
    build_tiny_lm,
    position_ids_from_mask,
)
from postrl.lm.rollout import (
    RolloutEngine,
    SamplingConfig,
    generate,
    left_pad,
    mask_after_eos,
    sample_tokens,
    score,
    score_values,
)
from postrl.lm.rollout.sampling import _top_p_keep

PAD, EOS = 0, 1
TOL = 1e-4


def tiny_llama(vocab: int = 64, n_kv_heads: int | None = None, seed: int = 0, **extra) -> LlamaForCausalLM:
    """2 layers, d = 64, 4 heads (GQA with ``n_kv_heads``, other config fields in ``extra``); a small vocab
    so that EOS gets sampled."""
    if n_kv_heads is None and not extra:
        cfg = TinyLMConfig(
            n_layers=2, hidden_size=64, n_heads=4, intermediate_size=128, max_position_embeddings=128
        )
        return build_tiny_lm(vocab, cfg, seed=seed, pad_token_id=PAD, eos_token_id=EOS).eval()
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=n_kv_heads or 4,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=PAD,
        eos_token_id=EOS,
        **extra,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # HF initialises biases and norm weights to 0 and 1: make them matter
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def tiny_gpt2(vocab: int = 64) -> GPT2LMHeadModel:
    """A non-Llama model (its fast path: tests/lm/test_fast_gpt2.py)."""
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=128, pad_token_id=PAD)
    return GPT2LMHeadModel(cfg).eval()


def prompts(
    batch: int = 5, width: int = 9, seed: int = 0, vocab: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts of different lengths (1 … width tokens), no pad or EOS inside."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (batch,), generator=g).tolist()
    lengths[0] = width
    seqs = [torch.randint(2, vocab, (n,), generator=g).tolist() for n in lengths]
    return left_pad(seqs, PAD)


def run(model, ids, mask, seed: int = 0, **kwargs):
    kwargs = {"max_new_tokens": 12, "eos_token_id": EOS, "pad_token_id": PAD, **kwargs}
    return generate(model, ids, mask, generator=torch.Generator().manual_seed(seed), **kwargs)


# ---- fast path == HF forward ----------------------------------------------------------------------------------
LLAMA_VARIANTS = {
    "mha": {},
    "gqa": {"n_kv_heads": 2},
    "biases": {"attention_bias": True, "mlp_bias": True},
    "linear_rope": {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}},
}


@pytest.mark.parametrize("variant", sorted(LLAMA_VARIANTS))
def test_fast_path_logits_match_hf_on_left_padded_batch_and_decode_steps(variant):
    model = tiny_llama(**LLAMA_VARIANTS[variant])
    assert llama_unsupported_reason(model) is None
    ids, mask = prompts(batch=4, width=8)
    full_ids = torch.cat(
        (ids, torch.randint(2, 64, (4, 6), generator=torch.Generator().manual_seed(1))), dim=1
    )
    full_mask = torch.cat((mask, torch.ones(4, 6, dtype=torch.long)), dim=1)
    pos = position_ids_from_mask(full_mask)
    with torch.no_grad():
        ref = model(input_ids=full_ids, attention_mask=full_mask, position_ids=pos).logits  # (B, L, V)
        all_logits = FastLlama(model).prefill(ids, mask, pos[:, :8], 14, all_logits=True)
        real = mask.bool()
        assert (all_logits - ref[:, :8])[real].abs().max() < TOL
        fast = FastLlama(model)
        steps = [fast.prefill(ids, mask, pos[:, :8], 14)]
        steps += [fast.step(full_ids[:, c]) for c in range(8, 13)]
    assert (torch.stack(steps, 1) - ref[:, 7:13]).abs().max() < TOL


def test_fast_path_refuses_unsupported_models():
    assert "LlamaForCausalLM" in llama_unsupported_reason(tiny_gpt2())
    llama = tiny_llama()
    llama.config.hidden_act = "gelu"
    assert "silu" in llama_unsupported_reason(llama)
    with pytest.raises(ValueError, match="fast decoders cannot run"):  # float64: neither fast decoder runs it
        run(tiny_gpt2().double(), *prompts(), use_fast=True)


# ---- sampling log-probs == teacher-forced score -----------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("use_fast", [None, False])
def test_sampled_log_probs_equal_teacher_forced_score(temperature, use_fast):
    model = tiny_llama()
    ids, mask = prompts(batch=6)
    out = run(model, ids, mask, temperature=temperature, use_fast=use_fast)
    assert out.log_probs.dtype == torch.float32
    with torch.no_grad():
        ref = score(
            model, out.input_ids, out.attention_mask, out.prompt_len, temperature=temperature, chunk_size=4
        )
    assert (out.log_probs - ref).abs().max() < TOL
    assert (out.log_probs[out.response_mask.bool()] < 0).all()


def test_rollout_tensors_feed_autograd_and_score_follows_the_grad_mode():
    model = tiny_llama()
    out = run(model, *prompts())
    new_log_probs = score(model, out.input_ids, out.attention_mask, out.prompt_len)
    ratio = torch.exp(new_log_probs - out.log_probs) * out.response_mask  # a PPO-style use of the rollout
    ratio.sum().backward()
    assert model.model.embed_tokens.weight.grad is not None
    assert torch.allclose(ratio.detach(), out.response_mask.float(), atol=1e-4)


def test_left_pad_pads_on_the_left_and_masks_the_padding():
    ids, mask = left_pad([[5, 6, 7], [8], []], PAD)
    assert ids.tolist() == [[5, 6, 7], [PAD, PAD, 8], [PAD, PAD, PAD]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert ids.dtype == mask.dtype == torch.long


def test_bad_prompts_are_refused():
    model = tiny_llama()
    ids, mask = prompts()
    with pytest.raises(ValueError, match="LEFT-padded"):
        run(model, ids.flip(1), mask.flip(1))
    with pytest.raises(ValueError, match="one shape"):
        run(model, ids, mask[:, 1:])


def test_log_probs_are_of_the_unfiltered_tempered_distribution_under_top_k_top_p():
    model = tiny_llama()
    ids, mask = prompts()
    out = run(model, ids, mask, temperature=0.7, top_k=5, top_p=0.8)
    with torch.no_grad():
        ref = score(model, out.input_ids, out.attention_mask, out.prompt_len, temperature=0.7)
    assert (out.log_probs - ref).abs().max() < TOL


def test_hf_fallback_on_a_gpt2_model_matches_score():
    model = tiny_gpt2()
    ids, mask = prompts()
    out = run(model, ids, mask, temperature=0.7, use_fast=False)
    with torch.no_grad():
        ref = score(model, out.input_ids, out.attention_mask, out.prompt_len, temperature=0.7)
    assert (out.log_probs - ref).abs().max() < TOL


# ---- EOS, masks, lengths ------------------------------------------------------------------------------------------
def test_tokens_after_eos_are_pad_and_masked_and_the_mask_includes_eos():
    model = tiny_llama(vocab=16)
    out = run(model, *prompts(batch=16, vocab=16), max_new_tokens=20)
    assert out.finished.any() and not out.finished.all()
    for row in range(16):
        tokens, m = out.response_ids[row].tolist(), out.response_mask[row].tolist()
        if out.finished[row]:
            end = tokens.index(EOS)
            assert m == [1] * (end + 1) + [0] * (len(tokens) - end - 1)
            assert tokens[end + 1 :] == [PAD] * (len(tokens) - end - 1)
            assert (out.log_probs[row, end + 1 :] == 0).all() and out.log_probs[row, end] < 0
        else:
            assert m == [1] * len(tokens) and EOS not in tokens
    P = out.prompt_len
    assert torch.equal(out.input_ids[:, P:], out.response_ids)
    assert torch.equal(out.attention_mask[:, P:], out.response_mask)


def test_mask_after_eos_by_hand():
    ids = torch.tensor([[5, 1, 0, 0], [5, 6, 7, 8], [1, 0, 0, 0]])
    assert mask_after_eos(ids, EOS).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    # pad == eos (GPT-2 style tokenizers): the first EOS still ends the response
    assert mask_after_eos(torch.tensor([[5, 1, 1, 1]]), 1).tolist() == [[1, 1, 0, 0]]


def test_max_new_tokens_respected_and_batch_stops_when_all_finished():
    model = tiny_llama()
    ids, mask = prompts()
    out = run(model, ids, mask, max_new_tokens=7, eos_token_id=None)
    assert out.response_ids.shape == (5, 7) and out.response_mask.all() and not out.finished.any()
    assert out.input_ids.shape == (5, ids.shape[1] + 7)
    model = tiny_llama(vocab=16)
    out = run(model, *prompts(batch=3, vocab=16), max_new_tokens=60)
    assert out.finished.all() and out.response_ids.shape[1] == int(out.response_lengths.max()) < 60


# ---- greedy, top-k, reproducibility, padding invariance -----------------------------------------------------------
@pytest.mark.parametrize("use_fast", [None, False])
def test_greedy_equals_hf_generate_token_for_token(use_fast):
    model = tiny_llama()
    ids, mask = prompts(batch=6)
    out = run(model, ids, mask, greedy=True, max_new_tokens=10, eos_token_id=None, use_fast=use_fast)
    hf = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=10,
        min_new_tokens=10,
        pad_token_id=PAD,
    )
    assert torch.equal(out.response_ids, hf[:, ids.shape[1] :])


def test_top_k_one_equals_greedy_and_temperature_zero_is_greedy():
    model = tiny_llama()
    ids, mask = prompts()
    greedy = run(model, ids, mask, greedy=True)
    assert torch.equal(run(model, ids, mask, top_k=1, seed=3).response_ids, greedy.response_ids)
    assert torch.equal(run(model, ids, mask, temperature=0.0).response_ids, greedy.response_ids)


def test_same_generator_seed_gives_the_same_samples():
    model = tiny_llama()
    ids, mask = prompts()
    a, b, c = run(model, ids, mask, seed=7), run(model, ids, mask, seed=7), run(model, ids, mask, seed=8)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.log_probs, b.log_probs)
    assert not torch.equal(a.response_ids, c.response_ids)


@pytest.mark.parametrize("use_fast", [None, False])
def test_greedy_is_padding_invariant(use_fast):
    model = tiny_llama()
    ids, mask = prompts(batch=5)
    batched = run(model, ids, mask, greedy=True, use_fast=use_fast)
    for row in range(5):
        real = mask[row].bool()
        alone = run(model, ids[row, real][None], mask[row, real][None], greedy=True, use_fast=use_fast)
        T = alone.response_ids.shape[1]
        assert alone.response_ids[0].tolist() == batched.response_ids[row, :T].tolist()
        assert (alone.log_probs[0] - batched.log_probs[row, :T]).abs().max() < TOL


def test_fast_path_reads_live_weights():
    model = tiny_llama()
    ids, mask = prompts()
    before = run(model, ids, mask, greedy=True, eos_token_id=None)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    after = run(model, ids, mask, greedy=True, eos_token_id=None)
    hf = run(model, ids, mask, greedy=True, eos_token_id=None, use_fast=False)
    assert torch.equal(after.response_ids, hf.response_ids)
    assert not torch.equal(after.response_ids, before.response_ids)


# ---- sampling helpers -------------------------------------------------------------------------------------------------
def test_top_p_keep_by_hand():
    probs = torch.tensor([[0.5, 0.25, 0.15, 0.1]])
    # keep a token while the mass before it is < top_p
    assert torch.equal(_top_p_keep(probs, 0.7), torch.tensor([[0.5, 0.25, 0.0, 0.0]]))
    assert torch.equal(_top_p_keep(probs, 0.8), torch.tensor([[0.5, 0.25, 0.15, 0.0]]))
    assert torch.equal(_top_p_keep(probs, 0.3), torch.tensor([[0.5, 0.0, 0.0, 0.0]]))
    assert torch.equal(_top_p_keep(probs * 2, 0.7), torch.tensor([[1.0, 0.5, 0.0, 0.0]]))  # unnormalised


def test_sample_tokens_follows_the_distribution_and_filters():
    p = torch.tensor([0.1, 0.0, 0.6, 0.3])
    log_p = p.log().expand(20000, 4)
    g = torch.Generator().manual_seed(0)
    freq = torch.bincount(sample_tokens(log_p, generator=g)[:, 0], minlength=4) / 20000
    assert (freq - p).abs().max() < 0.015 and freq[1] == 0
    assert set(sample_tokens(log_p, top_k=2, generator=g)[:, 0].tolist()) == {2, 3}
    assert set(sample_tokens(log_p, top_p=0.6, generator=g)[:, 0].tolist()) == {2}


# ---- score with values, engine --------------------------------------------------------------------------------------
def test_score_values_from_value_fn_and_from_a_policy_with_value_head():
    model = tiny_llama()
    out = run(model, *prompts())
    head = PolicyWithValueHead(model)
    P = out.prompt_len
    with torch.no_grad():
        lp, values = score(head, out.input_ids, out.attention_mask, P, chunk_size=2)
        lp2, values2 = score(model, out.input_ids, out.attention_mask, P, value_fn=head.head)
        _, all_values = head(out.input_ids, out.attention_mask)  # (B, L)
    assert (lp - out.log_probs).abs().max() < TOL and (lp2 - out.log_probs).abs().max() < TOL
    assert torch.allclose(values, values2, atol=1e-6)
    expected = all_values[:, P - 1 : -1] * out.response_mask
    assert torch.allclose(values, expected, atol=1e-6) and values.shape == out.response_ids.shape


def test_score_values_of_a_separate_critic_are_the_states_before_each_response_token():
    model = tiny_llama()
    out = run(model, *prompts())
    critic = ScalarHeadModel.from_causal_lm(model)
    P = out.prompt_len
    with torch.no_grad():
        values = score_values(critic, out.input_ids, out.attention_mask, P, chunk_size=2)
        all_values = critic(out.input_ids, out.attention_mask)  # (B, L)
    assert values.shape == out.response_ids.shape
    assert torch.allclose(values, all_values[:, P - 1 : -1] * out.response_mask, atol=1e-6)


def test_engine_left_pads_text_prompts_and_decodes_responses(tiny_lm, tiny_tokenizer):
    engine = RolloutEngine(tiny_lm, tiny_tokenizer, SamplingConfig(max_new_tokens=8, temperature=0.7))
    texts = ["<|user|>1+2=<|assistant|>", "<|user|>hello there, how are you<|assistant|>"]
    out = engine.generate(texts, generator=torch.Generator().manual_seed(0))
    assert out.prompts == texts and len(out.texts) == 2
    assert out.attention_mask[0, 0] == 0 and out.attention_mask[:, out.prompt_len - 1].all()
    for row, text in enumerate(out.texts):
        n = int(out.response_lengths[row]) - int(out.finished[row])
        assert text == tiny_tokenizer.decode(out.response_ids[row, :n], skip_special_tokens=True)
    with torch.no_grad():
        ref = score(tiny_lm, out.input_ids, out.attention_mask, out.prompt_len, temperature=0.7)
    assert (out.log_probs - ref).abs().max() < TOL


def test_the_path_log_forgets_a_freed_model():
    """The one-line-per-model log of the sampling path is keyed by the model itself, weakly: a freed model's
    entry goes with it (an id() key let a new model at the same address stay silent: a flaky test)."""
    import gc

    from postrl.lm.rollout import decoders

    model = torch.nn.Linear(1, 1)
    decoders._say(model, "a path", "a reason")
    assert model in decoders._SAID
    before = len(decoders._SAID)
    del model
    gc.collect()  # may free other tests' models too: their entries go as well
    assert len(decoders._SAID) <= before - 1


def test_sampling_backend_switch_picks_the_path_and_says_so(caplog):
    """sampling.backend: auto takes the fast decoder where it runs the model, hf forces the Hugging Face
    forward (same samples to float32 rounding), fast on a model it cannot run is a config error; the path
    taken is logged at info level."""
    import logging

    from postrl.lm.rollout import SamplingConfig
    from postrl.lm.rollout.decoders import HFDecoder, check_backend, make_decoder
    from postrl.runtime.errors import ConfigError

    model = tiny_llama()
    assert SamplingConfig(backend="auto").use_fast is None and SamplingConfig(backend="hf").use_fast is False
    with caplog.at_level(logging.INFO, logger="postrl.lm.rollout.decoders"):
        assert not isinstance(make_decoder(model, SamplingConfig().use_fast), HFDecoder)
        assert isinstance(make_decoder(model, SamplingConfig(backend="hf").use_fast), HFDecoder)
    assert "FastLlama" in caplog.text and "sampling.backend hf" in caplog.text
    ids, mask = prompts()
    fast = run(model, ids, mask, use_fast=SamplingConfig().use_fast)
    slow = run(model, ids, mask, use_fast=SamplingConfig(backend="hf").use_fast)
    assert torch.equal(fast.response_ids, slow.response_ids)
    check_backend(model, "fast")
    with pytest.raises(ConfigError, match="sampling.backend is fast"):
        check_backend(tiny_gpt2().double(), "fast")
