"""Checks across a source's rows (issue #41 items 4, 5 and 6): a preference pair with the same answer twice, a
file that mixes text and conversational rows, rows with pictures read for a text-only model, and chat-template
errors that name the data's file:line and the tokenizer's folder."""

from __future__ import annotations

import json
import math

import pytest
import torch

from postrl.core import dpo_loss, preference_loss
from postrl.lm.data import (
    DataError,
    load_rows,
    load_train_heldout,
    register_records,
    release_records,
    render_rows,
)
from postrl.runtime.errors import UserError

USER = {"role": "user", "content": "What color is the sky?"}
BLUE = {"role": "assistant", "content": "It is blue."}
GREEN = {"role": "assistant", "content": "It is green."}
PAIR = {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}
CHAT_PAIR = {"prompt": [USER], "chosen": [BLUE], "rejected": [GREEN]}


def _file(tmp_path, rows, name="data.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _refused(path, kind="prefs", **kw) -> str:
    with pytest.raises(DataError) as err:
        load_rows(path, kind, **kw)
    assert isinstance(err.value, UserError)
    return str(err.value)


# ---- the same answer twice ----------------------------------------------------------------------------------
def test_a_pair_with_one_answer_twice_has_a_constant_loss_and_no_gradient() -> None:
    """Why such rows are refused: h = (c − c_ref) − (r − r_ref) is 0 when the two answers are one text (same
    log-probs under the policy and under the reference), so DPO's loss is log 2 and its gradient 0; the reward
    model's soft loss is the cross-entropy of σ(0) = ½, log 2 again, also without a gradient."""
    logps = torch.tensor([-3.0, -5.5], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-2.0, -4.0], dtype=torch.float64)
    loss, _ = dpo_loss(logps, logps, ref, ref, beta=0.1)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(math.log(2), abs=1e-12)
    assert torch.equal(logps.grad, torch.zeros(2, dtype=torch.float64))
    score = torch.tensor([0.7, -1.2], dtype=torch.float64, requires_grad=True)
    rm = preference_loss(score, score, torch.ones(2, dtype=torch.float64))
    rm.backward()
    assert float(rm.detach()) == pytest.approx(math.log(2), abs=1e-12)
    assert torch.equal(score.grad, torch.zeros(2, dtype=torch.float64))


@pytest.mark.parametrize(
    "same",
    [
        {**PAIR, "rejected": " blue."},
        {"prompt": [USER], "chosen": [BLUE], "rejected": [BLUE]},
        {"chosen": "The sky is blue.", "rejected": "The sky is blue."},  # implicit prompt
        {"chosen": [USER, BLUE], "rejected": [USER, BLUE]},
        {**PAIR, "rejected": " blue.", "target": 0.5},  # a tie too: h is 0 whatever the weights
    ],
    ids=["text", "messages", "implicit-text", "implicit-messages", "tie"],
)
def test_one_pair_with_the_same_answer_is_refused_naming_its_line(tmp_path, same) -> None:
    good = CHAT_PAIR if isinstance(same["chosen"], list) else PAIR
    if "prompt" not in same:
        good = (
            {"chosen": [USER, BLUE], "rejected": [USER, GREEN]}
            if isinstance(same["chosen"], list)
            else {
                "chosen": "The sky is blue.",
                "rejected": "The sky is green.",
            }
        )
    path = _file(tmp_path, [good, good, same, good, same])
    message = _refused(path)
    assert message.startswith(f"{path}:3: fields 'chosen' and 'rejected' are the same answer (2 of 5 ")
    assert "log 2" in message


def test_the_same_answer_check_applies_to_rows_in_memory_and_held_out_files(tmp_path) -> None:
    name = register_records([PAIR, {**PAIR, "chosen": " green."}], label="data")
    try:
        assert _refused(name).startswith("data[1]: fields 'chosen' and 'rejected' are the same answer")
    finally:
        release_records(name)
    train, heldout = (
        _file(tmp_path, [PAIR] * 3),
        _file(tmp_path, [PAIR, {**PAIR, "rejected": " blue."}], "e.jsonl"),
    )
    with pytest.raises(DataError, match=f"{heldout}:2: fields 'chosen' and 'rejected' are the same answer"):
        load_train_heldout(str(train), "prefs", str(heldout))


def test_blank_answers_are_left_to_the_empty_row_policy(tmp_path) -> None:
    path = _file(tmp_path, [PAIR, {**PAIR, "chosen": " ", "rejected": " "}, PAIR])
    assert "field 'chosen': empty or whitespace-only" in _refused(path)
    assert len(load_rows(path, "prefs", empty="skip")) == 2


