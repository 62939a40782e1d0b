#!/usr/bin/env python
"""Reusable on-policy RL benchmark harness (reference backend: Stable-Baselines3 PPO).

Measures, per (config, torch-threads, seed):
  * env steps per second during training (total_timesteps / wall-clock of training)
  * training wall-clock (s)
  * env steps until the moving average of the last 20 *training* episode returns
    (across all vectorized envs, in completion order) first reaches the threshold
    (CartPole-v1: 475, Pendulum-v1: -200); None if never reached
  * final mean/std return over 20 evaluation episodes (deterministic policy,
    fresh env, seeds 10_000+seed*100+i, not counted in wall-clock)

Usage (from the repository root; `make peers` builds the venv from requirements-sb3.txt):
  make peers
  benchmarks/peers/.venv-sb3/bin/python benchmarks/peers/sb3_bench.py --config cartpole_zoo --threads 1 --seeds 0 1 2 --out res.jsonl
  benchmarks/peers/.venv-sb3/bin/python benchmarks/peers/sb3_bench.py --summarize res.jsonl
  benchmarks/peers/.venv-sb3/bin/python benchmarks/peers/sb3_bench.py --list

To benchmark another library on the same task, write a runner with the signature
    run_fn(cfg: dict, seed: int, tracker: ReturnTracker) -> predict_fn
where the runner trains for cfg["total_timesteps"] env steps, calls
tracker.on_episode(ep_return, global_env_steps) for every finished training
episode, and returns predict_fn(obs: np.ndarray) -> action for a single
(unbatched) observation. Register it in BACKENDS and call with --backend NAME.
Everything else (timing, thresholds, evaluation, JSON output) is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import deque

import numpy as np

THRESHOLDS = {"CartPole-v1": 475.0, "Pendulum-v1": -200.0, "Acrobot-v1": -100.0}
WINDOW = 20
N_EVAL = 20


def linear_schedule(initial: float):
    # SB3 passes progress_remaining (1 -> 0); rl-zoo "lin_X" == X * progress_remaining
    def f(progress_remaining: float) -> float:
        return progress_remaining * initial

    return f


# --------------------------------------------------------------------------------------
# Configs. "algo_kwargs" are SB3 PPO kwargs; other backends may interpret the same dict.
# --------------------------------------------------------------------------------------
CONFIGS = {
    # rl-baselines3-zoo hyperparams/ppo.yml "CartPole-v1" (tuned)
    "cartpole_zoo": dict(
        env_id="CartPole-v1",
        n_envs=8,
        total_timesteps=100_000,
        algo_kwargs=dict(
            n_steps=32,
            batch_size=256,
            gae_lambda=0.8,
            gamma=0.98,
            n_epochs=20,
            ent_coef=0.0,
            learning_rate=("lin", 0.001),
            clip_range=("lin", 0.2),
        ),
    ),
    # SB3 PPO defaults (n_steps=2048, batch 64, 10 epochs, lr 3e-4, gamma .99, lambda .95), 1 env
    "cartpole_default": dict(
        env_id="CartPole-v1",
        n_envs=1,
        total_timesteps=100_000,
        algo_kwargs=dict(),
    ),
    # rl-baselines3-zoo hyperparams/ppo.yml "Pendulum-v1" (tuned; uses gSDE)
    "pendulum_zoo": dict(
        env_id="Pendulum-v1",
        n_envs=4,
        total_timesteps=100_000,
        algo_kwargs=dict(
            n_steps=1024,
            gae_lambda=0.95,
            gamma=0.9,
            n_epochs=10,
            ent_coef=0.0,
            learning_rate=1e-3,
            clip_range=0.2,
            use_sde=True,
            sde_sample_freq=4,
        ),
    ),
    # same as pendulum_zoo but plain diagonal Gaussian (no gSDE) -- closer to what a
    # "classic" PG library implements
    "pendulum_zoo_nosde": dict(
        env_id="Pendulum-v1",
        n_envs=4,
        total_timesteps=100_000,
        algo_kwargs=dict(
            n_steps=1024,
            gae_lambda=0.95,
            gamma=0.9,
            n_epochs=10,
            ent_coef=0.0,
            learning_rate=1e-3,
            clip_range=0.2,
        ),
    ),
}


def _resolve(v):
    if isinstance(v, (tuple, list)) and len(v) == 2 and v[0] == "lin":
        return linear_schedule(float(v[1]))
    return v


class ReturnTracker:
    """Backend-agnostic: feed it finished training episodes in completion order."""

    def __init__(self, threshold: float | None, window: int = WINDOW):
        self.threshold = threshold
        self.buf = deque(maxlen=window)
        self.window = window
        self.n_episodes = 0
        self.steps_to_threshold = None
        self.episodes_to_threshold = None
        self.returns = []  # (step, return)

    def on_episode(self, ep_return: float, env_steps: int):
        self.n_episodes += 1
        self.buf.append(float(ep_return))
        self.returns.append((int(env_steps), float(ep_return)))
        if (
            self.steps_to_threshold is None
            and self.threshold is not None
            and len(self.buf) == self.window
            and np.mean(self.buf) >= self.threshold
        ):
            self.steps_to_threshold = int(env_steps)
            self.episodes_to_threshold = self.n_episodes


# --------------------------------------------------------------------------------------
# SB3 backend
# --------------------------------------------------------------------------------------
def run_sb3(cfg: dict, seed: int, tracker: ReturnTracker):
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    class EpisodeCallback(BaseCallback):
        def _on_step(self) -> bool:
            # make_vec_env wraps each env in Monitor -> info["episode"]["r"] at episode end
            for info in self.locals["infos"]:
                ep = info.get("episode")
                if ep is not None:
                    tracker.on_episode(ep["r"], self.num_timesteps)
            return True

    env = make_vec_env(cfg["env_id"], n_envs=cfg["n_envs"], seed=seed)
    kwargs = {k: _resolve(v) for k, v in cfg["algo_kwargs"].items()}
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kwargs)
    model.learn(total_timesteps=cfg["total_timesteps"], callback=EpisodeCallback())
    env.close()

    def predict_fn(obs):
        action, _ = model.predict(obs, deterministic=True)
        return action

    predict_fn.actual_timesteps = model.num_timesteps  # SB3 rounds up to n_envs*n_steps
    return predict_fn


BACKENDS = {"sb3": run_sb3}


def evaluate(env_id: str, predict_fn, n_episodes: int, seed: int):
    import gymnasium as gym

    env = gym.make(env_id)
    rets = []
    for i in range(n_episodes):
        obs, _ = env.reset(seed=10_000 + seed * 100 + i)
        done, total = False, 0.0
        while not done:
            obs, r, term, trunc, _ = env.step(predict_fn(obs))
            total += float(r)
            done = term or trunc
        rets.append(total)
    env.close()
    return float(np.mean(rets)), float(np.std(rets))


def run_one(backend: str, cfg_name: str, threads: int, seed: int, cfg_override: dict | None = None):
    import torch

    torch.set_num_threads(threads)
    cfg = dict(CONFIGS[cfg_name])
    if cfg_override:
        cfg.update(cfg_override)
    tracker = ReturnTracker(THRESHOLDS.get(cfg["env_id"]))
    t0 = time.perf_counter()
    predict_fn = BACKENDS[backend](cfg, seed, tracker)
    wall = time.perf_counter() - t0
    steps = getattr(predict_fn, "actual_timesteps", cfg["total_timesteps"])
    t1 = time.perf_counter()
    eval_mean, eval_std = evaluate(cfg["env_id"], predict_fn, N_EVAL, seed)
    eval_wall = time.perf_counter() - t1
    last = [r for _, r in tracker.returns[-WINDOW:]]
    return dict(
        backend=backend,
        config=cfg_name,
        env_id=cfg["env_id"],
        threads=threads,
        seed=seed,
        total_timesteps=steps,
        train_wall_s=round(wall, 2),
        sps=round(steps / wall, 1),
        threshold=tracker.threshold,
        steps_to_threshold=tracker.steps_to_threshold,
        episodes_to_threshold=tracker.episodes_to_threshold,
        train_episodes=tracker.n_episodes,
        final_train_ma20=round(float(np.mean(last)), 2) if last else None,
        eval_mean=round(eval_mean, 2),
        eval_std=round(eval_std, 2),
        eval_wall_s=round(eval_wall, 2),
        torch=torch.__version__,
        python=platform.python_version(),
        cpus=os.cpu_count(),
    )


def summarize(path: str):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    groups = {}
    for r in rows:
        groups.setdefault((r["backend"], r["config"], r["threads"]), []).append(r)
    hdr = f"{'backend':6} {'config':20} thr n  {'SPS':>14} {'wall_s':>12} {'steps_to_thr (per seed)':>30} {'eval_mean (per seed)':>30}"
    print(hdr)
    for (b, c, t), rs in groups.items():
        sps = np.array([r["sps"] for r in rs])
        wall = np.array([r["train_wall_s"] for r in rs])
        stt = [r["steps_to_threshold"] for r in rs]
        ev = [r["eval_mean"] for r in rs]
        print(
            f"{b:6} {c:20} {t:3} {len(rs)}  {sps.mean():8.0f}±{sps.std():<5.0f} {wall.mean():7.1f}±{wall.std():<4.1f}"
            f" {str(stt):>30} {str(ev):>30}"
        )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="sb3", choices=list(BACKENDS))
    p.add_argument("--config", choices=list(CONFIGS))
    p.add_argument("--threads", type=int, nargs="+", default=[1])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--timesteps", type=int, default=None, help="override total_timesteps")
    p.add_argument("--out", default=None, help="append JSON lines here")
    p.add_argument("--summarize", default=None)
    p.add_argument("--list", action="store_true")
    a = p.parse_args()
    if a.list:
        print(json.dumps(CONFIGS, indent=1, default=str))
        return
    if a.summarize:
        summarize(a.summarize)
        return
    override = {"total_timesteps": a.timesteps} if a.timesteps else None
    for th in a.threads:
        for s in a.seeds:
            res = run_one(a.backend, a.config, th, s, override)
            line = json.dumps(res)
            print(line, flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(line + "\n")


if __name__ == "__main__":
    sys.exit(main())
