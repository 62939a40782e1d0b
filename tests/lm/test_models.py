"""Models: positions and last-token indices on padded batches, scalar heads (init, scoring, save/load),
the shared-trunk policy, dropout, and loading a saved model through the user's path."""

from __future__ import annotations

import copy
import inspect
import logging
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from postrl.lm.data import join_prompt_response
from postrl.lm.models import (
    HEAD_WEIGHTS,
    PolicyWithValueHead,
    ScalarHeadModel,
    TinyLMConfig,
    assert_dropout_off,
    build_tiny_lm,
    check_context,
    context_length,
    fit_context,
    gather_last,
    last_token_index,
    load_causal_lm,
    new_scalar_head,
    position_ids_from_mask,
    set_dropout_off,
)
from postrl.runtime import notices
from postrl.runtime.errors import UserError

# two prompts left-padded to 3, responses right-padded to 3: [pad p p | r r pad], [p p p | r pad pad]
MASK = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]])


def test_position_ids_from_mask_left_padding() -> None:
    expected = torch.tensor([[0, 0, 1, 2, 3, 3], [0, 1, 2, 3, 3, 3]])
    assert torch.equal(position_ids_from_mask(MASK), expected)
    assert torch.equal(position_ids_from_mask(torch.tensor([[0, 0, 1, 1]])), torch.tensor([[0, 0, 0, 1]]))


def test_last_token_index_and_gather_last() -> None:
    assert last_token_index(MASK).tolist() == [4, 3]
    values = torch.arange(12.0).view(2, 6)
    assert gather_last(values, MASK).tolist() == [4.0, 9.0]
    assert last_token_index(torch.zeros(1, 4, dtype=torch.long)).tolist() == [0]


def test_scalar_head_init_statistics() -> None:
    d = 4095
    head = new_scalar_head(d, seed=1)
    assert head.weight.std().item() == pytest.approx(1 / math.sqrt(d + 1), rel=0.05)
    assert head.bias.item() == 0.0 and head.weight.dtype == torch.float32
    assert torch.equal(new_scalar_head(d, seed=1).weight, head.weight)


def test_build_tiny_lm_default_architecture() -> None:
    state = torch.random.get_rng_state()
    model = build_tiny_lm(512, seed=3)
    assert torch.equal(state, torch.random.get_rng_state())  # global RNG untouched
    c = model.config
    assert isinstance(model, LlamaForCausalLM)
    assert (c.hidden_size, c.num_attention_heads, c.intermediate_size, c.num_hidden_layers) == (
        128,
        4,
        512,
        2,
    )
    assert c.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert (c.pad_token_id, c.eos_token_id, c.bos_token_id) == (0, 1, 2)
    assert_dropout_off(model)
    again = build_tiny_lm(512, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True))


def test_user_path_loads_saved_model_and_tokenizer(tiny_lm_dir, tiny_tokenizer) -> None:
    assert inspect.signature(load_causal_lm).parameters["trust_remote_code"].default is False
    model = load_causal_lm(tiny_lm_dir)
    assert isinstance(model, LlamaForCausalLM) and next(model.parameters()).dtype == torch.float32
    assert sorted(p.name for p in tiny_lm_dir.iterdir() if p.suffix in (".bin", ".pt", ".safetensors")) == [
        "model.safetensors"
    ]
    half = load_causal_lm(str(tiny_lm_dir), dtype="bfloat16")
    assert next(half.parameters()).dtype == torch.bfloat16
    batch = tiny_tokenizer(["What is 1+1?", "Review: the tea"], padding=True, return_tensors="pt")
    logits = model(**batch).logits
    assert logits.shape == (2, batch["input_ids"].shape[1], len(tiny_tokenizer))


def test_missing_model_directory_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(UserError, match=r"model '.*missing': no such folder"):
        load_causal_lm(tmp_path / "missing")
    with pytest.raises(UserError, match=r"dtype: unknown dtype 'float8'; valid: float32, bfloat16, float16"):
        load_causal_lm(tmp_path, dtype="float8")
    with pytest.raises(UserError, match=r"ref_model '.*': the folder has no config.json"):
        load_causal_lm(tmp_path, what="ref_model")


