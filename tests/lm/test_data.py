"""Data: errors that name file, line and field; Parquet and task sources; chat rendering; SFT labels;
overlong prompts reported and handled; packing; the prompt/response padding layout."""

from __future__ import annotations

import json
import logging

import pytest

from postrl.lm.data import (
    DataError,
    apply_length_limit,
    collate_preferences,
    join_prompt_response,
    load_rows,
    load_train_heldout,
    pack_examples,
    pad,
    render_rows,
    tokenize_preferences,
    tokenize_prompts,
    tokenize_sft,
    write_jsonl,
)
from postrl.runtime.errors import UserError


def _write(tmp_path, lines: list[str], name: str = "data.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = json.dumps({"prompt": "What is 1+1?", "completion": " 2"})


@pytest.mark.parametrize(
    ("bad_line", "kind", "message"),
    [
        ('{"prompt": "a", "completion": ', "sft", r"data.jsonl:3: malformed JSON"),
        ('["prompt", "completion"]', "sft", r"data.jsonl:3: expected a JSON object, got list"),
        ('{"prompt": "a"}', "sft", r"data.jsonl:3: missing field 'completion'"),
        (
            '{"prompt": 7, "completion": "b"}',
            "sft",
            r"data.jsonl:3: field 'prompt': expected a string .* got int",
        ),
        ('{"messages": [{"role": "user", "content": null}]}', "sft", r":3: field 'messages\[0\].content'"),
        (
            '{"messages": [{"role": "user", "content": "hi"}]}',
            "sft",
            r":3: field 'messages': the last message",
        ),
        ('{"prompt": "a", "chosen": "b"}', "prefs", r"data.jsonl:3: missing field 'rejected'"),
        ('{"prompt": "a", "chosen": "b", "rejected": "c", "target": 2}', "prefs", r":3: field 'target'"),
        ('{"prompt": "a", "chosen": "b", "rejected": "c", "margin": "1"}', "prefs", r":3: field 'margin'"),
        ('{"prompt": "a", "chosen": "b", "rejected": "c", "margin": NaN}', "prefs", r":3: field 'margin'"),
        ('{"text": 5}', "sft", r":3: field 'text': expected a string, got int"),
        ('{"answer": "2"}', "prompts", r":3: missing field 'prompt' \(has: answer\)"),
    ],
)
def test_bad_record_names_file_line_and_field(tmp_path, bad_line: str, kind: str, message: str) -> None:
    good = {
        "sft": GOOD,
        "prefs": json.dumps({"prompt": "a", "chosen": "b", "rejected": "c"}),
        "prompts": GOOD,
    }[kind]
    path = _write(tmp_path, [good, "", bad_line])  # a blank line 2 still counts for line numbers
    with pytest.raises(DataError, match=message) as info:
        load_rows(path, kind)
    assert isinstance(info.value, UserError) and str(path) in str(info.value)


def test_sources(tmp_path) -> None:
    rows = [{"prompt": "What is 1+1?", "completion": " 2"}, {"prompt": "Q", "completion": " A"}]
    path = write_jsonl(rows, tmp_path / "sft.jsonl")
    assert load_rows(path, "sft") == rows
    (tmp_path / "list.json").write_text(json.dumps(rows))
    assert load_rows(tmp_path / "list.json", "sft") == rows
    with pytest.raises(DataError, match="no such data file"):
        load_rows(tmp_path / "missing.jsonl", "sft")
    assert load_rows("task:arithmetic", "prompts", "test", task_kwargs={"n_test": 5})[0].keys() == {
        "prompt",
        "answer",
    }


def test_parquet_source_and_row_errors(tmp_path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"prompt": ["a", "b"], "chosen": ["x", "y"], "rejected": ["z", None]})
    pq.write_table(table, tmp_path / "prefs.parquet")
    with pytest.raises(DataError, match=r"prefs.parquet: row 1: field 'rejected'.*got NoneType"):
        load_rows(tmp_path / "prefs.parquet", "prefs")
    pq.write_table(table.slice(0, 1), tmp_path / "ok.parquet")
    assert load_rows(tmp_path / "ok.parquet", "prefs") == [{"prompt": "a", "chosen": "x", "rejected": "z"}]


