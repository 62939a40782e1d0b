"""PPO's minibatch gradient written out (the MLPs' forward and backward and the loss's derivative, no
autograd): the gradient of `postrl.control.ppo.ppo_actor_critic_loss` for postrl's MLP actor and critic, which
`postrl.control.fast.ppo_step.FusedStep` takes instead of autograd's (tests/control/test_ppo_grad.py checks
every variant against autograd through ``ppo_actor_critic_loss``).

For the 64×64 MLPs of classic control on a 256-row minibatch, autograd's bookkeeping (a node per op, its
saved tensors, the engine's walk of the graph) costs about as much as the arithmetic; written out by hand
the same gradients (to float32 rounding) take well under half the time (benchmarks/control.py). PPO on
CartPole takes 20 minibatch steps per 256 env steps, so this is most of a run, and every op counts: a small
op's dispatch costs a sizeable fraction of a 256×64 GEMM.

The derivation (N rows; ρ = exp(log π − log π_old); A the whitened advantages; ε the clip range):

- policy: L_pg = −mean min(ρA, clip(ρ, 1−ε, 1+ε)A), so ∂L_pg/∂log π_i = −ρ_i A_i / N, and 0 where the clip
  binds (A > 0 and ρ > 1+ε, or A < 0 and ρ < 1−ε: `postrl.core.clipped_surrogate`'s mask, computed here
  as (ρ − clip(ρ))·A > 0: ρ − clip(ρ) is non-zero exactly outside the band, with the sign of the side);
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

On AMD CPUs tanh is computed as 2σ(2u) − 1 (the same function, to 2e-7; the ×2 rides in the GEMM, addmm's α,
β): there torch's float32 tanh kernel is far slower than its sigmoid (an AMD EPYC with AVX-512, 2026-12-06: 2.55
against 0.55 ns per element; the sigmoid and the add of 2σ − 1 take 23 us on a [2, 256, 64] tensor, tanh 83).
Elsewhere tanh is applied in place (an Intel Xeon with AVX-512, 2026-12-06: tanh 4.9 us on a [256, 64] tensor,
sigmoid 6.3 plus 3.4 for the add). The choice is the CPU's vendor, not a timing, so a resumed run on the same
machine takes the same path and repeats the same rounding (`TANH_VIA_SIGMOID`).

Everything is kept ``[N, 1]``-shaped (a column per row of the minibatch) so that nothing is reshaped; the
statistics' per-row terms are written into the columns of one preallocated ``[N, len(STATS)]`` buffer and averaged
by one GEMM (`STATS`). The output layers are computed out-major (`_Net.forward`) and the policy's one-hot is
stored the same way, so the head's softmax and weight gradient read contiguous memory. Nothing runs under
``torch.no_grad()``: every parameter is read through a detached view, so no autograd graph is built. Gradients are written into each
parameter's ``.grad`` as it was when the `HandGradient` was built (views of
`postrl.control.fast.flat.FlatParameters`' flat gradient), replacing what was there: no zeroing is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from postrl.control.buffer import Batch
from postrl.control.fast import numpy_actor
from postrl.control.policies import MLP, CategoricalActor, Critic, GaussianActor
from postrl.core import diag_gaussian_entropy, diag_gaussian_log_prob

__all__ = ["STATS", "HandGradient", "Minibatch", "fused_refusal", "minibatch_gradient", "stat_names"]

# The statistics of `postrl.control.ppo.ppo_actor_critic_loss`, in the order of the vector a gradient step returns.
STATS = ("policy_loss", "value_loss", "clip_fraction", "approx_kl", "ratio_mean", "entropy")

# grad ⊙ act'(x) from grad and y = act(x): autograd's own backward kernels (one fused op each):
# tanh grad·(1 − y²), relu grad·1[y > 0], elu (α = 1) grad·(y > 0 ? 1 : y + 1)
_ACT_BACKWARD = {
    "tanh": torch.ops.aten.tanh_backward,
    "relu": lambda grad, y: torch.ops.aten.threshold_backward(grad, y, 0),
    "elu": lambda grad, y: torch.ops.aten.elu_backward(grad, 1.0, 1.0, 1.0, True, y),
}
_MINUS_ONE = torch.tensor(-1.0)
_ZERO = torch.tensor(0.0)


def _cpu_vendor() -> str:
    """The CPU's vendor string as Linux reports it ("GenuineIntel", "AuthenticAMD"; "" where unknown)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


