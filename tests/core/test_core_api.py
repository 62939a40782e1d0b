"""The DESIGN.md contract: names, positional order, and inputs never modified in place."""

import inspect

import torch
from core_helpers import PROP, ragged_mask, rand
from hypothesis import given
from hypothesis import strategies as st

import postrl.core as core

DESIGN_SIGNATURES = {
    "masked_mean": ["x", "mask", "dim"],
    "masked_whiten": ["x", "mask", "shift_mean"],
    "discounted_returns": ["rewards", "dones", "gamma", "last_value"],
    "td_errors": ["rewards", "values", "next_values", "terminated", "gamma"],
    "gae": ["rewards", "values", "next_values", "terminated", "episode_end", "gamma", "lam"],
    "reinforce_loss": ["log_probs", "weights", "mask"],
    "ppo_clip_loss": ["log_probs", "old_log_probs", "advantages", "clip_eps", "mask", "clip_eps_high"],
    "value_loss": ["values", "returns", "mask", "old_values", "clip_eps"],
    "entropy_from_logits": ["logits"],
    "diag_gaussian_log_prob": ["x", "mean", "log_std"],
    "kl_estimate": ["log_probs", "ref_log_probs", "kind"],
    "kl_shaped_rewards": ["scores", "log_probs", "ref_log_probs", "mask", "beta"],
    "AdaptiveKLController": ["init_beta", "target", "horizon"],
    "pairwise_loss": ["chosen", "rejected", "margin"],
    "preference_loss": ["score_1", "score_2", "target"],
    "group_advantages": ["rewards", "group_size", "eps", "scale"],
    "grpo_loss": [
        "log_probs",
        "old_log_probs",
        "ref_log_probs",
        "advantages",
        "mask",
        "clip_eps",
        "beta",
        "loss_type",
    ],  # fmt: skip
    "rloo_advantages": ["rewards", "group_size"],
    "reinforce_pp_advantages": ["rewards", "group_size"],
    "overlong_penalty": ["lengths", "max_len", "buffer_len", "penalty"],
    "dpo_loss": [
        "chosen_logps",
        "rejected_logps",
        "ref_chosen_logps",
        "ref_rejected_logps",
        "beta",
        "loss_type",
        "target",
    ],  # fmt: skip
    "kto_loss": [
        "logps",
        "ref_logps",
        "desirable",
        "kl",
        "beta",
        "desirable_weight",
        "undesirable_weight",
    ],  # fmt: skip
    "truncated_is_weights": ["logps", "behaviour_logps", "mask", "cap", "level"],
    "conjugate_gradient": ["Avp", "b", "iters", "residual_tol"],
    "backtracking_line_search": [
        "f",
        "x",
        "full_step",
        "expected_improve",
        "max_backtracks",
        "accept_ratio",
    ],  # fmt: skip
}


def test_design_names_and_positional_order():
    for name, expected in DESIGN_SIGNATURES.items():
        assert name in core.__all__, name
        params = inspect.signature(getattr(core, name)).parameters.values()
        positional = [p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
        assert positional == expected, name
    for name in core.__all__:
        assert hasattr(core, name), name
    # wave 2: a keyword of grpo_loss
    assert inspect.signature(core.grpo_loss).parameters["importance_level"].default == "token"


@PROP
@given(seed=st.integers(0, 2**31 - 1), width=st.integers(1, 5))
def test_inputs_are_never_modified_in_place(seed, width):
    gen = torch.Generator().manual_seed(seed)
    B = 4
    mask = ragged_mask(gen, B, width)
    x = {k: rand(gen, B, width, scale=0.5) for k in ("a", "b", "c", "d", "e")}
    seq = rand(gen, B)
    term = torch.rand(B, width, generator=gen) < 0.3
    inputs = [mask, term, seq, *x.values()]
    before = [v.clone() for v in inputs]
    a, b, c, d, e = x.values()
    core.masked_mean(a, mask)
    core.masked_whiten(a, mask)
    core.discounted_returns(a, term, 0.9, seq)
    core.gae(a, b, c, term, term, 0.9, 0.95)
    core.reinforce_loss(a, b, mask)
    core.ppo_clip_loss(a, b, seq, 0.2, mask, 0.3)
    core.value_loss(a, b, mask, c, 0.2)
    core.entropy_from_logits(a)
    core.diag_gaussian_log_prob(a, b, c)
    core.kl_estimate(a, b, "k3")
    core.kl_shaped_rewards(seq, a, b, mask, 0.1)
    core.pairwise_loss(seq, seq.flip(0), seq.abs())
    core.preference_loss(seq, seq.flip(0), 0.5)
    core.group_advantages(seq, 2)
    for loss_type in ("grpo", "token", "dr_grpo"):
        core.grpo_loss(a, b, c, seq, mask, 0.2, 0.1, loss_type)
        core.grpo_loss(a, b, c, seq, mask, 0.2, 0.1, loss_type, importance_level="sequence")
    core.rloo_advantages(seq, 2)
    core.reinforce_pp_advantages(seq, 2)
    core.reinforce_pp_advantages(seq)
    core.overlong_penalty(seq.abs() * 4, 5, 2)
    core.turn_gae(a, b, mask, 0.9, 0.95, term[:, 0], seq)  # the turns of issue #35
    core.turn_group_advantages(a, mask, 2, 0.9)
    core.turn_group_advantages(a, mask, 2, 0.9, scale=False, leave_one_out=True)
    turns = core.turn_index(mask)
    core.turn_start_values(a, turns, width)
    core.turns_to_tokens(a, turns)
    for loss_type in ("sigmoid", "ipo"):
        core.dpo_loss(seq, seq.flip(0), seq.abs(), seq * 0.5, 0.1, loss_type, seq.sigmoid())
    spd = d.T @ d + torch.eye(width, dtype=torch.float64)
    rhs, step = e[0], e[1]
    core.conjugate_gradient(lambda v: spd @ v, rhs)
    core.backtracking_line_search(lambda z: (z**2).sum(), rhs, step, 1.0)
    for old, new in zip(before, inputs, strict=True):
        assert torch.equal(old, new)
