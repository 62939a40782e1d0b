"""``optim.step_in_backward``: each weight steps inside the backward and its gradient is freed there
(`postrl.lm.step_in_backward`). The weights, optimiser state and logged gradient norm equal those of the usual
backward-then-step; configs it cannot run are refused before anything is loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from postrl.lm.memory import MemoryConfig, configure_memory
from postrl.lm.rollout.forwards import ChunkedForward, forward_log_probs, response_forward
from postrl.lm.spine import accumulate
from postrl.lm.step_in_backward import step_in_backward_of
from postrl.lm.trainer import OptimConfig, clip_grad_norm, make_optimizer
from postrl.runtime.errors import UserError


def _train(model, steps, batch, step_in_backward, dtype_master=True, **kw):
    """``steps`` optimiser steps of ``batch(model, step)``'s loss; returns the logged gradient norms, the norms
    of the gradients left after each step (None: freed), and the optimiser."""
    optim = OptimConfig(
        lr=1e-2,
        warmup_steps=2,
        max_grad_norm=None,
        master_weights=dtype_master,
        step_in_backward=step_in_backward,
    )
    optimizer, scheduler = make_optimizer(model, optim, steps)
    norms, left = [], []
    for step in range(steps):
        batch(model, step).backward()
        left.append([p.grad is None for p in model.parameters()])
        norms.append(clip_grad_norm(model, None))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
    return norms, left, optimizer


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _mlp_loss(model, step):
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(step), dtype=next(model.parameters()).dtype)
    return model(x).float().pow(2).sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_same_weights_state_and_norms_as_stepping_after_the_backward(dtype):
    """Five steps of AdamW (warm-up, then the schedule; in bfloat16 `MasterAdamW`'s float32 masters): every
    weight, moment and step count equal, bit for bit, and the logged norm equal to the dtype's rounding; no
    gradient is left once the backward returns."""
    plain, fused = _mlp().to(dtype), _mlp().to(dtype)
    want_norms, want_left, want_opt = _train(plain, 5, _mlp_loss, False)
    norms, left, opt = _train(fused, 5, _mlp_loss, True)
    assert all(not any(step) for step in want_left) and all(all(step) for step in left)
    # torch sums a bfloat16 norm in bfloat16; ours is float32 (within bfloat16's rounding of it)
    torch.testing.assert_close(norms, want_norms, rtol=1e-6 if dtype == torch.float32 else 2.0**-7, atol=0)
    for p, q in zip(plain.parameters(), fused.parameters(), strict=True):
        assert torch.equal(p, q)
    want_state, state = want_opt.state_dict()["state"], opt.state_dict()["state"]
    assert want_state.keys() == state.keys()
    for key, tensors in want_state.items():
        for name, value in tensors.items():
            assert torch.equal(value, state[key][name]), (key, name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tied", [True, False])
def test_an_adopted_output_layer_gradient_steps_once_and_whole(tied, dtype, monkeypatch):
    """The chunked output layer sets its ∂L/∂W as the weight's .grad (`adopt_grad`) while the backward goes on:
    a tied weight steps when the input embedding's part has been added into it (not before, on the output
    layer's part alone), an untied one at once (or at the trainer's ``optimizer.step()`` if autograd skipped its
    hook).
    Both equal the usual step, bit for bit; the adoption is checked to happen."""
    import postrl.lm.rollout.chunked as chunked
    from tests.lm.test_chunked_log_probs import tiny_qwen2
    from tests.lm.test_forwards import grouped_batch

    adopted = []
    original = chunked.adopt_grad
    monkeypatch.setattr(chunked, "adopt_grad", lambda w, g: adopted.append(original(w, g)) or adopted[-1])
    ids, mask, P = grouped_batch()

    def loss(model, step):
        forward = response_forward(model)
        assert isinstance(forward, ChunkedForward)
        log_probs, _ = forward_log_probs(forward, ids, mask, P, 0.8)
        upstream = torch.randn(log_probs.shape, generator=torch.Generator().manual_seed(step))
        return (log_probs * upstream * mask[:, P:]).sum()

    def model():
        m = tiny_qwen2(tied=tied).to(dtype)
        configure_memory(m, MemoryConfig(log_probs="chunked", chunk_tokens=5))
        return m

    import postrl.lm.rollout.forwards as forwards

    plain, fused = model(), model()
    with monkeypatch.context() as patch:  # the full forward of every row, as stepping in the backward takes
        patch.setattr(forwards, "steps_in_backward", lambda model: True)
        want_norms, _, _ = _train(plain, 3, loss, False)
    adopted.clear()
    norms, left, opt = _train(fused, 3, loss, True)
    owner = step_in_backward_of(fused.parameters())
    if dtype == torch.float32:
        assert adopted == [True] * 3
        # a tied weight stepped outside its embedded rows as soon as the output layer's part was there
        assert owner.early_steps == (3 if tied else 0)
    else:  # each slice of the vocabulary's rows stepped in the output layer's backward: nothing to adopt
        assert not adopted and owner.early_steps == 3
    # every gradient is freed in the backward (autograd calls an untied head's hook too, though its backward
    # returned no gradient for it; were it not to, the trainer's optimizer.step() would step it)
    assert all(all(step) for step in left)
    torch.testing.assert_close(norms, want_norms, rtol=1e-6 if dtype == torch.float32 else 2.0**-7, atol=0)
    for (name, p), q in zip(plain.named_parameters(), fused.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_a_step_of_two_backwards_is_refused_by_the_nets():
    """Gradient accumulation would step every weight once per micro-batch: `spine.accumulate` refuses it, and
    so does a weight's second accumulation before the step's norm is taken (the config checks refuse such
    configs first)."""
    model = _mlp()
    make_optimizer(model, OptimConfig(max_grad_norm=None, step_in_backward=True), 4)
    assert step_in_backward_of(model.parameters()) is not None
    with pytest.raises(RuntimeError, match="runs 2 backwards; it needs one"):
        accumulate([model], [0, 1], lambda step: _mlp_loss(model, step))
    accumulate([model], [0], lambda step: _mlp_loss(model, step))
    # a second backward before the step ends (a forward whose backward reached a weight twice would too)
    with pytest.raises(RuntimeError, match="accumulated twice in one optimiser step"):
        _mlp_loss(model, 1).backward()
    clip_grad_norm(model, None)  # ends the step
    _mlp_loss(model, 2).backward()


def test_configs_it_cannot_run_are_refused_up_front(tiny_lm_dir, tmp_path):
    """One `postrl: error:` line names every key at fault, before the run folder exists: the clip, the
    accumulation, a stage that does not run it."""
    from postrl.lm.ppo.algorithm import PPORecipe
    from postrl.lm.recipe import check_step_in_backward
    from tests.lm.test_grpo import _config, run_grpo

    cfg = _config(tiny_lm_dir, grpo={"grad_accum": 2}, optim=OptimConfig(step_in_backward=True))
    with pytest.raises(UserError) as err:
        run_grpo(cfg, tmp_path / "run")
    assert str(err.value) == (
        "optim.step_in_backward=true: it needs grpo.grad_accum=1, not 2; it needs optim.max_grad_norm=null: each "
        "weight steps before the step's gradient norm is known (the norm is still logged)"
    )
    assert not (tmp_path / "run").exists()
    with pytest.raises(UserError, match=r"this stage does not run it \(sft, dpo, kto, rm and grpo do\)"):
        check_step_in_backward(PPORecipe(), cfg, 1)
    with pytest.raises(UserError, match="it runs one process, not 2"):
        check_step_in_backward(PPORecipe(), cfg, 2)


def test_a_grpo_run_logs_the_same_metrics(tiny_lm_dir, tmp_path):
    """Four GRPO steps (the tiny Llama, its tied-or-not output layer as it comes): every logged reward, loss,
    KL and gradient norm equal to the run that steps after the backward."""
    from tests.lm.test_grpo import _config, run_grpo
    from tests.lm.test_packed_forward import assert_same_metrics

    base = dict(lr=2e-4, warmup_steps=0, min_lr_ratio=1.0, max_grad_norm=None)
    run = {"eval_every": 0, "save_every": 0}
    run_grpo(_config(tiny_lm_dir, run=run, optim=OptimConfig(**base)), tmp_path / "after")
    run_grpo(_config(tiny_lm_dir, run=run, optim=OptimConfig(**base, step_in_backward=True)), tmp_path / "in")
    rows = assert_same_metrics(tmp_path / "in", tmp_path / "after")
    assert any(r.get("grad_norm", 0) > 0 for r in rows)


def test_a_dpo_run_and_its_resume_export_the_same_weights(tiny_lm_dir, tmp_path):
    """DPO (one forward of chosen and rejected per step, `dpo.length_groups=1`): the exported weights of a run
    that steps in the backward equal, bit for bit, those of one that steps after it, and so do those of a run
    killed after its step-2 checkpoint and resumed (the optimiser's state is the usual AdamW's)."""
    import shutil
    from dataclasses import replace

    from safetensors.torch import load_file

    from postrl.lm.dpo import run_dpo
    from tests.lm.test_dpo import _cfg

    def cfg(step_in_backward: bool):
        base = _cfg(tiny_lm_dir)
        optim = replace(base.optim, max_grad_norm=None, step_in_backward=step_in_backward)
        return replace(base, optim=optim, dpo=replace(base.dpo, length_groups=1))

    def weights(run):
        return load_file(str(run / "model" / "model.safetensors"))

    run_dpo(cfg(False), tmp_path / "after")
    run_dpo(cfg(True), tmp_path / "in")
    want = weights(tmp_path / "after")
    assert want.keys() == weights(tmp_path / "in").keys()
    assert all(torch.equal(v, weights(tmp_path / "in")[k]) for k, v in want.items())
    # killed after step 2's checkpoint: its folder as a kill leaves it, then resumed
    run = tmp_path / "in"
    for leftover in (run / "checkpoints" / "step_00000004", run / "model"):
        shutil.rmtree(leftover)
    (run / "summary.json").unlink()
    run_dpo(cfg(True), run, resume=True)
    assert all(torch.equal(v, weights(run)[k]) for k, v in want.items())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_sft_run_exports_the_same_weights(tiny_lm_dir, tmp_path, dtype, monkeypatch):
    """SFT (padding-free in float32, padded in bfloat16 with `MasterAdamW`): the exported weights equal, bit for
    bit, those of the run that steps after the backward (whose weights are checked to have stepped in it)."""
    from safetensors.torch import load_file

    from postrl.lm.step_in_backward import StepInBackward

    hooked = []
    original = StepInBackward._step
    monkeypatch.setattr(StepInBackward, "_step", lambda self, p: hooked.append(p.shape) or original(self, p))

    from postrl.lm.sft import SFTConfig, run_sft
    from postrl.lm.spine import RunConfig
    from postrl.lm.trainer import TrainConfig

    def run(step_in_backward: bool):
        cfg = SFTConfig(
            model=str(tiny_lm_dir), task={"n_train": 32, "n_test": 4}, train=TrainConfig(batch_size=4, max_length=48),
            optim=OptimConfig(lr=1e-3, warmup_steps=1, max_grad_norm=None, step_in_backward=step_in_backward),
            run=RunConfig(steps=3, eval_every=0, save_every=0, device="cpu", dtype=dtype), eval_size=0,
        )  # fmt: skip
        out = tmp_path / f"in{step_in_backward}"
        run_sft(cfg, out)
        return load_file(str(out / "model" / "model.safetensors"))

    want = run(False)
    assert not hooked
    got = run(True)
    assert len(hooked) == 3 * len(want)  # every weight, every step (the tiny Llama's head is tied)
    assert want.keys() == got.keys()
    assert all(torch.equal(v, got[k]) for k, v in want.items())


def _exported(run: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a run's exported model folder (its safetensors files)."""
    from safetensors.torch import load_file

    files = sorted((run / "model").glob("*.safetensors"))
    assert files, run
    return {f"{f.name}:{k}": v for f in files for k, v in load_file(str(f)).items()}


