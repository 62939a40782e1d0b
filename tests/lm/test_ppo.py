"""PPO-RLHF: shaped rewards and GAE masks on a padded batch (against the unpadded rows and hand values), score
normalisation, the pitfalls (score on the last real token, positions under left padding, temperature in
actor and reference log-probs, dropout off in all four roles), a PPO update lowers the loss on a fixed batch,
the run folder with exact resume (β and reward statistics restored from the checkpoint), and the config: old
key names are errors naming the new ones, the preset holds the tiny world's values."""

from __future__ import annotations

import copy
import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from postrl.core import gae, kl_shaped_rewards
from postrl.lm.evaluation import sequence_kl
from postrl.lm.models import ScalarHeadModel, assert_dropout_off, load_causal_lm
from postrl.lm.ppo import (
    PPOConfig,
    PPOLossConfig,
    backward_ppo_minibatch,
    optimise_ppo,
    policy_forward,
    ppo_loss,
    run_ppo,
)
from postrl.lm.ppo.advantages import (
    GAEConfig,
    KLConfig,
    RewardConfig,
    advantages_and_returns,
    last_token_mask,
    make_batch,
    normalize_scores,
    reward_model_scores,
)
from postrl.lm.ppo.build import build_roles, trainable_parts
from postrl.lm.ppo.config import PtxConfig
from postrl.lm.reward_model.evaluation import NORM_FILE
from postrl.lm.rollout import Rollout, RolloutEngine, SamplingConfig, response_forward
from postrl.lm.rollout.batch import RolloutBatch
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig, make_optimizer
from postrl.runtime.checkpoint import latest_checkpoint
from postrl.runtime.errors import UserError

PROMPTS = ["Review: the pasta", "Review: the soup at the diner", "Review: the staff", "Review: the view"]


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a shared 2-core machine spin-waiting threads make tiny models 100× slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_rm_dir(tmp_path_factory: pytest.TempPathFactory, tiny_lm_dir: Path, tiny_tokenizer) -> Path:
    """A reward model (new head on the tiny LM's trunk) exported as `postrl rm` does, with its statistics."""
    path = tmp_path_factory.mktemp("tiny_rm")
    rm = ScalarHeadModel.from_causal_lm(load_causal_lm(tiny_lm_dir), seed=1)
    rm.save_pretrained(path)
    tiny_tokenizer.save_pretrained(str(path))
    (path / NORM_FILE).write_text(json.dumps({"mean": 0.1, "std": 0.5, "n": 8}))
    return path


RUN = RunConfig(steps=2, log_every=1, eval_every=1, save_every=1, keep_last=3, device="cpu")


def _cfg(tiny_lm_dir: Path, tiny_rm_dir: Path, **kw) -> PPOConfig:
    base = PPOConfig(
        model=str(tiny_lm_dir),
        reward_model=str(tiny_rm_dir),
        data="task:reviews",
        max_prompt_length=32,
        sampling=SamplingConfig(max_new_tokens=6, temperature=0.7),
        batch_size=8,
        ppo=PPOLossConfig(epochs=2, minibatches=2, grad_accum=2),
        kl=KLConfig(beta=0.1),
        optim=OptimConfig(lr=1e-3, warmup_steps=0, min_lr_ratio=1.0),
        critic_optim=OptimConfig(lr=1e-3, warmup_steps=0, min_lr_ratio=1.0),
        run=RUN,
        eval_size=8,
    )
    return replace(base, **kw)


# ---- shaped rewards, GAE, normalisation ----------------------------------------------------------------
def padded_case() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    return {
        "mask": mask,
        "log_probs": -torch.rand(3, 4, generator=g, dtype=torch.float64) * mask,
        "ref_log_probs": -torch.rand(3, 4, generator=g, dtype=torch.float64) * mask,
        "values": torch.randn(3, 4, generator=g, dtype=torch.float64) * mask,
        "scores": torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64),
    }


