"""`MasterAdamW`: float32 parameters step exactly as torch.optim.AdamW; bfloat16 parameters step a float32
master (equal to torch AdamW on a float32 copy) and hold its rounding; updates too small for bfloat16 build up
in the master and move the weight where bfloat16 AdamW never does; the state survives a checkpoint, and a
bfloat16 SFT run resumes bit for bit, on one process and (slow) under torchrun with FSDP. This file is also the
script torchrun runs."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from postrl.lm.master_adamw import MasterAdamW, allocate_adamw_state
from postrl.lm.models import load_causal_lm
from postrl.lm.sft import SFTConfig, run_sft
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig, TrainConfig, make_optimizer
from postrl.runtime.logging import read_jsonl

KERNELS = [{"fused": True}, {"foreach": True}, {"foreach": False}]
IDS = ["fused", "foreach", "loop"]


def _params(dtype: torch.dtype, seed: int = 0) -> list[torch.nn.Parameter]:
    """A matrix, a vector and a scalar (the decayed and undecayed shapes of a model)."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(7, 5), (5,), ()]
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in shapes]


def _groups(params: list[torch.nn.Parameter]) -> list[dict]:
    return [{"params": params[:1], "weight_decay": 0.1}, {"params": params[1:], "weight_decay": 0.0}]


def _grads(step: int, like: list[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=g).to(dtype) for p in like]


