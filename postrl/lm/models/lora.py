"""Low-rank adapters (LoRA, Hu et al. 2021) through peft, injected in place: the model keeps its class.

W x becomes W x + (alpha/r)·B A x for every targeted Linear W, with A ∈ R^{r×d_in}, B ∈ R^{d_out×r} (B = 0 at
the start, so the adapted model starts as the base model) and W frozen. peft's ``inject_adapter_in_model``
swaps each target for a ``lora.Linear`` around it, so a `LlamaForCausalLM` stays one: every place that asks
for a Hugging Face causal LM (scoring, the fast decoders, heads, context checks) takes it unchanged.

- `apply_lora`: adapters on a loaded model (or a scalar-head model's trunk) when ``run.lora.enabled``; the
  adapters are kept in float32 whatever ``run.dtype`` (so their AdamW state is float32 too, as peft's
  ``autocast_adapter_dtype``), the base weights in ``run.dtype``.
- `adapters_disabled` and `AdapterFreeReference`: the reference policy of PPO and GRPO is the policy with its
  adapters disabled (TRL's ``with model.disable_adapter()``): the base model, no second copy in memory.
- `merged_state_dict`, `save_merged`, `save_adapter`, `export_adapted`: what a run exports. The adapter is a
  peft folder (``adapter_config.json`` naming its base model, ``adapter_model.safetensors``); merged weights
  W + (alpha/r)·B A are a plain Hugging Face folder that transformers loads without peft.
- `load_adapter_folder`: `load_causal_lm` on an adapter folder loads its base model and merges the adapter in,
  so a LoRA SFT run's ``RUN_DIR/model`` starts PPO or GRPO like any model folder.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from postrl.runtime.checkpoint import write_dir_atomically
from postrl.runtime.errors import ConfigError, ModelError

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
SETTINGS = "postrl_lora"  # the attribute under which an adapted model keeps its run.lora settings
PEFT_PREFIX = "base_model.model."  # peft's names in adapter_model.safetensors (those of a PeftModel)


def _peft(key: str = "run.lora.enabled") -> Any:
    try:
        import peft
    except ImportError:
        raise ModelError(f"{key} needs peft: pip install 'postrl[lora]' (or pip install peft)") from None
    return peft


def hf_model_of(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside ``model``: a scalar-head model's trunk, a policy-with-value-head's LM,
    else ``model`` itself (the adapters go there; a head stays trained in full)."""
    for attr in ("backbone", "lm"):
        inner = getattr(model, attr, None)
        if isinstance(inner, nn.Module):
            return inner
    return model


def lora_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, layer) of every peft LoRA layer in ``model`` (none without peft installed)."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return []
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LoraLayer)]


def has_lora(model: nn.Module) -> bool:
    """Whether ``model`` carries LoRA adapters."""
    return bool(lora_layers(model))


def lora_settings(model: nn.Module) -> Any | None:
    """The ``run.lora`` settings `apply_lora` used on ``model`` (None when it has no adapters from postrl)."""
    return getattr(hf_model_of(model), SETTINGS, None)


def peft_config(settings: Any, causal_lm: bool) -> Any:
    """The ``peft.LoraConfig`` of ``run.lora`` (`postrl.lm.spine.LoraConfig`)."""
    peft = _peft()
    targets = settings.target_modules
    return peft.LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(targets) if isinstance(targets, (list, tuple)) else targets,
        bias="none",
        task_type="CAUSAL_LM" if causal_lm else None,
    )


def apply_lora(model: nn.Module, run: Any, *, rl: bool = False) -> nn.Module:
    """``model`` with LoRA adapters in place when ``run.lora.enabled`` (``run``: the stage's `RunConfig`), else
    ``model`` untouched. Every weight but the adapters' (and a scalar head's) is frozen; the adapters are
    float32. ``rl``: PPO and GRPO, which need ``run.lora.dropout`` 0. Config mistakes are `ConfigError`s."""
    settings = run.lora
    if not settings.enabled:
        return model
    if rl and settings.dropout > 0:
        raise ConfigError(
            f"run.lora.dropout={settings.dropout}: PPO and GRPO need 0 (a log-prob must not change between "
            "sampling and training)"
        )
    if run.parallel == "fsdp" and torch.distributed.is_available() and torch.distributed.is_initialized():
        raise ConfigError("run.lora with run.parallel=fsdp is not supported; use run.parallel=ddp")
    peft = _peft()
    target = hf_model_of(model)
    config = peft_config(settings, causal_lm=target is model and hasattr(model, "generate"))
    try:
        peft.inject_adapter_in_model(config, target)
    except (ValueError, re.error) as err:  # peft: "Target modules {...} not found", or a broken regex
        first = str(err).strip().splitlines()[0]
        raise ConfigError(f"run.lora.target_modules={settings.target_modules!r}: {first}") from None
    for name, param in target.named_parameters():
        if "lora_" in name:  # peft put them in the base layer's dtype; train them in float32
            param.data = param.data.float()
    setattr(target, SETTINGS, settings)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    log.info(
        "LoRA rank %d (alpha %g) on %d modules: %d of %d parameters trained (%.2f%%)",
        settings.rank, settings.alpha, len(lora_layers(target)), trained, total, 100 * trained / total,
    )  # fmt: skip
    return model


