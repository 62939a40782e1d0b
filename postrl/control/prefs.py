"""Deep RL from segment preferences (Christiano et al. 2017, arXiv:1706.03741) on Gymnasium tasks.

The loop of the notes (Part 2, §2), run as PPO iterations (``postrl.control.ppo``):

1. the policy collects a rollout; random segments of ``segment_length`` steps are cut from it into a pool;
2. following the label schedule (``initial_labels`` at once, the rest of ``label_budget`` at a decaying rate
   until ``label_until`` of the run: ``prefs_reward.labels_due``), pairs are drawn from the pool, at random
   or where the ensemble disagrees most (variance of P_k(σ¹ ≻ σ²) over members), and labelled
   (``labeller.source``): by a judge that answers at once (``prefs_judges``: the synthetic labeller, which
   compares true returns, a Python function, or an earlier run's reward model), or by people on the labelling
   page, who label while the agent trains (``prefs_people``);
3. the reward-model ensemble (``prefs_reward``) takes gradient steps on every label so far;
4. the rollout's rewards are replaced by the normalised learned reward, then GAE and the PPO update.

Reward flow: the true reward never reaches the policy. Each sub-env is wrapped in :class:`RewardTap`, which
writes the true reward onto its own tape and hands the vector env a *poisoned* reward (NaN): anything that
learned from it would turn NaN. The labeller and the logged true return read the tape; the rollout buffer's
rewards are overwritten with r̂ before GAE (PPO's ``rollout_hook``). Evaluation uses a fresh env without
taps, so ``eval_return_mean`` is the true return of the final policy.

Normalisation of r̂ (``center``): each member is divided by the std of its r̂ over every step of the
labelled segments (so the PPO hyperparameters see a reward of unit scale), then centred, and the members
are averaged.
- ``absorbing`` (default): subtract the learned absorbing-state reward r̂_∅, so that the state after a
  termination is worth exactly the 0 that PPO bootstraps. On CartPole survival is then rewarded iff the
  model learned r̂(alive) > r̂_∅, i.e. iff the labels said falling is worse.
- ``mean``: zero mean, unit std (Christiano et al.). Where episodes can terminate this changes the task:
  every below-average state has a negative reward, so PPO (bootstrapping 0 after termination) is paid to
  end the episode early there. Fine for tasks without termination (Pendulum).
``normalize_returns`` then scales the centred r̂ as Gymnasium's ``NormalizeReward`` scales a true reward (by
the running std of the discounted return), which PPO on Pendulum needs on the true reward; on r̂ it did not
help (configs/prefs-pendulum.yaml), so it is off by default.

Observations handed to the reward model are raw (un-normalised with the env's running statistics), so the
labelled segments do not drift with the observation normaliser.

The configs are in ``prefs_config.py``, the reward-model ensemble, segments and pair selection in
``prefs_reward.py``, the labellers in ``prefs_judges.py`` and ``prefs_people.py``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from postrl.control import ppo
from postrl.control.buffer import RolloutBuffer
from postrl.control.envs import RunningMeanStd, VecEnv
from postrl.control.loop import Learner, train_from_config
from postrl.control.prefs_config import ControlPrefsConfig as ControlPrefsConfig
from postrl.control.prefs_config import PrefsConfig as PrefsConfig
from postrl.control.prefs_config import validate_prefs
from postrl.control.prefs_judges import load_segment_judge
from postrl.control.prefs_people import PageLabeller
from postrl.control.prefs_reward import (
    Pairs,
    RewardEnsemble,
    Segments,
    accuracy,
    cut_segments,
    extract_segments,
    labels_due,
    pick_segments,
    reward_correlation,
    select_pairs,
    synthetic_labels,
    train_reward_model,
)
from postrl.runtime.checkpoint import atomic_write_text
from postrl.runtime.config import ConfigError
from postrl.runtime.logging import read_jsonl
from postrl.runtime.plots import write_curves

__all__ = [
    "ControlPrefsConfig",
    "PrefsConfig",
    "RewardTap",
    "build_prefs",
    "extract_segments",
    "run",
    "select_pairs",
]


class RewardTap(gym.Wrapper):
    """Moves the true reward off the learning path: it is appended to ``tape`` (read by the labeller and
    the logs), and the agent-facing reward becomes ``fill`` (NaN: a leak into learning would show)."""

    fill = float("nan")

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.tape: list[float] = []

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.tape.append(float(reward))
        return obs, self.fill, terminated, truncated, {**info, "true_reward": reward}


def _tap_envs(env: VecEnv) -> list[RewardTap]:
    envs = env.sub_envs("prefs")
    if envs is None:
        raise ConfigError("prefs needs in-process envs (env.async_=false): the true reward is tapped per env")
    env.env.envs = [e if isinstance(e, RewardTap) else RewardTap(e) for e in envs]
    return env.env.envs


class Prefs(Learner):
    """PPO whose reward is an ensemble learned from labelled segment pairs, trained as the policy trains."""

    def __init__(self, cfg: ControlPrefsConfig, env: VecEnv):
        validate_prefs(cfg)
        self.cfg, self.env = cfg, env
        _tap_envs(env)
        self.ppo = ppo.PPOLearner(cfg, env, rollout_hook=self._on_rollout)
        self.actor = self.ppo.actor
        obs_dim = env.single_observation_space.shape[0]
        self.reward_model = RewardEnsemble(obs_dim, env.single_action_space, cfg.reward_model)
        rm = cfg.reward_model
        self.rm_optimizer = torch.optim.AdamW(
            self.reward_model.parameters(), lr=rm.lr, weight_decay=rm.weight_decay
        )
        lab, p = cfg.labeller, cfg.prefs
        self.page = (
            PageLabeller(lab.page, cfg.env.id, p.segment_length, p.val_fraction, cfg.env.kwargs)
            if lab.source == "page"
            else None
        )
        self.judge = None if self.page else load_segment_judge(lab, obs_dim, env.single_action_space)
        self.modules = {**self.ppo.modules, "reward_model": self.reward_model}
        self.optimizers = {**self.ppo.optimizers, "rm_optimizer": self.rm_optimizer}
        self.pairs: Pairs | None = None
        self.pool: Segments | None = None
        self.ep_true = np.zeros(env.n_envs)  # running true / learned return of each env's episode
        self.ep_learned = np.zeros(env.n_envs)
        self.ep_length = np.zeros(env.n_envs, dtype=np.int64)
        self.ret_rms = RunningMeanStd(()) if cfg.prefs.normalize_returns else None
        self.disc_return = np.zeros(env.n_envs)  # discounted learned return of each env's episode so far
        self._frac, self._metrics, self._episodes, self._it = 0.0, {}, [], 0

    @property
    def taps(self) -> list[RewardTap]:
        """The sub-envs' taps (read afresh: a resume restores the sub-envs' state in place from the data snapshot)."""
        return self.env.env.envs

    @property
    def labels_used(self) -> int:
        return 0 if self.pairs is None else len(self.pairs)

    @property
    def pairs_asked(self) -> int:
        """Pairs asked for so far: labelled at once by a judge, or shown to people on the page."""
        return self.labels_used if self.page is None else self.page.n_asked

    def attach(self, run_dir: Path) -> None:
        if self.page is not None:
            self.page.attach(run_dir)

    def close(self) -> None:
        if self.page is not None:
            self.page.close()

    def iteration(self, env: VecEnv, it: int, frac_done: float) -> tuple[dict, list, int]:
        self._frac, self._it = frac_done, it
        if self.page is not None:  # what the clips of this rollout's segments are drawn from
            self.page.renderer.rollout_start([tap.env for tap in self.taps], it)
        metrics, _poisoned_episodes, n_steps = self.ppo.iteration(env, it, frac_done)
        return {**metrics, **self._metrics}, self._episodes, n_steps

    # -- the preference loop, run on each rollout before GAE ---------------------------------------------
    def _on_rollout(self, buf: RolloutBuffer) -> None:
        true = torch.tensor([tap.tape for tap in self.taps], dtype=torch.float32)  # (E, T)
        for tap in self.taps:
            tap.tape.clear()
        obs = self._raw_obs(buf.obs)
        p = self.cfg.prefs
        picks = pick_segments(buf.terminated, buf.truncated, p.segment_length, p.segments_per_rollout)
        segs = cut_segments(obs, buf.actions, true, buf.terminated, picks, p.segment_length)
        if self.page is not None:
            self.page.renderer.add(self._it, picks, buf.actions, p.pool_size)
        self.pool = (
            segs if self.pool is None else Segments.cat([self.pool, segs]).take(slice(-p.pool_size, None))
        )
        first = self.labels_used == 0
        self._label(self._labels_due() - self.pairs_asked)
        if self.page is not None:
            self.pairs = self.page.labels(self._it, waiting_for_first=first)
        rm = self.cfg.reward_model
        steps = rm.pretrain_steps if first and self.pairs is not None else rm.steps_per_iteration
        rm_loss = None  # no labels yet (people on the page have not judged any): r̂ = 0 until they do
        if self.pairs is not None:
            rm_loss = train_reward_model(
                self.reward_model, self.rm_optimizer, self.pairs, steps, rm.batch_size, rm.random_response
            )
        with torch.no_grad():
            learned = self.learned_reward(obs, buf.actions)  # (E, T)
        buf.rewards.copy_(
            learned if self.ret_rms is None else self._scale_by_returns(learned, buf.episode_end)
        )
        self._episodes, learned_returns = self._track_episodes(true, learned, buf.episode_end)
        metrics = {**self._eval_model(), "rm_loss": rm_loss, "learned_return": _mean(learned_returns)}
        self._metrics = {k: math.nan if v is None else v for k, v in metrics.items()}  # NaN: not logged

    def _scale_by_returns(self, rewards: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """``rewards [E, T]`` / std of the discounted return (Gymnasium's NormalizeReward on r̂): the running
        statistics take in this rollout's returns, then the whole rollout is scaled by the updated std."""
        gamma, r, ends_np = self.cfg.env.reward_gamma, rewards.double().numpy(), ends.numpy()
        for t in range(r.shape[1]):
            self.disc_return = self.disc_return * gamma + r[:, t]
            self.ret_rms.update(self.disc_return)
            self.disc_return[ends_np[:, t]] = 0.0
        clip = self.cfg.env.clip_reward
        return (rewards / math.sqrt(self.ret_rms.var + 1e-8)).clamp(-clip, clip)

    def _labels_due(self) -> int:
        p = self.cfg.prefs
        return labels_due(self._frac, p.label_budget, p.initial_labels, p.label_until, p.label_decay)

    def _label(self, n: int) -> None:
        """Choose ``n`` pairs from the pool; a judge labels them at once (added to the labelled set), or they
        are shown to people on the page (their labels are read after)."""
        if n <= 0 or self.pool is None or len(self.pool) < 2:
            return
        p = self.cfg.prefs
        i, j = select_pairs(self.reward_model, self.pool, n, p.pair_selection, p.candidates_per_label)
        first, second = self.pool.take(i), self.pool.take(j)
        if self.page is not None:
            self.page.ask(first, second, i, j)
            return
        labels = self.judge(first, second)
        index = torch.arange(self.labels_used, self.labels_used + len(i), dtype=torch.float64)
        val = torch.floor((index + 1) * p.val_fraction) > torch.floor(index * p.val_fraction)
        new = Pairs(first, second, labels, val)
        if self.pairs is not None:
            old = self.pairs
            new = Pairs(
                Segments.cat([old.first, first]),
                Segments.cat([old.second, second]),
                torch.cat([old.labels, labels]),
                torch.cat([old.val, val]),
            )
        self.pairs = new

    def learned_reward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Normalised ensemble reward ``[*B]`` for raw ``obs [*B, obs_dim]`` (see ``center`` above)."""
        r = self.reward_model(obs, actions)  # (K, *B)
        if self.pairs is None:
            return torch.zeros(r.shape[1:])
        ref = self.reward_model.step_rewards(Segments.cat([self.pairs.first, self.pairs.second]))
        ref = ref.reshape(self.reward_model.k, -1)  # (K, N) r̂ on every step of the labelled segments
        center = self.reward_model.absorbing if self.cfg.prefs.center == "absorbing" else ref.mean(-1)
        shape = (-1, *([1] * (r.dim() - 1)))
        return ((r - center.reshape(shape)) / (ref.std(-1).reshape(shape) + 1e-8)).mean(0)

    def _eval_model(self) -> dict[str, Any]:
        if self.pairs is None:
            return {"labels_used": 0, "pairs_asked": self.pairs_asked}
        val = self.pairs.val
        held = Pairs(
            self.pairs.first.take(val), self.pairs.second.take(val), self.pairs.labels[val], val[val]
        )
        noiseless = synthetic_labels(
            held.first.true_returns(), held.second.true_returns(), self.cfg.labeller.tie_tolerance
        )
        return {
            "labels_used": self.labels_used,
            "pairs_asked": self.pairs_asked,
            "rm_accuracy": accuracy(self.reward_model, held, held.labels),
            "rm_accuracy_true": accuracy(self.reward_model, held, noiseless),
            "reward_correlation": reward_correlation(self.reward_model, held.first),
            "label_ties": float((self.pairs.labels == 0.5).float().mean()),
        }

    def _track_episodes(self, true: torch.Tensor, learned: torch.Tensor, ends: torch.Tensor) -> tuple:
        """Episodes ended in this rollout with their TRUE return (for the logs), and their learned returns."""
        episodes, learned_returns = [], []
        true_np, learned_np, ends_np = true.numpy(), learned.numpy(), ends.numpy()
        for t in range(true_np.shape[1]):
            self.ep_true += true_np[:, t]
            self.ep_learned += learned_np[:, t]
            self.ep_length += 1
            for e in np.flatnonzero(ends_np[:, t]):
                episodes.append(((t + 1) * len(self.taps), float(self.ep_true[e]), int(self.ep_length[e])))
                learned_returns.append(float(self.ep_learned[e]))
            done = ends_np[:, t]
            self.ep_true[done], self.ep_learned[done], self.ep_length[done] = 0.0, 0.0, 0
        return episodes, learned_returns

    def _raw_obs(self, obs: torch.Tensor) -> torch.Tensor:
        rms = self.env.obs_rms
        if rms is None:
            return obs.clone()
        std = torch.as_tensor(np.sqrt(rms.var + 1e-8), dtype=obs.dtype)
        return obs * std + torch.as_tensor(rms.mean, dtype=obs.dtype)

    # -- checkpoint ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "pairs": None if self.pairs is None else self.pairs.state_dict(),
            "pool": None if self.pool is None else self.pool.state_dict(),
            "ep_true": self.ep_true.tolist(),
            "ep_learned": self.ep_learned.tolist(),
            "ep_length": self.ep_length.tolist(),
            "ret_rms": None if self.ret_rms is None else self.ret_rms.state_dict(),
            "disc_return": self.disc_return.tolist(),
            "page": None if self.page is None else self.page.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pairs = None if state["pairs"] is None else Pairs.from_state(state["pairs"])
        self.pool = None if state["pool"] is None else Segments(**state["pool"])
        self.ep_true = np.asarray(state["ep_true"], dtype=np.float64)
        self.ep_learned = np.asarray(state["ep_learned"], dtype=np.float64)
        self.ep_length = np.asarray(state["ep_length"], dtype=np.int64)
        if self.ret_rms is not None and state.get("ret_rms") is not None:
            self.ret_rms.load_state_dict(state["ret_rms"])
        self.disc_return = np.asarray(state.get("disc_return", self.disc_return), dtype=np.float64)
        if self.page is not None and state.get("page") is not None:
            self.page.load_state_dict(state["page"])


def _mean(xs: list[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


def build_prefs(cfg: ControlPrefsConfig, env: VecEnv) -> Prefs:
    return Prefs(cfg, env)


def run(cfg: ControlPrefsConfig, run_dir, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Train (``postrl.control.loop.train_from_config``), then add the preference metrics to summary.json and curves.png,
    and plot the true return against the labels used (``true_return_vs_labels.png``)."""
    run_dir = Path(run_dir)
    summary = train_from_config(cfg, run_dir, resume=resume, overwrite=overwrite)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    last = rows[-1] if rows else {}
    summary = {
        **summary,
        "true_return": summary["eval_return_mean"],
        "labels_used": last.get("labels_used"),
        "rm_accuracy": last.get("rm_accuracy"),
        "rm_accuracy_true": last.get("rm_accuracy_true"),
        "reward_correlation": last.get("reward_correlation"),
        "labeller": cfg.labeller.source,
        "pairs_asked": last.get("pairs_asked"),
        "label_noise": cfg.labeller.flip_prob if cfg.labeller.source == "synthetic" else None,
    }
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    title = f"prefs on {cfg.env.id} (seed {cfg.run.seed})"
    _plot(rows, summary, run_dir / "true_return_vs_labels.png", title)
    keys = ["train_return_ma20", "eval_return", "labels_used", "rm_accuracy", "reward_correlation"]
    write_curves(run_dir, keys, title=title)  # curves.png, with the preference metrics
    return summary


def _plot(rows: list[dict], summary: dict, path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in (
        ("train_return_ma20", "true return (training, ma20)"),
        ("eval_return", "true return (eval)"),
    ):
        pts = [(r["labels_used"], r[key]) for r in rows if r.get(key) is not None and "labels_used" in r]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="." if key == "eval_return" else None, label=label)
    ax.axhline(summary["true_return"], ls="--", c="gray", label="final eval")
    ax.set_xlabel("labels used")
    ax.set_ylabel("true return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
