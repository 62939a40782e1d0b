"""The chunked output layer (postrl.lm.rollout.chunked) against the whole-logits reference: forward, entropy and
gradients in float64, and every LM forward that picks it (run.memory.log_probs) against the full path."""

from __future__ import annotations

import contextlib
import logging

import pytest
import torch
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from postrl.core import entropy_from_logits
from postrl.lm.memory import MemoryConfig, configure_memory
from postrl.lm.rollout.chunked import chunked_log_probs
from postrl.lm.rollout.forwards import ChunkedForward, forward_log_probs, response_forward
from postrl.lm.rollout.sampling import token_log_probs


def _reference(hidden, weight, bias, tokens, tau):
    logits = F.linear(hidden, weight, bias).float() / tau
    return token_log_probs(logits, tokens), entropy_from_logits(logits)


@pytest.mark.parametrize("chunk", [1, 5, 7, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_chunked_equals_whole_logits_float64(chunk, with_bias):
    g = torch.Generator().manual_seed(0)
    B, T, d, V, tau = 3, 7, 6, 50, 0.7
    h = torch.randn(B, T, d, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(V, d, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(V, generator=g, dtype=torch.float64, requires_grad=True) if with_bias else None
    y = torch.randint(V, (B, T), generator=g)
    upstream = torch.randn(B, T, generator=g, dtype=torch.float64)  # a loss weighting each token differently

    # the reference in float64 end to end (token_log_probs casts to float32: do the float64 math here)
    z = F.linear(h, w, b) / tau
    ref_lp = torch.log_softmax(z, -1).gather(-1, y[..., None]).squeeze(-1)
    ref_ent = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)
    ref_grads = torch.autograd.grad((ref_lp * upstream).sum(), [h, w] + ([b] if with_bias else []))

    lp, ent = chunked_log_probs(h, w, b, y, tau, chunk_tokens=chunk)
    assert lp.shape == (B, T) and ent is not None and not ent.requires_grad
    # the forward keeps float32 (as token_log_probs): equal to float32 rounding
    torch.testing.assert_close(lp.double(), ref_lp.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent.detach(), rtol=0, atol=1e-5)
    grads = torch.autograd.grad((lp.double() * upstream).sum(), [h, w] + ([b] if with_bias else []))
    for got, want in zip(grads, ref_grads, strict=True):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


class OpWatch(TorchDispatchMode):
    """Names the ops run under it whose tensor output ``picked(func, out)`` selects (``made``)."""

    def __init__(self, picked):
        super().__init__()
        self.picked, self.made = picked, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and self.picked(func, out):
            self.made.append(func.__name__)
        return out


def test_gradient_matches_hand_computed_onehot_minus_softmax():
    """One token, V = 3, W = I: ∂ log softmax(h)_y / ∂h = onehot(y) − softmax(h), by hand."""
    h = torch.tensor([[1.0, 2.0, 0.5]], dtype=torch.float64, requires_grad=True)
    w = torch.eye(3, dtype=torch.float64)
    lp, _ = chunked_log_probs(h, w, None, torch.tensor([1]), 1.0, chunk_tokens=1)
    lp.sum().backward()
    p = torch.tensor([1.0, 2.0, 0.5]).exp() / torch.tensor([1.0, 2.0, 0.5]).exp().sum()
    expect = torch.tensor([0.0, 1.0, 0.0]) - p
    torch.testing.assert_close(h.grad[0].float(), expect, rtol=0, atol=1e-6)
    assert abs(lp.item() - (2.0 - torch.tensor([1.0, 2.0, 0.5]).exp().sum().log().item())) < 1e-6


def test_frozen_weight_gets_no_gradient_and_entropy_optional():
    h = torch.randn(4, 3, requires_grad=True)
    w = torch.randn(9, 3)  # frozen output layer (LoRA): only the hidden states get a gradient
    lp, ent = chunked_log_probs(h, w, None, torch.tensor([0, 1, 2, 8]), 1.0, chunk_tokens=3, entropy=False)
    assert ent is None
    lp.sum().backward()
    assert h.grad is not None and w.grad is None
    ref, _ = _reference(h.detach(), w, None, torch.tensor([0, 1, 2, 8]), 1.0)
    torch.testing.assert_close(lp.detach(), ref, rtol=0, atol=1e-6)


def test_a_backward_onto_an_existing_gradient_adds_into_it_in_place():
    """With ``W.grad`` already there, ∂L/∂W is added into it inside the backward (no new [V, d] tensor is made:
    every product of that shape writes into W.grad) and the total is the sum of the two backwards;
    ``autograd.grad`` still gets W's gradient returned and leaves W.grad alone."""

    def new_weight_shaped(func, out):  # the ops that return a new [V, d] tensor
        new = out.shape == (40, 6) and not func._schema.is_mutable
        return new and func.__name__ not in ("t.default", "detach.default", "alias.default")

    g = torch.Generator().manual_seed(1)
    h = torch.randn(9, 6, generator=g, requires_grad=True)
    w = torch.randn(40, 6, generator=g, requires_grad=True)
    y = torch.randint(40, (9,), generator=g)
    ref_lp, _ = _reference(h, w, None, y, 0.8)
    (want,) = torch.autograd.grad(ref_lp.sum(), [w])
    first_pass, second_pass = OpWatch(new_weight_shaped), OpWatch(new_weight_shaped)
    loss = chunked_log_probs(h, w, None, y, 0.8, chunk_tokens=4)[0].sum()
    with first_pass:
        loss.backward()
    assert first_pass.made  # the first backward makes the gradient autograd stores as .grad
    first = w.grad
    loss = chunked_log_probs(h, w, None, y, 0.8, chunk_tokens=4)[0].sum()
    with second_pass:
        loss.backward()
    assert second_pass.made == [] and w.grad is first  # the second adds into it
    torch.testing.assert_close(w.grad, 2 * want, rtol=1e-5, atol=1e-6)
    (returned,) = torch.autograd.grad(chunked_log_probs(h, w, None, y, 0.8, chunk_tokens=4)[0].sum(), [w])
    torch.testing.assert_close(returned, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.grad, 2 * want, rtol=1e-5, atol=1e-6)  # untouched by autograd.grad


@pytest.mark.parametrize("chunk", [1, 4, 16, 64])
@pytest.mark.parametrize("slice_rows", [7, 16384])
@pytest.mark.parametrize("with_bias", [False, True])
def test_bfloat16_weights_sliced_by_vocabulary_match_the_plain_path(
    chunk, slice_rows, with_bias, monkeypatch
):
    """A trained bfloat16 output layer takes its backward a vocabulary slice at a time: ∂L/∂W, ∂L/∂b and ∂L/∂h
    equal the plain path's (the whole bfloat16 logits, then autograd) within bfloat16 rounding, and over more
    than one slice no float32 tensor of W's shape is made (the chunk loop summed ∂L/∂W in one: 544 MB at
    Qwen2.5's vocabulary)."""
    import postrl.lm.rollout.chunked as chunked

    g = torch.Generator().manual_seed(2)
    N, d, V, tau = 24, 8, 40, 0.9
    h0 = torch.randn(N, d, generator=g).to(torch.bfloat16)
    w0 = (torch.randn(V, d, generator=g) * 0.5).to(torch.bfloat16)
    b0 = (torch.randn(V, generator=g) * 0.1).to(torch.bfloat16) if with_bias else None
    y = torch.randint(V, (N,), generator=g)
    y[0], y[1] = 0, V - 1  # the first and the last slice each hold a target
    weights = torch.randn(N, generator=g)

    def grads(log_probs, watch=None):
        h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
        b = None if b0 is None else b0.clone().requires_grad_()
        lp = log_probs(h, w, b)
        with watch or contextlib.nullcontext():
            (lp * weights).sum().backward()
        return [h.grad, w.grad] + ([b.grad] if b is not None else []), lp.detach()

    watch = OpWatch(lambda func, out: out.shape == (V, d) and out.dtype == torch.float32)
    monkeypatch.setattr(chunked, "SLICE_ROWS", slice_rows)
    sliced, lp = grads(lambda h, w, b: chunked_log_probs(h, w, b, y, tau, chunk_tokens=chunk)[0], watch)
    plain, lp_plain = grads(lambda h, w, b: _reference(h, w, b, y, tau)[0])
    if min(chunk * V // N, slice_rows) < V:  # more than one slice: none of W's shape in float32
        assert watch.made == []
    torch.testing.assert_close(lp, lp_plain, rtol=0, atol=1e-6)
    for ours, want in zip(sliced, plain, strict=True):
        assert ours.dtype == torch.bfloat16
        tolerance = want.float().abs() * 2.0**-6 + want.float().abs().max() * 2.0**-8
        assert ((ours.float() - want.float()).abs() <= tolerance).all()


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tied_output_layer_and_embedding_write_one_gradient_in_place(dtype, checkpointing, monkeypatch):
    """The chunked output layer sets its ∂L/∂W as the tied weight's .grad and the input embedding adds its rows
    into it: over two backwards (gradient accumulation) the only [V, d] tensor made is that first gradient (the
    plain path makes the embedding's dense gradient at every backward too: 272 MB at Qwen2.5's vocabulary in
    bfloat16), and every gradient equals the whole-logits path's, within bfloat16 rounding in bfloat16 (the
    vocabulary in slices of 7 rows there). With checkpointing the prompt is not shared (one full forward), and
    the same holds."""
    import postrl.lm.rollout.chunked as chunked
    from tests.lm.test_forwards import grouped_batch

    monkeypatch.setattr(chunked, "SLICE_ROWS", 7)
    V, d = 48, 32
    ids, mask, P = grouped_batch()
    upstream = torch.randn(ids.shape[0], ids.shape[1] - P, generator=torch.Generator().manual_seed(1))

    def two_backwards(mode, watch=None):
        model = tiny_qwen2().to(dtype)
        if checkpointing:
            model.train()  # HF checkpoints only in training mode (no dropout in these configs)
        memory = MemoryConfig(log_probs=mode, chunk_tokens=5, gradient_checkpointing=checkpointing)
        configure_memory(model, memory)
        forward = response_forward(model)
        for _ in range(2):
            log_probs, _ = forward_log_probs(forward, ids, mask, P, 0.8)
            with watch or contextlib.nullcontext():
                (log_probs * upstream * mask[:, P:]).sum().backward()
        return forward, {n: p.grad for n, p in model.named_parameters()}

    def new_weight_shaped(func, out):  # ops that return a new [V, d] tensor (not views, not in-place adds)
        views = ("t.default", "slice.Tensor", "detach.default", "alias.default")
        return out.shape == (V, d) and not func._schema.is_mutable and func.__name__ not in views

    made = OpWatch(new_weight_shaped)
    forward, grads = two_backwards("chunked", made)
    assert isinstance(forward, ChunkedForward)
    assert made.made == ["empty_like.default" if dtype == torch.bfloat16 else "mm.default"], made.made
    _, want = two_backwards("full")
    assert grads.keys() == want.keys()
    for key, grad in grads.items():
        assert grad.dtype == dtype, key
        if dtype == torch.float32:
            torch.testing.assert_close(grad, want[key], rtol=1e-4, atol=1e-5, msg=key)
        else:
            # bfloat16 rounding through two layers: within 1.5% of the tensor's largest entry here; a lost part
            # (the embedding's rows, a slice) is off by its whole size
            error = (grad.float() - want[key].float()).abs().max()
            assert error <= want[key].float().abs().max() * 2.0**-5, key


def test_a_token_of_probability_zero_keeps_log_probs_and_entropy_finite():
    """A −inf logit (a bias that bans a token) has probability 0: it adds nothing to the logsumexp or the entropy
    (0 · log 0 = 0), where softmax(z) · z gave nan."""
    g = torch.Generator().manual_seed(3)
    h, w = torch.randn(6, 4, generator=g), torch.randn(10, 4, generator=g)
    bias = torch.zeros(10)
    bias[[2, 7]] = float("-inf")
    tokens = torch.tensor([0, 1, 3, 4, 5, 9])
    lp, ent = chunked_log_probs(h, w, bias, tokens, 1.0, chunk_tokens=4)
    keep = torch.tensor([k not in (2, 7) for k in range(10)])
    ref_lp, ref_ent = _reference(h, w[keep], None, torch.tensor([0, 1, 2, 3, 4, 7]), 1.0)
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-5)


def test_bad_chunk_size():
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_log_probs(torch.zeros(1, 2), torch.zeros(3, 2), None, torch.tensor([0]), chunk_tokens=0)


def tiny_qwen2(vocab: int = 48, tied: bool = True):
    """A 2-layer Qwen2 (biased q/k/v projections), random weights, in eval mode."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tied, pad_token_id=0,
        eos_token_id=1,
    )  # fmt: skip
    return Qwen2ForCausalLM(cfg).eval()


def _models():
    from tests.lm.test_rollout import tiny_llama

    return {
        "llama": lambda: tiny_llama(vocab=48),
        "qwen2": tiny_qwen2,
        "qwen2-untied": lambda: tiny_qwen2(tied=False),
    }


def _log_probs_and_grads(model, mode, checkpointing=False):
    from tests.lm.test_forwards import grouped_batch

    configure_memory(
        model, MemoryConfig(log_probs=mode, chunk_tokens=5, gradient_checkpointing=checkpointing)
    )
    forward = response_forward(model)
    ids, mask, P = grouped_batch()
    upstream = torch.randn(ids.shape[0], ids.shape[1] - P, generator=torch.Generator().manual_seed(1))
    model.zero_grad(set_to_none=True)
    log_probs, entropy = forward_log_probs(forward, ids, mask, P, 0.8, entropy=True)
    (log_probs * upstream * mask[:, P:]).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return forward, log_probs.detach() * mask[:, P:], entropy * mask[:, P:], grads


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen2-untied"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_chunked_forward_pinned_to_the_full_forward(name, checkpointing, caplog):
    """run.memory.log_probs=chunked (the decoder's hidden states, the output layer in chunks) gives the log-probs,
    entropies and every parameter's gradient of the reference path (the model's whole logits)."""
    model = _models()[name]().double()
    if checkpointing:
        model.train()  # HF checkpoints only in training mode (no dropout in these configs)
    with caplog.at_level(logging.INFO, logger="postrl.lm.rollout.forwards"):
        forward, lp, ent, grads = _log_probs_and_grads(model, "chunked", checkpointing)
    assert isinstance(forward, ChunkedForward) and "in chunks" in caplog.text
    reference, ref_lp, ref_ent, ref_grads = _log_probs_and_grads(model, "full", checkpointing)
    assert not isinstance(reference, ChunkedForward)
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-5)  # float32 log-softmax on both sides
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-5)
    assert grads.keys() == ref_grads.keys() and "model.embed_tokens.weight" in grads
    for key, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[key], rtol=1e-4, atol=1e-6, msg=key)


def test_checkpointing_acts_on_a_model_loaded_in_eval_mode():
    """from_pretrained returns eval mode, where transformers skips checkpointing: `configure_memory` puts the
    trained model in training mode, so the forward saves only the layers' inputs for the backward (GRPO and
    PPO, which never call train(), kept every activation before); the gradients are the same."""

    def saved_and_grads(model):
        saved = []
        ids = torch.randint(2, 48, (2, 6), generator=torch.Generator().manual_seed(0))
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(1) or t, lambda t: t):
            loss = model(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).sum()
        loss.backward()
        return len(saved), [p.grad for p in model.parameters()]

    plain_saved, plain_grads = saved_and_grads(tiny_qwen2())
    model = tiny_qwen2()  # eval mode, as loaded
    configure_memory(model, MemoryConfig(gradient_checkpointing=True))
    assert model.training
    saved, grads = saved_and_grads(model)
    assert saved < plain_saved / 3
    for grad, want in zip(grads, plain_grads, strict=True):
        torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-6)
    frozen = tiny_qwen2()
    configure_memory(frozen, MemoryConfig(gradient_checkpointing=True), trained=False)
    assert not frozen.training


def test_auto_chunks_a_large_vocabulary_only_and_refuses_what_it_cannot_run(caplog):
    from tests.lm.test_fast_gpt2 import tiny_gpt2

    assert not isinstance(response_forward(tiny_qwen2(vocab=48)), ChunkedForward)  # auto, small vocabulary
    assert isinstance(response_forward(tiny_qwen2(vocab=32768)), ChunkedForward)  # auto, large vocabulary
    gpt2 = configure_memory(tiny_gpt2(), MemoryConfig(log_probs="chunked"))
    with caplog.at_level(logging.WARNING, logger="postrl.lm.rollout.forwards"):
        assert not isinstance(response_forward(gpt2), ChunkedForward)
    assert "run.memory.log_probs=chunked refused" in caplog.text and "'gpt2'" in caplog.text


def test_lora_reference_runs_chunked_with_adapters_off():
    """A LoRA run's reference (the policy with adapters off) through the chunked path equals the base model."""
    pytest.importorskip("peft")
    from postrl.lm.models.lora import adapter_free_reference, apply_lora
    from postrl.lm.spine import LoraConfig, RunConfig
    from tests.lm.test_forwards import grouped_batch

    base = tiny_qwen2()
    ids, mask, P = grouped_batch()
    configure_memory(base, MemoryConfig(log_probs="full"))
    with torch.no_grad():
        want, _ = forward_log_probs(response_forward(base, gradients=False), ids, mask, P)
    policy = apply_lora(base, RunConfig(lora=LoraConfig(enabled=True, rank=4)), rl=True)
    for name, p in policy.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p)  # adapters that change the output, so that "off" is tested
    configure_memory(policy, MemoryConfig(log_probs="chunked", chunk_tokens=7))
    reference = response_forward(adapter_free_reference(policy), gradients=False)
    assert isinstance(reference, ChunkedForward)
    with torch.no_grad():
        got, _ = forward_log_probs(reference, ids, mask, P)
        on, _ = forward_log_probs(response_forward(policy, gradients=False), ids, mask, P)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert (on - want).abs().max() > 1e-3


def test_sft_token_losses_chunked_equal_the_whole_logits():
    """SFT's per-token NLL (postrl.lm.trainer.token_losses) through the chunked output layer: same values and
    gradients as the cross-entropy of the whole logits."""
    from postrl.lm.trainer import token_losses

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 48, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[2, 6:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :3] = -100  # the prompt: no loss
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    results = []
    for mode in ("chunked", "full"):
        model = configure_memory(tiny_qwen2().double(), MemoryConfig(log_probs=mode, chunk_tokens=4))
        nll, keep = token_losses(model, batch)
        (nll * keep).sum().backward()
        results.append((nll.detach() * keep, {n: p.grad for n, p in model.named_parameters()}))
    (chunked, grads), (full, ref_grads) = results
    logits = tiny_qwen2().double()(input_ids=ids, attention_mask=mask).logits[:, :-1]
    by_hand = F.cross_entropy(logits.flatten(0, 1), labels[:, 1:].clamp_min(0).flatten(), reduction="none")
    torch.testing.assert_close(full, by_hand.view(3, 8).float() * (labels[:, 1:] != -100), rtol=0, atol=1e-5)
    torch.testing.assert_close(chunked, full, rtol=0, atol=1e-5)
    for key, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[key], rtol=1e-4, atol=1e-6, msg=key)