def test_shaped_rewards_and_gae_masks_on_padded_batch() -> None:
    c = padded_case()
    mask, beta = c["mask"], 0.1
    rewards = kl_shaped_rewards(c["scores"], c["log_probs"], c["ref_log_probs"], mask, beta)
    cfg = GAEConfig(gamma=1.0, lam=0.95, whiten_advantages=False)
    adv, ret = advantages_and_returns(rewards, c["values"], mask, cfg)
    assert torch.equal(last_token_mask(mask), torch.tensor([[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 1]]).bool())
    for t in (rewards, adv, ret):
        assert torch.all(t[mask == 0] == 0)  # nothing on padding
    kl = c["log_probs"] - c["ref_log_probs"]
    torch.testing.assert_close(rewards[0, 2], -beta * kl[0, 2] + 1.0)  # the score on the last real token
    torch.testing.assert_close(rewards[1, 0], -beta * kl[1, 0] - 2.0)
    for row, n in enumerate(mask.sum(-1).tolist()):  # each row alone, unpadded, terminal at its end
        end = torch.zeros(1, n, dtype=torch.bool)
        end[0, -1] = True
        values = c["values"][row : row + 1, :n]
        next_values = torch.cat([values[:, 1:], torch.zeros(1, 1, dtype=values.dtype)], 1)
        a, r = gae(rewards[row : row + 1, :n], values, next_values, end, end, 1.0, 0.95)
        torch.testing.assert_close(adv[row, :n], a[0])
        torch.testing.assert_close(ret[row, :n], r[0])
    # γ = λ = 1: A_t = Σ_{k ≥ t} r_k − V_t (Monte Carlo), returns = reward-to-go
    adv1, ret1 = advantages_and_returns(rewards, c["values"], mask, GAEConfig(1.0, 1.0, False))
    to_go = rewards.flip(-1).cumsum(-1).flip(-1) * mask
    torch.testing.assert_close(ret1, to_go)
    torch.testing.assert_close(adv1, (to_go - c["values"]) * mask)


def test_whitened_advantages_ignore_padding() -> None:
    c = padded_case()
    rewards = kl_shaped_rewards(c["scores"], c["log_probs"], c["ref_log_probs"], c["mask"], 0.1)
    adv, _ = advantages_and_returns(rewards, c["values"], c["mask"], GAEConfig())
    real = adv[c["mask"] == 1]
    assert abs(float(real.mean())) < 1e-6 and float(real.std()) == pytest.approx(1.0, abs=1e-4)
    assert torch.all(adv[c["mask"] == 0] == 0)


def test_normalize_clip_and_missing_eos_penalty() -> None:
    scores = torch.tensor([1.1, 0.1, 3.1, -5.0])
    finished = torch.tensor([True, True, True, False])
    stats = {"mean": 0.1, "std": 0.5}
    out = normalize_scores(
        scores, finished, RewardConfig("rm_stats", clip=4.0, missing_eos_penalty=-1.0), stats
    )
    torch.testing.assert_close(out, torch.tensor([2.0, 0.0, 4.0, -1.0]))  # 6 clipped to 4; no EOS → −1
    kept = normalize_scores(scores, finished, RewardConfig("none", None, None), None)
    torch.testing.assert_close(kept, scores)
    whitened = normalize_scores(scores, finished, RewardConfig("batch", None, None), None)
    assert float(whitened.mean()) == pytest.approx(0.0, abs=1e-6)


