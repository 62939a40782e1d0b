"""Built-in tasks: the verifier on tricky strings, disjoint deterministic splits, the gold reward's order,
the labeller's noise and ties, the corpus never leaking held-out prompts, and `postrl data export`."""

from __future__ import annotations

import argparse
import json
import math
import random

import pytest

from postrl.lm.commands import add_data_command
from postrl.lm.tasks import (
    LabellerConfig,
    SyntheticLabeller,
    TaskError,
    build_corpus,
    get_task,
    is_correct,
    list_tasks,
    parse_last_number,
)
from postrl.lm.tasks.review_language import gold_reward_one, parse


# ---- arithmetic ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (" 85", 85),
        ("The answer is 85.", 85),
        ("The answer is 1,234.", 1234),
        ("-12", -12),
        (" −7", -7),
        ("3 - 5 = -2", -2),
        ("12-5", 5),
        ("47+38 is 85, not 84", 84),
        ("x=-5", -5),
        ("2.5 apples", 2.5),
        ("85.<eos>", 85),
        ("1,2,3", 3),
        ("12345", 12345),
        ("no number here", None),
        ("", None),
    ],
)
def test_parse_last_number(text: str, expected: float | None) -> None:
    assert parse_last_number(text) == expected


def test_is_correct_and_reward_fn() -> None:
    assert is_correct(" The answer is 1,234", "1234") and not is_correct(" 123", 1234)
    task = get_task("arithmetic")
    prompts = ["What is 47+38?", "What is 47+38?", "What is 9-12?", "What is 7*8?"]
    completions = [" 85", " 84", " -3", [{"role": "assistant", "content": "56"}]]
    assert task.reward_fn(prompts, completions) == [1.0, 0.0, 1.0, 1.0]  # answers parsed from the prompt
    assert task.reward_fn(prompts[:2], [" 85", " 84"], answer=["84", "84"]) == [0.0, 1.0]  # column wins


@pytest.mark.parametrize("name", ["arithmetic", "reviews"])
def test_task_rewards_take_trls_keyword_call(name: str) -> None:
    """The call `postrl.lm.rewards` makes (TRL's): keywords only, completion ids and the trainer state
    included, completions of conversational prompts as one-message lists; the same values as plain text."""
    task = get_task(name)
    rows = task.sft_rows("test")[:4]
    prompts, texts = [r["prompt"] for r in rows], [r["completion"] for r in rows]
    columns = {k: [r[k] for r in rows] for k in rows[0] if k not in ("prompt", "completion")}
    expected = task.reward_fn(prompts, texts, **columns)
    chat = [[{"role": "user", "content": p}] for p in prompts]
    for fn in (task.reward_fn, task.gold_reward):
        got = fn(
            prompts=chat,
            completions=[[{"role": "assistant", "content": t}] for t in texts],
            completion_ids=[[1, 2]] * len(texts),
            trainer_state=None,
            **columns,
        )
        assert got == expected


@pytest.mark.parametrize(
    "kwargs", [{}, {"digits": 1, "ops": "+-*"}, {"digits": 5, "n_train": 300, "n_test": 50}]
)
def test_arithmetic_splits_disjoint_and_deterministic(kwargs: dict) -> None:
    task = get_task("arithmetic", **kwargs)
    train, test = task.prompts("train"), task.prompts("test")
    assert train and test and not set(train) & set(test)
    assert len(set(train)) == len(train) and len(set(test)) == len(test)
    assert get_task("arithmetic", **kwargs).prompts("test") == test
    assert get_task("arithmetic", **kwargs, seed=1).prompts("test") != test


def test_arithmetic_rows_are_correct_and_short(tiny_tokenizer) -> None:
    task = get_task("arithmetic", ops="+-*", allow_negative=False, n_train=200)
    rows = task.sft_rows("train")
    assert len(rows) == 200
    assert task.reward_fn([r["prompt"] for r in rows], [r["completion"] for r in rows]) == [1.0] * 200
    assert all(int(r["answer"]) >= 0 for r in rows)
    longest = max(len(tiny_tokenizer(r["completion"])["input_ids"]) for r in rows)
    assert longest + 1 <= 8  # with EOS
    prefs = task.preference_rows("test")
    assert all(
        is_correct(r["chosen"], r["answer"]) and not is_correct(r["rejected"], r["answer"]) for r in prefs
    )


