"""GRPO trains a vision-language policy on an environment that returns pictures (issue #35 item 2): the
built-in tiny LLaVA on FrozenLake pictures through `postrl grpo --env frozenlake_pictures`, the engine's
scoring with the pictures, zero gradient on observation tokens and picture placeholders, exact resume, and a
policy that cannot see the environment's observations refused before a model loads."""

import pytest
import torch

from postrl.cli import main
from postrl.core import ppo_clip_loss, turn_group_advantages, turn_index, turns_to_tokens
from postrl.lm.agents import make_env
from postrl.lm.agents.config import EnvConfig
from postrl.lm.agents.pictures import PictureGymEnv
from postrl.lm.grpo import GRPOConfig, GRPOLossConfig, run_grpo
from postrl.lm.grpo.episodes import episode_prompts
from postrl.lm.rollout import SamplingConfig
from postrl.lm.rollout.batch import RolloutBatch
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig
from postrl.lm.vlm import base_model, image_token_id, load_vlm
from postrl.lm.vlm.episodes import PictureEpisodeEngine, PictureInputs
from postrl.runtime.errors import UserError
from postrl.runtime.logging import read_jsonl
from tests.lm.resume_check import assert_same_weights, interrupt_after

VLM = str(base_model.path())
ENV = {"invalid_penalty": -0.5}  # the untrained policy seldom names an action: rewards differ within a group


def _config(credit="trajectory", env=None, **kw) -> GRPOConfig:
    """2 seeds × G = 4 episodes on the 4×4 lake as pictures, ≤ 3 turns of ≤ 4 tokens, 2 steps."""
    base = dict(
        model=VLM,
        env=EnvConfig(
            **{
                "id": "frozenlake_pictures",
                "options": ENV,
                "n_train": 8,
                "n_eval": 2,
                "max_turns": 3,
                "max_tokens": 12,
                "credit": credit,
                **(env or {}),
            }
        ),
        sampling=SamplingConfig(max_new_tokens=4),
        grpo=GRPOLossConfig(group_size=4, prompts_per_step=2, beta=0.04),
        optim=OptimConfig(lr=2e-4, warmup_steps=0, min_lr_ratio=1.0),
        run=RunConfig(steps=2, eval_every=2, save_every=1, log_every=1, device="cpu", threads=1),
    )
    return GRPOConfig(**{**base, **kw})


def test_the_picture_ids_make_picture_environments():
    env = make_env("frozenlake_pictures")
    assert isinstance(env, PictureGymEnv) and not env.env.unwrapped.spec.kwargs["is_slippery"]
    assert isinstance(make_env("pictures:CliffWalking-v1"), PictureGymEnv)


def test_postrl_grpo_trains_a_vlm_on_picture_episodes(tmp_path):
    out = tmp_path / "run"
    argv = ["grpo", "--env", "frozenlake_pictures", "--model", VLM, "--out", str(out)]
    keys = [
        "env.options={invalid_penalty: -0.5}", "env.n_train=8", "env.n_eval=2", "env.max_turns=3",
        "env.max_tokens=12", "sampling.max_new_tokens=4", "grpo.group_size=4", "grpo.prompts_per_step=2",
        "grpo.beta=0.04", "optim.warmup_steps=0", "run.steps=2", "run.eval_every=2", "run.device=cpu",
        "run.threads=1", "run.log_every=1",
    ]  # fmt: skip
    assert main([*argv, *keys]) == 0
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "loss" in r]
    assert len(rows) == 2
    for r in rows:
        assert -1.5 <= r["reward_mean"] <= 1.0 and r["completion_length_max"] <= 12  # the actions only
    assert any(r["grad_norm"] > 0 for r in rows)
    assert "heldout_reward" in read_jsonl(out / "metrics.jsonl")[-1]
    model, processor = load_vlm(str(out / "model"))  # the export is a VLM folder, its processor beside it
    assert image_token_id(model, processor) is not None


@pytest.fixture(scope="module")
def sampled():
    cfg = _config("turn")
    model, processor = load_vlm(VLM)
    train, heldout, _ = episode_prompts(cfg)
    engine = PictureEpisodeEngine(cfg, model, None, processor, train, heldout, torch.device("cpu"))
    return engine, engine.sample("train", [0, 1], 4, cfg.sampling, ("train", 0, 0, 0))


def test_the_engine_scores_the_trajectory_with_its_pictures(sampled):
    engine, s = sampled
    rollout, inputs = s.rollout, s.inputs
    act = rollout.response_mask.bool()
    assert inputs.offsets[-1] == inputs.pixel_values.shape[0] == sum(r["turns"] for r in s.rows)
    old = engine.log_probs("old", rollout, inputs)
    torch.testing.assert_close(old[act], rollout.log_probs[act], atol=1e-4, rtol=0)
    assert torch.all(old[~act] == 0)  # observations and placeholders (−∞ under the banned mask) carry nothing