def trainable_share(model: nn.Module) -> float:
    """The fraction of ``model``'s parameters that are trained."""
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for p in model.parameters() if p.requires_grad) / max(1, total)


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Inside the block ``model`` runs as its base model (every adapter off: ΔW = 0 exactly); on exit the
    adapters that were on are on again, trainable as before. peft's own ``PeftModel.disable_adapter``."""
    layers = [layer for _, layer in lora_layers(model) if not layer.disable_adapters]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)


class AdapterFreeReference(nn.Module):
    """The frozen reference model of PPO and GRPO when the policy trains LoRA adapters: the policy's own
    forward with its adapters disabled, i.e. the base model it started from, without a second copy.

    The policy is not registered as a submodule, so this module has no parameters of its own: freezing it,
    moving it or sharding it never touches the policy."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "policy", policy)

    @property
    def config(self) -> Any:
        return self.policy.config

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        use_cache: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        with adapters_disabled(self.policy):
            return self.policy(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                logits_to_keep=logits_to_keep, use_cache=use_cache, **kwargs,
            )  # fmt: skip


def adapter_free_reference(policy: nn.Module) -> AdapterFreeReference:
    """The reference model of a LoRA policy (see `AdapterFreeReference`)."""
    return AdapterFreeReference(policy)


# ---- merged weights and adapter folders ------------------------------------------------------------------
def _lora_deltas(model: nn.Module) -> list[tuple[str, nn.Module, str, torch.Tensor]]:
    """(layer name, base module, name of the adapted parameter, ΔW = sum over active adapters in float32) of
    every LoRA layer, in ``named_modules`` order (outer wrappers first). A layer is peft's ``lora.Linear`` (ΔW
    on the base Linear's ``weight``) or a ``ParamWrapper``, which adapts one parameter of a module by name: a
    mixture-of-experts block's fused expert tensors ``[E, d_out, d_in]`` (two wrappers stacked on one module
    for ``gate_up_proj`` and ``down_proj``) or a router's ``weight``."""
    deltas = []
    for name, layer in lora_layers(model):
        parameter = getattr(layer, "parameter_name", None) or "weight"
        delta = sum(layer.get_delta_weight(a).float() for a in layer.active_adapters)
        deltas.append((name, layer.get_base_layer(), parameter, delta))
    return deltas


def plain_name(key: str) -> str:
    """A weight's name without peft's wrappers: every ``.base_layer`` dropped (stacked wrappers nest them)."""
    return re.sub(r"(\.base_layer)+(?=\.)", "", key)