@pytest.mark.parametrize("stage", ["kto", "rm"])
def test_kto_and_reward_model_runs_export_the_same_weights(tiny_lm_dir, tmp_path, stage, monkeypatch):
    """KTO and the reward model (a scalar head on the trunk, chosen and rejected in one forward): the exported
    weights equal, bit for bit, those of the run that steps after the backward, every weight stepped in it."""
    from dataclasses import replace

    from postrl.lm.step_in_backward import StepInBackward

    hooked = []
    original = StepInBackward._step
    monkeypatch.setattr(StepInBackward, "_step", lambda self, p: hooked.append(1) or original(self, p))
    if stage == "kto":
        from postrl.lm.kto.algorithm import run_kto as run
        from tests.lm.test_kto import _cfg
    else:
        from postrl.lm.reward_model import run_rm as run
        from tests.lm.test_reward_model import _cfg
    base = _cfg(tiny_lm_dir)
    for step_in_backward in (False, True):
        optim = replace(base.optim, max_grad_norm=None, step_in_backward=step_in_backward)
        run(replace(base, optim=optim), tmp_path / str(step_in_backward))
        assert bool(hooked) == step_in_backward
    want, got = _exported(tmp_path / "False"), _exported(tmp_path / "True")
    assert want.keys() == got.keys()
    assert all(torch.equal(v, got[k]) for k, v in want.items())