def test_arithmetic_bad_options() -> None:
    with pytest.raises(TaskError, match="ops"):
        get_task("arithmetic", ops="/")
    with pytest.raises(TaskError, match="did you mean 'digits'"):
        get_task("arithmetic", digit=2)
    with pytest.raises(TaskError, match="available: arithmetic, reviews"):
        get_task("arithmetc")
    assert list_tasks() == ["arithmetic", "reviews", "shapes"]


# ---- reviews: gold reward --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("better", "worse"),
    [
        (" was very fresh and delicious .", " was okay ."),
        (" was okay .", " was bland and cold ."),
        (" was fresh and tasty .", " was great great great amazing amazing ."),  # hacking is punished
        (" was great .", " was great"),  # unfinished
        (" was great .", " great was ."),  # ungrammatical
        (" was fresh .", " was friendly ."),  # "friendly" does not fit food
        (" was bland .", ""),
        (" was good and tasty .", " was good and and tasty ."),
    ],
)
def test_gold_reward_orders_obvious_pairs(better: str, worse: str) -> None:
    prompt = "Review: the pasta at the cafe"
    assert gold_reward_one(prompt, better) > gold_reward_one(prompt, worse)


def test_gold_reward_hand_values() -> None:
    # " was great ." : sentiment tanh(0.8·1.0), no penalty
    assert gold_reward_one("Review: the soup", " was great .") == pytest.approx(math.tanh(0.8))
    # " was very good ." : tanh(0.8·0.7·1.4)
    assert gold_reward_one("Review: the soup", " was very good .<eos>") == pytest.approx(
        math.tanh(0.8 * 0.98)
    )
    # " was great great ." : 2 of 4 words grammatical (−1.0), unfinished (−0.5), one repeat (−0.5)
    expected = math.tanh(1.6) - 1.0 - 0.5 - 0.5
    assert gold_reward_one("Review: the soup", " was great great .") == pytest.approx(expected)
    assert parse(" was fresh and tasty .").complete


def test_reviews_sft_is_grammatical_but_mediocre() -> None:
    task = get_task("reviews", n_sft_train=1000)
    rows = task.sft_rows("train")
    assert all(parse(r["completion"]).complete for r in rows)
    gold = task.gold_reward([r["prompt"] for r in rows], [r["completion"] for r in rows])
    mean = sum(gold) / len(gold)
    assert -0.4 < mean < 0.4 and max(gold) > 0.9  # RL has room above the demonstrations
    assert task.reward_fn(["Review: the tea"], [" was warm ."]) == task.gold_reward(
        ["Review: the tea"], [" was warm ."]
    )


def test_reviews_splits_disjoint_and_deterministic() -> None:
    task = get_task("reviews")
    train, test = task.prompts("train"), task.prompts("test")
    assert len(train) + len(test) == 180 and not set(train) & set(test) and len(test) > 10
    assert {r["prompt"] for r in task.sft_rows("test")} <= set(test)
    assert get_task("reviews").preference_rows("test") == task.preference_rows("test")


@pytest.mark.parametrize("name", list_tasks())
def test_no_prompt_is_a_prefix_of_another(name: str) -> None:
    # The prompt's text must mark where the response starts: a held-out "Review: the view" beside a train
    # "Review: the view at the harbor" made the SFT model go on writing the prompt (issue 5).
    task = get_task(name)
    prompts = sorted(set(task.prompts("train") + task.prompts("test")))
    # sorted, every string that starts with a comes right after a
    assert [(a, b) for a, b in zip(prompts[:-1], prompts[1:], strict=True) if b.startswith(a)] == []


