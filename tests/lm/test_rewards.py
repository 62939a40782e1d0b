"""Reward functions: loading the three kinds of spec, weighted sums, and the errors a bad function gets."""

from __future__ import annotations

import asyncio
import copy
import math

import pytest
import torch

from postrl.lm.rewards import (
    RewardError,
    RewardFunction,
    RewardModelScorer,
    TrainerState,
    completion_ids_of,
    compute_rewards,
    load_reward_fn,
    load_reward_fns,
    reward_terms,
    unscored,
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


def nan_on_second(prompts, completions, **columns):  # NaN is an error: None says "no reward"
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
    # TRL's conversational completions score as their text
    messages = [[{"role": "assistant", "content": c}] for c in COMPLETIONS]
    assert small(prompts=PROMPTS, completions=messages, completion_ids=None) == pytest.approx(
        got.tolist(), abs=1e-5
    )


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
        ("def r(x):\n", None, r"as fn\(prompts=, completions=, .*unexpected keyword argument 'prompts'"),
        # postrl passes TRL's keywords: a function without **kwargs must name each of them
        ("def r(prompts, completions, answer):\n", None, "unexpected keyword argument 'completion_ids'"),
        ("def r(answer, /, **kw):\n", None, "'answer' is positional-only"),
        ("def r(completions, answer, **kw):\n", ["id"], r"\(id\): missing a required argument: 'answer'"),
        (
            "def r(prompts, completions, completion_ids, trainer_state, answer):\n",
            ["answer", "id"],
            "unexpected keyword argument 'id'",
        ),
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
        + "def b(prompts, completions, completion_ids, trainer_state, answer):\n"
        + GOOD_BODY
        + "def c(*args, **kw):\n"
        + GOOD_BODY
        + "def d(prompts, completions, answer=None, **kw):\n"
        + GOOD_BODY
        + "def e(completions, **kwargs):\n"
        + GOOD_BODY
        + "async def f(completions, answer, **kwargs):\n"
        + GOOD_BODY,
    )
    assert len(load_reward_fns([f"{path}:{n}" for n in "abcdef"])) == 6
    assert len(load_reward_fns([f"{path}:{n}" for n in "bf"], columns=["answer"])) == 2
    assert len(load_reward_fns([f"{path}:{n}" for n in "acdef"], columns=["answer", "id"])) == 5


def test_a_reward_model_folder_without_a_head_is_named(tiny_lm_dir):
    with pytest.raises(
        RewardError, match=r"reward spec 'rm:.*': .*not a reward model: it has neither postrl's value_head"
    ):
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


