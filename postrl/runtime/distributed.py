"""Many processes through PyTorch's own engine: ``torchrun`` + ``torch.distributed`` (gloo / nccl).

Single-process runs need no set-up: every helper here is a no-op (identity) when no process group
exists, so trainers call them unconditionally and stay one code path.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file

from postrl.runtime.checkpoint import STATE_FILE
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
    """The module inside a DDP wrapper (what gets saved). An FSDP2 module is its own inner module."""
    return module.module if isinstance(module, torch.nn.parallel.DistributedDataParallel) else module


PARALLEL = ("ddp", "fsdp")
"""How a trained model is spread over ranks: ``ddp`` replicates it (DistributedDataParallel), ``fsdp``
shards parameters, gradients and optimiser state (FSDP2 ``fully_shard``) for models one device cannot hold."""


def wrap_model(
    module: torch.nn.Module, info: DistInfo, strategy: str = "ddp", forward_methods: tuple[str, ...] = ()
) -> torch.nn.Module:
    """``module`` ready for data-parallel training under ``strategy`` (``ddp`` or ``fsdp``).

    One process: the module itself, whatever the strategy. ``fsdp`` shards each transformer block (the
    classes a Hugging Face model, or one inside ``module``, lists in ``_no_split_modules``) and then the
    root, in place, so the returned object is ``module``; build the optimiser after this call, on its
    (sharded) parameters. ``forward_methods`` (e.g. ``("score",)``) are methods besides ``forward`` that
    run the module and so must gather its parameters too (FSDP2 ``register_fsdp_forward_method``).
    Both strategies average gradients over ranks, so a loss normalised by a global count is multiplied by
    ``world_size`` (see the trainers).
    """
    if strategy not in PARALLEL:
        raise ValueError(f"parallel must be one of {PARALLEL}, got '{strategy}'")
    if info.world_size <= 1:
        return module
    if strategy == "ddp":
        return wrap_ddp(module, info)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method  # FSDP2 (torch >= 2.6)

    mesh = init_device_mesh(info.device.type, (info.world_size,))
    names = {name for m in module.modules() for name in getattr(m, "_no_split_modules", None) or ()}
    for block in [m for m in module.modules() if type(m).__name__ in names]:
        fully_shard(block, mesh=mesh)
    fully_shard(module, mesh=mesh)
    for name in forward_methods:
        register_fsdp_forward_method(module, name)
    return module


def is_sharded(module: torch.nn.Module) -> bool:
    """Whether ``module`` holds FSDP2-sharded parameters (its state must be gathered to be saved)."""
    if not is_distributed():
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def whole_tensors(params: Iterable[torch.Tensor]) -> bool:
    """Whether every tensor is a plain (whole) one: False for FSDP2's DTensor shards, outside `gathered`."""
    return all(type(p) in (torch.Tensor, torch.nn.Parameter) for p in params)


