"""postrl.control: Part 1 of the notes on Gymnasium — REINFORCE, A2C, TRPO and PPO, plus tabular methods.

Layout (each algorithm is one file you can read top to bottom; all the math comes from ``postrl.core``):

- ``envs``: vector envs in SAME_STEP autoreset mode (``terminated`` and ``truncated`` kept apart; the final
  observation of a truncated episode is kept for bootstrapping), episode statistics, observation and
  reward normalisation whose statistics are saved with the checkpoint.
- ``policies``: MLP actor (categorical or diagonal Gaussian with state-independent log σ) and critic,
  orthogonal init, deterministic evaluation (argmax / mean).
- ``buffer``: ``[n_envs, n_steps]`` rollout storage (time last, as core) and the collection loop.
- ``reinforce``, ``a2c``, ``trpo``, ``ppo``: a config dataclass, a batch → loss function, the iteration.
- ``fast``: PPO's fast path (the gradient written out by hand, the rollout's actor in numpy, Adam on one flat
  tensor), chosen once by ``ppo.backend`` and pinned by tests to the reference path in ``ppo``; nothing in
  the algorithm files needs it to be read.
- ``loop``: the loop they share — run folder, metrics.jsonl, summary.json, checkpoints, exact resume,
  evaluation, curves.png, GIF.
- ``tabular``: value iteration, SARSA and Q-learning on FrozenLake / CliffWalking.
- ``commands``: ``postrl control train`` / ``postrl control eval``.

Quick start::

    postrl control train --algo ppo --env CartPole-v1 --seed 0 --out runs/ppo-cartpole
    postrl control eval runs/ppo-cartpole --episodes 20 --gif runs/ppo-cartpole/eval.gif

or from Python, the Stable-Baselines3 way (`postrl.control.api`)::

    import postrl.control

    agent = postrl.control.train("ppo", "CartPole-v1", total_steps=20_000, seed=0, out="runs/ppo-cartpole")
    action, _ = agent.predict(obs, deterministic=True)
    mean, std = postrl.control.evaluate(agent, n_episodes=10)
    agent = postrl.control.load("runs/ppo-cartpole")

This package never imports ``postrl.lm``; modules load lazily (``train``, ``load``, ``evaluate`` and ``Agent``
on first use), so ``import postrl.control`` is cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_API = ("Agent", "evaluate", "load", "train")


def __getattr__(name: str) -> Any:
    """``train``, ``load``, ``evaluate``, ``Agent`` from `postrl.control.api`, imported on first use."""
    if name in _API:
        return getattr(importlib.import_module("postrl.control.api"), name)
    raise AttributeError(f"module 'postrl.control' has no attribute {name!r}")
