"""PPO's minibatch step by hand, and ``ppo.backend``'s choice between it and the reference.

`FusedStep` does what ``ReferenceStep`` in `postrl.control.ppo` does (the gradient of ``ppo_actor_critic_loss``, the mean
over ranks, the global-norm clip, an Adam step) with the gradient written out (`postrl.control.fast.ppo_grad`)
and Adam and the clip on one flat tensor (`postrl.control.fast.flat`); the rollout then samples with the
numpy actor (`postrl.control.fast.numpy_actor`). The same updates to float32 rounding: the gradients are
summed in another order, the global norm is taken over one tensor instead of per parameter, and Adam is the
same kernel on one tensor instead of several (tests/control/test_ppo_grad.py, test_flat.py, test_ppo_paths.py).

:func:`use_fused` chooses once, when PPO is built: ``auto`` (the default) takes the fused step when the
networks are postrl's own MLP actor and critic, and logs why not otherwise (e.g. a custom actor subclass or
gSDE); ``fused`` insists on it (a ConfigError says why it cannot run); ``autograd`` takes the reference.
"""

from __future__ import annotations

import logging

from torch import Tensor, nn

from postrl.control import ranks
from postrl.control.buffer import Batch
from postrl.control.fast.flat import FlatAdam, FlatParameters
from postrl.control.fast.ppo_grad import HandGradient, Minibatch, fused_refusal, stat_names
from postrl.runtime.config import ConfigError

__all__ = ["BACKENDS", "FusedStep", "use_fused"]

log = logging.getLogger(__name__)

BACKENDS = ("auto", "fused", "autograd")
"""The values of ``ppo.backend``."""


def use_fused(backend: str, actor: nn.Module, critic: nn.Module) -> bool:
    """Whether PPO runs the fused path for ``ppo.backend`` = ``backend`` on these networks; logs which path
    runs and, when ``auto`` refuses the fused one, why. ``fused`` on networks it cannot run is a ConfigError."""
    if backend not in BACKENDS:
        raise ConfigError(f"'ppo.backend': {backend!r} is not one of {', '.join(BACKENDS)}")
    if backend == "autograd":
        log.info("ppo.backend=autograd: gradients through autograd, the rollout's actor in torch")
        return False
    reason = fused_refusal(actor, critic)
    if reason is None:
        log.info(
            "ppo.backend=%s: the fused path runs (hand-written gradient, numpy actor: postrl.control.fast)",
            backend,
        )
        return True
    if backend == "fused":
        raise ConfigError(f"'ppo.backend' is fused, but {reason}; use ppo.backend=auto or autograd")
    log.info("ppo.backend=auto: autograd path, the fused one cannot run: %s", reason)
    return False


class FusedStep:
    """One PPO minibatch step on ``actor`` and ``critic`` (postrl's MLPs: :func:`use_fused` says when):
    ``step(mb, clip_eps)`` writes the hand gradient, averages it over ranks, clips its global norm to
    ``max_grad_norm`` and takes an Adam step; it returns the statistics ``names`` as a row ``[1, k]``.

    Building it re-homes the networks' parameters into one flat tensor (their ``nn.Parameter`` objects,
    ``state_dict`` and checkpoints unchanged); ``optimizer`` is Adam on that tensor.
    """

    def __init__(
        self,
        actor: nn.Module,
        critic: nn.Module,
        *,
        lr: float,
        adam_eps: float,
        max_grad_norm: float,
        vf_coef: float,
        ent_coef: float,
        vf_clip: float | None,
    ):
        self.flat = FlatParameters([actor, critic])  # one tensor for Adam, clipping and the gradient
        self.optimizer = FlatAdam(self.flat.param, lr=lr, eps=adam_eps)
        self.gradient = HandGradient(actor, critic)  # writes into the flat gradient's views
        self.max_grad_norm, self.vf_coef, self.ent_coef, self.vf_clip = (
            max_grad_norm,
            vf_coef,
            ent_coef,
            vf_clip,
        )
        self.names = stat_names(ent_coef)
        self._batch: Batch | None = None
        self._prepared: Minibatch | None = None

    def __call__(self, mb: Batch, clip_eps: float) -> Tensor:
        if mb is not self._batch:  # the whole rollout as the minibatch of every epoch: prepared once
            self._batch, self._prepared = mb, self.gradient.prepare(mb)
        stats = self.gradient(self._prepared, clip_eps, self.vf_coef, self.ent_coef, self.vf_clip)
        ranks.sync_grads([self.flat.param])  # the mean over ranks (nothing in one process)
        self.optimizer.update(grad_scale=self.flat.clip_divisor(self.max_grad_norm))  # the clip, then Adam
        return stats
