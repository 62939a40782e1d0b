"""Many processes through PyTorch's own engine: ``torchrun`` + ``torch.distributed`` (gloo / nccl).

Single-process runs need no set-up: every helper here is a no-op (identity) when no process group
exists, so trainers call them unconditionally and stay one code path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from postrl.runtime.seeding import resolve_device


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str = "auto", backend: str | None = None) -> DistInfo:
    """Join the process group that ``torchrun`` describes in the environment (RANK, WORLD_SIZE, ...).

    Without those variables this is a single process on ``device``. On CUDA each rank takes
    ``cuda:LOCAL_RANK`` and the backend defaults to nccl; on CPU it is gloo.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or "RANK" not in os.environ:
        return DistInfo(0, 1, 0, resolve_device(device))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend or ("nccl" if dev.type == "cuda" else "gloo"))
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, dev)


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of ``t`` over ranks (a new tensor; the input is not modified)."""
    out = t.detach().clone()
    if is_distributed():
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def all_reduce_mean(t: torch.Tensor) -> torch.Tensor:
    """Mean of ``t`` over ranks."""
    return all_reduce_sum(t) / world_size()


def reduce_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Average each scalar metric over ranks (one all-reduce for the whole dict)."""
    if not is_distributed() or not metrics:
        return dict(metrics)
    keys = sorted(metrics)
    values = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64)
    values = all_reduce_mean(values)
    return dict(zip(keys, values.tolist(), strict=True))


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` from rank ``src`` on every rank (e.g. a resume decision made by rank 0)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def wrap_ddp(module: torch.nn.Module, info: DistInfo) -> torch.nn.Module:
    """``DistributedDataParallel(module)`` when running distributed, the module itself otherwise."""
    if info.world_size <= 1:
        return module
    ids = [info.device.index] if info.device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(module, device_ids=ids)


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP wrapper (what gets saved)."""
    return module.module if isinstance(module, torch.nn.parallel.DistributedDataParallel) else module


def shard_range(n: int, info: DistInfo | None = None) -> range:
    """This rank's contiguous share of ``n`` items (sizes differ by at most one)."""
    r, w = (info.rank, info.world_size) if info else (rank(), world_size())
    base, rest = divmod(n, w)
    start = r * base + min(r, rest)
    return range(start, start + base + (1 if r < rest else 0))


def cleanup() -> None:
    if is_distributed():
        dist.destroy_process_group()
