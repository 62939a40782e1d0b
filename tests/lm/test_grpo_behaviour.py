"""GRPO with samples from a behaviour policy μ ≠ π (another engine's numerics, a stale copy): the weights π_old/μ
reach the loss (a constant weight scales the gradient by exactly that constant), postrl's own engine is exact
(no mismatch logged), and a known mismatch injected into the sampler's log-probs is measured and corrected as
the hand values say (TIS holds every token at the cap, MIS drops them all)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from postrl.lm.grpo import GRPOConfig, GRPOLossConfig, backward_grpo_minibatch, run_grpo
from postrl.lm.grpo.engine import TextEngine
from postrl.runtime.config import load_config
from postrl.runtime.errors import ConfigError
from postrl.runtime.logging import read_jsonl
from tests.lm.test_grpo import _config, _fixed_batch, _grads


def test_a_constant_weight_scales_the_gradient_by_that_constant(tiny_lm, tiny_tokenizer):
    batch = _fixed_batch(tiny_lm, tiny_tokenizer, rewards=[1.0, 0.0, 0.0, 0.5])
    cfg = GRPOLossConfig(group_size=4, beta=0.0, loss_type="token")
    backward_grpo_minibatch(tiny_lm, batch, cfg, temperature=1.0, max_len=8)
    plain = _grads(tiny_lm)
    tiny_lm.zero_grad(set_to_none=True)
    weighted = dataclasses.replace(batch, is_weights=2.5 * batch.response_mask.float())
    backward_grpo_minibatch(tiny_lm, weighted, cfg, temperature=1.0, max_len=8)
    for a, b in zip(plain, _grads(tiny_lm), strict=True):
        if a is not None:
            torch.testing.assert_close(b, 2.5 * a, rtol=1e-4, atol=1e-6)  # float32 sums in another order
    assert any(a is not None and float(a.abs().max()) > 0 for a in plain)


def _rows(path):
    return [r for r in read_jsonl(path / "metrics.jsonl") if "loss" in r]


def test_postrls_own_engine_shows_no_mismatch(tiny_lm_dir, tmp_path):
    cfg = _config(tiny_lm_dir, run={"steps": 2}, grpo={"is_correction": "tis", "is_level": "token"})
    run_grpo(cfg, tmp_path / "run")
    for row in _rows(tmp_path / "run"):
        assert row["behaviour_kl"] < 1e-6 and row["behaviour_log_ratio"] < 1e-3
        assert row["is_capped_fraction"] == 0.0 and row["is_weight_mean"] == pytest.approx(1.0, abs=1e-3)
        assert row["ratio_mean"] == pytest.approx(1.0, abs=1e-5)


@pytest.fixture
def stale_sampler(monkeypatch):
    """The sampler reports log μ = log π − 0.5 on every response token: π/μ = e^0.5 per token."""
    real = TextEngine.sample

    def sample(self, *args, **kwargs):
        sampled = real(self, *args, **kwargs)
        rollout = sampled.rollout
        shifted = rollout.log_probs - 0.5 * rollout.response_mask.to(rollout.log_probs.dtype)
        return dataclasses.replace(sampled, rollout=dataclasses.replace(rollout, log_probs=shifted))

    monkeypatch.setattr(TextEngine, "sample", sample)


@pytest.mark.parametrize("correction", ["tis", "mis"])
def test_a_known_mismatch_is_measured_and_corrected(tiny_lm_dir, tmp_path, stale_sampler, correction):
    grpo = {"is_correction": correction, "is_level": "token", "is_cap": 1.5, "beta": 0.0}
    run_grpo(_config(tiny_lm_dir, run={"steps": 2}, grpo=grpo), tmp_path / "run")
    for row in _rows(tmp_path / "run"):
        assert row["behaviour_kl"] == pytest.approx(math.exp(0.5) - 1 - 0.5, abs=1e-4)  # k3 at log r = 0.5
        assert row["behaviour_log_ratio"] == pytest.approx(0.5, abs=1e-4)
        assert row["is_capped_fraction"] == 1.0  # e^0.5 ≈ 1.65 > 1.5 on every token
        # TIS holds every weight at the cap; MIS drops every token, so nothing is left to learn from
        assert row["is_weight_mean"] == pytest.approx(1.5 if correction == "tis" else 0.0, abs=1e-6)
        if correction == "mis":
            assert row["loss"] == 0.0


def test_without_correction_the_mismatch_is_logged_when_old_log_probs_are_rescored(
    tiny_lm_dir, tmp_path, stale_sampler
):
    run_grpo(_config(tiny_lm_dir, run={"steps": 1}, grpo={"epochs": 2}), tmp_path / "run")
    row = _rows(tmp_path / "run")[0]
    assert row["behaviour_kl"] == pytest.approx(math.exp(0.5) - 1 - 0.5, abs=1e-4)
    assert "is_capped_fraction" not in row


def test_a_cap_that_is_not_positive_is_refused():
    with pytest.raises(ConfigError, match="is_cap"):
        load_config(GRPOConfig, overrides=["grpo.is_cap=0"])
