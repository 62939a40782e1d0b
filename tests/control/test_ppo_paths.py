"""PPO's two minibatch steps (`postrl.control.ppo.ReferenceStep`, `postrl.control.fast.ppo_step.FusedStep`):
Adam is the same arithmetic on both, their checkpoints load into either, and a run resumes exactly on both."""

from __future__ import annotations

import copy
import shutil

import pytest
import torch

from postrl.control import ppo
from postrl.control.envs import VecEnv
from postrl.control.fast.flat import FlatAdam, FlatParameters, split_flat_state
from postrl.control.loop import train_from_config
from postrl.control.policies import CategoricalActor, Critic, PolicyConfig
from postrl.runtime.checkpoint import load_checkpoint
from postrl.runtime.config import load_config


def _nets(seed=0):
    torch.manual_seed(seed)
    return CategoricalActor(4, 2, PolicyConfig(hidden=(8, 8))), Critic(4, PolicyConfig(hidden=(8, 8)))


def _grads(params, step):
    generator = torch.Generator().manual_seed(step)
    return [torch.randn(p.shape, generator=generator) for p in params]


def _step_both(flat, flat_opt, params, opt, step):
    """One Adam step of each optimizer on the same gradients (those of ``step``)."""
    for p, q, g in zip(flat.params, params, _grads(params, step), strict=True):
        p.grad.copy_(g)
        q.grad = g.clone()
    flat_opt.update()
    opt.step()


def _reference_adam(params):
    opt = torch.optim.Adam(params, lr=1e-2, eps=1e-5, fused=True)  # ReferenceStep's
    opt.register_load_state_dict_pre_hook(split_flat_state)
    return opt


def _close(got, want, steps, lr=1e-2):
    """Adam's fused CPU kernel rounds its vectorised body and its scalar tail differently (1 ulp of exp_avg_sq,
    measured), and the tails fall elsewhere in one flat tensor than in the parameters one by one: per step a
    relative error of a few eps in v, so ≤ eps/2·… in the step lr·m̂/(√v̂ + ε), plus a rounding of the parameter;
    over ``steps`` steps at most steps · 4 · eps · (max|p| + lr)."""
    eps = torch.finfo(torch.float32).eps
    atol = steps * 4 * eps * (float(want.detach().abs().max()) + lr)
    assert torch.allclose(got, want, rtol=0, atol=atol), (got - want).abs().max() / eps


def _flat_and_reference(seed=0):
    actor, critic = _nets(seed)
    params = [p for m in copy.deepcopy([actor, critic]) for p in m.parameters()]
    flat = FlatParameters([actor, critic])
    return flat, FlatAdam(flat.param, lr=1e-2, eps=1e-5), params, _reference_adam(params)


def test_reference_adam_is_flat_adams_arithmetic():
    """The same fused kernel on the parameters one by one or concatenated: the same update up to its rounding,
    so the two steps differ only by their gradients and the clip's norm."""
    flat, flat_opt, params, opt = _flat_and_reference()
    for step in range(8):
        _step_both(flat, flat_opt, params, opt, step)
    for p, q in zip(flat.params, params, strict=True):
        _close(p, q, steps=8)


def test_adam_state_moves_between_the_flat_and_the_per_parameter_format():
    """A flat checkpoint (the fast path's, and every PPO checkpoint written before the reference step had its
    own optimizer) loads into the reference's Adam, and the other way round: the same numbers (exactly), and
    the steps continue from them."""
    flat, flat_opt, params, opt = _flat_and_reference()
    for step in range(3):
        _step_both(flat, flat_opt, params, opt, step)
    flat_state, per_parameter = copy.deepcopy(flat_opt.state_dict()), copy.deepcopy(opt.state_dict())
    assert len(flat_state["state"]) == 1 and len(per_parameter["state"]) == len(params)

    flat2, flat_opt2, params2, opt2 = _flat_and_reference(1)
    flat_opt2.load_state_dict(per_parameter)  # the reference's checkpoint into the fast path
    opt2.load_state_dict(flat_state)  # the fast path's into the reference
    for key in ("exp_avg", "exp_avg_sq"):
        joined = torch.cat([opt.state[q][key].reshape(-1) for q in params])
        assert torch.equal(flat_opt2.state[flat2.param][key], joined)
        split = flat_opt.state[flat.param][key].split([q.numel() for q in params])
        for p, part in zip(params2, split, strict=True):
            assert torch.equal(opt2.state[p][key], part.view_as(p))
    assert float(flat_opt2.state[flat2.param]["step"]) == float(opt2.state[params2[0]]["step"]) == 3.0
    with torch.no_grad():  # the parameters as the checkpoint's modules would load them
        flat2.param.copy_(torch.cat([q.reshape(-1) for q in params]))
        for p, q in zip(params2, flat.params, strict=True):
            p.copy_(q)
    for step in range(3, 5):
        _step_both(flat, flat_opt, params2, opt2, step)  # flat as saved, the reference from its state
        _step_both(flat2, flat_opt2, params, opt, step)  # the reference as saved, flat from its state
    for p, q in zip(flat.params, params2, strict=True):
        _close(p, q, steps=5)
    for p, q in zip(flat2.params, params, strict=True):
        _close(p, q, steps=5)