# ---- TRL's reward-function convention, with TRL's documented examples ------------------------------------------
# Sources: TRL v1.9.0 docs/source/grpo_trainer.md, "Using a custom reward function" (Examples 1-5) and the
# GRPO quickstart's reward_len; the function bodies are TRL's, each in a file of its own as a user would have it.
TRL_EXAMPLES = {
    "quickstart_len.py": (
        "def reward_len(completions, **kwargs):\n"
        "    return [-abs(20 - len(completion)) for completion in completions]\n"
    ),
    "example_1.py": (
        "def reward_func(completion_ids, **kwargs):\n"
        '    """Reward function that assigns higher scores to longer completions (in terms of token count)."""\n'
        "    return [float(len(ids)) for ids in completion_ids]\n"
    ),
    "example_1_1.py": (
        "def reward_func(completions, **kwargs):\n"
        '    """Reward function that assigns higher scores to longer completions (in terms of character count)."""\n'
        "    return [float(len(completion)) for completion in completions]\n"
    ),
    "example_2.py": (
        "import re\n\n"
        "def format_reward_func(completions, **kwargs):\n"
        '    """Reward function that checks if the completion has a specific format."""\n'
        '    pattern = r"^<think>.*?</think><answer>.*?</answer>$"\n'
        '    completion_contents = [completion[0]["content"] for completion in completions]\n'
        "    matches = [re.match(pattern, content) for content in completion_contents]\n"
        "    return [1.0 if match else 0.0 for match in matches]\n"
    ),
    "example_3.py": (
        "import re\n\n"
        "def reward_func(completions, ground_truth, **kwargs):\n"
        "    # Regular expression to capture content inside \\boxed{}\n"
        '    matches = [re.search(r"\\\\boxed\\{(.*?)\\}", completion) for completion in completions]\n'
        '    contents = [match.group(1) if match else "" for match in matches]\n'
        "    # Reward 1 if the content is the same as the ground truth, 0 otherwise\n"
        "    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]\n"
    ),
    # Example 4 as printed, with the two helpers it leaves to the reader; its coding function tests
    # t == "coding" while the data says "code", so the code rows get None from both functions
    "example_4.py": (
        "def check_math_solution(prompt, completion):\n"
        "    return completion.strip() == str(eval(prompt.removeprefix('What is ').removesuffix('?')))\n\n"
        "def test_code_solution(prompt, completion):\n"
        "    return 'return' in completion\n\n"
        "def math_reward_func(prompts, completions, task, **kwargs):\n"
        "    rewards = []\n"
        "    for prompt, completion, t in zip(prompts, completions, task):\n"
        '        if t == "math":\n'
        "            # Calculate math-specific reward\n"
        "            correct = check_math_solution(prompt, completion)\n"
        "            reward = 1.0 if correct else -1.0\n"
        "            rewards.append(reward)\n"
        "        else:\n"
        "            # Return None for non-math tasks\n"
        "            rewards.append(None)\n"
        "    return rewards\n\n"
        "def coding_reward_func(prompts, completions, task, **kwargs):\n"
        "    rewards = []\n"
        "    for prompt, completion, t in zip(prompts, completions, task):\n"
        '        if t == "coding":\n'
        "            # Calculate coding-specific reward\n"
        "            works = test_code_solution(prompt, completion)\n"
        "            reward = 1.0 if works else -1.0\n"
        "            rewards.append(reward)\n"
        "        else:\n"
        "            # Return None for non-coding tasks\n"
        "            rewards.append(None)\n"
        "    return rewards\n"
    ),
    "example_5.py": (
        "import asyncio\n\n"
        "async def async_reward_func(prompts, completions, **kwargs):\n"
        "    # Simulate an I/O-bound call (e.g., HTTP request, database lookup)\n"
        "    await asyncio.sleep(0.01)\n"
        "    # Simple toy reward: 1.0 if the completion is non-empty, else 0.0\n"
        "    return [1.0 if completion else 0.0 for completion in completions]\n"
    ),
}


def _trl(tmp_path, spec: str, columns=None, weight: float = 1.0) -> RewardFunction:
    file, _, name = spec.partition(":")
    path = _file(tmp_path, file, TRL_EXAMPLES[file])
    return load_reward_fn(f"{path}:{name}", weight, columns=columns)


def test_trl_quickstart_reward_len_takes_the_keyword_call(tmp_path):
    """The issue's failure: TRL's quickstart function got 'takes 1 positional argument but 2 were given'."""
    fn = _trl(tmp_path, "quickstart_len.py:reward_len", columns=["answer"])
    got = compute_rewards([fn], PROMPTS, [" 2", "x" * 20, "x" * 25], COLUMNS)
    assert got.tolist() == [-18.0, 0.0, -5.0]


def test_trl_example_1_token_length_reads_completion_ids(tmp_path):
    fn = _trl(tmp_path, "example_1.py:reward_func")
    prompts, completions = ["The sky is", "The sun is"], [" blue.", " in the sky."]
    got = compute_rewards([fn], prompts, completions, completion_ids=[[6303, 13], [304, 279, 12884, 13]])
    assert got.tolist() == [2.0, 4.0]
    # tensors of ids (a rollout's rows) are passed as lists of ints
    ids = [torch.tensor([6303, 13]), torch.tensor([304, 279, 12884, 13])]
    assert compute_rewards([fn], prompts, completions, completion_ids=ids).tolist() == [2.0, 4.0]
    with pytest.raises(RewardError, match="raised TypeError.*this caller passed no completion_ids"):
        compute_rewards([fn], prompts, completions)