TANH_VIA_SIGMOID = _cpu_vendor() == "AuthenticAMD"
"""Whether the forward computes tanh as 2σ(2u) − 1 (AMD CPUs) rather than torch's tanh (the module docstring)."""


def stat_names(ent_coef: float) -> tuple[str, ...]:
    """The statistics a step reports: `STATS`, without the entropy when it is not part of the loss."""
    return STATS if ent_coef else STATS[:-1]


def fused_refusal(actor: nn.Module, critic: nn.Module) -> str | None:
    """Why the fused path cannot run these networks (None: it can). Exact types only: a subclass may change
    the forward that this module and the numpy actor write out."""
    reason = numpy_actor.numpy_actor_refusal(actor)
    if reason is not None:
        return reason
    if type(critic) is not Critic:
        return f"the critic is a {type(critic).__qualname__}, not postrl's Critic"
    if type(critic.net) is not MLP:
        return f"the critic's net is a {type(critic.net).__qualname__}, not postrl's MLP"
    for name, net in (("actor", actor.net), ("critic", critic.net)):
        if net.activation_name not in _ACT_BACKWARD:
            return f"the {name}'s activation {net.activation_name!r} has no hand-written derivative"
    return None


@dataclass(frozen=True)
class Minibatch:
    """A `Batch` in the shapes the gradient reads (built once per minibatch, or once per update when the
    minibatch is the whole rollout)."""

    obs: Tensor  # [N, obs_dim]
    actions: Tensor  # [N, 1] int64 (discrete) or [N, A]
    onehot: Tensor | None  # [N, K] onehot(a) (discrete)
    old_log_probs: Tensor  # [N, 1]
    neg_advantages: Tensor  # [N, 1] −A
    returns: Tensor  # [N, 1]
    old_values: Tensor  # [N, 1]
    mean_weights: Tensor  # [1, N] all 1/N: a mean over the rows as a GEMM (a third of `mean`'s cost)
    columns: Tensor  # [N, len(STATS)] the per-row terms of the statistics, written in place by each call
    column_views: tuple[Tensor, ...]  # its columns [N, 1], in `STATS`' order (made once: split costs ~18 us)

    @classmethod
    def of(cls, batch: Batch, n_actions: int | None) -> Minibatch:
        """``n_actions``: K for a categorical policy, None for a Gaussian one."""
        actions, onehot = batch.actions, None
        if n_actions is not None:
            actions = actions.long()[:, None]
            # out-major [N, K] as the actor's head (_Net.forward), so that onehot − p keeps that layout
            onehot = torch.zeros(n_actions, actions.shape[0]).scatter_(0, actions.t(), 1.0).t()
        return cls(
            batch.obs,
            actions,
            onehot,
            batch.log_probs[:, None],
            -batch.advantages[:, None],
            batch.returns[:, None],
            batch.values[:, None],
            torch.full((1, batch.obs.shape[0]), 1.0 / batch.obs.shape[0]),
            columns := torch.empty(batch.obs.shape[0], len(STATS)),
            columns.split(1, dim=1),
        )


class _Layer:
    """A linear layer's tensors as the gradient uses them (views: they follow the parameters in place)."""

    def __init__(self, layer: nn.Linear):
        # detached views: no autograd graph is built whatever the grad mode (no torch.no_grad() per call)
        weight = layer.weight.detach()
        self.weight, self.weight_t, self.bias = weight, weight.t(), layer.bias.detach()
        self.bias_col = self.bias[:, None]  # [out, 1], for the output layer's out-major GEMM
        for p in (layer.weight, layer.bias):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.grad_weight, self.grad_bias = layer.weight.grad, layer.bias.grad
        self.grad_weight_t = self.grad_weight.t()
        # ∂L/∂W = δᵀh [out, in]; for a narrow input (the observation layer) (hᵀδ)ᵀ is ~2.5× cheaper in MKL
        self.transposed_dw = layer.in_features < layer.out_features