def test_unknown_name_needs_datasets(tmp_path) -> None:
    try:
        import datasets  # noqa: F401
    except ImportError:
        with pytest.raises(DataError, match="pip install 'postrl\\[datasets\\]'"):
            load_rows("someone/some-dataset", "sft")
    else:
        pytest.skip("datasets is installed; loading a hub name would need the network")


def test_conversational_rows_render_through_chat_template(tiny_tokenizer) -> None:
    rows = [
        {"messages": [{"role": "user", "content": "What is 4+5?"}, {"role": "assistant", "content": " 9"}]},
        {
            "prompt": [{"role": "user", "content": "Review: the tea"}],
            "completion": [{"role": "assistant", "content": " was warm ."}],
        },
        {"text": "the cat sat on the mat ."},
    ]
    rendered = render_rows(rows, "sft", tiny_tokenizer)
    assert rendered[0] == {"prompt": "<|user|>What is 4+5?<|assistant|>", "completion": " 9"}
    assert rendered[1] == {"prompt": "<|user|>Review: the tea<|assistant|>", "completion": " was warm ."}
    assert rendered[2] == {"prompt": "", "completion": "the cat sat on the mat ."}
    examples = tokenize_sft(rendered, tiny_tokenizer, max_length=64)
    conversation = tiny_tokenizer.apply_chat_template(rows[0]["messages"], tokenize=False)
    assert examples[0]["input_ids"] == tiny_tokenizer(conversation)["input_ids"]
    assert examples[2]["input_ids"][0] == tiny_tokenizer.bos_token_id and examples[2]["labels"][0] == -100
    assert examples[2]["labels"][1:] == examples[2]["input_ids"][1:]


def test_tokenize_sft_masks_prompt_and_appends_eos(tiny_tokenizer) -> None:
    (example,) = tokenize_sft(
        [{"prompt": "What is 47+38?", "completion": " 85"}], tiny_tokenizer, max_length=64
    )
    prompt = tiny_tokenizer("What is 47+38?")["input_ids"]
    completion = tiny_tokenizer(" 85")["input_ids"] + [tiny_tokenizer.eos_token_id]
    assert example["input_ids"] == prompt + completion
    assert example["labels"] == [-100] * len(prompt) + completion
    assert example["attention_mask"] == [1] * len(prompt + completion)


def test_overlong_prompts_are_reported_and_handled(caplog) -> None:
    ids = [[1, 2], [1, 2, 3, 4, 5], [7], [1, 2, 3, 4]]
    with caplog.at_level(logging.WARNING):
        kept, index = apply_length_limit(ids, 3, "drop")
    assert kept == [[1, 2], [7]] and index == [0, 2]
    assert (
        "2 of 4 prompts are longer than 3 tokens (e.g. row 1: 5 tokens)" in caplog.text
        and "dropped" in caplog.text
    )
    kept, index = apply_length_limit(ids, 3, "truncate")
    assert kept == [[1, 2], [3, 4, 5], [7], [2, 3, 4]] and index == [
        0,
        1,
        2,
        3,
    ]  # the end of a prompt is kept
    with pytest.raises(DataError, match="2 of 4 prompts are longer than 3 tokens"):
        apply_length_limit(ids, 3, "error")
    with pytest.raises(DataError, match="overlong must be one of"):
        apply_length_limit(ids, 3, "ignore")


