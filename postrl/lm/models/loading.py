"""Loading any Hugging Face causal LM: its source checked first, transformers' errors turned into ones a user
can act on, and dropout off.

Every loader checks its source first (`model_source`: a folder with a config.json, or a hub name) and turns
what transformers raises into a `ModelError` (a `UserError`) that names the config key, the path and what
would work: offline hub names, custom code without ``trust_remote_code``, missing weights, unknown dtypes.
"""

from __future__ import annotations

import functools
import logging
import pickle
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import HFValidationError
from safetensors import SafetensorError
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from postrl.lm.models.lora import is_adapter_folder, load_adapter_folder
from postrl.runtime.errors import ModelError as ModelError

log = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype | None, key: str = "dtype") -> torch.dtype | str:
    """A torch dtype from "float32"/"bf16"/... or a dtype; "auto"/None keep the checkpoint's dtype.
    An unknown name raises `ModelError` naming ``key`` and the valid names."""
    if dtype is None or dtype == "auto":
        return "auto"
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ModelError(
            f"{key}: unknown dtype {dtype!r}; valid: float32, bfloat16, float16 (or fp32, bf16, fp16), "
            "or auto (the checkpoint's own dtype)"
        )
    return DTYPES[dtype]


def looks_like_path(path_or_name: str | Path) -> bool:
    """A filesystem path rather than a hub name ("org/model" has exactly one slash and no leading ./ or /)."""
    text = str(path_or_name)
    return isinstance(path_or_name, Path) or text.startswith(("/", ".", "~")) or text.count("/") > 1


def folder_or_hub_name(
    path_or_name: str | Path, what: str, kind: str, problem: Callable[[Path], str | None]
) -> tuple[str, bool]:
    """(what to pass to ``from_pretrained``, whether it is a local folder), checked before any loading: a
    folder must pass ``problem`` (None: fine, else why not); a path that does not exist is an error unless it
    can be a hub name ("org/model"). Errors are `ModelError`s naming ``what`` (the config key) and the path."""
    path = Path(path_or_name).expanduser()
    if path.is_dir():
        if (why := problem(path)) is not None:
            raise ModelError(f"{what} '{path_or_name}': {why}")
        return str(path), True
    if path.exists():
        raise ModelError(f"{what} '{path_or_name}': a file, not a {kind} folder")
    if looks_like_path(path_or_name):
        raise ModelError(f"{what} '{path_or_name}': no such folder")
    return str(path_or_name), False


def model_source(path_or_name: str | Path, what: str = "model") -> tuple[str, bool]:
    """`folder_or_hub_name` for a model: a folder must hold a ``config.json``."""

    def problem(path: Path) -> str | None:
        if (path / "config.json").is_file():
            return None
        return (
            "the folder has no config.json, so it is not a Hugging Face model (expected a folder written by "
            "save_pretrained)"
        )

    return folder_or_hub_name(path_or_name, what, "model", problem)


