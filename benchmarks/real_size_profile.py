"""Where the time and the memory of a real-size step go (issue #37 item 1): postrl or TRL 1.16, one process.

Runs one contender of `benchmarks/real_size.py` in this process (postrl through ``postrl.cli.main``; TRL through
that file's worker, under ``benchmarks/peers/.venv-trl``) with four instruments:

- the resident set sampled every 0.1 s by a thread, each sample tagged with the phase the run is in: a forward
  of the ``*ForCausalLM`` module (with or without gradients), a backward (``torch.autograd.backward``), an
  optimiser step (torch's global optimiser hooks), or what came after one of them;
- the process's CPU seconds (user and kernel) and minor page faults in each phase (``getrusage``): a page fault
  is a fresh page, which an allocator that gives memory back (``run.memory.release_freed_mb``) makes more of;
- with ``--ops``, ``torch.profiler`` (``profile_memory=True``) over the whole run: self CPU time and memory per op
  (its records cost memory: at 0.5B the run was killed by the kernel at 21 GB);
- ``torch.get_num_threads()`` and the optimiser's class and kernel (fused / foreach) at its first step.

    .venv/bin/python benchmarks/real_size_profile.py --stage dpo --model qwen0.5b --steps 2
    benchmarks/peers/.venv-trl/bin/python benchmarks/real_size_profile.py --who trl --stage dpo --steps 2
    .venv/bin/python benchmarks/real_size_profile.py --stage dpo --accumulation [--distinct]

It prints the phases in order (seconds, RSS at the start and peak within) and the op tables; ``--json`` writes
them too.

torch loads here before postrl's CLI would set ``THP_MEM_ALLOC_ENABLE=1`` (huge pages for allocations of 2 MB and
up, `postrl.cli`): start this script with it in the environment to profile what ``postrl`` runs (page faults
differ several-fold).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import threading
import time
from pathlib import Path

import real_size
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.profiler import ProfilerActivity, profile


class Phases:
    """The run's phase now, and every (start, phase, peak RSS within) transition."""

    def __init__(self) -> None:
        self.now, self.t0 = "load", time.perf_counter()
        self.rows: list[dict] = [
            {"phase": "load", "start": 0.0, "rss_start": _rss(), "rss_peak": _rss(), **_usage()}
        ]
        self.lock, self.done = threading.Lock(), False
        self.info: dict = {"threads": torch.get_num_threads()}

    def enter(self, phase: str) -> None:
        with self.lock:
            if phase != self.now:
                rss = _rss()
                self.rows.append({"phase": phase, "start": time.perf_counter() - self.t0, "rss_start": rss,
                                  "rss_peak": rss, **_usage()})  # fmt: skip
                self.now = phase

    def sample(self, max_rss_mb: float) -> None:
        while not self.done:
            rss = _rss()
            if rss > max_rss_mb:  # the machine is shared: stop before the kernel's OOM killer picks someone
                print(f"RSS {rss:.0f} MB > --max-rss-mb {max_rss_mb:.0f}: stopped in {self.now}", flush=True)
                os._exit(3)
            with self.lock:
                self.rows[-1]["rss_peak"] = max(self.rows[-1]["rss_peak"], rss)
            time.sleep(0.1)

    def merged(self) -> list[dict]:
        """Consecutive rows of one phase as one: seconds, RSS at the start, peak within, the `USAGE` spent."""
        out: list[dict] = []
        end = {"start": time.perf_counter() - self.t0, **_usage()}
        for row, nxt in zip(self.rows, [*self.rows[1:], end], strict=True):
            spent = {k: nxt[k] - row[k] for k in ("start", *USAGE)}
            if out and out[-1]["phase"] == row["phase"]:
                out[-1]["seconds"] += spent.pop("start")
                out[-1]["rss_peak"] = max(out[-1]["rss_peak"], row["rss_peak"])
                for k in USAGE:
                    out[-1]["spent"][k] += spent[k]
            else:
                out.append({**row, "seconds": spent.pop("start"), "spent": spent})
        return out


USAGE = ("user_s", "system_s", "minor_faults")
"""getrusage fields each phase row records (the process's CPU seconds in user and kernel mode, page faults)."""