def test_overlong_sft_and_prompts(tiny_tokenizer, caplog) -> None:
    rows = [
        {"prompt": "1+1=", "completion": "2"},
        {"prompt": "Review: the pasta", "completion": " was great ." * 5},
    ]
    n_prompt = len(tiny_tokenizer(rows[1]["prompt"])["input_ids"])
    with caplog.at_level(logging.WARNING):
        dropped = tokenize_sft(rows, tiny_tokenizer, max_length=12, overlong="drop")
    assert len(dropped) == 1 and "1 of 2 SFT examples" in caplog.text
    cut = tokenize_sft(rows, tiny_tokenizer, max_length=12, overlong="truncate")
    assert (
        len(cut) == 2 and len(cut[1]["input_ids"]) == 12 and cut[1]["labels"][:n_prompt] == [-100] * n_prompt
    )
    short = {
        "prompt": "Q",
        "completion": " A",
    }  # 4 tokens with EOS: fits; row 1's prompt alone fills the limit
    assert (
        tokenize_sft([short, rows[1]], tiny_tokenizer, max_length=n_prompt, overlong="truncate")[0]["labels"][
            -1
        ]
        == 1
    )
    assert len(tokenize_sft([short, rows[1]], tiny_tokenizer, max_length=n_prompt, overlong="truncate")) == 1
    long_prompt = {"prompt": "Review: the pasta at the cafe " * 3}
    limit = len(tiny_tokenizer("What is 1+1?")["input_ids"]) + 1  # room for a BOS; the long prompt is 3x more
    kept, prompt_ids = tokenize_prompts(
        [{"prompt": "What is 1+1?", "answer": "2"}, long_prompt], tiny_tokenizer, limit
    )
    assert kept == [{"prompt": "What is 1+1?", "answer": "2"}] and len(prompt_ids) == 1


def test_pack_examples_keeps_whole_examples() -> None:
    examples = [
        {"input_ids": [i] * n, "attention_mask": [1] * n, "labels": [i] * n}
        for i, n in enumerate([3, 4, 2, 5])
    ]
    blocks = pack_examples(examples, max_length=7)
    assert [b["input_ids"] for b in blocks] == [[0, 0, 0, 1, 1, 1, 1], [2, 2, 3, 3, 3, 3, 3]]
    assert all(len(b["labels"]) == len(b["input_ids"]) == len(b["attention_mask"]) for b in blocks)


def test_padding_layout() -> None:
    ids, mask = pad([[5, 6], [7]], pad_id=0, side="left")
    assert ids.tolist() == [[5, 6], [0, 7]] and mask.tolist() == [[1, 1], [0, 1]]
    batch = join_prompt_response([[5, 6], [7]], [[8], [9, 10, 11]], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 8, 0, 0], [0, 7, 9, 10, 11]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]]
    assert batch["response_mask"].tolist() == [[1, 0, 0], [1, 1, 1]]


def test_preference_collation(tiny_tokenizer) -> None:
    rows = [{"prompt": "Review: the tea", "chosen": " was warm .", "rejected": " was cold .", "target": 0.5}]
    examples = tokenize_preferences(rows * 2, tiny_tokenizer, max_prompt_length=16)
    assert examples[0]["chosen_ids"][-1] == tiny_tokenizer.eos_token_id and examples[0]["target"] == 0.5
    batch = collate_preferences(examples, pad_id=tiny_tokenizer.pad_token_id)
    assert batch["input_ids"].shape[0] == 4 and batch["target"].tolist() == [0.5, 0.5]


def test_encode_prompts_follows_the_tokenizer_and_never_doubles_bos(tiny_corpus, tiny_tokenizer) -> None:
    from tokenizers import processors

    from postrl.lm.data import encode_completions, encode_prompts, special_prefix
    from postrl.lm.tokenizer import train_bpe, wrap_tokenizer

    raw = train_bpe(tiny_corpus[:300], vocab_size=300)
    raw.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    llama_like = wrap_tokenizer(raw)  # adds <bos> by itself, as Llama's tokenizer does
    assert special_prefix(llama_like) == [2] and special_prefix(tiny_tokenizer) == []
    plain = llama_like("What is 1+1?", add_special_tokens=False)["input_ids"]
    with_bos, rendered, empty = encode_prompts(llama_like, ["What is 1+1?", "<bos>What is 1+1?", ""])
    assert with_bos == [2, *plain] and rendered == [2, *plain] and empty == [2]
    assert encode_prompts(tiny_tokenizer, ["What is 1+1?", ""]) == [
        tiny_tokenizer("What is 1+1?")["input_ids"],
        [2],
    ]
    assert encode_completions(llama_like, [" 2"]) == [
        [*llama_like(" 2", add_special_tokens=False)["input_ids"], 1]
    ]


