"""Classic-control PPO on many processes (``torchrun`` + ``torch.distributed``, gloo on CPU).

What a rank does differently from one process, and nothing else (every helper is a no-op in one process):

- it steps its own ``n_envs`` envs, sub-env i seeded ``seed + rank·n_envs + i``, so 2 ranks × 4 envs see the
  episodes of 1 process × 8 envs, and samples actions from its own torch RNG (``seed + rank``);
- it learns on its share of the rollout: minibatches of ``batch_size / world_size`` of its own rows, whose
  gradients are averaged over ranks by one all-reduce (so the networks stay identical and one global
  minibatch of ``batch_size`` is used per step); advantages are whitened with the mean and std of the
  global minibatch, and the early stop on ``target_kl`` reads the KL averaged over ranks;
- after each iteration the observation / return normalisers fold in every rank's data (their raw moments
  add up exactly), the ended episodes of all ranks are gathered and the env steps of all ranks counted;
- only rank 0 logs, evaluates, plots and writes checkpoints. A checkpoint holds rank 0's env state where a
  one-process run keeps it (so ``postrl control eval`` loads it in one process) and each other rank's env
  state, env snapshot and RNG state beside it, so a resume with the same world size is exact.

With a full-batch update (``batch_size`` ≥ the global rollout) the update equals one process's on the same
global batch; with smaller minibatches each rank shuffles its own rows, so the minibatches (not their size)
depend on the world size, as in CleanRL's ``ppo_atari_multigpu.py``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist

from postrl.runtime import distributed as dist
from postrl.runtime.errors import UserError
from postrl.runtime.seeding import get_rng_state, set_rng_state

__all__ = ["SUPPORTED", "broadcast_modules", "env_seed", "gather_episodes", "local_batch_size", "setup"]

SUPPORTED = ("ppo",)
"""The algorithms that run under torchrun (the others refuse it)."""


def setup(algo: str) -> dist.DistInfo:
    """Join the process group that torchrun describes (gloo: the control networks run on CPU)."""
    if dist.is_distributed():  # a group made by the caller (e.g. a test with world size 1)
        return dist.DistInfo(dist.rank(), dist.world_size(), 0, torch.device("cpu"))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and algo not in SUPPORTED:
        raise UserError(
            f"postrl control {algo} runs in one process; of the control algorithms only "
            f"{', '.join(SUPPORTED)} runs under torchrun (launch {algo} without torchrun, e.g. one process per seed)"
        )
    return dist.init_distributed("cpu", backend="gloo")


def env_seed(seed: int, n_envs: int) -> int:
    """Seed of this rank's first sub-env: ranks see different episodes, and the union over ranks is the
    episodes one process with ``world_size · n_envs`` envs would see."""
    return seed + dist.rank() * n_envs


def local_batch_size(batch_size: int) -> int:
    """This rank's share of a global minibatch of ``batch_size`` rows."""
    world = dist.world_size()
    if batch_size % world:
        raise UserError(f"ppo.batch_size={batch_size} must be divisible by the number of processes ({world})")
    return batch_size // world


def whiten(advantages: torch.Tensor) -> torch.Tensor:
    """``advantages`` whitened with the mean and (Bessel-corrected) std over every rank's rows."""
    if not dist.is_distributed():
        # the arithmetic below without the all-reduces (a third of masked_whiten's ops)
        centered = advantages - advantages.sum() / len(advantages)
        var = (centered**2).sum() / max(len(advantages) - 1, 1)
        return centered * torch.rsqrt(var + 1e-8)
    moments = dist.all_reduce_sum(torch.stack([advantages.sum(), torch.tensor(float(len(advantages)))]))
    mean, count = moments[0] / moments[1], moments[1]
    centered = advantages - mean
    var = dist.all_reduce_sum((centered**2).sum()) / torch.clamp(count - 1, min=1.0)
    return centered * torch.rsqrt(var + 1e-8)


def mean_over_ranks(x: torch.Tensor) -> float:
    return float(dist.all_reduce_mean(x))