def test_completion_ids_of_a_rollout_keep_eos_and_drop_padding():
    response_ids = torch.tensor([[5, 6, 2, 0], [7, 0, 0, 0], [8, 9, 10, 11]])  # eos 2, pad 0
    response_mask = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    assert completion_ids_of(response_ids, response_mask) == [[5, 6, 2], [], [8, 9, 10, 11]]


def test_trl_example_1_1_character_length(tmp_path):
    fn = _trl(tmp_path, "example_1_1.py:reward_func")
    got = compute_rewards(
        [fn],
        ["The sky is", "The sun is"],
        [" blue.", " in the sky."],
        completion_ids=[[6303, 13], [304, 279]],
    )
    assert got.tolist() == [6.0, 12.0]


def test_trl_example_2_conversational_completions_are_message_lists(tmp_path):
    """Conversational prompts: postrl decodes text, the function reads completion[0]["content"] as in TRL."""
    fn = _trl(tmp_path, "example_2.py:format_reward_func")
    prompts = [
        [{"role": "assistant", "content": "What is the result of (1 + 2) * 4?"}],
        [{"role": "assistant", "content": "What is the result of (3 + 1) * 2?"}],
    ]
    texts = [
        "<think>The sum of 1 and 2 is 3, which we multiply by 4 to get 12.</think><answer>(1 + 2) * 4 = 12</answer>",
        "The sum of 3 and 1 is 4, which we multiply by 2 to get 8. So (3 + 1) * 2 = 8.",
    ]
    assert compute_rewards([fn], prompts, texts).tolist() == [1.0, 0.0]
    # completions already in TRL's form are passed as they are
    messages = [[{"role": "assistant", "content": t}] for t in texts]
    assert compute_rewards([fn], prompts, messages).tolist() == [1.0, 0.0]
    # the same function on text prompts gets strings: completion[0] is a character, as it would be in TRL
    with pytest.raises(RewardError, match=r"format_reward_func raised TypeError.*sample 0"):
        compute_rewards([fn], ["q1", "q2"], texts)


def test_trl_example_3_reads_the_ground_truth_column(tmp_path):
    fn = _trl(tmp_path, "example_3.py:reward_func", columns=["ground_truth"])
    prompts = [
        "Problem: Solve the equation $2x + 3 = 7$. Solution:",
        "Problem: Solve the equation $3x - 5 = 10$.",
    ]
    completions = [r" The solution is \boxed{2}.", r" The solution is \boxed{6}."]
    got = compute_rewards([fn], prompts, completions, {"ground_truth": ["2", "5"]})
    assert got.tolist() == [1.0, 0.0]
    with pytest.raises(RewardError, match=r"\(none\): missing a required argument: 'ground_truth'"):
        _trl(tmp_path, "example_3.py:reward_func", columns=[])


def test_trl_example_4_none_rewards_are_left_out_of_the_sum(tmp_path, caplog):
    math_fn = _trl(tmp_path, "example_4.py:math_reward_func", columns=["task"], weight=2.0)
    code_fn = _trl(tmp_path, "example_4.py:coding_reward_func", columns=["task"], weight=0.5)
    prompts = ["What is 2+2?", "Write a function that returns the sum of two numbers.", "What is 3*4?"]
    completions = [" 4", " def f(a, b): return a + b", " 13"]
    columns = {"task": ["math", "code", "math"]}
    terms = reward_terms([math_fn, code_fn], prompts, completions, columns)
    assert terms[math_fn.name][[0, 2]].tolist() == [1.0, -1.0] and terms[math_fn.name][1].isnan()
    assert terms[code_fn.name].isnan().all()  # the printed example's "coding" never matches "code"
    with caplog.at_level("WARNING", logger="postrl.lm.rewards"):
        total = compute_rewards([math_fn, code_fn], prompts, completions, columns)
    # math rows: only the math function's weighted value; the code row, scored by none: 0, with a warning
    assert total.tolist() == [2.0, 0.0, -2.0]
    assert "every reward function returned None for 1 of 3 samples (first: sample 1:" in caplog.text
    assert unscored(terms).tolist() == [False, True, False]