def test_data_check_command(tmp_path, capsys) -> None:
    import argparse

    from postrl.lm.commands import add_data_command

    parser = argparse.ArgumentParser()
    add_data_command(parser.add_subparsers())
    good = write_jsonl([{"prompt": "a", "completion": "b"}], tmp_path / "good.jsonl")
    args = parser.parse_args(["data", "check", "--kind", "sft", str(good)])
    assert args.handler(args) == 0 and "1 valid sft rows" in capsys.readouterr().out
    bad = _write(tmp_path, [GOOD, '{"prompt": "a"}'], name="bad.jsonl")
    args = parser.parse_args(["data", "check", "--kind", "sft", str(bad)])
    with pytest.raises(DataError, match=r"bad.jsonl:2: missing field 'completion'"):
        args.handler(args)


# ---- empty text, and every unreadable source, named by file:line:field --------------------------------------
PREF = {"prompt": "a", "chosen": "b", "rejected": "c"}
USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("kind", "good", "blank", "field"),
    [
        ("sft", json.loads(GOOD), {"prompt": "", "completion": " 2"}, "prompt"),
        ("sft", json.loads(GOOD), {"prompt": "Q", "completion": " \n\t"}, "completion"),
        ("sft", json.loads(GOOD), {"text": "   "}, "text"),
        (
            "sft",
            json.loads(GOOD),
            {"messages": [USER, {"role": "assistant", "content": " "}]},
            r"messages\[-1\].content",
        ),
        ("prefs", PREF, {**PREF, "chosen": ""}, "chosen"),
        ("prefs", PREF, {**PREF, "rejected": [{"role": "assistant", "content": ""}]}, "rejected"),
        ("prompts", {"prompt": "Q", "answer": "1"}, {"prompt": " ", "answer": "2"}, "prompt"),
        ("prompts", {"prompt": "Q"}, {"prompt": [{**USER, "content": " "}]}, "prompt"),
    ],
)
def test_empty_text_is_refused_or_skipped_and_counted(tmp_path, caplog, kind, good, blank, field) -> None:
    lines = [json.dumps(r) for r in (good, blank, good, blank)]
    path = _write(tmp_path, lines)
    with pytest.raises(
        DataError, match=rf"data.jsonl:2: field '{field}': empty or whitespace-only \(2 of 4 "
    ):
        load_rows(path, kind)
    with caplog.at_level(logging.WARNING):
        rows = load_rows(path, kind, empty="skip")
    assert rows == [good, good]
    assert f"2 of 4 {kind} rows have an empty or whitespace-only text field" in caplog.text
    _write(tmp_path, [json.dumps(blank)], name="all_blank.jsonl")
    with pytest.raises(DataError, match="no records left"):
        load_rows(tmp_path / "all_blank.jsonl", kind, empty="skip")
    with pytest.raises(DataError, match=r"empty must be one of \('error', 'skip'\)"):
        load_rows(path, kind, empty="drop")


def test_empty_policy_reaches_the_held_out_file(tmp_path) -> None:
    train = _write(tmp_path, [GOOD] * 3, name="train.jsonl")
    heldout = _write(tmp_path, [GOOD, json.dumps({"prompt": "Q", "completion": ""})], name="eval.jsonl")
    with pytest.raises(DataError, match=r"eval.jsonl:2: field 'completion'"):
        load_train_heldout(str(train), "sft", str(heldout))
    assert len(load_train_heldout(str(train), "sft", str(heldout), empty="skip")[1]) == 1


