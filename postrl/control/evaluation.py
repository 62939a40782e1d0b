"""Evaluating a control policy: deterministic (or sampled) episodes on fresh envs with the training env's
frozen observation statistics, and a GIF of one episode."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from postrl.control.envs import VecEnv, make_env


@torch.no_grad()
def evaluate_policy_episodes(
    actor: nn.Module,
    env: VecEnv,
    cfg: Any,
    episodes: int,
    deterministic: bool = True,
    seed: int | None = None,
) -> list[float]:
    """Returns of ``episodes`` evaluation episodes, run in parallel, one per env seeded 10000 + 100·seed + i.

    Observations are normalised with the training env's statistics (frozen); returns are raw rewards.
    Stochastic evaluation samples from its own torch generator, so it does not disturb training's RNG.
    """
    seed = cfg.run.seed if seed is None else seed
    eval_cfg = dataclasses.replace(cfg.env, n_envs=episodes, async_=False, normalize_reward=False)
    eval_env = VecEnv(eval_cfg, seed, training=False)
    if env.obs_rms is not None:
        eval_env.obs_rms.load_state_dict(env.obs_rms.state_dict())
    generator = torch.Generator().manual_seed(10_000 + seed)
    obs = eval_env.reset(seed=10_000 + 100 * seed)
    returns: list[float | None] = [None] * episodes
    while any(r is None for r in returns):
        actions, _ = actor.act(torch.from_numpy(obs), deterministic=deterministic, generator=generator)
        step = eval_env.step(actions.numpy())
        for i, ret, _length in step.episodes:
            if returns[i] is None:
                returns[i] = ret
        obs = step.obs
    eval_env.close()
    return [float(r) for r in returns]


@torch.no_grad()
def record_gif(actor: nn.Module, env: VecEnv, cfg: Any, path: Path, max_frames: int = 500) -> Path | None:
    """One deterministic episode rendered to an animated GIF; None (with a message) if it cannot render."""
    try:
        from PIL import Image

        single = make_env(cfg.env.id, **{**cfg.env.kwargs, "render_mode": "rgb_array"})
    except Exception as err:  # noqa: BLE001 - rendering is optional; say why and go on
        print(f"postrl: no GIF ({err})", file=sys.stderr)
        return None
    obs, _ = single.reset(seed=10_000 + 100 * cfg.run.seed)
    frames = [Image.fromarray(single.render())]
    for _ in range(max_frames):
        x = env.normalize(np.asarray(obs)[None])
        action, _ = actor.act(torch.from_numpy(x), deterministic=True)
        obs, _, terminated, truncated, _ = single.step(env.to_env_actions(action.numpy())[0])
        frames.append(Image.fromarray(single.render()))
        if terminated or truncated:
            break
    single.close()
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=20, loop=0)
    return path