class _Net:
    """An MLP's layers and activation, with its forward that keeps every layer's input and its backward."""

    def __init__(self, net: MLP, tanh_via_sigmoid: bool):
        self.layers = [_Layer(layer) for layer in net.layers]
        self.tanh = net.activation_name == "tanh"
        self.via_sigmoid = self.tanh and tanh_via_sigmoid
        self.activation, self.act_backward = net.activation, _ACT_BACKWARD[net.activation_name]

    def forward(self, x: Tensor) -> tuple[list[Tensor], Tensor]:
        """Every layer's input [x, h_1, …, h_{L−1}] and the output [N, out] (no activation on the last layer),
        stored out-major (a transposed view): for a narrow output layer W h_{L−1}ᵀ is ~2.5× cheaper in MKL than
        h_{L−1} Wᵀ, and a softmax over a row of outputs then runs along contiguous memory (~5× cheaper)."""
        inputs = [x]
        *hidden, last = self.layers
        for layer in hidden:
            if self.via_sigmoid:  # tanh(u) = 2σ(2u) − 1
                u2 = torch.addmm(layer.bias, inputs[-1], layer.weight_t, beta=2.0, alpha=2.0)
                h = torch.add(_MINUS_ONE, u2.sigmoid_(), alpha=2.0, out=u2)
            elif self.tanh:
                h = torch.addmm(layer.bias, inputs[-1], layer.weight_t).tanh_()
            else:
                h = self.activation(torch.addmm(layer.bias, inputs[-1], layer.weight_t))
            inputs.append(h)
        return inputs, torch.addmm(last.bias_col, last.weight, inputs[-1].t()).t()

    def backward(self, inputs: list[Tensor], delta: Tensor) -> None:
        """Write ∂L/∂W, ∂L/∂b of every layer from delta = ∂L/∂output [N, out]."""
        for k in range(len(self.layers) - 1, -1, -1):
            layer, h = self.layers[k], inputs[k]
            if layer.transposed_dw:
                layer.grad_weight_t.copy_(torch.mm(h.t(), delta))
            else:
                torch.mm(delta.t(), h, out=layer.grad_weight)
            torch.sum(delta, 0, out=layer.grad_bias)
            if k:
                delta = self.act_backward(torch.mm(delta, layer.weight), h)


