"""The teacher-forced forwards (`postrl.lm.rollout.forwards`: full, shared prefix, fused) and the prefill of
`generate`, which run each distinct prompt once, change no logit, gradient, token or log-probability beyond
float32 rounding; `response_forward` picks the one a model and a use allow."""

from __future__ import annotations

import pytest
import torch

from postrl.lm.models import position_ids_from_mask
from postrl.lm.rollout import generate, left_pad, score
from postrl.lm.rollout.forwards import (
    FullForward,
    FusedForward,
    SharedPrefixForward,
    distinct_prompts,
    response_forward,
)
from tests.lm.test_fast_gpt2 import tiny_gpt2
from tests.lm.test_rollout import tiny_llama

PAD, EOS = 0, 1
TOL = 1e-5


def grouped_batch(group: int = 4, T: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """3 distinct left-padded prompts (7, 3, 5 tokens) × ``group`` rows each, then T response tokens of which
    two rows end early (mask 0 after): input_ids, attention_mask [B, P + T] and P."""
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(2, 48, (n,), generator=g).tolist() for n in (7, 3, 5)]
    ids, mask = left_pad([s for s in seqs for _ in range(group)], PAD)
    response = torch.randint(2, 48, (ids.shape[0], T), generator=g)
    response_mask = torch.ones_like(response)
    response_mask[1, 3:], response_mask[5, 1:] = 0, 0
    return torch.cat((ids, response), 1), torch.cat((mask, response_mask), 1), ids.shape[1]


def test_distinct_prompts_by_hand():
    ids = torch.tensor([[0, 5, 6], [7, 5, 6], [0, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1]])
    distinct, distinct_mask, inverse = distinct_prompts(ids, mask)
    assert distinct.shape == (2, 3) and torch.equal(distinct[inverse], ids)
    assert torch.equal(distinct_mask[inverse], mask)


MODELS = {"gpt2": lambda: tiny_gpt2(), "llama": lambda: tiny_llama(vocab=48)}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_shared_prefix_passes_add_their_gradients_to_grad_separately(name):
    """The prompt pass and the response pass reach ``.grad`` one after the other (two accumulations per weight
    they share), not summed first, which held the response pass's share of every weight until the prompt
    pass's backward reached it (a second set of gradients on top of an existing ``.grad``); the accumulated
    gradient is the same as a full forward's, onto an existing one too."""
    model = MODELS[name]()
    input_ids, attention_mask, P = grouped_batch()
    forward = response_forward(model, use_fast=False)  # a trainer's: gradients=True
    assert isinstance(forward, SharedPrefixForward) and forward.split_backward
    assert not response_forward(model, use_fast=False, gradients=False).split_backward
    weights = torch.randn(input_ids.shape[0], input_ids.shape[1] - P, model.config.vocab_size)
    weights *= attention_mask[:, P:, None]
    calls: dict[str, int] = {}
    hooks = [
        p.register_post_accumulate_grad_hook(lambda _, n=n: calls.__setitem__(n, calls.get(n, 0) + 1))
        for n, p in model.named_parameters()
    ]
    (forward.logits(input_ids, attention_mask, P) * weights).sum().backward()
    for hook in hooks:
        hook.remove()
    shared = [n for n in calls if "layers.0.self_attn.q_proj" in n or "h.0.attn.c_attn" in n]
    assert shared and all(calls[n] == 2 for n in shared), calls
    first = [p.grad.clone() for p in model.parameters()]
    (forward.logits(input_ids, attention_mask, P) * weights).sum().backward()  # onto the existing .grad
    for g, g1 in zip((p.grad for p in model.parameters()), first, strict=True):
        assert (g - 2 * g1).abs().max() <= 1e-5 * max(1.0, g1.abs().max())
    with torch.no_grad():  # no graph: nothing to cut
        assert forward.logits(input_ids, attention_mask, P).grad_fn is None


