"""Reward functions: loading the three kinds of spec, weighted sums, and the errors a bad function gets."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from postrl.lm.rewards import (
    RewardError,
    RewardFunction,
    RewardModelScorer,
    compute_rewards,
    load_reward_fn,
    load_reward_fns,
    reward_terms,
)

PROMPTS = ["What is 1+1?", "What is 2+3?", "What is 4+4?"]
COMPLETIONS = [" 2", " 6", " 8"]
COLUMNS = {"answer": ["2", "5", "8"]}


# ---- user functions (imported by spec from this module) -----------------------------------------------------
def length_reward(prompts, completions, **columns):
    return [float(len(c)) for c in completions]


def answer_seen(prompts, completions, answer, **columns):
    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer, strict=True)]


def raises_on_six(prompts, completions, **columns):
    return [1.0 / (0 if "6" in c else 1) for c in completions]


def too_short(prompts, completions, **columns):
    return [0.0] * (len(completions) - 1)


def nan_on_second(prompts, completions, **columns):
    return [0.0, math.nan, 0.0][: len(completions)]


def inf_on_last(prompts, completions, **columns):
    return [0.0] * (len(completions) - 1) + [math.inf]


def not_a_number(prompts, completions, **columns):
    return [0.0, "good", 1.0][: len(completions)]


NOT_CALLABLE = 3


def _fn(name: str, weight: float = 1.0) -> RewardFunction:
    return load_reward_fn(f"{__name__}:{name}", weight)


def test_task_spec_is_the_built_in_verifier():
    fn = load_reward_fn("task:arithmetic")
    assert fn.is_verifier and fn.name == "task:arithmetic"
    assert compute_rewards([fn], PROMPTS, COMPLETIONS, COLUMNS).tolist() == [1.0, 0.0, 1.0]
    # without the answer column the task recomputes the answer from the prompt
    assert compute_rewards([fn], PROMPTS, COMPLETIONS).tolist() == [1.0, 0.0, 1.0]


def test_module_function_gets_the_columns_and_weights_sum():
    fns = load_reward_fns([f"{__name__}:answer_seen", f"{__name__}:length_reward"], [2.0, 0.5])
    assert [f.is_verifier for f in fns] == [False, False]
    terms = reward_terms(fns, PROMPTS, COMPLETIONS, COLUMNS)
    assert terms[fns[0].name].tolist() == [1.0, 0.0, 1.0]
    total = compute_rewards(fns, PROMPTS, COMPLETIONS, COLUMNS)
    assert total.dtype == torch.float32 and total.shape == (3,)
    assert total.tolist() == [2.0 + 1.0, 0.0 + 1.0, 2.0 + 1.0]


def test_file_spec_and_duplicate_names(tmp_path):
    file = tmp_path / "my_rewards.py"
    file.write_text(
        "def shout(prompts, completions, **kw):\n    return [c.count('!') for c in completions]\n"
    )
    fns = load_reward_fns([f"{file}:shout", f"{file}:shout"])
    assert len({f.name for f in fns}) == 2
    assert compute_rewards(fns, ["a", "b"], ["!!", "?"]).tolist() == [4.0, 0.0]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_xyz:fn", "cannot import module"),
        (f"{__name__}:missing", "has no attribute 'missing'"),
        (f"{__name__}:NOT_CALLABLE", "not a function"),
        ("justaname", "expected 'module:function'"),
        ("rm:/nonexistent/rm", "no reward-model folder"),
        ("task:nope", "unknown task"),
    ],
)
def test_bad_specs_are_user_errors(spec, message):
    with pytest.raises(Exception, match=message) as info:
        load_reward_fns([spec])
    from postrl.runtime.errors import UserError

    assert isinstance(info.value, UserError)


def test_weights_must_match_specs():
    with pytest.raises(RewardError, match=r"reward_weights has 1 weight\(s\) for 2 reward function\(s\)"):
        load_reward_fns(["task:arithmetic", "task:arithmetic"], [1.0])


def test_a_raising_function_names_itself_and_the_failing_sample():
    with pytest.raises(RewardError) as info:
        compute_rewards([_fn("raises_on_six")], PROMPTS, COMPLETIONS, COLUMNS)
    text = str(info.value)
    assert "raises_on_six" in text and "ZeroDivisionError" in text
    assert "sample 1" in text and "What is 2+3?" in text and "' 6'" in text


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("too_short", "returned 2 values for 3 completions"),
        ("nan_on_second", "returned nan for sample 1"),
        ("inf_on_last", "returned inf for sample 2"),
        ("not_a_number", "returned 'good', not a number, for sample 1"),
    ],
)
def test_bad_values_stop_with_the_function_and_sample(name, message):
    with pytest.raises(RewardError, match=message) as info:
        compute_rewards([_fn(name)], PROMPTS, COMPLETIONS, COLUMNS)
    assert name in str(info.value)


def test_reward_model_spec_scores_prompt_completion_eos_at_the_last_token(tiny_lm, tiny_tokenizer, tmp_path):
    from postrl.lm.models import ScalarHeadModel

    rm = ScalarHeadModel.from_causal_lm(copy.deepcopy(tiny_lm), seed=3)
    rm.save_pretrained(tmp_path / "rm")
    tiny_tokenizer.save_pretrained(str(tmp_path / "rm"))
    fn = load_reward_fn(f"rm:{tmp_path / 'rm'}")
    got = compute_rewards([fn], PROMPTS, COMPLETIONS)
    # independent: each sample alone, no padding, the value at the EOS position
    for i, (p, c) in enumerate(zip(PROMPTS, COMPLETIONS, strict=True)):
        ids = tiny_tokenizer(p + c, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([ids + [tiny_tokenizer.eos_token_id]])
        with torch.no_grad():
            expected = rm(ids, torch.ones_like(ids))[0, -1]
        assert float(got[i]) == pytest.approx(float(expected), abs=1e-5)
    small = RewardModelScorer(fn.fn.model, fn.fn.tokenizer, batch_size=1)
    assert small(PROMPTS, COMPLETIONS) == pytest.approx(got.tolist(), abs=1e-5)


# ---- a user's reward file: every mistake is named before training ---------------------------------------------
def _file(tmp_path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


GOOD_BODY = "    return [0.0 for _ in completions]\n"


def test_a_file_that_does_not_exist(tmp_path):
    with pytest.raises(RewardError, match=r"reward spec '.*nope.py:fn': no such file .*nope.py"):
        load_reward_fns([f"{tmp_path / 'nope.py'}:fn"])


def test_a_syntax_error_names_the_file_and_line(tmp_path):
    path = _file(tmp_path, "broken.py", "import math\n\ndef reward(prompts, completions, **kw)\n" + GOOD_BODY)
    with pytest.raises(RewardError, match=rf"'{path}:reward': {path}:3: SyntaxError"):
        load_reward_fns([f"{path}:reward"])


def test_a_missing_module_is_named(tmp_path):
    path = _file(tmp_path, "needs.py", "import postrl_no_such_module\n")
    with pytest.raises(RewardError, match=r"needs.py imports module 'postrl_no_such_module', which is not"):
        load_reward_fns([f"{path}:reward"])
    with pytest.raises(RewardError, match=r"cannot import module 'postrl_no_such_module': no such module"):
        load_reward_fns(["postrl_no_such_module:reward"])
    # a module that exists but imports a missing one: the missing one is named, not the module
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(RewardError, match=r"needs imports module 'postrl_no_such_module'"):
            load_reward_fns(["needs:reward"])
    finally:
        sys.path.remove(str(tmp_path))


def test_an_error_while_importing_names_the_line(tmp_path):
    path = _file(tmp_path, "raises.py", "x = 1\ny = {}['key']\n")
    with pytest.raises(RewardError, match=rf"importing {path} raised KeyError at {path}:2"):
        load_reward_fns([f"{path}:reward"])


def test_a_missing_function_names_the_close_ones(tmp_path):
    path = _file(tmp_path, "good.py", "def reward(prompts, completions, **kw):\n" + GOOD_BODY)
    with pytest.raises(
        RewardError, match=r"good.py:rewards': .*good.py has no attribute 'rewards'; did you mean reward\?"
    ):
        load_reward_fns([f"{path}:rewards"])
    with pytest.raises(RewardError, match=r"has no attribute 'nope'; its functions: reward"):
        load_reward_fns([f"{path}:nope"])


def test_an_object_that_is_not_callable(tmp_path):
    path = _file(tmp_path, "not_callable.py", "reward = 3\n")
    with pytest.raises(RewardError, match=r"not_callable.py:reward': reward is a int, not a function"):
        load_reward_fns([f"{path}:reward"])


@pytest.mark.parametrize(
    ("source", "columns", "message"),
    [
        ("def r(x):\n", None, r"as fn\(prompts, completions, \*\*columns\): too many positional"),
        ("def r(completions, **kw):\n", None, "too many positional arguments"),
        ("def r(prompts, completions, answer, /):\n", None, "'answer' is positional-only"),
        ("def r(prompts, completions, answer):\n", ["id"], r"\(id\): missing a required argument: 'answer'"),
        ("def r(prompts, completions, answer):\n", ["answer", "id"], "unexpected keyword argument 'id'"),
    ],
)
def test_a_signature_that_cannot_take_the_call_is_refused_at_load(tmp_path, source, columns, message):
    path = _file(tmp_path, "sig.py", source + GOOD_BODY)
    with pytest.raises(RewardError, match=message) as info:
        load_reward_fns([f"{path}:r"], columns=columns)
    assert str(info.value).startswith(f"reward function {path}:r")


def test_signatures_that_take_the_call_load(tmp_path):
    path = _file(
        tmp_path,
        "ok.py",
        "def a(prompts, completions, **kw):\n"
        + GOOD_BODY
        + "def b(prompts, completions, answer):\n"
        + GOOD_BODY
        + "def c(*args, **kw):\n"
        + GOOD_BODY
        + "def d(prompts, completions, answer=None, **kw):\n"
        + GOOD_BODY,
    )
    assert len(load_reward_fns([f"{path}:{n}" for n in "abcd"])) == 4
    assert len(load_reward_fns([f"{path}:b"], columns=["answer"])) == 1
    assert len(load_reward_fns([f"{path}:{n}" for n in "acd"], columns=["answer", "id"])) == 3


def test_a_reward_model_folder_without_a_head_is_named(tiny_lm_dir):
    with pytest.raises(RewardError, match=r"reward spec 'rm:.*': .*value_head.safetensors not found"):
        load_reward_fns([f"rm:{tiny_lm_dir}"])


def test_weights_must_be_finite_numbers():
    with pytest.raises(RewardError, match="reward weights must be finite numbers; got nan"):
        load_reward_fns(["task:arithmetic"], [math.nan])


def test_a_reward_file_may_define_a_dataclass(tmp_path):
    """A file loaded by path runs as a registered module (dataclasses look their module up by name)."""
    path = tmp_path / "with_dataclass.py"
    path.write_text(
        "from dataclasses import dataclass\n\n@dataclass\nclass Weights:\n    bonus: float = 1.0\n\n"
        "def reward(prompts, completions, **kw):\n    return [Weights().bonus] * len(completions)\n"
    )
    (fn,) = load_reward_fns([f"{path}:reward"])
    assert fn.fn(["p"], ["c"]) == [1.0]
