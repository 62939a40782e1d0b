"""GRPO over episodes of a text environment (issue #35 items 2 and 5): the trainer's engine seam, trajectory
and per-turn credit, and the errors an env run gives before it touches its run folder."""

import pytest
import torch

from postrl.core import group_advantages, turn_group_advantages, turn_index, turns_to_tokens
from postrl.lm.agents import AgentError
from postrl.lm.agents.config import EnvConfig
from postrl.lm.grpo import GRPOConfig, GRPOLossConfig, run_grpo
from postrl.lm.grpo.build import build_grpo_run
from postrl.lm.grpo.rollouts import PromptStream, collect
from postrl.lm.rollout import SamplingConfig
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig
from postrl.runtime import distributed as dist
from postrl.runtime.errors import UserError
from postrl.runtime.logging import read_jsonl
from tests.lm.resume_check import assert_same_weights, interrupt_after


def _config(tiny_lm_dir, credit="trajectory", env=None, grpo=None, **kw) -> GRPOConfig:
    """2 seeds × G = 4 episodes of guess-the-number in [1, 8], ≤ 3 turns of ≤ 4 tokens, 2 steps."""
    base = dict(
        model=str(tiny_lm_dir),
        env=EnvConfig(
            **{
                "id": "guess_number",
                "options": {"high": 8},
                "n_train": 8,
                "n_eval": 2,
                "max_turns": 3,
                "max_tokens": 12,
                "credit": credit,
                **(env or {}),
            }
        ),
        sampling=SamplingConfig(max_new_tokens=4),
        grpo=GRPOLossConfig(**{"group_size": 4, "prompts_per_step": 2, "beta": 0.04, **(grpo or {})}),
        optim=OptimConfig(lr=2e-4, warmup_steps=0, min_lr_ratio=1.0),
        run=RunConfig(steps=2, eval_every=2, save_every=2, log_every=1, device="cpu", threads=1),
    )
    return GRPOConfig(**{**base, **kw})


@pytest.mark.parametrize("credit", ["trajectory", "turn"])
def test_grpo_trains_on_episodes(tiny_lm_dir, tmp_path, credit):
    summary = run_grpo(_config(tiny_lm_dir, credit), tmp_path / "run")
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert len(rows) == 2
    for r in rows:
        assert r["reward_mean"] <= 1.0 and torch.isfinite(torch.tensor(r["loss"]))
        assert r["completion_length_max"] <= 12  # the episode's token budget: actions only
    assert "heldout_reward" in summary
    assert (tmp_path / "run" / "model" / "config.json").is_file()


def _collect(cfg):
    run = build_grpo_run(cfg, dist.init_distributed("cpu"))
    return collect(run, PromptStream(run.engine.prompt_count("train"), cfg.run.seed), 0)


def test_per_turn_credit_reaches_each_turns_tokens(tiny_lm_dir):
    cfg = _config(tiny_lm_dir, "turn", grpo={"advantage": "rloo"})
    batch, _, inputs = _collect(cfg)
    turns = turn_index(batch.response_mask)
    per_turn = turn_group_advantages(
        inputs.turn_rewards, inputs.turn_mask, 4, scale=False, leave_one_out=True
    )
    assert batch.advantages.shape == batch.response_mask.shape
    torch.testing.assert_close(batch.advantages, turns_to_tokens(per_turn, turns).float())
    assert torch.all(batch.advantages[batch.response_mask == 0] == 0)


def test_trajectory_credit_is_the_group_advantage_of_the_return(tiny_lm_dir):
    batch, metrics, inputs = _collect(_config(tiny_lm_dir))
    returns = inputs.turn_rewards.sum(-1)
    torch.testing.assert_close(batch.advantages, group_advantages(returns, 4).float())
    assert metrics["reward_mean"] == pytest.approx(float(returns.mean()), abs=1e-6)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (
            {"env": {"id": "frozenlak"}},
            AgentError,
            "unknown environment 'frozenlak'.*did you mean frozenlake",
        ),
        ({"env": {"options": {"colour": "red"}}}, AgentError, "guess_number.*colour"),
        ({"rewards": ["task:arithmetic"]}, UserError, "leave rewards empty"),
        ({"env": {"n_train": 1}}, UserError, "env.n_train=1 is fewer than grpo.prompts_per_step=2"),
        ({"grpo": {"dynamic_sampling": True}}, UserError, "set grpo.dynamic_sampling=false"),
    ],
)
def test_a_bad_env_run_is_one_error_before_the_run_folder(tiny_lm_dir, tmp_path, change, error, match):
    env = change.pop("env", None)
    grpo = change.pop("grpo", None)
    with pytest.raises(error, match=match):
        run_grpo(_config(tiny_lm_dir, env=env, grpo=grpo, **change), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_an_episode_run_resumes_exactly(tiny_lm_dir, tmp_path):
    cfg = _config(
        tiny_lm_dir, "turn", run=RunConfig(steps=4, save_every=2, log_every=1, device="cpu", threads=1)
    )
    run_grpo(cfg, tmp_path / "a")
    run_grpo(cfg, tmp_path / "b")
    # interrupt "b" after its step-2 checkpoint: remove what steps 3-4 wrote, then resume
    interrupt_after(tmp_path / "b", 2)
    torch.manual_seed(123)  # nothing may depend on the RNG state left behind
    run_grpo(cfg, tmp_path / "b", resume=True)
    assert_same_weights(tmp_path / "a", tmp_path / "b")
    rewards = [
        [r["reward_mean"] for r in read_jsonl(tmp_path / x / "metrics.jsonl") if "loss" in r] for x in "ab"
    ]
    assert rewards[0] == rewards[1] and len(rewards[0]) == 4


def test_the_python_api_takes_an_env_section_and_refuses_an_unknown_id(tiny_lm_dir, tmp_path):
    import postrl

    with pytest.raises(AgentError, match="unknown environment 'frozenlak'"):
        postrl.grpo(model=str(tiny_lm_dir), env={"id": "frozenlak"}, out=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
    with pytest.raises(AgentError, match="unknown environment 'frozenlak'"):  # the id alone, as `--env ID`
        postrl.grpo(model=str(tiny_lm_dir), env="frozenlak", out=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
