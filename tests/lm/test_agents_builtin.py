"""Built-in multi-turn environments (issue #35 item 4): calculator, guess the number, Gymnasium as text."""

import json
import math
import random

import gymnasium as gym
import pytest

from postrl.lm.agents import AgentError, CalculatorEnv, EpisodeBudget, carrying_sum, make_env, run_episode
from postrl.lm.agents.config import HELDOUT_SEED
from postrl.lm.agents.games import carries


def scripted(replies):
    replies = list(replies)
    return lambda messages, max_new_tokens: replies.pop(0)


def test_carrying_sums_carry():
    assert carries(47, 38) and carries(95, 5) and not carries(12, 34) and not carries(0, 0)
    rng = random.Random(0)
    for _ in range(200):
        a, b = carrying_sum(rng, 2)
        assert 10 <= a <= 99 and 10 <= b <= 99
        assert any(int(x) + int(y) >= 10 for x, y in zip(str(a)[::-1], str(b)[::-1], strict=True))


def test_calculator_rewards_the_right_final_answer_after_a_tool_call():
    env = make_env("calculator")
    messages, _ = env.reset(seed=7)
    a, b = map(int, messages[0]["content"].removeprefix("What is ").removesuffix("?").split("+"))
    assert carries(a, b)

    def policy(conversation, max_new_tokens):
        if conversation[-1]["role"] == "tool":
            return f"The answer is {conversation[-1]['content']}."
        return "<tool_call>" + json.dumps({"name": "add", "arguments": {"a": a, "b": b}}) + "</tool_call>"

    ep = run_episode(env, policy, seed=7)
    assert ep.rewards == [0.0, 1.0] and ep.terminated
    assert ep.messages[2] == {"role": "tool", "name": "add", "content": str(a + b)}
    wrong = run_episode(env, scripted([f"{a + b + 1}"]), seed=7)
    assert wrong.rewards == [0.0] and wrong.terminated
    row = run_episode(env, scripted(["12"]), options={"prompt": "What is 5+7?", "answer": 12})
    assert row.rewards == [1.0]
    with pytest.raises(AgentError, match="digits must be >= 1"):
        CalculatorEnv(digits=0)