def test_a_second_backward_adds_the_embedding_rows_into_grad_in_place():
    """A trainer's shared-prefix forward of a plain-embedding model feeds ``inputs_embeds`` whose backward adds
    the rows into an existing ``.grad`` (no new [V, d] tensor in the second backward of a step); the gradients
    equal the full forward's, the padding row's too."""
    from torch.utils._python_dispatch import TorchDispatchMode

    model = tiny_llama(vocab=48)
    V, d = model.get_input_embeddings().weight.shape

    class NewTables(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.made = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            skip = func._schema.is_mutable or func.__name__ in (
                "t.default",
                "detach.default",
                "alias.default",
            )
            if isinstance(out, torch.Tensor) and out.shape == (V, d) and not skip:
                self.made.append(func.__name__)
            return out

    input_ids, attention_mask, P = grouped_batch()
    input_ids[2, P + 1] = model.get_input_embeddings().padding_idx  # a padding id among the inputs
    weights = torch.randn(input_ids.shape[0], input_ids.shape[1] - P, V) * attention_mask[:, P:, None]
    positions = position_ids_from_mask(attention_mask)
    full = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False)
    want = torch.autograd.grad((full.logits[:, P - 1 : -1] * weights).sum(), list(model.parameters()))
    forward = response_forward(model, use_fast=False)
    (forward.logits(input_ids, attention_mask, P) * weights).sum().backward()
    second = NewTables()
    loss = (forward.logits(input_ids, attention_mask, P) * weights).sum()
    with second:
        loss.backward()
    embedding = model.get_input_embeddings().weight
    # only the tied output layer's product may be new (plain logits here, not the chunked layer)
    assert "embedding_dense_backward.default" not in second.made, second.made
    hook = model.get_input_embeddings().register_forward_hook(lambda m, i, o: o)  # e.g. NEFTune's noise
    hooked = NewTables()
    loss = (forward.logits(input_ids, attention_mask, P) * weights).sum()
    with hooked:
        loss.backward()
    hook.remove()
    assert "embedding_dense_backward.default" in hooked.made  # the module's own forward ran, its hook with it
    model.zero_grad(set_to_none=True)  # a new step: the first backward makes .grad, the second adds into it
    (forward.logits(input_ids, attention_mask, P) * weights).sum().backward()
    (forward.logits(input_ids, attention_mask, P) * weights).sum().backward()
    assert embedding.grad is not None
    for p, w in zip(model.parameters(), want, strict=True):  # the padding id's row as F.embedding leaves it
        assert (p.grad - 2 * w).abs().max() <= 1e-4 * max(1.0, w.abs().max())


@pytest.mark.parametrize("use_fast", [None, False])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_response_logits_and_their_gradients_equal_the_full_forward(name, use_fast):
    """Through the fast decoder (None) and through the model's own forward and cache (False)."""
    expected = FusedForward if use_fast is None else SharedPrefixForward
    model = MODELS[name]()  # eval mode: GPT-2's dropout off, gradients still flow
    input_ids, attention_mask, P = grouped_batch()
    weights = torch.randn(input_ids.shape[0], input_ids.shape[1] - P, model.config.vocab_size)
    weights *= attention_mask[:, P:, None]

    def run(fn):
        model.zero_grad(set_to_none=True)
        logits = fn()
        (logits * weights).sum().backward()
        return logits.detach(), [p.grad.clone() for p in model.parameters()]

    def full():
        positions = position_ids_from_mask(attention_mask)
        out = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False
        )
        return out.logits[:, P - 1 : -1]

    ref, ref_grads = run(full)
    forward = response_forward(model, use_fast)
    assert isinstance(forward, expected)
    shared, grads = run(lambda: forward.logits(input_ids, attention_mask, P))
    assert ((shared - ref) * attention_mask[:, P:, None]).abs().max() < TOL
    for g, r in zip(grads, ref_grads, strict=True):
        assert (g - r).abs().max() <= 1e-4 * max(1.0, r.abs().max())