def test_a_state_before_the_first_step_moves_too():
    actor, critic = _nets()
    flat = FlatParameters([actor, critic])
    opt = _reference_adam([p for m in copy.deepcopy([actor, critic]) for p in m.parameters()])
    opt.load_state_dict(FlatAdam(flat.param, lr=1e-2).state_dict())
    FlatAdam(flat.param, lr=1e-2).load_state_dict(opt.state_dict())
    assert not opt.state


SMALL = ["env.n_envs=2", "ppo.n_steps=16", "ppo.batch_size=8", "ppo.epochs=2", "run.steps=192"]
SMALL += ["run.save_every=1", "run.keep_last=20", "run.eval_episodes=1"]


def _interrupt(run, after_step):
    """``run`` as if killed after the checkpoint of env step ``after_step``."""
    for ckpt in (run / "checkpoints").iterdir():
        if int(ckpt.name.split("_")[1]) > after_step:
            shutil.rmtree(ckpt)
    (run / "summary.json").unlink()


@pytest.mark.parametrize("backend", ["fused", "autograd"])
def test_a_run_resumes_exactly_on_either_path(tmp_path, backend):
    cfg = load_config(ppo.ControlPPOConfig, None, [*SMALL, f"ppo.backend={backend}"])
    train_from_config(cfg, tmp_path / "straight")
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    _interrupt(tmp_path / "resumed", 96)
    train_from_config(cfg, tmp_path / "resumed", resume=True)
    last = [tmp_path / run / "checkpoints" / "step_00000192" for run in ("straight", "resumed")]
    for name in ("actor.safetensors", "critic.safetensors"):
        assert (last[0] / name).read_bytes() == (last[1] / name).read_bytes(), name
    adam = [torch.load(ckpt / "state.pt", weights_only=True)["optimizers"]["optimizer"] for ckpt in last]
    for state, other in zip(adam[0]["state"].values(), adam[1]["state"].values(), strict=True):
        assert all(torch.equal(state[key], other[key]) for key in state)


def test_a_fast_path_checkpoint_resumes_on_the_reference_path(tmp_path):
    """The flat Adam state of a fused run (the format of every PPO checkpoint before the reference step, on
    either backend) is split into the reference's per-parameter state: the same numbers, and it steps on. (A
    run folder itself refuses a resume with another ppo.backend: the config must match.)"""
    fused = load_config(ppo.ControlPPOConfig, None, [*SMALL, "ppo.backend=fused"])
    train_from_config(fused, tmp_path / "run")
    ckpt = tmp_path / "run" / "checkpoints" / "step_00000096"
    agents = {}
    for backend in ("fused", "autograd"):
        cfg = load_config(ppo.ControlPPOConfig, None, [*SMALL, f"ppo.backend={backend}"])
        agents[backend] = ppo.build_ppo(cfg, VecEnv(cfg.env, 0))
        load_checkpoint(ckpt, modules=agents[backend].modules, optimizers=agents[backend].optimizers)
    flat_state = agents["fused"].optimizer.state[agents["fused"].step.flat.param]
    reference = agents["autograd"].optimizer
    for key in ("exp_avg", "exp_avg_sq"):
        joined = torch.cat([reference.state[p][key].reshape(-1) for p in agents["autograd"].step.params])
        assert torch.equal(joined, flat_state[key])
    env = VecEnv(load_config(ppo.ControlPPOConfig, None, SMALL).env, 0)
    env.reset()
    metrics, _, steps = agents["autograd"].iteration(env, 3, 0.5)  # and the reference steps on from it
    assert steps == 32 and all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