def test_answers_are_compared_as_they_are_trained() -> None:
    # a conversational answer trains on its last message's content: [GREEN, BLUE] and [BLUE] are one text
    same = register_records([CHAT_PAIR, {**CHAT_PAIR, "rejected": [GREEN, BLUE]}])
    distinct = register_records([PAIR, {**PAIR, "chosen": " grey."}, {**PAIR, "rejected": " blue. "}])
    try:
        with pytest.raises(DataError, match=r"data\[1\]: fields 'chosen' and 'rejected' are the same answer"):
            load_rows(same, "prefs")
        assert [r["rejected"] for r in load_rows(distinct, "prefs")] == [" green.", " green.", " blue. "]
    finally:
        release_records(same)
        release_records(distinct)


# ---- one format per source --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "first", "other", "field"),
    [
        ("prefs", PAIR, CHAT_PAIR, "prompt"),
        ("prefs", CHAT_PAIR, PAIR, "prompt"),
        ("prefs", {"chosen": [USER, BLUE], "rejected": [USER, GREEN]}, PAIR, "prompt"),
        ("sft", {"prompt": "1+1=", "completion": "2"}, {"messages": [USER, BLUE]}, "messages"),
        ("prompts", {"prompt": "1+1="}, {"prompt": [USER]}, "prompt"),
    ],
    ids=["prefs-text-then-chat", "prefs-chat-then-text", "prefs-implicit", "sft", "prompts"],
)
def test_a_file_mixing_text_and_conversational_rows_is_refused(tmp_path, kind, first, other, field) -> None:
    path = _file(tmp_path, [first, first, other, first])
    message = _refused(path, kind)
    assert message.startswith(f"{path}:3: field '{field}': ")
    assert f"the first row ({path}:1)" in message


@pytest.mark.parametrize("field", ["chosen", "rejected"])
def test_a_preference_row_mixing_a_text_prompt_and_message_answers_is_refused(tmp_path, field) -> None:
    path = _file(tmp_path, [PAIR, {**PAIR, field: [BLUE if field == "chosen" else GREEN]}])
    assert _refused(path).startswith(f"{path}:2: field '{field}': conversational (a list of messages), but ")
    path = _file(tmp_path, [CHAT_PAIR, {**CHAT_PAIR, field: "It is grey."}], "chat.jsonl")
    assert _refused(path).startswith(f"{path}:2: field '{field}': text, but 'prompt' is conversational")


# ---- pictures for a text-only model -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "row", "field"),
    [
        ("sft", {"prompt": "How many dots?", "completion": "3", "images": ["dots.png"]}, "images"),
        ("prompts", {"prompt": "How many dots?", "answer": "3", "image": "dots.png"}, "image"),
        ("prefs", {**PAIR, "images": [{"path": "dots.png"}]}, "images"),
    ],
)
def test_rows_with_pictures_are_refused_for_a_text_model(tmp_path, kind, row, field) -> None:
    plain = {k: v for k, v in row.items() if k not in ("images", "image")}
    path = _file(tmp_path, [plain, row])
    message = _refused(path, kind)
    assert message.startswith(f"{path}:2: field '{field}': the row has pictures") and "text-only" in message
    assert len(load_rows(_file(tmp_path, [plain, {**row, field: None}], "none.jsonl"), kind)) == 2


# ---- chat templates: the data's file:line and the tokenizer's folder ------------------------------------
def test_a_chat_template_that_refuses_a_row_names_the_file_line_and_the_tokenizer(
    tmp_path, tiny_tokenizer, tiny_tokenizer_dir
) -> None:
    tool = {"prompt": [{"role": "tool", "content": "x"}], "completion": "y"}
    path = _file(tmp_path, [{"prompt": [USER], "completion": "blue"}, tool])
    message = str(pytest.raises(DataError, render_rows, load_rows(path, "sft"), "sft", tiny_tokenizer).value)
    assert message.startswith(f"{path}:2: field 'prompt': the chat template of the tokenizer at ")
    assert str(tiny_tokenizer_dir) in message and "unknown chat role: tool" in message
    in_memory = str(pytest.raises(DataError, render_rows, [tool], "sft", tiny_tokenizer).value)
    assert in_memory.startswith("row 0: field 'prompt': the chat template of the tokenizer at ")


def test_conversational_rows_without_a_chat_template_name_the_file_line_and_the_tokenizer(
    tmp_path, tiny_tokenizer_dir
) -> None:
    from postrl.lm.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tiny_tokenizer_dir)
    tokenizer.chat_template = None
    path = _file(tmp_path, [{"messages": [USER, BLUE]}, {"messages": [USER, GREEN]}])
    message = str(pytest.raises(DataError, render_rows, load_rows(path, "sft"), "sft", tokenizer).value)
    assert message.startswith(
        f"{path}:1: field 'messages': conversational data needs a tokenizer with a chat"
    )
    assert f"the tokenizer at {tiny_tokenizer_dir} has none" in message