@contextlib.contextmanager
def no_grad_sync(model: torch.nn.Module) -> Iterator[None]:
    """Accumulate gradients locally (no all-reduce / reduce-scatter) inside the block: DDP ``no_sync``,
    FSDP2 ``set_requires_gradient_sync(False)``; a plain module needs nothing."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        with model.no_sync():
            yield
    elif is_sharded(model):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


@contextlib.contextmanager
def gathered(*models: torch.nn.Module | None) -> Iterator[None]:
    """Inside the block every parameter of each FSDP2-sharded model is whole (plain tensors) on every rank,
    e.g. for generation code that reads weights directly; resharded on exit. Every rank must enter it, and
    may run any forwards inside (no collective). A module that is not sharded (or None) needs nothing."""
    with contextlib.ExitStack() as stack:
        for model in models:
            if model is not None and is_sharded(model):
                stack.enter_context(_gathered(model))
        yield


@contextlib.contextmanager
def _gathered(model: torch.nn.Module) -> Iterator[None]:
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    # A forward inside must not reshard (the next one would all-gather: a collective that ranks decoding a
    # different number of steps would not all join), so reshard_after_forward is off until the exit. The
    # root's lazy init runs first: it is what turns the root's own resharding off for training.
    model._get_fsdp_state()._lazy_init()
    reshards = [any(g._reshard_after_forward for g in u._get_fsdp_state()._fsdp_param_groups) for u in units]
    for unit in units:
        unit.unshard()
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit, reshard in zip(units, reshards, strict=True):
            unit.set_reshard_after_forward(reshard, recurse=False)
            unit.reshard()


def grad_norm(params: Iterable[torch.nn.Parameter], max_norm: float | None) -> float:
    """Global L2 norm of the gradients (over every rank's shard under FSDP); clip to ``max_norm`` if given."""
    params = [p for p in params if p.grad is not None]
    if not params:
        return 0.0
    if max_norm is None:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    else:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def _full_options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def model_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole, unsharded state dict of ``module`` (what rank 0 saves).

    Sharded (FSDP2): a collective that every rank must call; rank 0 gets the full tensors on CPU, the others
    an empty dict. Otherwise: ``unwrap(module).state_dict()``.
    """
    if not is_sharded(module):
        return unwrap(module).state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(module, options=_full_options())


def without_tied_copies(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` without the extra names of tied parameters (e.g. ``lm_head.weight`` = the embedding),
    keeping the first registered name (for a Hugging Face causal LM the input embedding, as
    ``save_pretrained`` does: a trunk loaded with ``AutoModel`` then finds its embedding). The file loads
    with ``safetensors.torch.load_model(..., strict=True)``, which takes the names it finds in the file."""
    groups: dict[int, list[str]] = {}
    for name, param in unwrap(module).named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    drop = {name for names in groups.values() for name in names[1:]}
    return {k: v for k, v in state.items() if k not in drop}


def load_model_state_dict(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a full state dict (as saved by rank 0) into ``module``; each FSDP2 rank keeps its shard."""
    if not is_sharded(module):
        unwrap(module).load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(module, state, options=StateDictOptions(full_state_dict=True))


def optimizer_state_dict(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimiser state to save: gathered and keyed by parameter name under FSDP2 (a collective;
    empty except on rank 0), ``optimizer.state_dict()`` otherwise."""
    if not is_sharded(module):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(module, optimizer, options=_full_options())


def load_optimizer_state_dict(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Inverse of :func:`optimizer_state_dict` (same world size and strategy as the run that saved it)."""
    if not is_sharded(module):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(module, optimizer, state, options=StateDictOptions(full_state_dict=True))


def saved_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, dict[str, Any]]:
    """(weights, optimiser state) of ``module`` as `postrl.runtime.checkpoint.save_checkpoint` takes them.

    Sharded (FSDP2): a collective that every rank must call; rank 0 gets the full weights (without tied copies,
    see :func:`without_tied_copies`) and the gathered optimiser state. Otherwise: the module and its state."""
    if not is_sharded(module):
        return unwrap(module), optimizer.state_dict()
    weights = without_tied_copies(module, model_state_dict(module))
    return weights, optimizer_state_dict(module, optimizer)


def load_sharded(
    folder: str | os.PathLike, module: torch.nn.Module, optimizer: torch.optim.Optimizer, name: str, opt: str
) -> None:
    """Restore a sharded ``module`` and its ``optimizer`` from checkpoint ``folder`` (written from
    :func:`saved_state`): weights ``name.safetensors``, optimiser ``opt``; each rank keeps its shard (same
    world size as the run that saved it)."""
    folder = os.fspath(folder)
    load_model_state_dict(module, load_file(os.path.join(folder, f"{name}.safetensors")))
    state = torch.load(os.path.join(folder, STATE_FILE), map_location="cpu", weights_only=True)
    load_optimizer_state_dict(module, optimizer, state["optimizers"][opt])


def all_gather_object(obj: Any) -> list[Any]:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank (``[obj]`` in one process)."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def shard_range(n: int, info: DistInfo | None = None) -> range:
    """This rank's contiguous share of ``n`` items (sizes differ by at most one)."""
    r, w = (info.rank, info.world_size) if info else (rank(), world_size())
    base, rest = divmod(n, w)
    start = r * base + min(r, rest)
    return range(start, start + base + (1 if r < rest else 0))


def cleanup() -> None:
    if is_distributed():
        dist.destroy_process_group()