@pytest.mark.parametrize(("dtype", "master"), [("bfloat16", False), ("bfloat16", True), ("float32", True)])
def test_a_tied_weight_steps_early_outside_its_embedded_rows_and_ends_the_same(
    tiny_lm_dir, tmp_path, dtype, master, monkeypatch
):
    """DPO through the chunked output layer (as at a real vocabulary): the tied embedding's gradient steps as
    the output layer makes it (in bfloat16 a slice of the vocabulary at a time, in float32 whole) outside the
    rows the step's tokens reach, those rows once the embedding's part is added; the
    exported weights equal, bit for bit, those of the run that steps after the backward (bfloat16 weights with
    bfloat16 moments, with `MasterAdamW`'s float32 masters, and float32)."""
    from dataclasses import replace

    from postrl.lm.dpo import run_dpo
    from postrl.lm.memory import MemoryConfig
    from postrl.lm.step_in_backward import StepInBackward
    from tests.lm.test_dpo import _cfg

    waited, blocks = [], []
    close, block = StepInBackward.close_rows, StepInBackward.step_block
    monkeypatch.setattr(
        StepInBackward,
        "close_rows",
        lambda self, w: waited.append(w.rows.numel() / w.param.shape[0]) or close(self, w),
    )
    monkeypatch.setattr(
        StepInBackward,
        "step_block",
        lambda self, w, start, g: blocks.append(start) or block(self, w, start, g),
    )

    def cfg(step_in_backward: bool):
        base = _cfg(tiny_lm_dir)
        optim = replace(
            base.optim, max_grad_norm=None, step_in_backward=step_in_backward, master_weights=master
        )
        memory = MemoryConfig(log_probs="chunked", chunk_tokens=4)
        run = replace(base.run, dtype=dtype, memory=memory, eval_every=0, save_every=0)
        return replace(base, optim=optim, run=run, dpo=replace(base.dpo, length_groups=1))

    import postrl.lm.rollout.forwards as forwards

    with monkeypatch.context() as patch:  # the full forward of every row, as stepping in the backward takes
        patch.setattr(forwards, "steps_in_backward", lambda model: True)
        run_dpo(cfg(False), tmp_path / "after")
    assert not waited
    run_dpo(cfg(True), tmp_path / "in")
    assert len(waited) == 4 and all(0 < share < 1 for share in waited)  # every step, some rows waited
    # bfloat16: the output layer's backward steps each slice of the vocabulary as it makes its gradient
    assert len(blocks) > 4 if dtype == "bfloat16" else blocks == [0] * 4
    want, got = _exported(tmp_path / "after"), _exported(tmp_path / "in")
    assert want.keys() == got.keys()
    assert all(torch.equal(v, got[k]) for k, v in want.items())


