"""`columns_of`: the data columns reward functions get, written once for every stage (PPO, GRPO, the VLM's
GRPO, task evaluation)."""

from postrl.lm.rewards import columns_of


def test_every_key_of_any_row_is_a_column_aligned_with_the_rows() -> None:
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4", "kind": "sum"}]
    assert columns_of(rows) == {"answer": ["2", "4"], "kind": [None, "sum"]}


def test_hidden_keys_are_left_out_and_no_rows_give_no_columns() -> None:
    rows = [{"prompt": "p", "where": "a.jsonl:1", "base": "/data", "answer": "x"}]
    assert columns_of(rows, ("prompt", "where", "base")) == {"answer": ["x"]}
    assert columns_of([]) == {}
