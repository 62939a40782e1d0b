"""TRL's documented ``environment_factory`` examples run unchanged through ``postrl.grpo`` (issue #35).

The environment classes and the dataset are TRL's docs/source/grpo_trainer.md ("Agent Training" >
"Environments" and "Providing an external dataset"), copied verbatim into `tests.lm.trl_docs` (what differs is
said there). What is replaced in the calls: ``model="Qwen/Qwen3-0.6B"`` by the built-in tiny Llama
(`postrl/lm/base_model`), ``GRPOTrainer(..., args=GRPOConfig(max_steps=1000, chat_template_kwargs=...))`` +
``trainer.train()`` by ``postrl.grpo(..., run={"steps": 2})`` with small episode budgets. The built-in model
was never taught to call tools, so the runs check the wiring; the scripted episodes check what the
environment sees and how it scores.
"""

import random

import pytest
import yaml

import postrl
from postrl.lm import base_model
from postrl.lm.agents import AgentError, EpisodeBudget, run_episode
from postrl.lm.agents.python_envs import register_tool_env, release_tool_env
from postrl.lm.agents.registry import ENVS, make_env
from postrl.runtime.logging import read_jsonl
from tests.lm.trl_docs import from_dataset, self_sampled

SMALL = dict(
    max_prompt_length=256,  # within the built-in model's context: config.yaml is then the config as given
    eval_at_start=False,
    sampling={"max_new_tokens": 24},
    grpo={"group_size": 4, "prompts_per_step": 2},
    run={"steps": 2, "eval_every": 2, "save_every": 2, "log_every": 1, "device": "cpu", "threads": 1},
)


def call(step):
    return f'<tool_call>{{"name": "increment", "arguments": {{"step": {step}}}}}</tool_call>'


def scripted(replies):
    replies = iter(replies)
    return lambda messages, tokens_left: next(replies)


def test_the_self_sampling_example_runs_through_postrl_grpo(tmp_path):
    result = postrl.grpo(
        model=str(base_model.path()),
        environment_factory=self_sampled.IncrementEnv,
        env={"max_turns": 3, "max_tokens": 48, "n_eval": 2},
        out=str(tmp_path / "run"),
        **SMALL,
    )
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert len(rows) == 2 and all(0.0 <= r["reward_mean"] <= 1.0 for r in rows)
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "the environment (python:...) was given in memory" in config
    assert yaml.safe_load(config)["env"]["id"] == "python:tests.lm.trl_docs.self_sampled.IncrementEnv"
    assert result.model_path is not None
    assert not any(key.startswith("python:") for key in ENVS)  # registered for the run only


def test_the_self_sampling_example_scores_its_own_state():
    env_id, rows = register_tool_env(environment_factory=self_sampled.IncrementEnv)
    try:
        assert rows is None
        env = make_env(env_id)
        assert [t["function"]["name"] for t in env.tools] == ["increment"]
        for seed in range(6):
            target = random.Random(seed).randint(1, 6)  # reset draws with Python's random, seeded per episode
            ep = run_episode(env, scripted([call(target), "Done."]), seed=seed)
            # TRL's rule: reset's string is appended to the (empty) user prompt
            assert ep.messages[0] == {"role": "user", "content": f"Increment the counter by {target}."}
            assert ep.messages[2] == {"role": "tool", "name": "increment", "content": str(target)}
            assert ep.terminated and ep.rewards == [0.0, 1.0]  # get_reward once, at the end
            wrong = run_episode(env, scripted([call(target + 1), "Done."]), seed=seed)
            assert wrong.rewards == [0.0, 0.0]
        random.seed(123)
        expected = random.random()
        random.seed(123)
        run_episode(env, scripted(["Done."]), seed=5)
        assert random.random() == expected  # the caller's random state is left as it was
    finally:
        release_tool_env(env_id)


def test_the_dataset_example_runs_through_postrl_grpo(tmp_path):
    postrl.grpo(
        model=str(base_model.path()),
        data=from_dataset.dataset,
        environment_factory=from_dataset.IncrementEnv,
        env={"max_turns": 3, "max_tokens": 48, "n_eval": 2},
        out=str(tmp_path / "run"),
        **SMALL,
    )
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["env"]["n_train"] == 6  # one episode seed per row
    assert len([r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r]) == 2


def test_the_dataset_example_plays_row_seed_mod_rows():
    env_id, rows = register_tool_env(environment_factory=from_dataset.IncrementEnv, rows=from_dataset.dataset)
    try:
        assert rows == 6
        env = make_env(env_id)
        for seed in (0, 4, 9):
            target = seed % 6 + 1  # the row's `target` column reached reset(target=...)
            ep = run_episode(env, scripted([call(2), call(target - 2), "Done."]), seed=seed)
            assert ep.messages[0]["content"] == f"Increment the counter to {target}."
            assert ep.total_reward == 1.0
    finally:
        release_tool_env(env_id)


def test_the_dataset_examples_class_as_printed_is_refused_naming_its_tool(tmp_path):
    with pytest.raises(AgentError, match=r"tool increment \(.*from_dataset.py:\d+\): .*no docstring"):
        postrl.grpo(
            model=str(base_model.path()),
            data=from_dataset.dataset,
            environment_factory=from_dataset.AS_PRINTED,
            out=str(tmp_path / "run"),
        )
    assert not (tmp_path / "run").exists()


def test_an_environment_step_budget_truncation_still_scores_with_get_reward():
    env_id, _ = register_tool_env(environment_factory=self_sampled.IncrementEnv)
    try:
        target = random.Random(3).randint(1, 6)
        ep = run_episode(make_env(env_id), scripted([call(target)] * 5), EpisodeBudget(max_turns=1), seed=3)
        assert ep.truncated and ep.rewards == [1.0]  # cut by the budget: get_reward scores what there is
    finally:
        release_tool_env(env_id)


def test_reward_funcs_get_the_environment_objects_next_to_get_reward():
    def reward_func(environments, **kwargs):  # the shape of TRL's OpenEnv docs' reward function
        return [float(env.counter) for env in environments]

    env_id, _ = register_tool_env(environment_factory=self_sampled.IncrementEnv, reward_funcs=reward_func)
    try:
        target = random.Random(1).randint(1, 6)
        ep = run_episode(make_env(env_id), scripted([call(target), "Done."]), seed=1)
        assert ep.rewards == [0.0, target + 1.0]  # reward_func's counter + get_reward's 1
    finally:
        release_tool_env(env_id)