@functools.cache
def hub_reachable() -> bool:
    """Whether the Hugging Face hub's host resolves (asked once per process). When it does not, hub names are
    loaded from the local cache only: the hub client would otherwise retry for ~30 s, printing each retry,
    before saying the same thing."""
    if hf_constants.is_offline_mode():
        return False
    host = urlparse(hf_constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        log.info("%s does not resolve: hub names are loaded from the local cache only", host)
        return False
    return True


def _first_line(err: BaseException) -> str:
    return next((line for line in str(err).splitlines() if line.strip()), type(err).__name__).strip()


def _caused_by(err: BaseException | None, kind: type[BaseException]) -> bool:
    while err is not None and not isinstance(err, kind):
        err = err.__cause__ or err.__context__
    return err is not None


def load_error(what: str, path_or_name: str | Path, local: bool, err: Exception) -> ModelError:
    """The `ModelError` for a ``from_pretrained`` failure: transformers' OSError / ValueError / hub errors
    turned into what the user can do about them."""
    text, name = str(err), f"{what} '{path_or_name}'"
    if "trust_remote_code" in text:
        return ModelError(
            f"{name} ships its own Python code; pass trust_remote_code=true only if you trust that "
            "repository (its code runs on this machine)"
        )
    if "does not recognize this architecture" in text or "Unrecognized model" in text:
        return ModelError(f"{name}: this transformers version cannot build it: {_first_line(err)}")
    if not local and _caused_by(err, HFValidationError):  # transformers re-raises it as an OSError
        return ModelError(f"{name}: no such folder, and not a valid hub name: {_first_line(err)}")
    if not local and isinstance(err, OSError):
        offline = (
            " (HF_HUB_OFFLINE is set)" if hf_constants.is_offline_mode() else " (this machine is offline?)"
        )
        return ModelError(
            f"{name}: no such folder; a hub name needs network access{offline}: {_first_line(err)}"
        )
    return ModelError(f"{name}: cannot load it: {_first_line(err)}")


def pickled_weights_error(what: str, path_or_name: str | Path) -> ModelError:
    """The `ModelError` for a folder whose ``pytorch_model*.bin`` holds pickled Python objects besides tensors:
    torch refuses them (``weights_only=True``: unpickling can run any code), so the fix is a safetensors copy,
    made once, by someone who trusts where the file came from."""
    folder = Path(path_or_name).expanduser()
    bins = sorted(p.name for p in folder.glob("pytorch_model*.bin")) if folder.is_dir() else []
    name = bins[0] if len(bins) == 1 else "pytorch_model*.bin"
    file = folder / name
    convert = (
        f"import torch; from safetensors.torch import save_file; o = torch.load('{file}', weights_only=False); "
        "sd = o.state_dict() if hasattr(o, 'state_dict') else o; "
        "save_file({k: v.clone().contiguous() for k, v in sd.items() if torch.is_tensor(v)}, "
        f"'{folder / 'model.safetensors'}', {{'format': 'pt'}})"
    )
    return ModelError(
        f"{what} '{path_or_name}': {name} is a pickled checkpoint holding Python objects, which torch refuses "
        "to load (weights_only: unpickling could run code); only if you trust its source, convert it to "
        f'safetensors once: python -c "{convert}", then remove {name}'
    )


def load_pretrained(
    auto_cls: Any, path_or_name: str | Path, what: str, dtype: Any, trust_remote_code: bool
) -> PreTrainedModel:
    """``auto_cls.from_pretrained`` (e.g. ``AutoModelForCausalLM``) on a checked source, local files only when
    the hub is unreachable; a failure is the `ModelError` of `load_error`, naming ``what``."""
    dtype = resolve_dtype(dtype)
    source, local = model_source(path_or_name, what)
    # use_kernels off: transformers 5 turns hub kernels on whenever the `kernels` package is installed, which
    # may fetch code from the hub at run time and re-kernelizes the model at every train()/eval() switch
    # (0.8 ms on the built-in tiny models, twice per GRPO step: benchmarks/grpo.py)
    kwargs = {"dtype": dtype, "trust_remote_code": trust_remote_code, "use_kernels": False}
    kwargs["local_files_only"] = local or not hub_reachable()
    try:
        return auto_cls.from_pretrained(source, **kwargs)
    except pickle.UnpicklingError as err:  # torch.load(weights_only=True) refused a pickled checkpoint
        raise pickled_weights_error(what, path_or_name) from err
    except (OSError, ValueError) as err:  # transformers' and the hub's errors for a bad path, name or file
        raise load_error(what, path_or_name, local, err) from err
    # a damaged folder: weights cut short, weights of other shapes than config.json's, a config that is not
    # a mapping (safetensors', torch's and transformers' own errors)
    except (SafetensorError, RuntimeError, TypeError, AttributeError, KeyError) as err:
        raise ModelError(
            f"{what} '{path_or_name}': cannot load it (a damaged model folder?): {_first_line(err)}"
        ) from err


def load_causal_lm(
    path_or_name: str | Path,
    dtype: str | torch.dtype | None = "float32",
    device: str | torch.device = "cpu",
    trust_remote_code: bool = False,
    disable_dropout: bool = True,
    *,
    what: str = "model",
) -> PreTrainedModel:
    """Any Hugging Face causal LM, from a local directory or (online) a hub name.

    A LoRA adapter folder (``adapter_config.json``, e.g. the ``RUN_DIR/model`` of a run with ``run.lora``)
    loads as its base model with the adapter merged in (`postrl.lm.models.lora.load_adapter_folder`).
    ``trust_remote_code`` runs the repository's own Python and is therefore off unless the user asks.
    ``disable_dropout`` (default) zeroes every dropout, as RL needs log-probs that do not change between
    sampling and training (Ziegler et al., 2019). ``what`` is the config key, named in every error.
    """

    def load_base(source: str | Path, key: str) -> PreTrainedModel:
        return load_pretrained(AutoModelForCausalLM, source, key, dtype, trust_remote_code)

    if is_adapter_folder(path_or_name):  # a LoRA run's export: its base model, the adapter merged in
        model = load_adapter_folder(path_or_name, what, load_base).to(device)
    else:
        model = load_base(path_or_name, what).to(device)
    if disable_dropout:
        set_dropout_off(model)
    return model


def _is_dropout_attr(name: str, value: Any) -> bool:
    return isinstance(value, float) and ("dropout" in name or "pdrop" in name)


def set_dropout_off(model: nn.Module) -> nn.Module:
    """Zero every dropout of ``model`` in place: ``nn.Dropout`` modules, float ``*dropout*`` attributes
    (e.g. Llama's functional attention dropout) and the config's fields (so a saved model keeps it off)."""
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if _is_dropout_attr(name, value):
                setattr(module, name, 0.0)
    config = getattr(model, "config", None)
    if config is not None:
        for name, value in list(config.to_dict().items()):
            if _is_dropout_attr(name, value):
                setattr(config, name, 0.0)
    return model


def assert_dropout_off(model: nn.Module) -> None:
    """Raise ``ValueError`` naming every module of ``model`` with a non-zero dropout."""
    bad = []
    for path, module in model.named_modules():
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            bad.append(f"{path or '<root>'}.p={module.p}")
        bad += [
            f"{path or '<root>'}.{n}={v}" for n, v in vars(module).items() if _is_dropout_attr(n, v) and v > 0
        ]
    if bad:
        raise ValueError(f"dropout is on in: {', '.join(bad)}; call set_dropout_off(model)")