def test_json_list_errors_name_the_line_of_the_item(tmp_path) -> None:
    rows = [{"prompt": "a", "completion": "b"}, {"prompt": "c", "completion": "d"}]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows, indent=2))  # each object spans 4 lines: items start on lines 2 and 6
    assert load_rows(path, "sft") == rows
    path.write_text(json.dumps([*rows, {"prompt": "e"}], indent=2))
    with pytest.raises(DataError, match=r"rows.json:10: missing field 'completion'"):
        load_rows(path, "sft")
    path.write_text('[{"prompt": "a", "completion": "b"},\n "just text"]')
    with pytest.raises(DataError, match=r"rows.json:2: item 1: expected a JSON object, got str"):
        load_rows(path, "sft")
    path.write_text("  \n")
    with pytest.raises(DataError, match=r"rows.json: empty file"):
        load_rows(path, "sft")
    path.write_text('[{"prompt": "a",\n "completion": }]')
    with pytest.raises(DataError, match=r"rows.json:2: malformed JSON"):
        load_rows(path, "sft")


def test_unreadable_sources_are_data_errors(tmp_path, tiny_tokenizer) -> None:
    (tmp_path / "latin1.jsonl").write_bytes(GOOD.encode() + b"\n" + '{"prompt": "caf\xe9"}'.encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.jsonl:2: not UTF-8 text"):
        load_rows(tmp_path / "latin1.jsonl", "sft")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(DataError, match=r"empty.jsonl: no records \(the file is empty\)"):
        load_rows(tmp_path / "empty.jsonl", "sft")
    with pytest.raises(DataError, match=r"a folder, not a data file"):
        load_rows(tmp_path, "sft")
    with pytest.raises(DataError, match=r"no such data file"):
        load_rows(tmp_path / "nothing" / "here", "sft")
    if pytest.importorskip("pyarrow"):
        (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
        with pytest.raises(DataError, match=r"bad.parquet: not a readable Parquet file"):
            load_rows(tmp_path / "bad.parquet", "sft")
    rows = [{"prompt": [{"role": "tool", "content": "x"}], "completion": "y"}]
    with pytest.raises(
        DataError, match=r"row 0: field 'prompt': the chat template of the tokenizer at .+ refused it"
    ):
        render_rows(rows, "sft", tiny_tokenizer)


# ---- SFT prompts are the prompts generation sees --------------------------------------------------------------
def _llama_like(tiny_corpus):
    """A tokenizer that adds <bos> by itself, as Llama's and Mistral's do."""
    from tokenizers import processors

    from postrl.lm.tokenizer import train_bpe, wrap_tokenizer

    raw = train_bpe(tiny_corpus[:300], vocab_size=300)
    raw.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    return wrap_tokenizer(raw)


def test_sft_prompt_ids_are_the_generation_prompt_ids(tiny_corpus, tiny_tokenizer) -> None:
    from postrl.lm.data import encode_completions, encode_prompts

    rows = [
        {"prompt": "What is 1+1?", "completion": " 2"},
        {"prompt": "<bos>Review: the tea", "completion": " was warm ."},  # a rendered template with its BOS
    ]
    for tokenizer, bos_first in ((_llama_like(tiny_corpus), True), (tiny_tokenizer, False)):
        prompts = encode_prompts(tokenizer, [r["prompt"] for r in rows])
        completions = encode_completions(tokenizer, [r["completion"] for r in rows])
        examples = tokenize_sft(rows, tokenizer, max_length=64)
        for example, p, c in zip(examples, prompts, completions, strict=True):
            assert example["input_ids"] == p + c and example["labels"] == [-100] * len(p) + c
        plain, rendered = (e["input_ids"] for e in examples)
        assert (plain[0] == 2) is bos_first and plain.count(2) == int(bos_first)
        assert rendered[0] == 2 and rendered.count(2) == 1  # the template's BOS, never a second one


def test_pretraining_rows_are_unchanged_bos_text_eos(tiny_corpus, tiny_tokenizer) -> None:
    """`postrl pretrain` tokenises {"prompt": "", "completion": line}: [bos] + the line + eos, every token after
    the BOS a target, with either kind of tokenizer."""
    for tokenizer in (_llama_like(tiny_corpus), tiny_tokenizer):
        (example,) = tokenize_sft([{"prompt": "", "completion": "the cat sat ."}], tokenizer, max_length=64)
        text = tokenizer("the cat sat .", add_special_tokens=False)["input_ids"]
        assert example["input_ids"] == [2, *text, 1] and example["labels"] == [-100, *text, 1]