def test_context_length_from_any_config(tiny_lm, tiny_lm_dir) -> None:
    gpt2 = GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=32)
    assert context_length(tiny_lm) == 128 and context_length(tiny_lm.config) == 128
    assert context_length(tiny_lm_dir) == 128 and context_length(str(tiny_lm_dir)) == 128
    assert context_length(gpt2) == 32 and context_length(ScalarHeadModel.from_causal_lm(tiny_lm)) == 128
    assert (
        context_length({"seq_length": 2048}) == 2048 and context_length({"text_config": {"n_ctx": 64}}) == 64
    )
    assert context_length({"hidden_size": 8}) is None


def test_check_context_names_the_keys_the_limit_and_its_field(tiny_lm, tiny_lm_dir) -> None:
    check_context(tiny_lm, 128, "train.max_length (128)")
    what = "sampling.max_new_tokens (64) + longest prompt (80 tokens)"
    with pytest.raises(UserError) as info:
        check_context(tiny_lm, 144, what)
    assert str(info.value) == (
        f"{what} = 144 exceeds the model's context (128 positions, max_position_embeddings in "
        f"{tiny_lm_dir}/config.json)"
    )
    with pytest.raises(UserError, match=r"\(32 positions, n_positions in the model's config\)"):
        check_context(GPT2Config(n_positions=32), 33, "train.max_length (33)")
    check_context({"hidden_size": 8}, 10**6, "anything")  # unknown context: not checked


def test_fit_context_clips_a_ceiling_to_the_context_and_says_so_once(tiny_lm, tiny_lm_dir, caplog) -> None:
    """#41 item 14: a length key is a ceiling (TRL's max_length): above the 128 positions it becomes 128, or
    128 less the positions reserved after it; only a reservation that leaves no position is an error."""
    where = f"(128 positions, max_position_embeddings in {tiny_lm_dir}/config.json)"
    with caplog.at_level(logging.WARNING, logger="postrl.lm.models"):
        assert fit_context(tiny_lm, 64, "train.max_length") == 64  # fits: kept, nothing said
        assert fit_context(tiny_lm, 128, "train.max_length") == 128
        assert caplog.records == []
        assert fit_context(tiny_lm, 1024, "train.max_length") == 128
        assert fit_context(tiny_lm, 512, "max_prompt_length", 100, "sampling.max_new_tokens (100)") == 28
        assert fit_context(tiny_lm, 20, "max_prompt_length", 100, "sampling.max_new_tokens (100)") == 20
        assert caplog.records == []  # said once the input is accepted (open_run), not beside a refusal
        notices.flush()
    assert [r.getMessage() for r in caplog.records] == [
        f"train.max_length (1024) is clipped to 128, the model's context {where}",
        f"max_prompt_length (512) is clipped to 28, the model's context {where} less sampling.max_new_tokens (100)",
    ]
    with pytest.raises(UserError) as info:
        fit_context(tiny_lm, 512, "max_prompt_length", 128, "sampling.max_new_tokens (128)")
    assert str(info.value) == (
        f"sampling.max_new_tokens (128) leaves no position for max_prompt_length in the model's context {where}"
    )
    assert fit_context({"hidden_size": 8}, 10**6, "train.max_length") == 10**6  # unknown context: kept


def _padded_pair(tiny_tokenizer) -> dict[str, torch.Tensor]:
    prompts = [tiny_tokenizer(t)["input_ids"] for t in ["Review: the tea", "Review: the soup at the cafe"]]
    responses = [tiny_tokenizer(t)["input_ids"] + [1] for t in [" was warm and very fresh .", " was ok ."]]
    return join_prompt_response(prompts, responses, pad_id=tiny_tokenizer.pad_token_id)


def test_score_reads_last_real_token_and_ignores_padding(tiny_lm, tiny_tokenizer) -> None:
    model = ScalarHeadModel.from_causal_lm(tiny_lm, seed=0).eval()
    batch = _padded_pair(tiny_tokenizer)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        values = model(ids, mask)
        scores = model.score(ids, mask)
        for b in range(2):
            last = int(last_token_index(mask)[b])
            assert mask[b, last] == 1 and (last == ids.shape[1] - 1 or mask[b, last + 1 :].sum() == 0)
            assert scores[b] == values[b, last]
            alone = ids[b, mask[b].bool()].unsqueeze(0)  # the same sequence with no padding at all
            assert model.score(alone, torch.ones_like(alone)).item() == pytest.approx(
                scores[b].item(), abs=1e-5
            )