def test_reviews_prompt_and_response_tokenise_apart(tiny_tokenizer) -> None:
    # Encoding prompt and completion separately (SFT, rollout) gives the tokens of their concatenation
    # (the corpus), so no token spans the boundary.
    from postrl.lm.data import encode

    rows = get_task("reviews").sft_rows("test")[:200]
    joint = encode(tiny_tokenizer, [r["prompt"] + r["completion"] for r in rows])
    prompts = encode(tiny_tokenizer, [r["prompt"] for r in rows])
    completions = encode(tiny_tokenizer, [r["completion"] for r in rows])
    assert joint == [p + c for p, c in zip(prompts, completions, strict=True)]


def test_reviews_noun_of_both_prompt_forms() -> None:
    from postrl.lm.tasks.review_language import noun_of

    assert noun_of("Review of the waiter at the cafe:") == "waiter"
    assert noun_of("Review: the soup") == "soup" and noun_of("Review of the robot:") is None


# ---- labeller --------------------------------------------------------------------------------------------
def test_labeller_noise_rate_matches_config() -> None:
    labeller = SyntheticLabeller(LabellerConfig(noise=0.2, tie_tolerance=0.05), seed=3)
    rng = random.Random(0)
    labelled, flips = 0, 0
    for _ in range(20000):
        a, b = rng.uniform(-1, 1), rng.uniform(-1, 1)
        target = labeller.target(a, b)
        if abs(a - b) <= 0.05:
            assert target == 0.5
            continue
        labelled += 1
        flips += target != (1.0 if a > b else 0.0)
    assert abs(flips / labelled - 0.2) < 0.015  # binomial sd ≈ 0.003


def test_labeller_ties_and_rows() -> None:
    labeller = SyntheticLabeller(LabellerConfig(noise=0.5, tie_tolerance=0.1))
    assert {labeller.target(0.3, 0.35) for _ in range(50)} == {0.5}
    row = SyntheticLabeller(LabellerConfig(noise=0.0)).label("p", "a", "b", gold_a=0.0, gold_b=1.0)
    assert row == {"prompt": "p", "chosen": "b", "rejected": "a", "target": 1.0}
    tie = SyntheticLabeller().label("p", "a", "b", gold_a=0.5, gold_b=0.5)
    assert tie["target"] == 0.5 and tie["chosen"] == "a"


def test_labeller_bradley_terry_frequency() -> None:
    labeller = SyntheticLabeller(
        LabellerConfig(mode="bradley_terry", noise=0.0, tie_tolerance=0.0, temperature=0.5)
    )
    wins = sum(labeller.target(0.3, 0.0) for _ in range(20000)) / 20000
    assert wins == pytest.approx(1 / (1 + math.exp(-0.6)), abs=0.012)


def test_reviews_preferences_from_policy_samples() -> None:
    task = get_task("reviews", label_noise=0.0, n_pairs_train=200)
    samples = {"Review: the soup": [" was cold .", " was delicious .", " was okay .", " was okay ."]}
    rows = task.preference_rows("train", policy_samples=samples)
    assert rows[0]["chosen"] == " was delicious ." and rows[0]["target"] == 1.0
    assert rows[1]["target"] == 0.5
    generated = task.preference_rows("train")
    assert len(generated) == task.config.n_pairs_train and {r["target"] for r in generated} <= {0.5, 1.0}


# ---- corpus and export -----------------------------------------------------------------------------------
def test_corpus_never_contains_held_out_prompts() -> None:
    corpus = build_corpus(n_lines=3000, seed=0)
    assert corpus == build_corpus(n_lines=3000, seed=0) and len(corpus) == 3000
    arithmetic_test = set(get_task("arithmetic").prompts("test"))
    reviews_test = set(get_task("reviews").prompts("test"))
    for line in corpus:
        assert line.split("?")[0] + "?" not in arithmetic_test
        assert line.split(" was ")[0] not in reviews_test


