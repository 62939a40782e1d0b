"""PPO's minibatch gradient written out: the MLPs' forward and backward and the loss's derivative, no autograd.

For the 64×64 MLPs of classic control on a 256-row minibatch, autograd's bookkeeping (a node per op, its
saved tensors, the engine's walk of the graph) costs about as much as the arithmetic: `ppo_loss` + `backward`
took 2.6 ms per minibatch on the 2-core benchmark machine, this 1.8 ms, for the same gradients to float32
rounding (tests/control/test_ppo_grad.py checks every variant against autograd through
`postrl.control.ppo.ppo_loss`). PPO on CartPole takes 20 minibatch steps per 256 env steps, so this is a
fifth of a run. The loss values and statistics are `postrl.core`'s (`clipped_surrogate`, `value_loss`, the
statistics of `ppo_clip_loss`; the tests compare them too); their gradients are written here.

The derivation (N rows; ρ = exp(log π − log π_old); A the whitened advantages; ε, ε_h the clip range):

- policy: L_pg = −mean min(ρA, clip(ρ, 1−ε, 1+ε_h)A), so ∂L_pg/∂log π_i = −ρ_i A_i / N, and 0 where the clip
  binds (A > 0 and ρ > 1+ε_h, or A < 0 and ρ < 1−ε: `postrl.core.clipped_surrogate`'s mask);
- categorical head (logits z, p = softmax z): ∂log π(a)/∂z = onehot(a) − p; the entropy H = −Σ p log p has
  ∂H/∂z = −p ⊙ (log p + H);
- Gaussian head (mean μ, state-independent log σ): ∂log π/∂μ = (a − μ)/σ², ∂log π/∂log σ = ((a − μ)/σ)² − 1,
  and H = Σ log σ + const has ∂H/∂log σ = 1;
- value: L_v = ½ mean (V − R̂)², so ∂L_v/∂V_i = (V_i − R̂_i)/N; clipped (V_c = V_old + clip(V − V_old, ±ε)):
  ½ mean max((V − R̂)², (V_c − R̂)²) has the same derivative where the unclipped term is the max or
  |V − V_old| ≤ ε, else 0;
- total: L = L_pg + c_v L_v − c_H mean H;
- MLP layer k, h_k = act(h_{k−1} W_kᵀ + b_k) (no activation on the last): ∂L/∂W_k = δ_kᵀ h_{k−1},
  ∂L/∂b_k = Σ_rows δ_k, δ_{k−1} = (δ_k W_k) ⊙ act'(h_{k−1}), with act' read off the output y:
  tanh 1 − y², relu 1[y > 0], elu (α = 1) 1 where y > 0 else y + 1.

Gradients are written into each parameter's ``.grad`` (views of `postrl.control.flat.FlatParameters`' flat
gradient), replacing what was there: no zeroing is needed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from postrl.control.buffer import Batch
from postrl.control.policies import MLP, CategoricalActor, Critic, GaussianActor
from postrl.core import (
    clipped_surrogate,
    diag_gaussian_entropy,
    diag_gaussian_log_prob,
    value_loss,
)

__all__ = ["minibatch_gradient", "supported"]

# grad ⊙ act'(x) from grad and y = act(x): autograd's own backward kernels (one fused op each):
# tanh grad·(1 − y²), relu grad·1[y > 0], elu (α = 1) grad·(y > 0 ? 1 : y + 1)
_ACT_BACKWARD = {
    "tanh": torch.ops.aten.tanh_backward,
    "relu": lambda grad, y: torch.ops.aten.threshold_backward(grad, y, 0),
    "elu": lambda grad, y: torch.ops.aten.elu_backward(grad, 1.0, 1.0, 1.0, True, y),
}


def supported(actor: torch.nn.Module, critic: torch.nn.Module) -> bool:
    """True when `minibatch_gradient` covers these networks (postrl's MLP actors and critic)."""
    # exact types: a subclass may change the forward this module writes out
    heads = type(actor) in (CategoricalActor, GaussianActor) and type(critic) is Critic
    nets = heads and all(type(net) is MLP for net in (actor.net, critic.net))
    return nets and all(net.activation_name in _ACT_BACKWARD for net in (actor.net, critic.net))


def _forward(net: MLP, x: Tensor) -> tuple[list[Tensor], Tensor]:
    """Every layer's input [x, h_1, …, h_{L−1}] and the output (no activation on the last layer)."""
    inputs = [x]
    *hidden, last = net.layers
    for layer in hidden:
        inputs.append(net.activation(torch.addmm(layer.bias, inputs[-1], layer.weight.t())))
    return inputs, torch.addmm(last.bias, inputs[-1], last.weight.t())


def _backward(net: MLP, inputs: list[Tensor], delta: Tensor) -> None:
    """Write ∂L/∂W, ∂L/∂b of every layer into ``.grad`` from delta = ∂L/∂output [N, out]."""
    act_backward = _ACT_BACKWARD[net.activation_name]
    for k in range(len(net.layers) - 1, -1, -1):
        layer, h = net.layers[k], inputs[k]
        torch.mm(delta.t(), h, out=_grad(layer.weight))
        torch.sum(delta, 0, out=_grad(layer.bias))
        if k:
            delta = act_backward(torch.mm(delta, layer.weight), h)


def _grad(param: Tensor) -> Tensor:
    """The tensor to write ``param``'s gradient into (allocated when there is none)."""
    if param.grad is None:
        param.grad = torch.empty_like(param)
    return param.grad


@torch.no_grad()
def minibatch_gradient(
    actor: torch.nn.Module,
    critic: torch.nn.Module,
    batch: Batch,
    clip_eps: float,
    vf_coef: float,
    ent_coef: float,
    clip_vf: float | None,
) -> dict[str, Tensor]:
    """Write the gradient of `postrl.control.ppo.ppo_loss` on ``batch`` into every parameter's ``.grad``;
    return the same statistics as it does (policy_loss, value_loss, clip_fraction, approx_kl, ratio_mean,
    and entropy when ``ent_coef`` ≠ 0). ``batch.advantages`` are used as given (already whitened)."""
    n = batch.obs.shape[0]
    actor_in, head = _forward(actor.net, batch.obs)
    critic_in, values = _forward(critic.net, batch.obs)
    values = values.squeeze(-1)
    discrete = isinstance(actor, CategoricalActor)
    if discrete:
        log_p = torch.log_softmax(head, dim=-1)  # (N, K)
        actions = batch.actions.long().unsqueeze(-1)
        log_probs = log_p.gather(-1, actions).squeeze(-1)
    else:
        std = actor.log_std.exp()
        z = (batch.actions - head) / std  # (N, A): the standardised action
        log_probs = diag_gaussian_log_prob(batch.actions, head, actor.log_std)

    # `postrl.core.ppo_clip_loss`'s value and statistics, from the ratio and clip mask the gradient needs too
    log_ratio = log_probs - batch.log_probs
    ratio = log_ratio.exp()
    surrogate, clipped = clipped_surrogate(ratio, batch.advantages, clip_eps)
    stats = {
        "policy_loss": -surrogate.mean(),
        "clip_fraction": clipped.to(ratio.dtype).mean(),
        "approx_kl": ((ratio - 1.0) - log_ratio).mean(),
        "ratio_mean": ratio.mean(),
    }
    d_log_probs = (ratio * batch.advantages).mul_(-1.0 / n).masked_fill_(clipped, 0.0)  # ∂L/∂log π, (N,)

    old_values = None if clip_vf is None else batch.values
    v_loss = value_loss(values, batch.returns, old_values=old_values, clip_eps=clip_vf)
    d_values = (values - batch.returns) * (vf_coef / n)  # ∂(c_v L_v)/∂V
    if clip_vf is not None:
        clipped_v = batch.values + torch.clamp(values - batch.values, -clip_vf, clip_vf)
        outside = (values - batch.returns) ** 2 < (clipped_v - batch.returns) ** 2
        d_values.masked_fill_(outside, 0.0)
    stats["value_loss"] = v_loss

    if discrete:
        probs = log_p.exp()
        d_head = probs * -d_log_probs[:, None]  # (onehot − p) · ∂L/∂log π, the −p part
        d_head.scatter_add_(-1, actions, d_log_probs[:, None])
        if ent_coef:
            entropy = -(probs * log_p).sum(-1)  # (N,)
            stats["entropy"] = entropy.mean()
            d_head += probs * (log_p + entropy[:, None]) * (ent_coef / n)  # −c_H/N · ∂H/∂z
    else:
        d_head = (z / std) * d_log_probs[:, None]  # ∂log π/∂μ = (a − μ)/σ²
        d_log_std = ((z * z - 1.0) * d_log_probs[:, None]).sum(0)
        if ent_coef:
            stats["entropy"] = diag_gaussian_entropy(actor.log_std)
            d_log_std -= ent_coef  # ∂(−c_H mean H)/∂log σ
        _grad(actor.log_std).copy_(d_log_std)
    _backward(actor.net, actor_in, d_head)
    _backward(critic.net, critic_in, d_values[:, None])
    return stats