def test_score_with_shared_prompts_equals_row_by_row_score():
    model = tiny_gpt2()
    input_ids, attention_mask, P = grouped_batch()
    with torch.no_grad():
        batched = score(model, input_ids, attention_mask, P, temperature=0.7)
        alone = [
            score(model, input_ids[r : r + 1], attention_mask[r : r + 1], P, temperature=0.7)
            for r in range(12)
        ]
    assert (batched - torch.cat(alone)).abs().max() < TOL


@pytest.mark.parametrize("use_fast", [None, False])
def test_generate_prefills_a_shared_prompt_once_with_the_same_tokens_and_log_probs(use_fast):
    model = tiny_gpt2()
    input_ids, attention_mask, P = grouped_batch()
    ids, mask = input_ids[:, :P], attention_mask[:, :P]
    kwargs = {"max_new_tokens": 8, "eos_token_id": EOS, "pad_token_id": PAD, "use_fast": use_fast}
    out = generate(model, ids, mask, generator=torch.Generator().manual_seed(3), **kwargs)
    with torch.no_grad():
        ref = score(model, out.input_ids, out.attention_mask, out.prompt_len, chunk_size=1)  # no sharing
    assert (out.log_probs - ref).abs().max() < TOL
    greedy = generate(model, ids, mask, greedy=True, **kwargs)
    for row in range(0, 12, 4):  # each group's greedy rows equal its prompt run alone
        real = mask[row].bool()
        alone = generate(model, ids[row, real][None], mask[row, real][None], greedy=True, **kwargs)
        T = alone.response_ids.shape[1]
        assert torch.equal(greedy.response_ids[row : row + 4, :T], alone.response_ids.expand(4, T))


def test_gradient_checkpointing_keeps_the_hugging_face_forward():
    """The fast decoders do not checkpoint: a model asked to must take its own forward (and drop no cache)."""
    model = tiny_llama(vocab=48)
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    model.train()
    input_ids, attention_mask, P = grouped_batch()
    forward = response_forward(model)
    assert isinstance(forward, FullForward)
    forward.logits(input_ids, attention_mask, P).sum().backward()
    scoring = response_forward(model, gradients=False)  # no backward, nothing to checkpoint: fast is fine
    assert isinstance(scoring, FusedForward)
    with torch.no_grad():
        assert scoring.logits(input_ids, attention_mask, P).shape[1] == input_ids.shape[1] - P


class _Scaled(torch.nn.Module):
    """An adapter-like wrapper around a projection: the base layer's output times a trainable scale."""

    def __init__(self, base: torch.nn.Module) -> None:
        super().__init__()
        self.base, self.scale = base, torch.nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        return self.base(x) * self.scale


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_wrapped_projection_takes_the_hugging_face_forward(name):
    """The fast decoders read the stock projections' weights only: a wrapped one (a LoRA adapter, say) must
    send every forward to the model's own, and its parameters must get gradients."""
    from postrl.lm.rollout.decoders import fast_decoder

    model = MODELS[name]()
    mlp = model.transformer.h[0].mlp if name == "gpt2" else model.model.layers[0].mlp
    attr = "c_fc" if name == "gpt2" else "up_proj"
    setattr(mlp, attr, _Scaled(getattr(mlp, attr)))
    assert fast_decoder(model) is None
    input_ids, attention_mask, P = grouped_batch()
    forward = response_forward(model)
    assert isinstance(forward, SharedPrefixForward)
    logits = forward.logits(input_ids, attention_mask, P)
    positions = position_ids_from_mask(attention_mask)
    full = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False)
    real = attention_mask[:, P:, None]
    assert ((logits - full.logits[:, P - 1 : -1]) * real).abs().max() < TOL
    (logits * real).sum().backward()
    assert getattr(mlp, attr).scale.grad is not None
