"""TRL's dataset formats (https://huggingface.co/docs/trl/dataset_formats), with the example rows of that page:
standard and conversational; language modelling, prompt-only, prompt-completion and preference (explicit and
implicit prompt); ``messages`` with a system turn; rows in memory (a list of dicts, a ``datasets.Dataset``) with
errors naming the row index and the field. The implicit-prompt splits are the outputs of TRL 1.16's
``trl.data_utils.extract_prompt`` on the same rows (run once in the peer venv and written here)."""

from __future__ import annotations

import json

import pytest

from postrl.lm.data import (
    DataError,
    explicit_prompt,
    load_rows,
    register_records,
    release_records,
    render_rows,
    tokenize_preferences,
    tokenize_sft,
)

SKY = "What color is the sky?"
USER = {"role": "user", "content": SKY}
BLUE = {"role": "assistant", "content": "It is blue."}
GREEN = {"role": "assistant", "content": "It is green."}

# (kind, TRL's example row) for every format the page shows that a postrl stage reads
TRL_ROWS = [
    ("sft", {"text": "The sky is blue."}),
    ("sft", {"messages": [USER, BLUE]}),
    ("sft", {"prompt": "The sky is", "completion": " blue."}),
    ("sft", {"prompt": [USER], "completion": [BLUE]}),
    ("prompts", {"prompt": "The sky is"}),
    ("prompts", {"prompt": [USER]}),
    ("prefs", {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}),
    ("prefs", {"prompt": [USER], "chosen": [BLUE], "rejected": [GREEN]}),
    ("prefs", {"chosen": "The sky is blue.", "rejected": "The sky is green."}),
    ("prefs", {"chosen": [USER, BLUE], "rejected": [USER, GREEN]}),
]


@pytest.mark.parametrize(("kind", "row"), TRL_ROWS)
def test_every_trl_example_row_loads_from_a_file_and_from_memory(tmp_path, kind, row) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    name = register_records([row])
    try:
        assert load_rows(path, kind) == load_rows(name, kind)
    finally:
        release_records(name)
    loaded = load_rows(path, kind)[0]
    if kind == "prefs":
        assert {"prompt", "chosen", "rejected"} <= set(loaded)


def test_implicit_prompt_is_trls_extract_prompt() -> None:
    # trl.data_utils.extract_prompt (TRL 1.16) on the documentation's two implicit-prompt rows
    standard = {"chosen": "The sky is blue.", "rejected": "The sky is green."}
    assert explicit_prompt(standard, "row 0") == {
        "prompt": "The sky is",
        "chosen": " blue.",
        "rejected": " green.",
    }
    conversational = {"chosen": [USER, BLUE], "rejected": [USER, GREEN]}
    assert explicit_prompt(conversational, "row 0") == {
        "prompt": [USER],
        "chosen": [BLUE],
        "rejected": [GREEN],
    }
    system = {"role": "system", "content": "Be brief."}
    multi = {"chosen": [system, USER, BLUE], "rejected": [system, USER, GREEN], "target": 0.5}
    assert explicit_prompt(multi, "row 0") == {
        "prompt": [system, USER],
        "chosen": [BLUE],
        "rejected": [GREEN],
        "target": 0.5,
    }
    explicit = {"prompt": "x", "chosen": "a", "rejected": "b"}
    assert explicit_prompt(explicit, "row 0") is explicit


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            {"chosen": "blue", "rejected": "green"},
            "data[1]: no 'prompt' field, and 'chosen' and 'rejected' share no",
        ),
        (
            {"chosen": "The sky", "rejected": "The sky is"},
            "data[1]: no 'prompt' field, and 'chosen' is all shared",
        ),
        (
            {"chosen": [USER, BLUE], "rejected": "It is green."},
            "data[1]: fields 'chosen' and 'rejected': one is text",
        ),
        ({"chosen": [USER, BLUE]}, "data[1]: missing field 'prompt'"),
        (
            {"prompt": "x", "chosen": "a", "rejected": 3},
            "data[1]: field 'rejected': expected a string or a list",
        ),
        (
            {"prompt": [{"role": "user"}], "chosen": "a", "rejected": "b"},
            "data[1]: field 'prompt[0].content'",
        ),
    ],
)
def test_bad_preference_rows_in_memory_name_the_index_and_field(row, message) -> None:
    good = {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}
    name = register_records([good, row])
    try:
        with pytest.raises(DataError) as err:
            load_rows(name, "prefs")
        assert str(err.value).startswith(message), str(err.value)
    finally:
        release_records(name)


def test_rows_in_memory_errors_and_names() -> None:
    with pytest.raises(DataError, match=r"eval_data\[2\]: expected a dict \(one row\), got str"):
        name = register_records([{"prompt": "a"}, {"prompt": "b"}, "c"], label="eval_data")
        load_rows(name, "prompts")
    with pytest.raises(
        DataError, match="expected a file path, task:NAME, a list of dicts or a datasets.Dataset"
    ):
        register_records(42)
    rows = [{"prompt": "2+2=", "answer": "4"}]
    assert register_records(rows) == register_records([dict(r) for r in rows])  # content-addressed
    name = register_records(rows)
    release_records(name)
    with pytest.raises(DataError, match="pass the same data= again"):
        load_rows(name, "prompts")


def test_a_datasets_dataset_is_read_as_its_rows() -> None:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([{"prompt": [USER], "chosen": [BLUE], "rejected": [GREEN]}] * 3)
    name = register_records(ds)
    try:
        assert load_rows(name, "prefs") == [{"prompt": [USER], "chosen": [BLUE], "rejected": [GREEN]}] * 3
    finally:
        release_records(name)
    implicit = datasets.Dataset.from_list([{"chosen": "The sky is blue.", "rejected": "The sky is green."}])
    name = register_records(implicit)
    try:
        assert load_rows(name, "prefs")[0]["prompt"] == "The sky is"
    finally:
        release_records(name)
    with pytest.raises(DataError, match="a DatasetDict of splits \\['train'\\]; pass one split"):
        register_records(datasets.DatasetDict({"train": ds}))


def test_messages_with_a_system_turn_train_on_the_answer_only(tiny_tokenizer) -> None:
    system = {"role": "system", "content": "You answer in three words."}
    rows = load_rows(register_records([{"messages": [system, USER, BLUE]}]), "sft")
    rendered = render_rows(rows, "sft", tiny_tokenizer)[0]
    expected = tiny_tokenizer.apply_chat_template([system, USER], tokenize=False, add_generation_prompt=True)
    assert rendered["prompt"] == expected and "You answer in three words." in rendered["prompt"]
    assert rendered["completion"] == "It is blue."
    example = tokenize_sft([rendered], tiny_tokenizer, max_length=128)[0]
    answer = tiny_tokenizer("It is blue.", add_special_tokens=False)["input_ids"] + [
        tiny_tokenizer.eos_token_id
    ]
    targets = [t for t in example["labels"] if t != -100]
    assert targets == answer


def test_implicit_and_explicit_preferences_tokenize_the_same(tiny_tokenizer) -> None:
    implicit = register_records([{"chosen": [USER, BLUE], "rejected": [USER, GREEN]}])
    explicit = register_records([{"prompt": [USER], "chosen": [BLUE], "rejected": [GREEN]}])
    pairs = [
        tokenize_preferences(
            render_rows(load_rows(name, "prefs"), "prefs", tiny_tokenizer), tiny_tokenizer, 64
        )
        for name in (implicit, explicit)
    ]
    assert pairs[0] == pairs[1]
    assert pairs[0][0]["chosen_ids"] != pairs[0][0]["rejected_ids"]
