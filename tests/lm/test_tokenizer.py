"""The postrl tokenizer: round trip through AutoTokenizer, special ids, digits, left padding, chat template,
determinism."""

from __future__ import annotations

import json
import logging

import pytest
from transformers import AutoTokenizer

from postrl.lm.tokenizer import (
    CHAT_TEMPLATE,
    MIN_VOCAB_SIZE,
    SPECIAL_TOKENS,
    build_tokenizer,
    check_vocab_size,
    load_tokenizer,
    train_bpe,
    wrap_tokenizer,
)
from postrl.runtime.errors import UserError

TEXTS = [
    "What is 47+38? 85",
    "Review: the pasta at the cafe was very fresh and tasty .",
    "the old fox ran past the river .",
    "héllo wörld — 1,234 ünïcode ✓",
    "  leading spaces and\ttabs\nnewlines  ",
]


def test_round_trip_through_auto_tokenizer(tiny_tokenizer_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    for text in TEXTS:
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids) == text
        assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]  # no special token is added
    assert len(tokenizer) == 400


def test_special_tokens_and_padding_side(tiny_tokenizer_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id) == (0, 1, 2)
    assert tokenizer.convert_tokens_to_ids(["<|system|>", "<|user|>", "<|assistant|>"]) == [3, 4, 5]
    assert tokenizer.padding_side == "left"
    batch = tokenizer(["1+1=2", "Review of the pasta at the cafe:"], padding=True)  # the first is shorter
    short = batch["input_ids"][0]
    assert short[0] == 0 and batch["attention_mask"][0][0] == 0 and batch["attention_mask"][0][-1] == 1
    ids = tokenizer(" 9")["input_ids"] + [tokenizer.eos_token_id]
    assert tokenizer.decode(ids, skip_special_tokens=True) == " 9"


def test_digits_are_single_tokens(tiny_tokenizer) -> None:
    tokens = tiny_tokenizer.convert_ids_to_tokens(tiny_tokenizer("What is 47+38? 1085")["input_ids"])
    digits = [t.lstrip("Ġ") for t in tokens if any(c.isdigit() for c in t)]
    assert digits == list("47381085")


def test_chat_template(tiny_tokenizer_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 4+5?"},
        {"role": "assistant", "content": " 9"},
    ]
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    assert full == "<|system|>Be brief.<|user|>What is 4+5?<|assistant|> 9<eos>"
    prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|system|>Be brief.<|user|>What is 4+5?<|assistant|>"
    # rendered prompt + completion + EOS tokenises exactly as the rendered conversation
    joined = tokenizer(prompt)["input_ids"] + tokenizer(" 9")["input_ids"] + [tokenizer.eos_token_id]
    assert joined == tokenizer(full)["input_ids"]
    with pytest.raises(Exception, match="unknown chat role"):
        tokenizer.apply_chat_template([{"role": "robot", "content": "hi"}], tokenize=False)


def test_training_is_deterministic(tiny_corpus) -> None:
    first = json.loads(train_bpe(tiny_corpus, vocab_size=300).to_str())
    second = json.loads(train_bpe(list(tiny_corpus), vocab_size=300).to_str())
    assert first["model"]["vocab"] == second["model"]["vocab"]
    assert first["model"]["merges"] == second["model"]["merges"]
    assert [first["model"]["vocab"][t] for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4, 5]


def test_vocab_too_small_is_refused_with_the_minimum() -> None:
    assert MIN_VOCAB_SIZE == 256 + len(SPECIAL_TOKENS) + 1
    with pytest.raises(UserError, match=rf"vocab_size=200 is too small: .* at least {MIN_VOCAB_SIZE} "):
        build_tokenizer(["a b c"], vocab_size=200)
    with pytest.raises(UserError, match="vocab_size=262"):
        check_vocab_size(MIN_VOCAB_SIZE - 1)
    assert len(build_tokenizer(["ab ab ab cd"], vocab_size=MIN_VOCAB_SIZE)) <= MIN_VOCAB_SIZE


def test_load_tokenizer_refuses_a_model_folder_without_tokenizer(tiny_lm_dir, tmp_path) -> None:
    model_only = tmp_path / "model_notok"
    model_only.mkdir()
    for name in ("config.json", "model.safetensors"):
        (model_only / name).write_bytes((tiny_lm_dir / name).read_bytes())
    with pytest.raises(UserError) as info:
        load_tokenizer(model_only)
    message = str(info.value)
    assert str(model_only) in message and "has no tokenizer" in message and "`tokenizer` key" in message
    with pytest.raises(UserError, match=r"model '.*nowhere': no such folder"):
        load_tokenizer(tmp_path / "nowhere", what="model")
    with pytest.raises(UserError, match=r"a file, not a tokenizer folder"):
        load_tokenizer(model_only / "config.json")


def test_load_tokenizer_refuses_a_tokenizer_without_eos(tmp_path, tiny_corpus) -> None:
    tokenizer = wrap_tokenizer(train_bpe(tiny_corpus[:200], vocab_size=300))
    tokenizer.eos_token = None
    tokenizer.save_pretrained(str(tmp_path))
    with pytest.raises(UserError, match=r"tokenizer '.*' has no eos_token; postrl needs one"):
        load_tokenizer(tmp_path)


def test_load_tokenizer_sets_missing_pad_and_logs(tmp_path, tiny_corpus, caplog) -> None:
    tokenizer = wrap_tokenizer(train_bpe(tiny_corpus[:200], vocab_size=300))
    tokenizer.pad_token = None
    tokenizer.save_pretrained(str(tmp_path))
    with caplog.at_level(logging.WARNING):
        loaded = load_tokenizer(tmp_path)
    assert loaded.pad_token_id == loaded.eos_token_id and "no pad token" in caplog.text
    assert loaded.chat_template == CHAT_TEMPLATE


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=40))
def test_any_text_round_trips(tiny_tokenizer, text: str) -> None:
    for special in SPECIAL_TOKENS:
        text = text.replace(special, "")
    ids = tiny_tokenizer(text)["input_ids"]
    assert tiny_tokenizer.decode(ids) == text
