"""Text environments, TRL's tool conventions and the episode loop (issue #35 items 1 and 5)."""

import time

import pytest
from transformers.utils import get_json_schema

from postrl.lm.agents import (
    AgentError,
    EpisodeBudget,
    TextEnv,
    ToolEnv,
    call_tool,
    parse_tool_calls,
    run_episode,
    tool_schema,
)


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.

    Returns:
        The product.
    """
    return a * b


def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: The dividend.
        b: The divisor.
    """
    return a / b


def untyped(a, b):
    """Add.

    Args:
        a: x.
        b: y.
    """
    return a + b


class Counter:
    """An environment in the shape of TRL's `environment_factory` example: state, a tool method, a reward."""

    instances = 0

    def __init__(self):
        Counter.instances += 1
        self.counter = 0

    def reset(self, **kwargs):
        self.counter = kwargs.get("start", 0)
        return " Start from the counter."

    def increment(self, step: int) -> int:
        """Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter

    def get_reward(self) -> float:
        return float(self.counter == 5)

    def _private(self) -> None:
        """Not a tool."""


def call(name, **arguments):
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def scripted(replies):
    replies = list(replies)
    return lambda messages, max_new_tokens: replies.pop(0)


# ---- tools -----------------------------------------------------------------------------------------------------


def test_tool_schema_is_transformers_schema():
    assert tool_schema(multiply) == get_json_schema(multiply)
    assert tool_schema(multiply)["function"]["parameters"]["required"] == ["a", "b"]


def test_tool_without_type_hints_is_one_error_naming_it_and_its_file():
    with pytest.raises(AgentError, match=r"tool untyped \(.*test_agents_env.py:\d+\).*missing a type hint"):
        tool_schema(untyped)
    with pytest.raises(AgentError, match="tool untyped"):
        ToolEnv(tools=[untyped], reward_funcs=[lambda **kw: [0.0]])


def test_parse_tool_calls_reads_hermes_calls_and_flags_malformed_ones():
    text = f"thinking {call('multiply', a=2, b=3)} then {call('divide', a=1, b=2)}"
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("multiply", {"a": 2, "b": 3}, None),
        ("divide", {"a": 1, "b": 2}, None),
    ]
    string_args = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>')
    assert string_args[0].arguments == {"x": 1}
    broken = parse_tool_calls("<tool_call>{not json}</tool_call><tool_call>[1]</tool_call>")
    assert [c.error is not None for c in broken] == [True, True]
    assert parse_tool_calls("no call here") == []


def test_a_tool_that_raises_or_hangs_answers_an_error():
    assert call_tool(multiply, {"a": 2, "b": 4}, 1.0) == 8
    assert call_tool(divide, {"a": 1, "b": 0}, 1.0) == {"error": "ZeroDivisionError: division by zero"}
    assert "error" in call_tool(multiply, {"a": 1}, 1.0)  # a missing argument is the tool's TypeError
    start = time.perf_counter()
    out = call_tool(lambda: time.sleep(5), {}, 0.2)
    assert out == {"error": "tool <lambda> timed out after 0.2 s"}
    assert time.perf_counter() - start < 2


# ---- ToolEnv: tools= and environment_factory ---------------------------------------------------------------


def test_environment_factory_public_methods_are_tools_and_each_episode_gets_a_fresh_object():
    env = ToolEnv(environment_factory=Counter)
    assert [s["function"]["name"] for s in env.tools] == ["increment"]
    before = Counter.instances
    messages, _ = env.reset(options={"prompt": "Count to five.", "start": 1})
    assert messages == [{"role": "user", "content": "Count to five. Start from the counter."}]
    observation, reward, terminated, _, info = env.step(call("increment", step=4))
    assert observation == [{"role": "tool", "name": "increment", "content": "5"}]
    assert (reward, terminated, info["tool_calls"]) == (0.0, False, 1)
    _, reward, terminated, _, _ = env.step("done")
    assert (reward, terminated) == (1.0, True)  # get_reward: counter == 5
    env.reset(options={"prompt": "again"})
    assert Counter.instances == before + 2  # one object per episode
    _, _, _, _, _ = env.step(call("increment", step=4))
    _, reward, _, _, _ = env.step("done")
    assert reward == 0.0  # the new episode's counter started from 0: 4 != 5


def test_reward_functions_get_the_environment_objects_as_trl_passes_them():
    def reward_func(completions, environments, **kwargs):
        return [float(env.counter) for env in environments]

    env = ToolEnv(environment_factory=Counter, reward_funcs=[reward_func])
    env.reset(options={"prompt": [{"role": "user", "content": "Add three."}], "start": 2})
    env.step(call("increment", step=3))
    _, reward, terminated, _, _ = env.step("done")
    assert terminated and reward == 5.0 + 1.0  # the reward function's 5, get_reward's 1 (counter == 5)


def test_tool_errors_are_observations_and_the_episode_goes_on():
    env = ToolEnv(
        tools=[multiply, divide], reward_funcs=[lambda completions, **kw: [float(len(completions[0]))]]
    )
    env.reset(options={"prompt": "go"})
    reply = (
        call("divide", a=1, b=0) + call("nope") + "<tool_call>{oops</tool_call>" + call("multiply", a=3, b=3)
    )
    observation, _, terminated, _, info = env.step(reply)
    contents = [m["content"] for m in observation]
    assert contents[0] == "{'error': 'ZeroDivisionError: division by zero'}"
    assert contents[1] == "{'error': 'Tool nope not found.'}"
    assert contents[2].startswith("{'error': 'tool call is not valid JSON")
    assert contents[3] == "9"
    assert not terminated and info == {"tool_calls": 4, "tool_failures": 3}
    # the reward functions get TRL's conversational completion: the assistant turns and tool results
    _, reward, terminated, _, _ = env.step("the end")
    assert terminated and reward == 6.0


def test_no_reward_source_and_no_reset_are_errors():
    with pytest.raises(AgentError, match="no reward source"):
        ToolEnv(tools=[multiply])

    class NoReset:
        def get_reward(self) -> float:
            return 0.0

    with pytest.raises(AgentError, match="must return an object with a callable reset"):
        ToolEnv(environment_factory=NoReset)


# ---- the episode loop -------------------------------------------------------------------------------------------


class Corridor(TextEnv):
    """Walk right n times; reward 1 per step, the episode ends at the wall."""

    def __init__(self, length=3, broken_at=None):
        self.length, self.broken_at = length, broken_at

    def reset(self, seed=None, options=None):
        self.pos = 0
        return "walk", {}

    def step(self, action):
        if self.pos == self.broken_at:
            raise RuntimeError("the floor gave way")
        self.pos += action == "right"
        return f"at {self.pos}", 1.0, self.pos == self.length, False, {}

    def truncation_reward(self):
        return 10.0


def test_run_episode_plays_to_the_end():
    ep = run_episode(Corridor(), scripted(["right", "left", "right", "right"]))
    assert ep.actions == ["right", "left", "right", "right"] and ep.rewards == [1.0] * 4
    assert ep.terminated and not ep.truncated and ep.prompt_len == 1
    roles = [m["role"] for m in ep.messages]
    assert roles == ["user", "assistant", "user", "assistant", "user", "assistant", "user", "assistant"]


def test_run_episode_truncates_at_the_turn_and_token_budgets():
    ep = run_episode(Corridor(), scripted(["left"] * 9), EpisodeBudget(max_turns=2))
    assert ep.truncated and not ep.terminated and ep.rewards == [1.0, 11.0]  # truncation reward added last
    budgets = []

    def policy(messages, max_new_tokens):
        budgets.append(max_new_tokens)
        return "left"

    ep = run_episode(Corridor(), policy, EpisodeBudget(max_turns=9, max_tokens=10))
    assert budgets == [10, 6, 2] and ep.tokens == 12 and ep.truncated


def test_an_environment_whose_step_raises_is_one_clear_error():
    with pytest.raises(AgentError) as err:
        run_episode(Corridor(broken_at=1), scripted(["right", "right"]))
    message = str(err.value)
    assert "environment Corridor (" in message and "test_agents_env.py:" in message
    assert "RuntimeError: the floor gave way on turn 1 with the action 'right'" in message


def test_an_environment_whose_reset_raises_is_one_clear_error():
    class Broken(Corridor):
        def reset(self, seed=None, options=None):
            raise KeyError("no map")

    with pytest.raises(
        AgentError, match=r"environment Broken \(.*test_agents_env.py:\d+\): reset raised KeyError"
    ):
        run_episode(Broken(), scripted(["right"]), seed=3)


def test_budget_must_be_positive():
    with pytest.raises(AgentError, match="max_turns must be >= 1"):
        EpisodeBudget(max_turns=0)
