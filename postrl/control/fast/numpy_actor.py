"""A fast path of the rollout loop: postrl's MLP actors sampling in numpy instead of torch.

With 8 observations and 64×64 MLPs a torch op's dispatch costs several times a numpy op's, so the actor's
part of a vector step is cheaper here (``benchmarks/control.py`` measures the whole effect). The
reference is ``actor.act`` (`postrl.control.policies`): random numbers still come from torch (the same calls,
in the same order), so both draw the same actions and log-probs up to float rounding
(tests/control/test_policies.py).

The loop uses it only where the copy is exact: :func:`numpy_actor_refusal` says why it cannot for an actor, and
:func:`use_numpy_actor` picks the path once per run and logs which one runs and why (PPO's ``ppo.backend``
switch; A2C and TRPO take it whenever the actor allows).
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import nn

from postrl.control.policies import MLP, CategoricalActor, GaussianActor
from postrl.core import diag_gaussian_log_prob

__all__ = ["NumpyActor", "numpy_actor_refusal", "use_numpy_actor"]

log = logging.getLogger(__name__)

_NUMPY_ACTIVATIONS = {
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0.0, out=x),
    "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))),
}


def numpy_actor_refusal(actor: nn.Module) -> str | None:
    """Why `NumpyActor` cannot stand in for ``actor`` (None: it can). Exact types only: a subclass may change
    the forward that the numpy copy writes out."""
    if getattr(actor, "use_sde", False):
        return "the actor uses gSDE (policy.use_sde), which has no numpy copy"
    if type(actor) not in (CategoricalActor, GaussianActor):
        return f"the actor is a {type(actor).__qualname__}, not postrl's CategoricalActor or GaussianActor"
    if type(actor.net) is not MLP:
        return f"the actor's net is a {type(actor.net).__qualname__}, not postrl's MLP"
    if actor.net.activation_name not in _NUMPY_ACTIVATIONS:
        return f"activation {actor.net.activation_name!r} has no numpy copy"
    return None


def use_numpy_actor(actor: nn.Module, who: str) -> bool:
    """Whether ``who``'s rollout loop may sample with `NumpyActor` (it does whenever ``actor`` allows); logs
    the path that runs and, when torch's, why."""
    reason = numpy_actor_refusal(actor)
    if reason is None:
        log.info(
            "%s: the rollout samples actions with the numpy actor (postrl.control.fast.numpy_actor)", who
        )
        return True
    log.info("%s: the rollout samples actions with actor.act in torch: %s", who, reason)
    return False


class NumpyActor:
    """``actor.act`` (sampling, under no_grad) in numpy, for the rollout loop's few observations.

    The weights are copied at construction: build one per rollout, after each update.
    """

    def __init__(self, actor: CategoricalActor | GaussianActor):
        with torch.no_grad():
            self.layers = [
                (layer.weight.detach().numpy().T.copy(), layer.bias.detach().numpy().copy())
                for layer in actor.net.layers
            ]
        self.activation = _NUMPY_ACTIVATIONS[actor.net.activation_name]
        self.actor = actor

    def _forward(self, obs: np.ndarray) -> np.ndarray:
        *hidden, (w, b) = self.layers
        x = obs
        for wh, bh in hidden:
            x = self.activation(x @ wh + bh)
        return x @ w + b

    def draws(self, n_steps: int, n_obs: int) -> np.ndarray | None:
        """The uniforms ``[n_steps, n_obs, 1]`` that ``n_steps`` calls of `act` on ``n_obs`` observations would
        draw, in one torch call instead of one per step: torch's CPU generator fills a block with the same
        numbers, in the same order, as a call per step, and ends in the same state (tests/control/
        test_policies.py). None for a Gaussian policy, whose normal draws are not blocked that way."""
        return torch.rand((n_steps, n_obs, 1)).numpy() if isinstance(self.actor, CategoricalActor) else None

    def act(self, obs: np.ndarray, uniforms: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Sampled actions ``[N]`` (int64) or ``[N, act_dim]`` and their log-probs ``[N]`` (float32);
        ``uniforms`` ``[N, 1]``: this step's row of `draws` (categorical), else they are drawn here."""
        out = self._forward(obs)
        if isinstance(self.actor, CategoricalActor):  # inverse-CDF sampling, as CategoricalActor.act
            z = out - out.max(axis=-1, keepdims=True)  # (N, K) logits − max
            cdf = np.exp(z).cumsum(axis=-1)  # unnormalised: the total is its last column
            total = cdf[:, -1:]
            if uniforms is None:
                uniforms = torch.rand((obs.shape[0], 1)).numpy()
            u = uniforms * total  # u ≤ total: never past the last action
            actions = (cdf < u).sum(axis=-1)  # the first k with cdf_k ≥ u
            rows = np.arange(obs.shape[0])
            log_probs = z[rows, actions] - np.log(total[:, 0])  # log softmax of the drawn action
            return actions, log_probs.astype(np.float32)
        mean = torch.from_numpy(out)
        actions = mean + torch.randn(mean.shape, dtype=mean.dtype) * self.actor.log_std.detach().exp()
        log_probs = diag_gaussian_log_prob(actions, mean, self.actor.log_std.detach())
        return actions.numpy(), log_probs.numpy()