def _usage() -> dict:
    """This process's `USAGE` so far (all threads)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {"user_s": ru.ru_utime, "system_s": ru.ru_stime, "minor_faults": ru.ru_minflt}


def _rss() -> float:
    """This process's resident set now (MB)."""
    status = Path("/proc/self/status").read_text()
    return next(int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmRSS"))


def instrument(phases: Phases) -> None:
    """Tag forwards of the causal LM, backwards and optimiser steps with their phase."""

    def is_lm(module: torch.nn.Module) -> bool:
        return type(module).__name__.endswith("ForCausalLM")

    def pre(module, args):
        if is_lm(module):
            phases.enter("forward" if torch.is_grad_enabled() else "forward (no grad)")

    def post(module, args, out):
        if is_lm(module):
            phases.enter("after forward")

    torch.nn.modules.module.register_module_forward_pre_hook(pre)
    torch.nn.modules.module.register_module_forward_hook(post)
    backward = torch.autograd.backward

    def tagged_backward(*args, **kwargs):
        phases.enter("backward")
        try:
            return backward(*args, **kwargs)
        finally:
            phases.enter("after backward")

    torch.autograd.backward = tagged_backward

    def opt_pre(opt, args, kwargs):
        if "optimizer" not in phases.info:
            group = opt.param_groups[0]
            kernel = {k: group.get(k) for k in ("fused", "foreach")}
            numel = sum(p.numel() for g in opt.param_groups for p in g["params"])
            phases.info["optimizer"] = {"class": type(opt).__name__, **kernel, "trained_numel": numel}
            phases.info["threads_at_step"] = torch.get_num_threads()
        phases.enter("optimizer step")

    register_optimizer_step_pre_hook(opt_pre)
    register_optimizer_step_post_hook(lambda *a: phases.enter("after optimizer"))


def run(args: argparse.Namespace) -> None:
    work = args.work
    model = work / args.model if args.model_dir is None else Path(args.model_dir)
    phases = Phases()
    instrument(phases)
    sampler = threading.Thread(target=phases.sample, args=(args.max_rss_mb,), daemon=True)
    sampler.start()
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True) if args.ops else None
    with prof or contextlib.nullcontext():
        if args.who == "postrl":
            from postrl.cli import main as postrl_main

            args.ranks, args.parallel = 1, "ddp"
            out = work / f"profile-{args.stage}-postrl"
            code = postrl_main(real_size.postrl_command(args, model, Path(args.data), out))
            if code:
                raise SystemExit(code)
        else:
            args.model_dir, args.json = str(model), str(work / f"profile-{args.stage}-trl.json")
            real_size.trl_worker(args)
    phases.done = True
    by_time = by_memory = ""
    if prof is not None:
        table = prof.key_averages()
        by_time = table.table(sort_by="self_cpu_time_total", row_limit=args.rows)
        by_memory = table.table(sort_by="self_cpu_memory_usage", row_limit=args.rows)
    merged = phases.merged()
    for row in merged:
        spent = row["spent"]
        print(f"{row['start']:8.1f}s  {row['seconds']:7.1f}s  rss {row['rss_start']:8.0f} -> peak "
              f"{row['rss_peak']:8.0f} MB  cpu {spent['user_s']:7.1f}s user {spent['system_s']:6.1f}s sys "
              f"{spent['minor_faults']:9d} faults  {row['phase']}")  # fmt: skip
    print(json.dumps(phases.info))
    print(by_time)
    print(by_memory)
    if args.json_out:
        Path(args.json_out).write_text(
            json.dumps({"phases": merged, "info": phases.info, "by_time": by_time, "by_memory": by_memory})
        )


def accumulation_probe(args: argparse.Namespace) -> None:
    """Resident set around three forward+backward passes of one DPO-shaped micro-batch (4 rows: 2 prompts of 10
    tokens, each shared by a chosen and a rejected row of 12 tokens; ``--distinct``: 4 different prompts) through
    the forward a postrl trainer picks, the later backwards adding onto existing gradients: what gradient
    accumulation holds beyond the gradients themselves."""
    from postrl.lm.memory import MemoryConfig, configure_memory
    from postrl.lm.models import load_causal_lm
    from postrl.lm.rollout.forwards import forward_log_probs, response_forward

    torch.set_num_threads(args.threads)
    phases = Phases()
    threading.Thread(target=phases.sample, args=(args.max_rss_mb,), daemon=True).start()
    path = Path(args.model_dir) if args.model_dir else args.work / args.model
    model = configure_memory(load_causal_lm(str(path), dtype=torch.float32), MemoryConfig())
    forward = response_forward(model.train())
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (4, 22), generator=gen)  # (B, P + T), P = 10
    if not args.distinct:
        ids[2:, :10] = ids[:2, :10]  # row b and b + 2 share a prompt, as a DPO pair's chosen and rejected
    print(type(forward).__name__)
    for k in range(3):
        phases.enter(f"forward {k + 1}")
        log_probs, _ = forward_log_probs(forward, ids, torch.ones_like(ids), 10)
        phases.enter(f"backward {k + 1} ({'onto gradients' if k else 'fresh gradients'})")
        log_probs.sum().backward()
        phases.enter(f"after backward {k + 1}")
    phases.done = True
    for row in phases.merged():
        print(
            f"{row['seconds']:7.1f}s  rss {row['rss_start']:8.0f} -> peak {row['rss_peak']:8.0f} MB  {row['phase']}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--who", choices=("postrl", "trl"), default="postrl")
    p.add_argument("--stage", choices=("sft", "dpo", "grpo"), required=True)
    p.add_argument("--model", choices=sorted(real_size.SHAPES), default="qwen0.5b")
    p.add_argument("--model-dir", default=None, help="a model folder instead of --model's under --work")
    p.add_argument("--work", type=Path, default=real_size.ROOT / "runs" / "bench_real_size")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--group", type=int, default=8, help="grpo: completions per prompt")
    p.add_argument("--prompts", type=int, default=4, help="grpo: prompts per step")
    p.add_argument("--per-forward", type=int, default=8, help="grpo: completions per forward")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--lora", action="store_true")
    p.add_argument("--full-logits", action="store_true")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="a postrl override (repeatable)")
    p.add_argument("--accumulation", action="store_true", help="the gradient-accumulation probe alone")
    p.add_argument("--distinct", action="store_true", help="--accumulation: 4 distinct prompts")
    p.add_argument("--ops", action="store_true", help="torch.profiler's op tables too (more memory)")
    p.add_argument("--rows", type=int, default=25, help="ops per table")
    p.add_argument("--max-rss-mb", type=float, default=13000, help="stop the run above this resident set")
    p.add_argument("--json-out", help="write the phases and tables here")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.accumulation:
        return accumulation_probe(args)
    if args.model_dir is None:
        real_size.make_model(args.model, args.work / args.model)
    names = {"sft": "sft.jsonl", "dpo": "pairs.jsonl", "grpo": "prompts.jsonl"}
    if args.who == "postrl":  # TRL's venv has no postrl: it reads the file postrl's profile wrote
        make = {"sft": real_size._sft_data, "dpo": real_size._dpo_data}.get(args.stage, real_size._grpo_data)
        make(args.work, args.batch * args.steps)
    args.data = str(args.work / names[args.stage])
    run(args)


if __name__ == "__main__":
    main()