def test_data_export_writes_trl_columns(tmp_path) -> None:
    parser = argparse.ArgumentParser()
    add_data_command(parser.add_subparsers())
    out = tmp_path / "prefs.jsonl"
    argv = ["data", "export", "--task", "reviews", "--kind", "prefs", "--split", "test", "--out", str(out)]
    args = parser.parse_args([*argv, "--option", "n_pairs_test=7", "--option", "label_noise=0"])
    assert args.handler(args) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 7 and set(rows[0]) == {"prompt", "chosen", "rejected", "target"}
    out = tmp_path / "prompts.jsonl"
    args = parser.parse_args(
        ["data", "export", "--task", "arithmetic", "--kind", "prompts", "--out", str(out), "--limit", "3"]
    )
    args.handler(args)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and set(rows[0]) == {"prompt", "answer"}


# ---- properties ------------------------------------------------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from postrl.lm.tasks.review_language import ADJECTIVES, CONNECTIVES, INTENSIFIERS  # noqa: E402

_NO_DIGITS = st.text(
    alphabet=st.characters(blacklist_categories=("Nd",), blacklist_characters="-−,."), max_size=20
)


@settings(max_examples=60, deadline=None)
@given(prefix=_NO_DIGITS, n=st.integers(-(10**9), 10**9), commas=st.booleans())
def test_parse_last_number_reads_any_written_integer(prefix: str, n: int, commas: bool) -> None:
    written = f"{n:,}" if commas else str(n)
    assert parse_last_number(f"{prefix} {written}") == n
    assert parse_last_number(f"{prefix} {written}.") == n


_VOCAB = [*ADJECTIVES, *INTENSIFIERS, *CONNECTIVES, "was", ".", "the", "pasta"]


@settings(max_examples=80, deadline=None)
@given(words=st.lists(st.sampled_from(_VOCAB), max_size=20))
def test_gold_reward_is_bounded_and_spam_never_beats_a_clean_review(words: list[str]) -> None:
    text = " " + " ".join(words)
    gold = gold_reward_one("Review: the pasta", text)
    # sentiment ≥ −1 and every penalty term is at most 1 per word plus 3.5 in all (see gold_reward_one)
    assert -(4.5 + len(words)) <= gold < 1.0
    if len([w for w in words if w in ADJECTIVES]) != len({w for w in words if w in ADJECTIVES}):
        assert gold < gold_reward_one("Review: the pasta", " was very fresh and delicious .")


@settings(max_examples=60, deadline=None)
@given(a=st.floats(-3, 3), b=st.floats(-3, 3))
def test_noiseless_labeller_is_antisymmetric(a: float, b: float) -> None:
    labeller = SyntheticLabeller(LabellerConfig(noise=0.0, tie_tolerance=0.05))
    assert labeller.target(a, b) + labeller.target(b, a) == 1.0


def test_default_preferences_leave_a_naive_reward_model_hackable() -> None:
    """A bag-of-words Bradley–Terry reward model fit on the default pairs prefers positive-word spam to a
    clean positive review, while the gold reward ranks them the other way: hacking is visible."""
    import torch

    from postrl.lm.tasks.review_language import words_of

    rows = get_task("reviews", n_pairs_train=1000).preference_rows("train")
    vocab = {
        w: i for i, w in enumerate(sorted({w for r in rows for w in words_of(r["chosen"] + r["rejected"])}))
    }

    def features(texts: list[str]) -> torch.Tensor:
        counts = [[0.0] * len(vocab) for _ in texts]
        for row, text in zip(counts, texts, strict=True):
            for w in words_of(text):
                row[vocab[w]] += 1
        return torch.tensor(counts, dtype=torch.float64)

    diff = features([r["chosen"] for r in rows]) - features([r["rejected"] for r in rows])
    target = torch.tensor([r["target"] for r in rows], dtype=torch.float64)
    weights = torch.zeros(len(vocab), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([weights], max_iter=100)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = (
            torch.nn.functional.binary_cross_entropy_with_logits(diff @ weights, target)
            + 1e-3 * weights.square().sum()
        )
        loss.backward()
        return loss

    optimizer.step(closure)
    clean, spam = " was very fresh and delicious .", " was great great amazing amazing perfect perfect ."
    proxy = (features([clean, spam]) @ weights).tolist()
    assert proxy[1] > proxy[0]
    assert gold_reward_one("Review: the pasta", spam) < gold_reward_one("Review: the pasta", clean) - 2
