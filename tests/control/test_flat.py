"""FlatParameters / FlatAdam: the same training step as per-tensor torch.optim.Adam + clip_grad_norm_."""

import copy

import torch
from torch import nn

from postrl.control.fast.flat import FlatAdam, FlatParameters
from postrl.control.policies import CategoricalActor, Critic, PolicyConfig
from postrl.runtime.checkpoint import load_checkpoint, save_checkpoint


def _nets(seed=0):
    torch.manual_seed(seed)
    return CategoricalActor(4, 2, PolicyConfig()), Critic(4, PolicyConfig())


def _loss(actor, critic, x):
    return actor(x).pow(2).sum() + critic(x).sin().sum()


def test_flat_step_equals_per_tensor_adam_and_clipping():
    actor, critic = _nets()
    ref_actor, ref_critic = copy.deepcopy(actor), copy.deepcopy(critic)
    flat = FlatParameters([actor, critic])
    opt = FlatAdam(flat.param, lr=1e-2, eps=1e-5)
    ref_params = [*ref_actor.parameters(), *ref_critic.parameters()]
    ref_opt = torch.optim.Adam(ref_params, lr=1e-2, eps=1e-5, foreach=False)
    x = torch.randn(32, 4)
    for _ in range(5):
        flat.zero_grad()
        _loss(actor, critic, x).backward()
        norm = flat.clip_grad_norm_(0.5)
        opt.step()
        ref_opt.zero_grad()
        _loss(ref_actor, ref_critic, x).backward()
        ref_norm = nn.utils.clip_grad_norm_(ref_params, 0.5)
        ref_opt.step()
        assert torch.allclose(norm, ref_norm, rtol=1e-5)
    for p, q in zip([*actor.parameters(), *critic.parameters()], ref_params, strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_the_clip_as_adams_grad_scale_equals_clipping_then_stepping():
    """FusedStep's step: Adam's kernel dividing by `clip_divisor` is clip_grad_norm_ then Adam, to float32 rounding,
    both when the clip binds (max_norm 0.05) and when it does not (max_norm 1e3: the divisor is exactly 1)."""
    for max_norm in (0.05, 1e3):
        runs = []
        for folded in (True, False):
            actor, critic = _nets()
            flat = FlatParameters([actor, critic])
            opt = FlatAdam(flat.param, lr=1e-2, eps=1e-5)
            x = torch.randn(32, 4, generator=torch.Generator().manual_seed(1))
            for _ in range(5):
                flat.zero_grad()
                _loss(actor, critic, x).backward()
                if folded:
                    divisor = flat.clip_divisor(max_norm)
                    assert float(divisor) >= 1.0
                    opt.update(grad_scale=divisor)
                else:
                    flat.clip_grad_norm_(max_norm)
                    opt.update()
            runs.append(flat.param.detach().clone())
        assert torch.allclose(runs[0], runs[1], atol=1e-6), (runs[0] - runs[1]).abs().max()


def test_flat_adam_matches_torch_adam_exactly_without_clipping():
    p = nn.Parameter(torch.randn(100))
    start = p.detach().clone()
    q, r = nn.Parameter(start.clone()), nn.Parameter(start.clone())
    opt = FlatAdam(p, lr=1e-3, betas=(0.8, 0.99), eps=1e-5)
    fused = torch.optim.Adam([q], lr=1e-3, betas=(0.8, 0.99), eps=1e-5, fused=True)
    plain = torch.optim.Adam([r], lr=1e-3, betas=(0.8, 0.99), eps=1e-5, foreach=False)
    for i in range(4):
        grad = torch.randn(100, generator=torch.Generator().manual_seed(i))
        p.grad, q.grad, r.grad = grad.clone(), grad.clone(), grad.clone()
        opt.step()
        fused.step()
        plain.step()
    assert torch.equal(p, q)  # the same kernel
    assert torch.equal(opt.state[p]["exp_avg_sq"], fused.state[q]["exp_avg_sq"])
    assert float(opt.state[p]["step"]) == 4.0
    assert torch.allclose(p, r, rtol=0, atol=1e-6)  # the textbook update, to float32 rounding
    assert (p - start).abs().max() > 1e-3  # the steps moved the parameters (~lr each)


def test_replaced_grad_is_reattached_so_backward_still_reaches_the_flat_gradient():
    actor, critic = _nets()
    flat = FlatParameters([actor, critic])
    actor.zero_grad(set_to_none=True)  # what a careless caller might do
    flat.zero_grad()
    _loss(actor, critic, torch.randn(8, 4)).backward()
    assert flat.param.grad.abs().sum() > 0
    assert flat.param.grad.numel() == sum(p.numel() for p in [*actor.parameters(), *critic.parameters()])


def test_flat_modules_round_trip_through_a_checkpoint(tmp_path):
    actor, critic = _nets(0)
    flat = FlatParameters([actor, critic])
    opt = FlatAdam(flat.param, lr=1e-3)
    flat.zero_grad()
    _loss(actor, critic, torch.randn(8, 4)).backward()
    opt.step()
    path = save_checkpoint(tmp_path, 1, modules={"actor": actor, "critic": critic}, optimizers={"o": opt})
    actor2, critic2 = _nets(1)
    flat2 = FlatParameters([actor2, critic2])
    opt2 = FlatAdam(flat2.param, lr=1e-3)
    load_checkpoint(path, modules={"actor": actor2, "critic": critic2}, optimizers={"o": opt2})
    assert torch.equal(flat2.param, flat.param)  # loaded in place: the views still alias the flat tensor
    assert torch.equal(opt2.state[flat2.param]["exp_avg"], opt.state[flat.param]["exp_avg"])
