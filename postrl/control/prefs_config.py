"""The configs of `postrl control prefs` (`postrl.control.prefs`): segments, the label schedule, pair
selection, the normalisation of r̂, where the labels come from, and the whole run; `validate_prefs` checks what
the ranges cannot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from postrl.control import ppo
from postrl.control.envs import EnvConfig
from postrl.control.loop import ControlRunConfig
from postrl.control.policies import PolicyConfig
from postrl.control.prefs_reward import RewardModelConfig
from postrl.runtime.config import ConfigError


@dataclass(frozen=True)
class PrefsConfig:
    segment_length: int = 25
    """Steps L per segment (must not exceed ppo.n_steps: segments are cut from one rollout)."""
    label_budget: int = 500
    """Total number of labelled pairs over the run."""
    initial_labels: int = 100
    """Pairs labelled from the first rollout (the untrained policy), before PPO first uses r̂."""
    label_until: float = 1.0
    """Fraction of the run by which the whole budget is labelled. Labelling to the end keeps the reward
    model online: one frozen halfway lets the policy drift where r̂ was never checked (Christiano et al. §3.3)."""
    label_decay: float = 0.1
    """τ of the label rate ∝ τ / (τ + fraction of the run) after the initial labels (Christiano et al.: ∝
    2·10⁶ / (T + 2·10⁶)); 0: a constant rate."""
    pair_selection: str = "disagreement"
    """How pairs are chosen: random, or disagreement (highest variance of P(σ¹≻σ²) over the ensemble)."""
    candidates_per_label: int = 10
    """disagreement: random candidate pairs scored per pair labelled."""
    segments_per_rollout: int = 64
    """Random segments cut from each rollout into the pool."""
    pool_size: int = 512
    """The pool keeps this many of the most recent segments."""
    val_fraction: float = 0.2
    """Share of the labelled pairs held out to measure the reward model's accuracy."""
    center: str = "absorbing"
    """Centring of the normalised r̂: absorbing (r̂_∅ = 0, for tasks that terminate) or mean (zero mean)."""
    normalize_returns: bool = False
    """Also scale the centred r̂ by the running std of its discounted return (γ = env.reward_gamma, clipped to
    ±env.clip_reward), as env.normalize_reward does for a true reward (which prefs never sees)."""

    CHECKS = {  # valid ranges (postrl.runtime.config.validate)
        "segment_length": ">= 1",
        "label_budget": ">= 1",
        "initial_labels": ">= 0",
        "label_until": "(0, 1]",
        "label_decay": ">= 0",
        "candidates_per_label": ">= 1",
        "segments_per_rollout": ">= 1",
        "pool_size": ">= 1",
        "val_fraction": "[0, 1)",
    }


@dataclass(frozen=True)
class PageConfig:
    """People label on the page of `postrl label` while the agent trains (``labeller.source: page``)."""

    folder: str = "labelling"
    """The labelling folder the run writes the pairs it wants labelled into (relative: inside the run folder)."""
    serve: bool = True
    """Serve the page from the run (a background thread); false: the run prints the `postrl label --out
    FOLDER` command to serve it from another terminal."""
    host: str = "127.0.0.1"
    """Address the page binds to (127.0.0.1: this computer only)."""
    port: int = 8765
    """Port of the page (0: any free port; the run prints the address)."""
    wait: str = "initial"
    """When the labels are short: initial (wait for the initial labels before PPO uses r̂, then train on the
    labels so far, as Christiano et al.'s labellers worked while the agent trained), all (every iteration waits
    until each pair asked for is judged or skipped), none (never wait)."""
    timeout: float | None = None
    """Seconds one wait lasts at most before training goes on with the labels so far (null: no limit)."""
    poll_seconds: float = 0.2
    """How often a waiting run reads the page's judgements."""
    clip_width: int = 240
    """Width in pixels of the segments' clips."""
    fps: int = 15
    """Frames per second of the clips."""

    CHECKS = {  # valid ranges (postrl.runtime.config.validate)
        "port": "[0, 65535]",
        "timeout": ">= 0",
        "poll_seconds": "> 0",
        "clip_width": ">= 16",
        "fps": ">= 1",
    }