def test_scalar_head_model_save_and_load(tiny_lm, tiny_lm_dir, tiny_tokenizer, tmp_path) -> None:
    model = ScalarHeadModel.from_causal_lm(copy.deepcopy(tiny_lm), seed=4).eval()
    assert model.backbone.embed_tokens.weight is not tiny_lm.model.embed_tokens.weight
    batch = _padded_pair(tiny_tokenizer)
    model.save_pretrained(tmp_path / "rm")
    names = {p.name for p in (tmp_path / "rm").iterdir()}
    assert {"model.safetensors", "config.json"} <= names  # a sequence classifier: its head is score.weight
    assert HEAD_WEIGHTS not in names  # a bias of 0 (a reward model's) needs no file of its own
    assert not any(n.endswith((".bin", ".pt")) for n in names)
    loaded = ScalarHeadModel.from_pretrained(tmp_path / "rm").eval()
    with torch.no_grad():
        assert torch.allclose(loaded.score(**_ids(batch)), model.score(**_ids(batch)))
    with pytest.raises(UserError, match="not a reward model: it has neither"):
        ScalarHeadModel.from_pretrained(tiny_lm_dir)
    fresh = ScalarHeadModel.from_pretrained(tiny_lm_dir, new_head=True)  # SFT model → reward model
    assert torch.equal(fresh.backbone.embed_tokens.weight, tiny_lm.model.embed_tokens.weight)


def _ids(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


def test_policy_with_value_head(tiny_lm, tiny_tokenizer, tmp_path) -> None:
    policy = PolicyWithValueHead(tiny_lm, seed=2).eval()
    batch = _padded_pair(tiny_tokenizer)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    logits, values = policy(ids, mask)
    reference = tiny_lm(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    assert torch.allclose(logits, reference) and values.shape == ids.shape
    critic = ScalarHeadModel(tiny_lm.model, head=policy.head)  # the same trunk and head
    assert torch.allclose(critic(ids, mask), values, atol=1e-6)
    last_logits, _ = policy(ids, mask, logits_to_keep=1)
    assert torch.allclose(last_logits[:, 0], logits[:, -1], atol=1e-6)
    (logits.sum() + values.sum()).backward()
    assert policy.head.weight.grad is not None and tiny_lm.model.embed_tokens.weight.grad is not None
    policy.save_pretrained(tmp_path / "policy")
    assert isinstance(AutoModelForCausalLM.from_pretrained(str(tmp_path / "policy")), LlamaForCausalLM)
    loaded = PolicyWithValueHead.from_pretrained(tmp_path / "policy").eval()
    with torch.no_grad():
        assert torch.allclose(loaded(ids, mask)[1], values, atol=1e-6)


def test_heads_work_on_another_architecture(tmp_path) -> None:
    config = GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=32, resid_pdrop=0.1)
    gpt2 = GPT2LMHeadModel(config)
    with pytest.raises(ValueError, match="dropout is on"):
        assert_dropout_off(gpt2)
    set_dropout_off(gpt2)
    assert_dropout_off(gpt2)
    assert gpt2.config.resid_pdrop == 0.0 and gpt2.config.attn_pdrop == 0.0
    gpt2.save_pretrained(str(tmp_path))
    model = ScalarHeadModel.from_pretrained(tmp_path, new_head=True)
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert model.score(ids, mask).shape == (2,)


def test_set_dropout_off_on_llama_attention_dropout() -> None:
    config = LlamaConfig(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        attention_dropout=0.2,
    )
    model = LlamaForCausalLM(config)
    with pytest.raises(ValueError, match="attention_dropout=0.2"):
        assert_dropout_off(model)
    assert_dropout_off(set_dropout_off(model))
    assert model.config.attention_dropout == 0.0


def test_tiny_config_is_respected() -> None:
    model = build_tiny_lm(300, TinyLMConfig(n_layers=3, hidden_size=64, n_heads=2, intermediate_size=96))
    assert len(model.model.layers) == 3 and model.config.head_dim == 32


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=50, deadline=None)
@given(
    layout=st.lists(
        st.tuples(st.integers(0, 4), st.integers(1, 5), st.integers(0, 4)), min_size=1, max_size=4
    )
)
def test_positions_and_last_index_on_any_left_and_right_padding(layout: list[tuple[int, int, int]]) -> None:
    width = max(left + real + right for left, real, right in layout)
    rows = [[0] * left + [1] * real + [0] * (width - left - real) for left, real, _ in layout]
    mask = torch.tensor(rows)
    positions = position_ids_from_mask(mask)
    for b, (left, real, _) in enumerate(layout):
        assert positions[b, left : left + real].tolist() == list(range(real))
        assert int(last_token_index(mask)[b]) == left + real - 1