# ---- the four roles and the pitfalls -------------------------------------------------------------------
@pytest.mark.parametrize("critic", ["reward_model", "sft", "shared"])
def test_roles_dropout_off_frozen_and_separate(tiny_lm_dir, tiny_rm_dir, critic) -> None:
    roles = build_roles(_cfg(tiny_lm_dir, tiny_rm_dir, critic=critic), torch.device("cpu"))
    for model in (roles.actor, roles.reference, roles.reward_model, roles.critic):
        if model is not None:
            assert_dropout_off(model)
    for frozen in (roles.reference, roles.reward_model):
        assert not any(p.requires_grad for p in frozen.parameters()) and not frozen.training
    parts = trainable_parts(roles)
    actor_ids = {id(p) for p in parts["actor"].parameters()}
    assert actor_ids.isdisjoint(id(p) for p in parts["critic"].parameters())
    assert actor_ids.isdisjoint(id(p) for p in roles.reference.parameters())
    if critic == "reward_model":  # N+ details: the critic starts as the reward model (a separate copy)
        for p, q in zip(roles.critic.parameters(), roles.reward_model.parameters(), strict=True):
            assert torch.equal(p, q) and p is not q


def _rollout(roles, tokenizer, temperature: float = 0.7, seed: int = 0):
    engine = RolloutEngine(roles.policy, tokenizer, SamplingConfig(max_new_tokens=6, temperature=temperature))
    return engine.generate(PROMPTS, generator=torch.Generator().manual_seed(seed))