def _roundtrip(state: dict) -> dict:
    """The optimiser state as a checkpoint carries it (torch.save, then a weights-only load)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_float32_parameters_step_exactly_as_torch_adamw(kernel: dict) -> None:
    ours, theirs = _params(torch.float32), _params(torch.float32)
    opt = MasterAdamW(_groups(ours), lr=1e-2, betas=(0.9, 0.95), **kernel)
    ref = torch.optim.AdamW(_groups(theirs), lr=1e-2, betas=(0.9, 0.95), **kernel)
    for step in range(5):
        for p, q, g in zip(ours, theirs, _grads(step, ours, torch.float32), strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    assert all(torch.equal(p, q) for p, q in zip(ours, theirs, strict=True))
    mine, reference = opt.state_dict(), ref.state_dict()
    assert mine["param_groups"] == reference["param_groups"]
    for i, state in reference["state"].items():
        assert mine["state"][i].keys() == state.keys()  # no master for a float32 parameter
        assert all(
            torch.equal(mine["state"][i][k], v) and mine["state"][i][k].dtype == v.dtype
            for k, v in state.items()
        )


@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
def test_bfloat16_parameters_step_a_float32_master(kernel: dict) -> None:
    ours = _params(torch.bfloat16)
    copies = [torch.nn.Parameter(p.detach().float()) for p in ours]  # the same start, in float32
    opt = MasterAdamW(_groups(ours), lr=1e-2, **kernel)
    ref = torch.optim.AdamW(_groups(copies), lr=1e-2, **kernel)
    for step in range(6):
        grads = _grads(step, ours, torch.bfloat16)
        for p, q, g in zip(ours, copies, grads, strict=True):
            p.grad, q.grad = g, g.float()
        opt.step()
        ref.step()
        for p, q in zip(ours, copies, strict=True):
            state = opt.state[p]
            assert p.dtype == torch.bfloat16
            assert {state[k].dtype for k in ("master", "exp_avg", "exp_avg_sq")} == {torch.float32}
            torch.testing.assert_close(state["master"], q.detach(), rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(state["exp_avg_sq"], ref.state[q]["exp_avg_sq"], rtol=1e-6, atol=0)
            assert torch.equal(p, state["master"].to(torch.bfloat16))


def test_tiny_updates_build_up_in_the_master_and_move_the_weight() -> None:
    # lr 1e-6 on weights in [1/8, 1/4), where bfloat16's spacing is 2^-10 ≈ 9.8e-4: Adam's step (~lr·sign(g)
    # under a constant gradient) is ~500 times below half a spacing, so plain bfloat16 AdamW rounds every one
    # away; the master gathers them, and after 1000 steps (~1e-3) each weight sits one spacing higher
    start = (0.125 + torch.arange(16) / 256).to(torch.bfloat16)
    plain, mastered = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    float32 = torch.nn.Parameter(start.float())
    opts = [
        torch.optim.AdamW([plain], lr=1e-6, weight_decay=0.0),
        MasterAdamW([mastered], lr=1e-6, weight_decay=0.0),
        torch.optim.AdamW([float32], lr=1e-6, weight_decay=0.0),
    ]
    for _ in range(1000):
        for p in (plain, mastered, float32):
            p.grad = torch.full_like(p, -1.0)
        for opt in opts:
            opt.step()
    assert torch.equal(plain, start)  # never moved
    master = opts[1].state[mastered]["master"]
    torch.testing.assert_close(master, float32.detach(), rtol=1e-6, atol=0)
    assert (master - start.float()).min() > 0.99e-3
    assert torch.equal(mastered, master.to(torch.bfloat16))
    assert torch.equal(mastered.float() - start.float(), torch.full((16,), 2.0**-10))


@pytest.mark.parametrize("kernel", KERNELS[:2], ids=IDS[:2])
def test_state_dict_roundtrip_resumes_exactly(kernel: dict) -> None:
    mixed = lambda: [*_params(torch.bfloat16), torch.nn.Parameter(torch.ones(3))]  # noqa: E731
    straight, resumed = mixed(), mixed()
    opt = MasterAdamW(_groups(straight), lr=3e-3, **kernel)
    for step in range(8):
        if step == 4:  # a checkpoint: weights and optimiser state saved, loaded into a fresh optimiser
            saved = _roundtrip(opt.state_dict())
            for p, q in zip(resumed, straight, strict=True):
                p.data.copy_(q.detach())
            opt_resumed = MasterAdamW(_groups(resumed), lr=3e-3, **kernel)
            opt_resumed.load_state_dict(saved)
            states = [opt_resumed.state[p] for p in resumed[:3]]
            assert all(s["master"].dtype == s["exp_avg"].dtype == torch.float32 for s in states)
        grads = _grads(step, straight, torch.bfloat16)
        for p, g in zip(straight, grads, strict=True):
            p.grad = g.to(p.dtype)
        opt.step()
        if step >= 4:
            for p, g in zip(resumed, grads, strict=True):
                p.grad = g.to(p.dtype)
            opt_resumed.step()
    assert all(torch.equal(p, q) for p, q in zip(straight, resumed, strict=True))
    a, b = opt.state_dict()["state"], opt_resumed.state_dict()["state"]
    assert all(torch.equal(a[i][k], b[i][k]) for i in a for k in a[i])


def test_a_plain_bfloat16_adamw_state_loads_with_a_master_from_the_weights() -> None:
    old, new = _params(torch.bfloat16), _params(torch.bfloat16)
    plain = torch.optim.AdamW(_groups(old), lr=1e-2)
    for p, g in zip(old, _grads(0, old, torch.bfloat16), strict=True):
        p.grad = g
    plain.step()
    for p, q in zip(new, old, strict=True):
        p.data.copy_(q.detach())
    opt = MasterAdamW(_groups(new), lr=1e-2)
    opt.load_state_dict(_roundtrip(plain.state_dict()))
    for p, q in zip(new, old, strict=True):
        assert torch.equal(opt.state[p]["master"], p.float())
        assert torch.equal(opt.state[p]["exp_avg"], plain.state[q]["exp_avg"].float())


def test_make_optimizer_takes_master_adamw_for_bfloat16_weights_only(tiny_lm_dir: Path) -> None:
    cfg = OptimConfig()
    fp32 = load_causal_lm(tiny_lm_dir)
    assert type(make_optimizer(fp32, cfg, 10)[0]) is torch.optim.AdamW
    assert type(make_optimizer(fp32.to(torch.bfloat16), cfg, 10)[0]) is MasterAdamW


def test_master_weights_false_steps_the_bfloat16_weights_as_torch_adamw(tiny_lm_dir: Path, caplog) -> None:
    """``optim.master_weights=false``: torch's AdamW on the bfloat16 weights, moments bfloat16 (no master), the
    same update as a plain torch.optim.AdamW of the same groups; one info line says what it gives up."""
    cfg = OptimConfig(master_weights=False, warmup_steps=0, min_lr_ratio=1.0)
    model, twin = (load_causal_lm(tiny_lm_dir).to(torch.bfloat16) for _ in range(2))
    with caplog.at_level("INFO", logger="postrl.lm.trainer"):
        opt, _ = make_optimizer(model, cfg, 10)
    assert type(opt) is torch.optim.AdamW and "master_weights=false" in caplog.text
    ref = torch.optim.AdamW(
        [
            {"params": [p for p in twin.parameters() if p.dim() >= 2], "weight_decay": cfg.weight_decay},
            {"params": [p for p in twin.parameters() if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=cfg.lr, betas=cfg.betas, fused=True,
    )  # fmt: skip
    for _ in range(3):
        for m in (model, twin):
            for i, p in enumerate(m.parameters()):
                p.grad = torch.full_like(p, 0.01 * (i % 5 - 2))
        opt.step()
        ref.step()
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(p, q) and p.dtype is torch.bfloat16
    state = opt.state[next(model.parameters())]
    assert state["exp_avg"].dtype is torch.bfloat16 and "master" not in state


def _sft(
    tiny_lm_dir: Path, steps: int, lr: float = 1e-3, save_every: int = 2, parallel: str = "ddp"
) -> SFTConfig:
    return SFTConfig(
        model=str(tiny_lm_dir),
        task={"n_train": 32, "n_test": 4},
        train=TrainConfig(batch_size=4, max_length=48, eval_examples=4),
        optim=OptimConfig(lr=lr, warmup_steps=0, min_lr_ratio=1.0),
        run=RunConfig(steps=steps, eval_every=0, save_every=save_every, log_every=1, device="cpu", threads=1, dtype="bfloat16", parallel=parallel),
        eval_size=2,
    )  # fmt: skip


def test_bfloat16_sft_resumes_exactly(tiny_lm_dir: Path, tmp_path: Path) -> None:
    run_sft(_sft(tiny_lm_dir, steps=4), tmp_path / "a")
    run_sft(_sft(tiny_lm_dir, steps=2), tmp_path / "b")  # interrupted after the step-2 checkpoint
    state = torch.load(tmp_path / "b" / "checkpoints" / "step_00000002" / "state.pt", weights_only=True)
    masters = [s["master"] for s in state["optimizers"]["model"]["state"].values()]
    assert masters and all(m.dtype == torch.float32 for m in masters)
    torch.manual_seed(123)
    run_sft(_sft(tiny_lm_dir, steps=4), tmp_path / "b", resume=True)
    a, b = (load_file(str(tmp_path / x / "model" / "model.safetensors")) for x in "ab")
    assert {t.dtype for t in a.values()} == {torch.bfloat16}
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = [[r["loss"] for r in read_jsonl(tmp_path / x / "metrics.jsonl") if "loss" in r] for x in "ab"]
    assert rows[0] == rows[1] and len(rows[0]) == 4


def test_bfloat16_sft_at_lr_1e_6_keeps_its_progress_in_the_master(tiny_lm_dir: Path, tmp_path: Path) -> None:
    run_sft(_sft(tiny_lm_dir, steps=2, lr=1e-6), tmp_path / "run")
    ckpt = tmp_path / "run" / "checkpoints" / "step_00000002"
    state = torch.load(ckpt / "state.pt", weights_only=True)["optimizers"]["model"]["state"]
    weights = [t for t in load_file(str(ckpt / "model.safetensors")).values() if t.dim() >= 2]
    masters = [s["master"] for s in state.values() if s["master"].dim() >= 2]
    assert sorted(w.numel() for w in weights) == sorted(m.numel() for m in masters)
    # two steps of ~1e-6 each: far below most weights' bfloat16 spacing, yet held by (nearly) every master
    moved = sum(int((m != m.to(torch.bfloat16).float()).sum()) for m in masters)
    assert moved > 0.9 * sum(m.numel() for m in masters)


def main(model: str, out: str) -> None:
    """The torchrun side: a straight FSDP run, and the same run resumed from its step-2 checkpoint."""
    from postrl.runtime import distributed as dist

    cfg = _sft(Path(model), steps=4, parallel="fsdp")
    run_sft(cfg, Path(out) / "straight")
    if dist.is_main():
        shutil.copytree(Path(out) / "straight", Path(out) / "resumed")
        shutil.rmtree(Path(out) / "resumed" / "checkpoints" / "step_00000004")
        shutil.rmtree(Path(out) / "resumed" / "model")
        (Path(out) / "resumed" / "summary.json").unlink()
    dist.barrier()
    run_sft(cfg, Path(out) / "resumed", resume=True)


@pytest.mark.slow  # a torchrun launch of ~1 min on a loaded 2-core machine
def test_bfloat16_sft_under_fsdp_resumes_exactly(tiny_lm_dir: Path, tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__]
    proc = subprocess.run(
        [*cmd, str(tiny_lm_dir), str(tmp_path)], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    state = torch.load(
        tmp_path / "straight" / "checkpoints" / "step_00000002" / "state.pt", weights_only=True
    )
    states = list(state["optimizers"]["model"]["state"].values())
    assert states and all(s["master"].dtype == s["exp_avg"].dtype == torch.float32 for s in states)
    a, b = (load_file(str(tmp_path / x / "model" / "model.safetensors")) for x in ("straight", "resumed"))
    assert {t.dtype for t in a.values()} == {torch.bfloat16}
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


if __name__ == "__main__":
    main(*sys.argv[1:])


@pytest.mark.parametrize("kernel", KERNELS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_allocated_adamw_state_steps_as_the_lazy_one(kernel, dtype):
    """`allocate_adamw_state` gives every parameter the state torch's first step would: three steps (one
    parameter without a gradient at the first, so its state waits there) leave weights and state bit for bit
    those of a lazily initialised AdamW."""

    def run(eager):
        g = torch.Generator().manual_seed(0)
        params = [
            torch.randn(5, 3, generator=g).to(dtype).requires_grad_(),
            torch.randn(4, generator=g).to(dtype),
        ]
        params[1].requires_grad_()
        opt = torch.optim.AdamW(params, lr=0.1, weight_decay=0.01, **kernel)
        if eager:
            allocate_adamw_state(opt)
            assert all(opt.state[p]["step"] == 0 and not opt.state[p]["exp_avg"].any() for p in params)
        for step in range(3):
            for k, p in enumerate(params):
                p.grad = None if (step == 0 and k == 1) else torch.randn(p.shape, generator=g).to(dtype)
            opt.step()
        return params, opt.state

    (lazy_params, lazy), (eager_params, eager) = run(False), run(True)
    for a, b in zip(lazy_params, eager_params, strict=True):
        assert torch.equal(a, b)
        assert lazy[a].keys() == eager[b].keys()
        for key in lazy[a]:
            assert torch.equal(lazy[a][key], eager[b][key]) and lazy[a][key].dtype == eager[b][key].dtype, key
            assert lazy[a][key].device == eager[b][key].device, key


def test_make_optimizer_allocates_torch_adamw_state_only():
    """torch's AdamW (float32, or bfloat16 with optim.master_weights=false) gets its state at construction;
    MasterAdamW does not (its masters copy the weights at the first step, after a resumed run loads them)."""
    for dtype, master, allocated in [
        (torch.float32, True, True),
        (torch.bfloat16, False, True),
        (torch.bfloat16, True, False),
    ]:
        model = torch.nn.Linear(3, 2).to(dtype)
        opt, _ = make_optimizer(model, OptimConfig(master_weights=master), 10)
        assert (len(opt.state) == 2) is allocated, (dtype, master)