def sync_grads(params: list[torch.nn.Parameter]) -> None:
    """Average the gradients over ranks, in place (a gradient may be a view that must stay attached): one
    all-reduce of all of them, flattened (what DDP does in buckets)."""
    if not dist.is_distributed():
        return
    params = [p for p in params if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    tdist.all_reduce(flat, op=tdist.ReduceOp.SUM)
    flat /= dist.world_size()
    for p, part in zip(params, flat.split([p.numel() for p in params]), strict=True):
        p.grad.copy_(part.view_as(p))


def broadcast_modules(modules: dict[str, torch.nn.Module]) -> None:
    """Rank 0's parameters and buffers on every rank (the start of training: the same networks everywhere)."""
    if not dist.is_distributed():
        return
    for module in modules.values():
        for t in [*module.parameters(), *module.buffers()]:
            tdist.broadcast(t.data, src=0)


def gather_episodes(episodes: list, n_steps: int, n_envs: int) -> tuple[list, int]:
    """Every rank's ended episodes, with offsets counted in global env steps, and the global step count.

    A rank reports an episode that ended at rollout step t as offset (t + 1)·n_envs; globally that step is
    (t + 1)·n_envs·world_size. Episodes are ordered by step, then rank, then env.
    """
    world = dist.world_size()
    if world == 1:
        return episodes, n_steps
    merged = []
    for r, eps in enumerate(dist.all_gather_object(episodes)):
        merged += [(offset * world, r, i, ret, length) for i, (offset, ret, length) in enumerate(eps)]
    merged.sort(key=lambda e: e[:3])
    return [(offset, ret, length) for offset, _, _, ret, length in merged], n_steps * world


def _normalisers(env: Any) -> list:
    return [env.obs_rms, env.ret_rms]


def _raw_moments(rms: Any) -> np.ndarray:
    """(count, count·mean, count·(var + mean²)): moments that add up when two streams are merged."""
    c = rms.count
    return np.concatenate([[c], c * rms.mean.ravel(), c * (rms.var + rms.mean**2).ravel()])


def normaliser_moments(env: Any) -> list:
    """The normalisers' moments before an iteration, for :func:`sync_normalisers` after it."""
    return [None if rms is None else _raw_moments(rms) for rms in _normalisers(env)]


def sync_normalisers(env: Any, before: list) -> None:
    """Fold what every rank's normalisers saw since ``before`` into each rank's (then identical) statistics."""
    if dist.world_size() == 1:
        return
    for rms, start in zip(_normalisers(env), before, strict=True):
        if rms is None:
            continue
        seen = dist.all_reduce_sum(torch.from_numpy(_raw_moments(rms) - start)).numpy()
        total = start + seen
        k, count = rms.mean.size, total[0]
        mean = total[1 : 1 + k] / count
        var = np.maximum(total[1 + k :] / count - mean**2, 0.0)
        rms.count, rms.mean, rms.var = float(count), mean.reshape(rms.mean.shape), var.reshape(rms.var.shape)


def _snapshot_name(rank: int) -> str:
    return "env_state.npz" if rank == 0 else f"env_state.rank{rank}.npz"


def gather_rank_states(env: Any) -> tuple[list[dict[str, Any]], list[bytes | None]]:
    """Every rank's env state and RNG state, and its env snapshot (a collective; in one process: this one's)."""
    gathered = dist.all_gather_object(({"env": env.state_dict(), "rng": get_rng_state()}, env.snapshot()))
    return [state for state, _ in gathered], [snapshot for _, snapshot in gathered]


def write_snapshots(snapshots: list[bytes | None]) -> Any:
    """``write_files`` for ``save_checkpoint``: each rank's env snapshot (rank 0's as in one process)."""

    def write(tmp: Path) -> None:
        for r, snapshot in enumerate(snapshots):
            if snapshot is not None:
                (tmp / _snapshot_name(r)).write_bytes(snapshot)

    return write


def restore_rank(ckpt: Path, extra: dict[str, Any], env: Any) -> bool:
    """Give this rank its own env state, snapshot and RNG from a checkpoint (rank 0's is already loaded).

    Returns whether the envs were restored from a snapshot (if not, the caller resets them). Refuses a
    checkpoint written by another number of processes, and a snapshot file that is not one; an old pickled
    snapshot (``.pkl``) is never loaded: the envs are then reset as when there is none.
    """
    saved, world = int(extra.get("world_size", 1)), dist.world_size()
    if saved != world:
        raise UserError(
            f"{ckpt} was written by {saved} process(es); resume it with the same number (got {world}); "
            "`postrl control eval` loads it in one process"
        )
    r = dist.rank()
    if r > 0:
        state = extra["ranks"][r]
        env.load_state_dict(state["env"])
        set_rng_state(state["rng"])
    snapshot = ckpt / _snapshot_name(r)
    if snapshot.is_file():
        try:
            env.restore(snapshot.read_bytes())
        except ValueError as err:
            raise UserError(
                f"{snapshot} is not a valid env snapshot: {err}; delete it to resume from {ckpt.name} "
                "with re-seeded envs (not bit-identical to an uninterrupted run)"
            ) from err
        return True
    legacy = snapshot.with_suffix(".pkl")
    if legacy.is_file():
        # postrl < this format pickled the envs; unpickling a file can run any code, so it is never read
        print(f"postrl: {legacy} is a pickled env snapshot (older postrl); it is not loaded", file=sys.stderr)
    return False
