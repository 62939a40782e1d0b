"""Where an FSDP rank's memory goes (issue #37 item 3): SFT steps of a real-size model on two ranks, per phase.

Run under torchrun (gloo on CPU): each rank loads the model (`real_size.make_model`'s folder), shards it with
postrl's own ``run.parallel=fsdp`` wrapping (`postrl.runtime.distributed.wrap_model`: every decoder block, then
the root), builds AdamW, and takes ``--steps`` steps of `postrl.lm.trainer.train_step` on ``--batch`` random
sequences of ``--length`` tokens (the global batch; each rank takes its share). A thread samples the resident
set every 50 ms and keeps each phase's peak: load, wrap, optimiser, then per step its forward, backward and
what follows. Rank 0 also prints the resident set after the input embedding and after every block's forward
in the first step.

    .venv/bin/torchrun --nproc_per_node 2 benchmarks/real_size_fsdp_profile.py --model qwen0.5b --steps 2

Ends with one JSON line: every rank's peaks by phase (MB).
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import real_size
import torch


def resident_mb() -> float:
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20


class Phases:
    """The phase now and the resident set's peak within each phase, sampled by a daemon thread."""

    def __init__(self) -> None:
        self.now, self.peaks = "start", {}
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while True:
            now = self.now
            self.peaks[now] = max(self.peaks.get(now, 0.0), resident_mb())
            time.sleep(0.05)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(real_size.SHAPES), default="qwen0.5b")
    p.add_argument("--work", default=str(real_size.ROOT / "runs" / "bench_real_size"))
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--batch", type=int, default=4, help="sequences per step, over all ranks")
    p.add_argument("--length", type=int, default=128)
    args = p.parse_args()

    from pathlib import Path

    from postrl.lm.memory import MemoryConfig, configure_memory
    from postrl.lm.models import load_causal_lm
    from postrl.lm.trainer import OptimConfig, TrainConfig, make_optimizer, train_step
    from postrl.runtime import distributed as dist

    phases = Phases()
    info = dist.init_distributed("cpu")
    torch.set_num_threads(1)
    folder = Path(args.work) / args.model
    if info.rank == 0:
        real_size.make_model(args.model, folder)
    dist.barrier()
    phases.now = "load"
    model = load_causal_lm(str(folder), dtype=torch.float32, device=info.device)
    configure_memory(model, MemoryConfig())
    phases.now = "wrap"
    model = dist.wrap_model(model, info, "fsdp")
    phases.now = "optimizer"
    optimizer, _ = make_optimizer(model, OptimConfig(lr=1e-5), args.steps)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    examples = [
        {"input_ids": torch.randint(0, vocab, (args.length,), generator=g).tolist()}
        for _ in range(args.batch)
    ]
    for e in examples:
        e["labels"] = list(e["input_ids"])

    first: list[tuple[str, float]] = []
    base = model.model
    base.embed_tokens.register_forward_hook(
        lambda *_: first.append(("embedding", resident_mb())) if not step else None
    )
    for i, layer in enumerate(base.layers):
        layer.register_forward_hook(
            lambda *_, i=i: first.append((f"block {i}", resident_mb())) if not step else None
        )
    backward = torch.Tensor.backward

    def phased_backward(self, *a, **k):
        phases.now = f"step {step} backward"
        backward(self, *a, **k)
        phases.now = f"step {step} after backward"

    torch.Tensor.backward = phased_backward
    train = TrainConfig(batch_size=args.batch, max_length=args.length)
    for step in range(args.steps):
        phases.now = f"step {step} forward"
        train_step(model, optimizer, examples, list(range(args.batch)), train, OptimConfig(), 0, info.device)
        phases.now = f"step {step} after"
    time.sleep(0.2)
    mine = {k: round(v) for k, v in phases.peaks.items()}
    gathered = [None] * info.world_size
    torch.distributed.all_gather_object(gathered, mine)
    if info.rank == 0:
        for k, mb in first:
            print(f"rank 0, first step, after {k}: {mb:,.0f} MB")
        for rank, peaks in enumerate(gathered):
            print(f"rank {rank}: " + ", ".join(f"{k} {v:,}" for k, v in peaks.items()))
        print(json.dumps({"model": args.model, "ranks": info.world_size, "peaks_mb": gathered}))


if __name__ == "__main__":
    main()