def test_a_micro_batch_gets_its_rows_pictures_in_its_order():
    pictures = torch.arange(5.0).view(5, 1, 1, 1)  # row 0: picture 0, row 1: 1 and 2, row 2: 3 and 4
    inputs = PictureInputs(torch.zeros(3, 2), torch.ones(3, 2, dtype=torch.bool), pictures, [0, 1, 3, 5])
    assert inputs.pictures(torch.tensor([2, 0]))["pixel_values"].flatten().tolist() == [3, 4, 0]
    assert torch.equal(inputs.pictures()["pixel_values"], pictures)


def test_observation_tokens_and_placeholders_get_exactly_zero_gradient(sampled):
    engine, s = sampled
    rollout, inputs = s.rollout, s.inputs
    rewards = inputs.turn_rewards + torch.linspace(0, 1, inputs.turn_rewards.numel()).view_as(
        inputs.turn_rewards
    )
    per_turn = turn_group_advantages(rewards, inputs.turn_mask, 4, scale=False, leave_one_out=True)
    mask = rollout.response_mask
    advantages = turns_to_tokens(per_turn, turn_index(mask))
    advantages = torch.where(mask.bool(), advantages, torch.full_like(advantages, 1e6))  # garbage off actions
    kept = {}

    def keep(module, args, out):  # the logits, kept for their gradient
        out.retain_grad()
        kept["logits"] = out

    hook = engine.policy_module.get_output_embeddings().register_forward_hook(keep)
    n = rollout.input_ids.shape[0]
    batch = RolloutBatch(
        rollout.input_ids, rollout.attention_mask, rollout.prompt_len, mask, rollout.log_probs, advantages,
        row_ids=torch.arange(n),
    )  # fmt: skip
    log_probs, _ = engine.policy(inputs, n)(batch)
    hook.remove()
    loss, _ = ppo_clip_loss(log_probs, rollout.log_probs, advantages, 0.2, mask=mask)
    loss.backward()
    T = mask.shape[1]
    grad = kept["logits"].grad[:, :T].abs().sum(-1)  # (B, T): on the logits predicting each response token
    placeholders = rollout.input_ids[:, rollout.prompt_len :] == image_token_id(
        engine.policy_module, engine.processor
    )
    assert placeholders.any() and not (placeholders & mask.bool()).any()
    assert torch.all(grad[mask == 0] == 0) and torch.all(grad[placeholders] == 0)
    assert torch.all(grad[(mask == 1) & (advantages != 0)] > 0)
    assert all(torch.isfinite(p.grad).all() for p in engine.policy_module.parameters() if p.grad is not None)
    # a micro-batch of rows in another order gets its own rows' pictures (by row_ids)
    rows = torch.tensor([5, 2, 7])
    part = RolloutBatch(
        rollout.input_ids[rows], rollout.attention_mask[rows], rollout.prompt_len, mask[rows],
        rollout.log_probs[rows], advantages[rows], row_ids=rows,
    )  # fmt: skip
    with torch.no_grad():
        log_probs, _ = engine.policy(inputs, n)(part)
    act = mask[rows].bool()
    torch.testing.assert_close(log_probs[act], rollout.log_probs[rows][act], atol=1e-4, rtol=0)


def test_a_picture_episode_run_resumes_exactly(tmp_path):
    cfg = _config("turn")
    run_grpo(cfg, tmp_path / "a")
    run_grpo(cfg, tmp_path / "b")
    interrupt_after(tmp_path / "b", 1)  # as if killed after its step-1 checkpoint
    torch.manual_seed(123)  # nothing may depend on the RNG state left behind
    run_grpo(cfg, tmp_path / "b", resume=True)
    assert_same_weights(tmp_path / "a", tmp_path / "b")
    rewards = [
        [r["reward_mean"] for r in read_jsonl(tmp_path / x / "metrics.jsonl") if "loss" in r] for x in "ab"
    ]
    assert rewards[0] == rewards[1] and len(rewards[0]) == 2


@pytest.mark.parametrize(
    ("model", "env_id", "match"),
    [
        (
            VLM,
            "frozenlake",
            "env.id=frozenlake is a text environment but model .* is a vision-language model",
        ),
        (None, "frozenlake_pictures", "env.id=frozenlake_pictures observes pictures but model .* is a text"),
        (None, "pictures:Taxi-v4", "env.id=pictures:Taxi-v4 observes pictures"),
    ],
    ids=["text-env-vlm", "pictures-text-lm", "gym-pictures-text-lm"],
)
def test_a_policy_that_cannot_see_the_observations_is_refused_before_a_model_loads(
    tiny_lm_dir, tmp_path, monkeypatch, model, env_id, match
):
    import postrl.lm.grpo.build as build
    import postrl.lm.vlm.grpo as vlm_grpo

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(build, "load_causal_lm", no_load)
    monkeypatch.setattr(vlm_grpo, "load_vlm", no_load)
    cfg = _config(env={"id": env_id, "options": {}}, model=model or str(tiny_lm_dir))
    with pytest.raises(UserError, match=match):
        run_grpo(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_the_python_api_takes_a_picture_env_id_with_a_vlm(tmp_path):
    import postrl

    # refused by the VLM's trainer: the API routes a VLM folder with env there
    with pytest.raises(UserError, match="env.id=frozenlake is a text environment"):
        postrl.grpo(model=VLM, env="frozenlake", out=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
