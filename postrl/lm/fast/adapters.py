"""Projections as the fast decoders read them: a plain ``nn.Linear``, or a peft LoRA layer around one, whose
weight the decoders take merged, W + Σ_a (alpha_a / r_a)·B_a A_a over its active adapters (Hu et al. 2021).

Merging is exact in real arithmetic and differs from peft's forward, W x + (alpha/r)·B (A x), only by float32
rounding; with gradients on, the merged weight is a differentiable function of A and B, so a training forward
through a fast decoder trains the adapters. peft is never imported: a LoRA layer is recognised by its
attributes (``base_layer``, ``lora_A``, ``lora_B``, ``scaling``), so the fast path costs nothing without it.
"""

from __future__ import annotations

from torch import Tensor, nn


def is_lora_layer(module: nn.Module) -> bool:
    """A peft LoRA layer (``lora.Linear`` and kin): a ``base_layer`` with ``lora_A`` / ``lora_B`` beside it."""
    return all(hasattr(module, a) for a in ("base_layer", "lora_A", "lora_B", "scaling"))


def unsupported_projection(module: nn.Module, kind: type = nn.Linear) -> str | None:
    """None when the fast path can read ``module`` as a ``kind`` projection (plain, or LoRA around a plain one
    with its adapters mergeable), else why not."""
    if type(module) is kind:
        return None
    if not is_lora_layer(module) or type(module.base_layer) is not kind:
        return f"a projection is a {type(module).__name__}, not a plain {kind.__name__} (or LoRA around one)"
    if any(getattr(module, "use_dora", {}).get(a, False) for a in module.active_adapters):
        return "a LoRA adapter uses DoRA (its weight is not W + BA)"
    if module.training and any(isinstance(d, nn.Dropout) and d.p > 0 for d in module.lora_dropout.values()):
        return "LoRA dropout is active (sampling from merged weights would drop nothing)"
    return None


def linear_weight(module: nn.Module) -> tuple[Tensor, Tensor | None]:
    """(W [out, in], bias or None) of a plain ``nn.Linear``, or of a LoRA layer with its active adapters merged
    (nothing merged while its adapters are disabled or already merged into W by peft)."""
    if not is_lora_layer(module):
        return module.weight, module.bias
    base = module.base_layer
    weight = base.weight
    if module.disable_adapters or module.merged:
        return weight, base.bias
    for name in module.active_adapters:
        if name in module.lora_A:
            a, b = module.lora_A[name].weight, module.lora_B[name].weight  # (r, in), (out, r)
            weight = weight + (module.scaling[name] * (b @ a)).to(weight.dtype)  # (out, in)
    return weight, base.bias


def any_lora(modules: list[nn.Module]) -> bool:
    """Whether any of ``modules`` is a LoRA layer."""
    return any(is_lora_layer(m) for m in modules)