def test_trl_example_5_async_functions_are_awaited(tmp_path):
    fn = _trl(tmp_path, "example_5.py:async_reward_func")
    assert compute_rewards([fn], ["a", "b"], ["yes", ""]).tolist() == [1.0, 0.0]


def test_a_none_reward_leaves_the_other_functions_weighted_sum():
    fns = [
        RewardFunction("half", lambda completions, **kw: [1.0, None, None], 0.5),
        RewardFunction("two", lambda completions, **kw: [3.0, 4.0, None], 2.0),
        RewardFunction("one", lambda completions, **kw: [None, 1.0, None], 1.0),
    ]
    assert compute_rewards(fns, ["a", "b", "c"], ["x", "y", "z"]).tolist() == [6.5, 9.0, 0.0]


# two async functions that each wait for the other: only a concurrent run (asyncio.gather) finishes
async def waits_for_b(completions, **kwargs):
    EVENTS["a"].set()
    await asyncio.wait_for(EVENTS["b"].wait(), 5)
    return [1.0] * len(completions)


async def waits_for_a(completions, **kwargs):
    EVENTS["b"].set()
    await asyncio.wait_for(EVENTS["a"].wait(), 5)
    return [2.0] * len(completions)


async def async_raises_on_six(prompts, completions, **kwargs):
    await asyncio.sleep(0)
    return [1.0 / (0 if "6" in c else 1) for c in completions]


EVENTS: dict[str, asyncio.Event] = {}


def test_async_functions_run_concurrently_also_inside_a_running_loop():
    def score():
        EVENTS.update(a=asyncio.Event(), b=asyncio.Event())
        return compute_rewards([_fn("waits_for_b"), _fn("waits_for_a")], PROMPTS, COMPLETIONS)

    assert score().tolist() == [3.0] * 3

    async def notebook_cell():  # a reward call from code that already runs an event loop (Jupyter)
        return score()

    assert asyncio.run(notebook_cell()).tolist() == [3.0] * 3


def test_an_async_function_that_raises_names_itself_and_the_sample():
    with pytest.raises(
        RewardError,
        match=r"async_raises_on_six \(.*test_rewards.py:async_raises_on_six\) raised ZeroDivisionError.*on sample 1: ",
    ):
        compute_rewards([_fn("async_raises_on_six")], PROMPTS, COMPLETIONS, COLUMNS)


def reads_trainer_state(completions, trainer_state, **kwargs):
    return [trainer_state.global_step / trainer_state.max_steps] * len(completions)


def test_trainer_state_is_passed_for_curriculum_rewards():
    state = TrainerState(global_step=3, max_steps=12)
    assert (
        compute_rewards([_fn("reads_trainer_state")], PROMPTS, COMPLETIONS, trainer_state=state).tolist()
        == [0.25] * 3
    )


def test_every_argument_is_passed_by_keyword_with_the_columns():
    seen = {}

    def spy(**kwargs):
        seen.update(kwargs)
        return [0.0] * len(kwargs["completions"])

    chat = [[{"role": "system", "content": "s"}, {"role": "user", "content": p}] for p in PROMPTS]
    compute_rewards(
        [RewardFunction("spy", spy)], chat, COMPLETIONS, COLUMNS, completion_ids=[[5], [6], [7, 8]]
    )
    assert sorted(seen) == ["answer", "completion_ids", "completions", "prompts", "trainer_state"]
    assert seen["prompts"] == chat and seen["answer"] == COLUMNS["answer"]
    assert seen["completions"] == [[{"role": "assistant", "content": c}] for c in COMPLETIONS]
    assert seen["completion_ids"] == [[5], [6], [7, 8]] and seen["trainer_state"] is None


def test_a_column_named_like_a_call_keyword_is_refused():
    with pytest.raises(RewardError, match="column named 'completion_ids'.*rename the column"):
        compute_rewards([_fn("length_reward")], PROMPTS, COMPLETIONS, {"completion_ids": [1, 2, 3]})
    with pytest.raises(ValueError, match="'completion_ids' has 2 values for 3 completions"):
        compute_rewards([_fn("length_reward")], PROMPTS, COMPLETIONS, completion_ids=[[1], [2]])