def test_guess_number_bisection_solves_it_with_a_hint_every_turn():
    env = make_env("guess_number")
    for seed in range(5):
        lo, hi = 1, 100

        def bisect(conversation, max_new_tokens):
            nonlocal lo, hi
            last = conversation[-1]["content"] if len(conversation) > 1 else ""
            if "higher" in last:
                lo = int(last.split()[0]) + 1
            elif "lower" in last:
                hi = int(last.split()[0]) - 1
            return str((lo + hi) // 2)

        ep = run_episode(env, bisect, EpisodeBudget(max_turns=10), seed=seed)
        assert ep.terminated and ep.rewards[-1] == 1.0 and len(ep.actions) <= 7
        assert all(r == 0.0 for r in ep.rewards[:-1])
        assert all(("higher" in m["content"]) != ("lower" in m["content"]) for m in ep.messages[2::2])


def test_guess_number_penalises_guesses_the_hints_ruled_out():
    env = make_env("guess_number", low=1, high=10, penalty=0.5)
    env.reset(seed=0)
    secret = env.secret
    low_guess = 1 if secret != 1 else 10
    _, r1, *_ = env.step(str(low_guess))
    _, r2, *_ = env.step(str(low_guess))  # ruled out by the first hint
    _, r3, *_ = env.step("no idea")
    _, r4, terminated, *_ = env.step(f"it is {secret}")
    assert (r1, r2, r3, r4, terminated) == (0.0, -0.5, -0.5, 1.0, True)


def secrets(env, seeds):
    drawn = set()
    for seed in seeds:
        env.reset(seed=seed)
        drawn.add(env.secret)
    return drawn


def test_guess_number_holds_out_secrets_the_training_seeds_never_draw():
    env = make_env("guess_number", high=15)
    heldout = secrets(env, range(HELDOUT_SEED, HELDOUT_SEED + 1000))
    assert heldout == {5, 10, 15} and secrets(env, range(1000)) == set(range(1, 16)) - heldout
    whole = make_env("guess_number", high=15, heldout_every=0)
    assert secrets(whole, range(HELDOUT_SEED, HELDOUT_SEED + 1000)) == set(range(1, 16))
    with pytest.raises(AgentError, match="no heldout secret in \\[1, 4\\] with heldout_every=5"):
        make_env("guess_number", high=4)
    with pytest.raises(AgentError, match="no train secret"):
        make_env("guess_number", high=4, heldout_every=1)


def test_guess_number_interval_reward_is_the_share_of_information_each_hint_wins():
    env = make_env("guess_number", high=15, reward="interval", penalty=0.5)
    env.reset(seed=0)
    env.secret = 3  # bisection: 8 leaves [1, 7], 4 leaves [1, 3], 2 leaves [3, 3], then 3
    rewards = [env.step(g)[1] for g in ("8", "4", "9", "2", "3")]
    ln = math.log
    expected = [ln(15 / 7) / ln(15), ln(7 / 3) / ln(15), -0.5, ln(3 / 1) / ln(15), 0.0]
    assert rewards == pytest.approx(expected, abs=1e-12)
    assert sum(r for r in rewards if r >= 0) == pytest.approx(1.0)  # a solved episode earns 1 in all
    env.reset(seed=0)
    env.secret = 3
    assert env.step("3")[1:3] == (1.0, True)  # solved at once: all the information in one turn
    with pytest.raises(AgentError, match="reward must be one of success, interval"):
        make_env("guess_number", reward="bits")


def test_frozenlake_as_text_reaches_the_goal():
    env = make_env("frozenlake")
    messages, _ = env.reset(seed=0)
    assert "[S]FFF" in messages[0]["content"] and "left, down, right, up" in messages[0]["content"]
    path = ["down", "Down.", "I go right", "right", "down", "move: right"]
    ep = run_episode(env, scripted(path), seed=0)
    assert ep.terminated and ep.rewards == [0.0] * 5 + [1.0]
    assert [info["action"] for info in ep.infos] == [1, 1, 2, 2, 1, 2]


def test_a_reply_without_an_action_costs_the_turn_not_a_step():
    env = make_env("frozenlake")
    env.reset(seed=0)
    observation, reward, terminated, truncated, info = env.step("hmm")
    assert info == {"invalid": True} and (reward, terminated, truncated) == (0.0, False, False)
    assert "Reply with one of: left, down, right, up" in observation[0]["content"]
    assert env.env.unwrapped.s == 0


@pytest.mark.parametrize("env_id", ["cliffwalking", "taxi", "gym:CartPole-v1"])
def test_gym_text_env_steps_as_gymnasium_does(env_id):
    env = make_env(env_id)
    gym_id = env.env_id
    reference = gym.make(gym_id)
    state, _ = reference.reset(seed=3)
    messages, _ = env.reset(seed=3)
    assert f"state {state}" in messages[0]["content"]
    rng = random.Random(0)
    for _ in range(12):
        action = rng.randrange(env.n_actions)
        reply = f"I choose {env.names[action] if env.names else action}"
        observation, reward, terminated, truncated, _ = env.step(reply)
        state, ref_reward, ref_terminated, ref_truncated, _ = reference.step(action)
        assert (reward, terminated, truncated) == (ref_reward, ref_terminated, ref_truncated)
        assert observation[0]["content"].endswith(f"state {state}")
        if terminated or truncated:
            break


def test_unknown_and_unsuitable_environments_are_one_clear_error():
    with pytest.raises(AgentError, match=r"unknown environment 'frozenlak'.*did you mean frozenlake"):
        make_env("frozenlak")
    with pytest.raises(AgentError, match=r"unknown Gymnasium environment 'FrozenLake-v9'.*FrozenLake-v1"):
        make_env("gym:FrozenLake-v9")
    with pytest.raises(AgentError, match=r"Pendulum-v1.*needs a Discrete one"):
        make_env("gym:Pendulum-v1")
    with pytest.raises(AgentError, match="environment 'guess_number'.*unexpected keyword"):
        make_env("guess_number", colour="red")


def test_local_view_shows_the_cells_around_the_agent():
    env = make_env("cliffwalking", view="local")
    messages, _ = env.reset(seed=0)
    assert messages[0]["content"] == (
        "You act in CliffWalking-v1, 4 rows by 12 columns, # off the map.\nrow 3 col 0\n#oo\n#oC\n###\n"
        "Actions: up, right, down, left. Reply with one action."
    )
    steps = [env.step(a) for a in ("up", "right", "down")]
    assert [s[0][0]["content"] for s in steps] == [
        "row 2 col 0\n#oo\n#oo\n#oC",
        "row 2 col 1\nooo\nooo\noCC",
        "row 3 col 0\n#oo\n#oC\n###",  # into the cliff: back to the start
    ]
    assert [s[1] for s in steps] == [-1.0, -1.0, -100.0]
    for action in ["up"] + ["right"] * 11:  # along the cliff's edge to the column of the goal
        observation, *_ = env.step(action)
    assert observation[0]["content"] == "row 2 col 11\noo#\noo#\nCT#"
    assert env.step("down")[1:3] == (-1.0, True)
    lake = make_env("frozenlake", view="local")
    assert "row 0 col 0\n###\n#SF\n#FH\n" in lake.reset(seed=0)[0][0]["content"]
    assert lake.step("right")[0][0]["content"] == "row 0 col 1\n###\nSFF\nFHF"


def test_local_view_needs_a_grid_world_and_worlds_that_charge_a_step_charge_no_action_as_much():
    with pytest.raises(AgentError, match="view 'local' needs a grid world.*Taxi-v4 has no map"):
        make_env("taxi", view="local")
    with pytest.raises(AgentError, match="view must be one of grid, local, got 'map'"):
        make_env("frozenlake", view="map")
    for env_id in ("cliffwalking", "taxi"):
        env = make_env(env_id)
        env.reset(seed=0)
        assert env.step("hmm")[1] == -1.0  # as a step costs: writing no action never pays
    assert make_env("frozenlake").invalid_penalty == 0.0  # no step costs anything there
    assert make_env("cliffwalking", invalid_penalty=0.0).invalid_penalty == 0.0