@dataclass(frozen=True)
class SegmentLabellerConfig:
    """Who labels the segment pairs: the synthetic labeller, people on the page, or a judge."""

    source: str = "synthetic"
    """synthetic (the true returns compared, with tie_tolerance and flip_prob), page (people, see
    labeller.page), fn:MODULE:FUNCTION (a Python function of two segments returning P(first preferred)),
    or rm:RUN_DIR (the reward-model ensemble of an earlier prefs run)."""
    tie_tolerance: float = 0.0
    """synthetic: label 0.5 (equally good) when the two segments' true returns differ by at most this."""
    flip_prob: float = 0.0
    """synthetic: probability that a non-tie label is flipped (a noisy annotator; 0.1 is 10% label noise)."""
    page: PageConfig = field(default_factory=PageConfig)
    """source page: the labelling folder, the page, and what to do when labels are short."""

    CHECKS = {"tie_tolerance": ">= 0", "flip_prob": "[0, 1]"}  # valid ranges


@dataclass(frozen=True)
class ControlPrefsConfig:
    """A ``postrl control prefs`` run, as its config.yaml holds it: env, networks, run, PPO, the preference
    schedule, the reward model and the labeller."""

    algo: str = "prefs"
    """Algorithm name (fixed for this config class)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Environment settings (sync envs, no reward normalisation: the reward is the learned one)."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """Actor and critic networks."""
    run: ControlRunConfig = field(default_factory=ControlRunConfig)
    """Budget, seed, logging, evaluation and checkpoints."""
    ppo: ppo.PPOHyperparams = field(default_factory=ppo.PPOHyperparams)
    """PPO hyperparameters (the policy learner)."""
    prefs: PrefsConfig = field(default_factory=PrefsConfig)
    """Segments, label schedule, pair selection, normalisation of r̂."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """The reward-model ensemble and its optimiser."""
    labeller: SegmentLabellerConfig = field(default_factory=SegmentLabellerConfig)
    """Where the labels come from: the synthetic labeller, people on the labelling page, or a judge."""


CENTERS = ("absorbing", "mean")
SELECTIONS = ("random", "disagreement")
WAITS = ("initial", "all", "none")


def validate_prefs(cfg: ControlPrefsConfig) -> None:
    """Raise `ConfigError` for what the ``CHECKS`` ranges cannot say: the choices, ``segment_length`` within
    one rollout, ``initial_labels`` within the budget, no env reward normalisation."""
    p = cfg.prefs
    if p.center not in CENTERS:
        raise ConfigError(f"'prefs.center': {p.center!r} is not one of {', '.join(CENTERS)}")
    if p.pair_selection not in SELECTIONS:
        raise ConfigError(
            f"'prefs.pair_selection': {p.pair_selection!r} is not one of {', '.join(SELECTIONS)}"
        )
    if not 1 <= p.segment_length <= cfg.ppo.n_steps:
        raise ConfigError(f"'prefs.segment_length' must be in [1, ppo.n_steps={cfg.ppo.n_steps}]")
    if p.label_decay < 0:
        raise ConfigError("'prefs.label_decay' must be ≥ 0")
    if not 0 <= p.initial_labels <= p.label_budget:
        raise ConfigError("'prefs.initial_labels' must be between 0 and prefs.label_budget")
    if cfg.env.normalize_reward:
        raise ConfigError(
            "'env.normalize_reward' must be false for prefs: the env reward is never used "
            "(prefs.normalize_returns scales the learned reward instead)"
        )
    if not 0 <= cfg.reward_model.random_response < 1:
        raise ConfigError("'reward_model.random_response' must be in [0, 1)")
    if not 0 <= cfg.labeller.flip_prob <= 1:
        raise ConfigError("'labeller.flip_prob' must be in [0, 1]")
    if cfg.labeller.page.wait not in WAITS:
        raise ConfigError(
            f"'labeller.page.wait': {cfg.labeller.page.wait!r} is not one of {', '.join(WAITS)}"
        )
