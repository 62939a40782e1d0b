"""AdamW for low-precision weights: bfloat16 (or float16) parameters, float32 master weights and moments.

A weight stored in bfloat16 has 8 significant bits: an AdamW update smaller than half its spacing (about
0.4% of the weight) rounds away, and so do the moments' small changes when they are bfloat16 too. At TRL's
GRPO learning rate of 1e-6 such a policy never moves. The fix of mixed-precision training (Micikevicius et
al. 2018, "Mixed Precision Training", §3.1; DeepSpeed's and Megatron's bf16 optimisers) keeps a float32
master copy of every low-precision weight in the optimiser:

    g    ← grad.float()                                   the bfloat16 gradient cast up
    master, m, v ← AdamW step on (master, g)              torch's own kernel, every tensor float32
    param ← master.to(param.dtype)                        round to nearest even

so an update accumulates in the master until it crosses a bfloat16 spacing. The master, ``exp_avg`` and
``exp_avg_sq`` live in ``optimizer.state[param]``: ``state_dict()`` carries them into checkpoints and
``load_state_dict`` keeps them float32 (torch's own casts every floating state to its parameter's dtype),
so a resumed run continues bit for bit. Memory per trained bfloat16 parameter: 2 bytes of weight and 12 of
optimiser state (4 master + 8 moments), plus a float32 copy of the gradients while a step runs, at most
`CHUNK_NUMEL` elements (or one tensor) at a time.

float32 parameters take the unchanged path: the same functional AdamW torch.optim.AdamW.step calls, with
their own tensors, so with only float32 parameters this is torch.optim.AdamW, step for step (tested).
`postrl.lm.trainer.make_optimizer` picks this class only when some trained parameter is low-precision.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.adamw import adamw

LOW_PRECISION = (torch.bfloat16, torch.float16)
CHUNK_NUMEL = 1 << 26
"""Most gradient elements cast to float32 at once (256 MB); a larger tensor goes alone."""


def needs_master(param: torch.Tensor) -> bool:
    """Whether AdamW on ``param`` needs a float32 master copy (a bfloat16 or float16 tensor)."""
    return param.dtype in LOW_PRECISION


class MasterAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` (same arguments, decoupled weight decay, schedules and hooks) that steps a float32
    master copy of each bfloat16/float16 parameter with float32 moments, then rounds it into the parameter."""

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 - torch.optim.Optimizer.step
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            full = [p for p in params if not needs_master(p)]
            if full:
                self._update(group, full, [p.grad for p in full], [self._state(group, p) for p in full])
            low = [p for p in params if needs_master(p)]
            for chunk in _chunks(low):
                states = [self._state(group, p) for p in chunk]
                masters = [s["master"] for s in states]
                self._update(group, masters, [p.grad.float() for p in chunk], states)
                for p, master in zip(chunk, masters, strict=True):
                    p.copy_(master)
        return loss

    def _state(self, group: dict[str, Any], param: torch.Tensor) -> dict[str, torch.Tensor]:
        """``self.state[param]``, created as torch.optim.AdamW creates it (for a low-precision parameter:
        on its float32 master, made from the parameter's value at the first step)."""
        state = self.state[param]
        if not state:
            like = param.detach().to(torch.float32) if needs_master(param) else param
            state.update(adamw_state(group, param, like))
            if needs_master(param):
                state["master"] = like
        return state

    def _update(self, group: dict[str, Any], params, grads, states) -> None:
        """torch's functional AdamW on these tensors (what torch.optim.AdamW.step runs per group)."""
        beta1, beta2 = group["betas"]
        adamw(
            params,
            grads,
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [s["max_exp_avg_sq"] for s in states] if group["amsgrad"] else [],
            [s["step"] for s in states],
            foreach=group["foreach"],
            capturable=group["capturable"],
            differentiable=group["differentiable"],
            fused=group["fused"],
            grad_scale=getattr(self, "grad_scale", None),
            found_inf=getattr(self, "found_inf", None),
            has_complex=any(torch.is_complex(p) for p in params),
            amsgrad=group["amsgrad"],
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=group["maximize"],
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """``torch.optim.Optimizer.load_state_dict``, except that a low-precision parameter's master and
        moments stay float32 (torch casts them to the parameter's dtype). A state saved without a master
        (by plain AdamW on the same bfloat16 weights) gets one from the loaded weights, moments cast up."""
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        kept = {
            p: {k: v for k, v in state_dict["state"][i].items() if k != "step"}
            for i, p in zip(saved_ids, params, strict=False)  # a mismatch: torch's own error below
            if needs_master(p) and i in state_dict["state"]
        }
        super().load_state_dict(state_dict)
        for p, tensors in kept.items():
            state = self.state[p]
            for key, value in tensors.items():
                state[key] = value.to(device=p.device, dtype=torch.float32)
            state.setdefault("master", p.detach().to(torch.float32))


def adamw_state(group: dict[str, Any], param: torch.Tensor, like: torch.Tensor) -> dict[str, torch.Tensor]:
    """The state torch.optim.AdamW gives ``param`` at its first step: ``step`` 0 and zero moments shaped as
    ``like`` (the parameter, or its float32 master)."""
    fused_or_capturable = group["fused"] or group["capturable"]
    # where torch keeps `step`: on the device for the fused and capturable kernels, else a CPU scalar
    state = {
        "step": torch.zeros((), dtype=torch.float32, device=param.device)
        if fused_or_capturable
        else torch.tensor(0.0, dtype=_cpu_step_dtype()),
        "exp_avg": torch.zeros_like(like, memory_format=torch.preserve_format),
        "exp_avg_sq": torch.zeros_like(like, memory_format=torch.preserve_format),
    }
    if group["amsgrad"]:
        state["max_exp_avg_sq"] = torch.zeros_like(like, memory_format=torch.preserve_format)
    return state


def allocate_adamw_state(optimizer: torch.optim.AdamW) -> None:
    """Give every parameter of a torch.optim.AdamW its state now, what the first step would create (the same
    zeros: the steps that follow are the lazy optimizer's, bit for bit). A step's transient tensors are then
    never allocated before the moments, which live for the whole run: when the first step made them (2 GB
    for a bfloat16 0.5B model) between the freed gradients and activations of the first backward, the heap kept
    those holes, and a bfloat16 GRPO step at 0.5B peaked 130 MB higher (benchmarks/real_size.py)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if not optimizer.state[param]:
                optimizer.state[param].update(adamw_state(group, param, param))


def _cpu_step_dtype() -> torch.dtype:
    """The dtype torch.optim.AdamW gives a CPU ``step`` counter: float64 under a float64 default, else float32."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def _chunks(params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Consecutive runs of ``params`` of at most `CHUNK_NUMEL` elements in all (a larger tensor alone)."""
    chunks: list[list[torch.Tensor]] = []
    size = CHUNK_NUMEL
    for p in params:
        if size + p.numel() > CHUNK_NUMEL:
            chunks.append([])
            size = 0
        chunks[-1].append(p)
        size += p.numel()
    return chunks