def test_an_embedding_outside_the_recorded_rows_is_an_error_not_a_wrong_step(monkeypatch):
    """An embedding the forward did not record (a model calling ``F.embedding`` itself) would add its part to
    rows that already stepped without it: the step raises instead. A backward that never reaches the embedding
    steps the waiting rows at its end, or when the step's norm is taken."""
    import postrl.lm.rollout.chunked as chunked
    from postrl.lm.step_in_backward import record_rows

    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(10, 4) * 0.1)
    holder = torch.nn.Module()
    holder.weight = weight
    optimizer, _ = make_optimizer(holder, OptimConfig(lr=1e-2, max_grad_norm=None, step_in_backward=True), 4)
    owner = step_in_backward_of([weight])
    monkeypatch.setattr(chunked, "_writable", lambda w: True)

    def loss(ids, recorded, embed=True):
        record_rows(weight, recorded)
        hidden = torch.nn.functional.embedding(ids, weight) if embed else torch.randn(len(ids), 4)
        log_probs, _ = chunked.chunked_log_probs(
            hidden, weight, None, torch.tensor([1, 2, 3]), chunk_tokens=2
        )
        return log_probs.sum()

    ids = torch.tensor([4, 5, 6])
    with pytest.raises(RuntimeError, match="reached rows its forward did not record"):
        loss(ids, torch.tensor([4, 5])).backward()
    weight.grad = None  # (the failed step's leftovers)
    clip_grad_norm(holder, None)
    before = weight.detach().clone()
    loss(ids, torch.tensor([4, 5, 6]), embed=False).backward()  # the embedding is not in this backward
    # autograd calls the weight's hook at the end all the same: every row has stepped
    assert not owner.deferred and not torch.equal(weight[4:7], before[4:7])
    clip_grad_norm(holder, None)
    # rows still waiting when the step's norm is taken (a hook autograd did not call) step then
    record_rows(weight, torch.tensor([2]))
    weight.grad = torch.ones_like(weight)
    before = weight.detach().clone()
    owner.adopted(weight)
    assert owner.deferred and weight.grad is None and torch.equal(weight[2], before[2])
    assert not torch.equal(weight[3], before[3])
    assert clip_grad_norm(holder, None) == pytest.approx(40**0.5) and not owner.deferred
    assert not torch.equal(weight[2], before[2])
    del optimizer