@torch.no_grad()
def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The weights of ``model`` with every active adapter folded in, W + (alpha/r)·B A (computed in float32,
    stored in W's dtype), under the names the model has without adapters; ``model`` is not changed."""
    merged: dict[str, torch.Tensor] = {}  # by plain name: a tied lm_head shares its tensor with the embedding
    for name, base, parameter, delta in _lora_deltas(model):
        key = plain_name(f"{name}.{parameter}")
        merged[key] = merged.get(key, getattr(base, parameter).float()) + delta
    out = {}
    for key, value in model.state_dict().items():
        if ".lora_" in key:
            continue
        key = plain_name(key)
        out[key] = merged[key].to(value.dtype) if key in merged else value.detach()
    return out


def without_shared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One name per storage (tied embeddings: the first name, as save_pretrained), contiguous, on the CPU."""
    seen: set[int] = set()
    out = {}
    for key, value in tensors.items():
        if value.data_ptr() in seen:
            continue
        seen.add(value.data_ptr())
        out[key] = value.detach().cpu().contiguous()
    return out


def save_merged(model: nn.Module, folder: str | Path) -> None:
    """A plain Hugging Face folder of ``model`` with its adapters merged (config, generation config,
    ``model.safetensors``): transformers loads it without peft."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(without_shared(merged_state_dict(model)), str(folder / "model.safetensors"), {"format": "pt"})
    config = model.config
    if any(name.split(".")[-1] == "lm_head" for name, _ in lora_layers(model)):
        config = copy.deepcopy(config)  # an adapted output layer is no longer the (tied) input embedding
        config.tie_word_embeddings = False
    config.save_pretrained(str(folder))
    generation = getattr(model, "generation_config", None)
    if generation is not None and getattr(model, "can_generate", lambda: False)():
        generation.save_pretrained(str(folder))


def _base_path(model: nn.Module) -> str:
    """The base model's folder (absolute) or hub name, as ``from_pretrained`` recorded it."""
    name = str(getattr(model.config, "_name_or_path", "") or getattr(model.config, "name_or_path", ""))
    path = Path(name).expanduser()
    return str(path.resolve()) if name and path.exists() else name


def save_adapter(model: nn.Module, folder: str | Path) -> None:
    """A peft adapter folder: ``adapter_config.json`` (with the base model's absolute path) and
    ``adapter_model.safetensors`` under peft's names (``PeftModel.from_pretrained`` and transformers with peft
    load it on that base)."""
    peft = _peft()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    target = hf_model_of(model)
    config = peft_config(lora_settings(model), causal_lm=hasattr(target, "generate"))
    config.base_model_name_or_path = _base_path(target)
    config.save_pretrained(str(folder))
    state = peft.get_peft_model_state_dict(target)
    tensors = {PEFT_PREFIX + k: v for k, v in state.items()}
    save_file(without_shared(tensors), str(folder / ADAPTER_WEIGHTS), {"format": "pt"})


def export_adapted(model: nn.Module, tokenizer: Any, path: str | Path) -> Path:
    """Export a LoRA model to ``path`` atomically: the adapter (`save_adapter`), or with
    ``run.lora.merge_on_export`` the merged weights (`save_merged`), and then the adapter in ``path``'s
    sibling ``adapter``; the tokenizer goes with each."""
    path = Path(path)
    settings = lora_settings(model)

    def writer(save: Any) -> Any:
        def write(tmp: Path) -> None:
            save(model, tmp)
            tokenizer.save_pretrained(str(tmp))

        return write

    if settings is not None and settings.merge_on_export:
        write_dir_atomically(path, writer(save_merged))
        write_dir_atomically(path.parent / "adapter", writer(save_adapter))
    else:
        write_dir_atomically(path, writer(save_adapter))
    return path


def is_adapter_folder(path: str | Path) -> bool:
    """A peft adapter folder (``adapter_config.json``, no ``config.json``)."""
    path = Path(path).expanduser()
    return (path / ADAPTER_CONFIG).is_file() and not (path / "config.json").is_file()


@torch.no_grad()
def merge_into_base(model: nn.Module) -> nn.Module:
    """Fold every adapter of ``model`` into its base weights and put the plain modules back, in place:
    the model without peft's layers (peft's ``merge_and_unload``, for every kind of layer `_lora_deltas`
    names)."""
    deltas = _lora_deltas(model)  # all of them before any wrapper is taken off
    for name, base, parameter, delta in reversed(deltas):  # inner wrappers first
        weight = getattr(base, parameter)
        # a new tensor, not an in-place add: an adapted lm_head must not drag its tied embedding along
        setattr(
            base, parameter, nn.Parameter((weight.float() + delta).to(weight.dtype), weight.requires_grad)
        )
        if name.split(".")[-1] == "lm_head" and hasattr(model, "config"):
            model.config.tie_word_embeddings = False
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, base)
    for attr in ("peft_config", SETTINGS):
        if hasattr(model, attr):
            delattr(model, attr)
    return model


def load_adapter_folder(path: str | Path, what: str, load_base: Any) -> nn.Module:
    """The model of adapter folder ``path``: its base model (``load_base(name_or_path, what)``) with the
    adapter merged in. A base that cannot be found, or weights that do not fit it, are `ModelError`s."""
    peft = _peft(what)
    path = Path(path).expanduser()
    try:
        config = peft.LoraConfig.from_pretrained(str(path))
    except (ValueError, TypeError, json.JSONDecodeError) as err:
        raise ModelError(f"{what} '{path}': {ADAPTER_CONFIG} is not a LoRA adapter's: {err}") from None
    base = config.base_model_name_or_path
    if not base:
        raise ModelError(f"{what} '{path}': {ADAPTER_CONFIG} names no base_model_name_or_path")
    model = load_base(base, f"{what} '{path}' base_model_name_or_path")
    config.inference_mode = False
    peft.inject_adapter_in_model(config, model)
    tensors = {k.removeprefix(PEFT_PREFIX): v for k, v in load_file(str(path / ADAPTER_WEIGHTS)).items()}
    try:
        result = peft.set_peft_model_state_dict(model, tensors)
    except RuntimeError as err:  # torch's size mismatch: a multi-line message, put on one line
        raise ModelError(
            f"{what} '{path}': {ADAPTER_WEIGHTS} does not fit its base model {base} "
            f"({' '.join(str(err).split())[:300]})"
        ) from None
    if result.unexpected_keys:
        raise ModelError(
            f"{what} '{path}': {ADAPTER_WEIGHTS} does not fit its base model {base} (e.g. "
            f"{result.unexpected_keys[0]})"
        )
    log.info("%s: merged the LoRA adapter %s into its base model %s", what, path, base)
    return merge_into_base(model)