class HandGradient:
    """The gradient of `postrl.control.ppo.ppo_actor_critic_loss` for one actor and critic, written out.

    It holds views of the parameters and of their gradients as they are when it is built: build it after
    `postrl.control.fast.flat.FlatParameters` has re-homed them; call it per minibatch.
    """

    def __init__(
        self,
        actor: CategoricalActor | GaussianActor,
        critic: Critic,
        tanh_via_sigmoid: bool = TANH_VIA_SIGMOID,
    ):
        self.actor, self.discrete = actor, isinstance(actor, CategoricalActor)
        self.actor_net = _Net(actor.net, tanh_via_sigmoid)
        self.critic_net = _Net(critic.net, tanh_via_sigmoid)
        if not self.discrete:
            if actor.log_std.grad is None:
                actor.log_std.grad = torch.zeros_like(actor.log_std)
            self.log_std_grad, self.log_std = actor.log_std.grad, actor.log_std.detach()

    def prepare(self, batch: Batch) -> Minibatch:
        """``batch`` in the shapes a call reads (once per minibatch, or once per update for the whole rollout)."""
        return Minibatch.of(batch, self.actor.net.layers[-1].out_features if self.discrete else None)

    @torch.no_grad()
    def mean_entropy(self, obs: Tensor) -> float:
        """The actor's entropy averaged over ``obs`` (what ``actor.evaluate`` gives, in the forward written here)."""
        if not self.discrete:  # state-independent
            return float(diag_gaussian_entropy(self.log_std))
        log_p = torch.log_softmax(self.actor_net.forward(obs)[1].t(), dim=0).t()
        return -float(torch.mul(log_p.exp(), log_p).sum()) / obs.shape[0]

    def __call__(
        self, mb: Minibatch, clip_eps: float, vf_coef: float, ent_coef: float, vf_clip: float | None
    ) -> Tensor:
        """Write the gradient on ``mb`` into every parameter's ``.grad``; return the statistics
        `stat_names(ent_coef)` as a row ``[1, k]``. The advantages are used as given (already whitened).
        Every tensor it reads is detached, so it builds no autograd graph in any grad mode."""
        n = mb.obs.shape[0]
        actor_in, head = self.actor_net.forward(mb.obs)
        critic_in, values = self.critic_net.forward(mb.obs)  # [N, 1]
        if self.discrete:
            log_p = torch.log_softmax(head.t(), dim=0).t()  # (N, K), out-major as the head (see _Net.forward)
            log_probs = log_p.gather(1, mb.actions)  # (N, 1)
        else:
            std = self.log_std.exp()
            z = (mb.actions - head) / std  # (N, A): the standardised action
            log_probs = diag_gaussian_log_prob(mb.actions, head, self.log_std)[:, None]

        # the statistics' per-row terms go straight into their columns (in `STATS`' order)
        surrogate_col, value_col, clipped_col, kl_col, ratio_col, entropy_col = mb.column_views
        log_ratio = log_probs - mb.old_log_probs
        ratio = torch.exp(log_ratio, out=ratio_col)
        neg_unclipped = ratio * mb.neg_advantages  # −ρA
        clipped_ratio = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)
        # −min(ρA, clip(ρ)A)
        torch.maximum(neg_unclipped, clipped_ratio * mb.neg_advantages, out=surrogate_col)
        # 1.0 where (ρ − clip ρ)·A > 0: the clip binds
        clipped = torch.lt(torch.mul(ratio - clipped_ratio, mb.neg_advantages), 0.0, out=clipped_col)
        # ∂L/∂log π (N, 1): −ρA/N, and 0 where clipped (x − x·1 is exactly 0, x − x·0 exactly x)
        d_log_probs = torch.mul(neg_unclipped, 1.0 / n)
        d_log_probs = torch.addcmul(d_log_probs, d_log_probs, clipped, value=-1.0)
        # (ρ − 1) − log ρ, as ppo_clip_loss's approx_kl
        torch.add(_MINUS_ONE, ratio, out=kl_col).sub_(log_ratio)
        d_values = self._value_gradient(values, mb, vf_coef / n, vf_clip, value_col)
        n_columns = len(STATS) - 1

        if self.discrete:
            probs = log_p.exp()
            d_head = torch.sub(mb.onehot, probs).mul_(d_log_probs)  # (onehot − p) · ∂L/∂log π
            if ent_coef:
                entropy = torch.sum(torch.mul(probs, log_p), -1, keepdim=True, out=entropy_col).neg_()
                n_columns += 1
                d_head += probs * (log_p + entropy) * (ent_coef / n)  # −c_H/N · ∂H/∂z
        else:
            d_head = (z / std) * d_log_probs  # ∂log π/∂μ = (a − μ)/σ²
            d_log_std = ((z * z - 1.0) * d_log_probs).sum(0)
            if ent_coef:
                d_log_std -= ent_coef  # ∂(−c_H mean H)/∂log σ
            self.log_std_grad.copy_(d_log_std)
        self.actor_net.backward(actor_in, d_head)
        self.critic_net.backward(critic_in, d_values)
        stats = torch.mm(mb.mean_weights, mb.columns[:, :n_columns])  # (1, k): the columns' means
        if ent_coef and not self.discrete:  # the Gaussian's entropy does not depend on the state
            stats = torch.cat([stats, diag_gaussian_entropy(self.log_std).reshape(1, 1)], dim=1)
        return stats

    @staticmethod
    def _value_gradient(
        values: Tensor, mb: Minibatch, scale: float, vf_clip: float | None, terms: Tensor
    ) -> Tensor:
        """∂(c_v L_v)/∂V (N, 1), ``scale`` = c_v / N; writes the per-row terms whose mean is L_v into ``terms``."""
        error = values - mb.returns
        d_values = error * scale
        if vf_clip is None:
            torch.addcmul(_ZERO, error, error, value=0.5, out=terms)  # ½ (V − R̂)²
            return d_values
        clipped_error = mb.old_values + torch.clamp(values - mb.old_values, -vf_clip, vf_clip) - mb.returns
        squared, clipped_squared = error * error, clipped_error * clipped_error
        d_values.masked_fill_(squared < clipped_squared, 0.0)
        torch.maximum(squared, clipped_squared, out=terms).mul_(0.5)
        return d_values


def minibatch_gradient(
    actor: torch.nn.Module,
    critic: torch.nn.Module,
    batch: Batch,
    clip_eps: float,
    vf_coef: float,
    ent_coef: float,
    vf_clip: float | None,
) -> dict[str, Tensor]:
    """`HandGradient` for one `Batch`: write the gradient into ``.grad``; return the statistics by name (those
    of `postrl.control.ppo.ppo_actor_critic_loss`)."""
    gradient = HandGradient(actor, critic)
    stats = gradient(gradient.prepare(batch), clip_eps, vf_coef, ent_coef, vf_clip)
    return dict(zip(stat_names(ent_coef), stats[0], strict=True))