def test_temperature_in_actor_and_reference_log_probs(tiny_lm_dir, tiny_rm_dir, tiny_tokenizer) -> None:
    """At the start actor = reference = sampler: ratio 1 and KL 0 only when all use log softmax(logits/τ)."""
    cfg = _cfg(tiny_lm_dir, tiny_rm_dir, reward=RewardConfig("none"))
    roles = build_roles(cfg, torch.device("cpu"))
    rollout = _rollout(roles, tiny_tokenizer, 0.7)
    raw = reward_model_scores(roles.reward_model, rollout)
    batch, metrics = make_batch(
        roles, rollout, raw, temperature=0.7, beta=0.1, reward=cfg.reward, advantage=cfg.gae, norm_stats=None
    )
    assert abs(metrics["kl_to_ref"]) < 1e-4 and abs(metrics["kl_k3"]) < 1e-6
    with torch.no_grad():
        log_probs, _, values = policy_forward(roles, batch, 0.7, False)
        mask = batch.response_mask.bool()
        torch.testing.assert_close(log_probs[mask], rollout.log_probs[mask], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(values * mask, batch.values, atol=1e-5, rtol=1e-5)
        at_one, _, _ = policy_forward(roles, batch, 1.0, False)
        assert (at_one[mask] - rollout.log_probs[mask]).abs().max() > 1e-2  # τ matters: the test can fail


def handmade_rollout(tokenizer, pad_id: int) -> Rollout:
    """Left-padded prompts and right-padded responses of different lengths (three end with EOS, then pads;
    one is cut without EOS), padded with ``pad_id``."""
    from postrl.lm.data import encode_completions, encode_prompts, join_prompt_response

    responses = encode_completions(tokenizer, [" was great .", " was very bad and cold .", " was ok ."])
    responses.append(encode_completions(tokenizer, [" was fine and"])[0][:-1])  # no EOS: cut at the limit
    batch = join_prompt_response(encode_prompts(tokenizer, PROMPTS), responses, pad_id)
    P = batch["input_ids"].shape[1] - batch["response_mask"].shape[1]
    return Rollout(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        prompt_len=P,
        response_ids=batch["input_ids"][:, P:],
        response_mask=batch["response_mask"],
        log_probs=torch.zeros(batch["response_mask"].shape),
        finished=torch.tensor([True, True, True, False]),
    )


@pytest.mark.parametrize("pad", ["pad", "eos"])
def test_score_on_last_real_token_and_left_padding(tiny_lm_dir, tiny_rm_dir, tiny_tokenizer, pad) -> None:
    """RM score (at EOS, not at a pad after it; pad = EOS too), reference log-probs and values of each row of
    a padded batch equal those of the row alone, without any padding."""
    cfg = _cfg(tiny_lm_dir, tiny_rm_dir, reward=RewardConfig("none", None, None))
    roles = build_roles(cfg, torch.device("cpu"))
    pad_id = tiny_tokenizer.pad_token_id if pad == "pad" else tiny_tokenizer.eos_token_id
    rollout = handmade_rollout(tiny_tokenizer, pad_id)
    scores = reward_model_scores(roles.reward_model, rollout)
    full, _ = make_batch(
        roles,
        rollout,
        scores,
        temperature=0.7,
        beta=0.0,
        reward=cfg.reward,
        advantage=cfg.gae,
        norm_stats=None,
    )
    k1, _ = sequence_kl(
        rollout, response_forward(roles.reference, gradients=False), 0.7
    )  # Σ (0 − log π_ref): minus the reference log-likelihood
    for row in range(len(PROMPTS)):
        keep = rollout.attention_mask[row].bool()
        ids = rollout.input_ids[row][keep][None]  # the row with no padding at all
        n = int(rollout.response_mask[row].sum())
        assert (ids[0, -1] == tiny_tokenizer.eos_token_id) == bool(rollout.finished[row])
        with torch.no_grad():
            alone = roles.reward_model(ids, torch.ones_like(ids))[0, -1]
            critic_alone = roles.critic(ids, torch.ones_like(ids))[0, -n - 1 : -1]
            ref_logits = roles.reference(ids).logits[0, -n - 1 : -1] / 0.7
        torch.testing.assert_close(scores[row], alone, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(full.values[row, :n], critic_alone, atol=1e-5, rtol=1e-5)
        ref_lp = torch.log_softmax(ref_logits, -1).gather(-1, ids[0, -n:, None])[:, 0]
        torch.testing.assert_close(k1[row], -ref_lp.sum(), atol=1e-4, rtol=1e-4)


# ---- the update ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("critic", ["reward_model", "shared"])
def test_ppo_update_lowers_the_loss_on_a_fixed_batch(
    tiny_lm_dir, tiny_rm_dir, tiny_tokenizer, critic
) -> None:
    cfg = _cfg(
        tiny_lm_dir, tiny_rm_dir, critic=critic, ppo=PPOLossConfig(epochs=4, minibatches=1, grad_accum=2)
    )
    roles = build_roles(cfg, torch.device("cpu"))
    rollout = _rollout(roles, tiny_tokenizer, 0.7)
    raw = torch.tensor([1.0, -1.0, 0.5, -0.5])
    batch, _ = make_batch(
        roles,
        rollout,
        raw,
        temperature=0.7,
        beta=0.1,
        reward=cfg.reward,
        advantage=cfg.gae,
        norm_stats={"mean": 0, "std": 1},
    )
    parts = trainable_parts(roles)
    opts = {k: make_optimizer(m, OptimConfig(lr=1e-3, warmup_steps=0), 10)[0] for k, m in parts.items()}
    params = {k: list(m.parameters()) for k, m in parts.items()}
    with torch.no_grad():
        before, stats0 = ppo_loss(roles, batch, cfg.ppo, 0.7)
    assert float(stats0["ratio_mean"]) == pytest.approx(1.0, abs=1e-4)
    reference = copy.deepcopy([p.detach().clone() for p in roles.reference.parameters()])
    stats = optimise_ppo(roles, batch, cfg, opts, params, torch.Generator().manual_seed(0))
    with torch.no_grad():
        after, stats1 = ppo_loss(roles, batch, cfg.ppo, 0.7)
    assert float(after) < float(before)
    assert float(stats1["value_loss"]) < float(stats0["value_loss"])
    assert stats["approx_kl"] >= 0 and 0 <= stats["clip_fraction"] <= 1
    for p, q in zip(roles.reference.parameters(), reference, strict=True):
        assert torch.equal(p, q)  # the reference stays frozen


# ---- short batches: an epoch's last batch may have fewer rows than ppo.minibatches ------------------------
def _hand_batch(n_rows: int) -> RolloutBatch:
    """A RolloutBatch of ``n_rows`` rows (P = 2, T = 4) whose responses have 1..4 tokens."""
    g = torch.Generator().manual_seed(n_rows)
    lengths = torch.tensor([1 + i % 4 for i in range(n_rows)])
    response_mask = (torch.arange(4) < lengths[:, None]).long()  # (B, T)
    mask = torch.cat([torch.ones(n_rows, 2, dtype=torch.long), response_mask], dim=1)  # (B, P + T)
    ids = torch.randint(6, 50, (n_rows, 6), generator=g) * mask
    values = [torch.randn(n_rows, 4, generator=g) * response_mask for _ in range(4)]
    log_probs, old_values, advantages, returns = values
    return RolloutBatch(
        ids, mask, 2, response_mask, log_probs, advantages, values=old_values, returns=returns
    )


@pytest.mark.parametrize(("n_rows", "sizes"), [(1, [1]), (3, [2, 1]), (4, [2, 2])])
def test_short_batch_splits_into_non_empty_minibatches(n_rows: int, sizes: list[int]) -> None:
    batch = _hand_batch(n_rows)
    order = torch.randperm(n_rows, generator=torch.Generator().manual_seed(0))
    parts = batch.minibatches(order, 2)
    assert [p.input_ids.shape[0] for p in parts] == sizes
    start = 0
    for part, size in zip(parts, sizes, strict=True):
        expected = batch.rows(order[start : start + size])
        start += size
        for name in (
            "input_ids",
            "attention_mask",
            "response_mask",
            "old_log_probs",
            "advantages",
            "returns",
        ):
            assert torch.equal(getattr(part, name), getattr(expected, name)), name
    with pytest.raises(ValueError, match="no rows selected"):
        batch.rows(order[:0])
    assert batch.minibatches(order[:0], 2) == []


def test_a_one_row_minibatch_gradient_is_its_token_mean(tiny_lm_dir, tiny_rm_dir, tiny_tokenizer) -> None:
    """The step a short batch makes (1 row, ppo.minibatches = 2, grad_accum = 2) has the gradient of the
    row's own token-mean PPO loss."""
    cfg = _cfg(tiny_lm_dir, tiny_rm_dir, ppo=PPOLossConfig(epochs=1, minibatches=2, grad_accum=2))
    roles = build_roles(cfg, torch.device("cpu"))
    rollout = handmade_rollout(tiny_tokenizer, tiny_tokenizer.pad_token_id)
    full, _ = make_batch(
        roles,
        rollout,
        torch.ones(4),
        temperature=0.7,
        beta=0.1,
        reward=RewardConfig("none"),
        advantage=cfg.gae,
        norm_stats=None,
    )
    one = full.rows(torch.tensor([1]))
    (mb,) = one.minibatches(torch.arange(1), cfg.ppo.minibatches)
    backward_ppo_minibatch(roles, mb, cfg.ppo, 0.7)
    got = [p.grad.clone() for p in roles.actor.parameters()]
    roles.actor.zero_grad(set_to_none=True)
    roles.critic.zero_grad(set_to_none=True)
    ppo_loss(roles, one, cfg.ppo, 0.7)[0].backward()
    for g, p in zip(got, roles.actor.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, atol=1e-6, rtol=1e-5)


def test_optimise_on_a_one_row_batch_with_two_minibatches(tiny_lm_dir, tiny_rm_dir, tiny_tokenizer) -> None:
    cfg = _cfg(tiny_lm_dir, tiny_rm_dir, ppo=PPOLossConfig(epochs=1, minibatches=2, grad_accum=1))
    roles = build_roles(cfg, torch.device("cpu"))
    rollout = handmade_rollout(tiny_tokenizer, tiny_tokenizer.pad_token_id)
    full, _ = make_batch(
        roles,
        rollout,
        torch.ones(4),
        temperature=0.7,
        beta=0.1,
        reward=RewardConfig("none"),
        advantage=cfg.gae,
        norm_stats=None,
    )
    parts = trainable_parts(roles)
    opts = {k: make_optimizer(m, OptimConfig(lr=1e-3, warmup_steps=0), 10)[0] for k, m in parts.items()}
    params = {k: list(m.parameters()) for k, m in parts.items()}
    stats = optimise_ppo(
        roles, full.rows(torch.tensor([0])), cfg, opts, params, torch.Generator().manual_seed(0)
    )
    assert math.isfinite(stats["loss"])


# ---- the run -------------------------------------------------------------------------------------------
def test_run_ppo_folder_and_exact_resume(tiny_lm_dir, tiny_rm_dir, tmp_path) -> None:
    cfg = _cfg(tiny_lm_dir, tiny_rm_dir, kl=KLConfig(beta=0.1, target=0.01, horizon=20))
    summary = run_ppo(cfg, tmp_path / "a")
    for key in ("gold_reward", "rm_score", "kl_to_ref", "start_gold_reward", "wall_seconds", "peak_rss_mb"):
        assert summary[key] is not None, key
    assert [h["step"] for h in summary["heldout"]] == [0, 1, 2]
    assert summary["beta"] != 0.1  # the adaptive controller moved β
    for name in ("heldout.png", "curves.png", "summary.json", "config.yaml", "model/config.json"):
        assert (tmp_path / "a" / name).is_file(), name
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    step_rows = [r for r in rows if "rm_score" in r]
    for key in (
        "gold_reward",
        "kl_to_ref",
        "kl_k3",
        "entropy",
        "clip_fraction",
        "approx_kl",
        "explained_variance",
    ):
        assert key in step_rows[0], key
    for key in ("response_length", "no_eos_fraction", "tokens_per_second", "time_generate", "time_train"):
        assert key in step_rows[0], key
    state = torch.load(latest_checkpoint(tmp_path / "a" / "checkpoints") / "state.pt", weights_only=True)
    extra = state["extra"]["algorithm"]
    assert extra["reward_norm"] == {"mean": 0.1, "std": 0.5}
    assert extra["kl"]["value"] == pytest.approx(summary["beta"])
    # interrupted after step 1: drop the later checkpoint and the export, then resume
    cfg = replace(cfg, plots=False)
    run_ppo(cfg, tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "step_00000002")
    shutil.rmtree(tmp_path / "b" / "model")
    resumed = run_ppo(cfg, tmp_path / "b", resume=True)
    assert resumed["beta"] == summary["beta"]
    assert resumed["gold_reward"] == summary["gold_reward"]
    a, b = load_causal_lm(tmp_path / "a" / "model"), load_causal_lm(tmp_path / "b" / "model")
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(p, q), name


def test_rule_based_reward_shared_critic_and_ptx(tiny_lm_dir, tiny_rm_dir, tmp_path) -> None:
    """GRPO's reward-function interface instead of the RM, a value head on the actor, the ptx loss."""
    cfg = _cfg(
        tiny_lm_dir,
        tiny_rm_dir,
        reward_model=None,
        rewards=["task:reviews"],
        critic="shared",
        reward=RewardConfig("batch", clip=3.0),
        ptx=PtxConfig(coef=0.5, batch_size=4),
        run=replace(RUN, steps=1, eval_every=0),
        plots=False,
    )
    summary = run_ppo(cfg, tmp_path / "run")
    assert summary["steps"] == 1 and summary["rm_score"] == pytest.approx(summary["gold_reward"])
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("ptx_loss" in r for r in rows)


def test_bad_configs_are_refused(tiny_lm_dir, tiny_rm_dir, tmp_path) -> None:
    with pytest.raises(UserError, match="critic=reward_model needs reward_model"):
        run_ppo(_cfg(tiny_lm_dir, tiny_rm_dir, reward_model=None, rewards=["task:reviews"]), tmp_path / "x")
    with pytest.raises(UserError, match="critic must be one of"):
        run_ppo(_cfg(tiny_lm_dir, tiny_rm_dir, critic="nope"), tmp_path / "y")
