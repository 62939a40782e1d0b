"""Language models: loading any Hugging Face causal LM, the tiny built-in Llama, and scalar heads.

Layout conventions shared with the rollout engine and the trainers: a batch is ``input_ids [B, T]`` with
``attention_mask [B, T]`` (1 = real token); prompts are LEFT-padded and responses RIGHT-padded, so real
tokens are not aligned to either edge. Positions therefore always come from the mask
(`position_ids_from_mask`) and a sequence's last real token from `last_token_index`, never from a column.

Scalar heads (critic values, reward-model scores) are ``nn.Linear(d, 1)`` on the final hidden states,
initialised N(0, 1/(d+1)) with bias 0 as in Stiennon et al. (2020), kept in float32. A head is saved next to
its backbone as ``value_head.safetensors`` plus ``value_head.json``; the backbone is saved in plain Hugging
Face format (safetensors), so any HF tool can load it.

Every loader checks its source first (`model_source`: a folder with a config.json, or a hub name) and turns
what transformers raises into a `ModelError` (a `UserError`) that names the config key, the path and what
would work: offline hub names, custom code without ``trust_remote_code``, missing weights, unknown dtypes.
`check_context` refuses lengths beyond the model's positions.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import HFValidationError
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedModel

from postrl.runtime.errors import UserError

log = logging.getLogger(__name__)

HEAD_WEIGHTS = "value_head.safetensors"
HEAD_CONFIG = "value_head.json"
HEAD_FORMAT = "postrl.scalar_head"
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


# ---- positions and last tokens ---------------------------------------------------------------------------
def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens: ``cumsum(mask) − 1`` clamped at 0.

    attention_mask: [B, T] (0/1) → position_ids: [B, T] long. With left padding the first real token gets
    position 0; pads before it get 0, pads after the last real token repeat its position (never attended).
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real token of each row. attention_mask: [B, T] → [B] long (0 for an empty row)."""
    positions = torch.arange(attention_mask.shape[-1], device=attention_mask.device)
    return (attention_mask.long() * positions).amax(-1)


def gather_last(values: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``values[b, last_token_index(mask)[b]]``. values: [B, T], attention_mask: [B, T] → [B]."""
    index = last_token_index(attention_mask).unsqueeze(-1)  # (B, 1)
    return values.gather(-1, index).squeeze(-1)


# ---- loading and building --------------------------------------------------------------------------------
class ModelError(UserError, ValueError):
    """A model path, hub name or setting that cannot be loaded; the message names it and what would work."""


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


def model_source(path_or_name: str | Path, what: str = "model") -> tuple[str, bool]:
    """(what to pass to ``from_pretrained``, whether it is a local folder), checked before any loading.

    A folder must hold a ``config.json``; a path that does not exist is an error unless it can be a hub
    name ("org/model"). Errors are `ModelError`s that name ``what`` (the config key) and the path.
    """
    path = Path(path_or_name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(
                f"{what} '{path_or_name}': the folder has no config.json, so it is not a Hugging Face model "
                "(expected a folder written by save_pretrained)"
            )
        return str(path), True
    if path.exists():
        raise ModelError(f"{what} '{path_or_name}': a file, not a model folder")
    if looks_like_path(path_or_name):
        raise ModelError(f"{what} '{path_or_name}': no such folder")
    return str(path_or_name), False


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


def _from_pretrained(
    auto_cls: Any, path_or_name: str | Path, what: str, dtype: Any, trust_remote_code: bool
) -> PreTrainedModel:
    dtype = resolve_dtype(dtype)
    source, local = model_source(path_or_name, what)
    kwargs = {"dtype": dtype, "trust_remote_code": trust_remote_code}
    kwargs["local_files_only"] = local or not hub_reachable()
    try:
        return auto_cls.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as err:  # transformers' and the hub's errors for a bad path, name or file
        raise load_error(what, path_or_name, local, err) from err


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

    ``trust_remote_code`` runs the repository's own Python and is therefore off unless the user asks.
    ``disable_dropout`` (default) zeroes every dropout, as RL needs log-probs that do not change between
    sampling and training (Ziegler et al., 2019). ``what`` is the config key, named in every error.
    """
    model = _from_pretrained(AutoModelForCausalLM, path_or_name, what, dtype, trust_remote_code).to(device)
    if disable_dropout:
        set_dropout_off(model)
    return model


@dataclass(frozen=True)
class TinyLMConfig:
    """Shape of the built-in tiny Llama."""

    n_layers: int = 2
    """decoder layers"""
    hidden_size: int = 128
    """model width d"""
    n_heads: int = 4
    """attention heads (head size d / n_heads)"""
    intermediate_size: int = 512
    """MLP width"""
    max_position_embeddings: int = 512
    """longest sequence (RoPE positions)"""

    CHECKS = {  # valid ranges (postrl.runtime.config.validate)
        "n_layers": ">= 1",
        "hidden_size": ">= 1",
        "n_heads": ">= 1",
        "intermediate_size": ">= 1",
        "max_position_embeddings": ">= 2",
    }


def build_tiny_lm(
    vocab_size: int,
    config: TinyLMConfig | None = None,
    *,
    seed: int = 0,
    pad_token_id: int = 0,
    eos_token_id: int = 1,
    bos_token_id: int = 2,
) -> LlamaForCausalLM:
    """A freshly initialised tiny ``LlamaForCausalLM``: no dropout, tied embeddings, weights fixed by ``seed``.

    The default token ids are those of `postrl.lm.tokenizer`. The global torch RNG is left untouched.
    """
    c = config or TinyLMConfig()
    llama = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_heads,
        max_position_embeddings=c.max_position_embeddings,
        attention_dropout=0.0,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=bos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(llama)


# ---- context length --------------------------------------------------------------------------------------
CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "max_sequence_length",
    "seq_length",
    "n_ctx",
)
"""Config fields that hold a model's context length, in the order they are looked up."""


def _context_entry(model_or_config: Any) -> tuple[int, str, str] | None:
    """(positions, the config field, where the config lives) of a model, its config or its folder."""
    if isinstance(model_or_config, (str, Path)):
        file = Path(model_or_config).expanduser() / "config.json"
        config: Any = json.loads(file.read_text()) if file.is_file() else {}
        where = str(file)
    else:  # a (DDP-wrapped) model, or a config
        model = getattr(model_or_config, "module", model_or_config)
        config = getattr(model, "config", model)
        name = getattr(config, "_name_or_path", "")
        where = f"{name}/config.json" if name else "the model's config"
    if hasattr(config, "to_dict"):  # the fields as config.json names them (GPT-2: n_positions)
        config = config.to_dict()
    if not isinstance(config, dict):
        return None
    for c in (config, config.get("text_config") or {}):  # multimodal configs nest the LM's fields
        for key in CONTEXT_KEYS:
            value = c.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value, key, where
    return None


def context_length(model_or_config: Any) -> int | None:
    """The most positions the model takes (``max_position_embeddings``, ``n_positions``, ...), read from a
    model, its HF config or its folder's config.json; None when the config does not say."""
    entry = _context_entry(model_or_config)
    return None if entry is None else entry[0]


def check_context(model_or_config: Any, needed: int, what: str) -> None:
    """Raise `ModelError` when ``needed`` positions exceed the model's context.

    ``what`` says where ``needed`` comes from in the user's keys, e.g. "sampling.max_new_tokens (64) +
    longest prompt (480 tokens)"; the error adds the limit and the config field it was read from. A model
    whose config gives no context length is not checked (logged).
    """
    entry = _context_entry(model_or_config)
    if entry is None:
        log.info(
            "the model's config has no context length (%s); not checked: %s", "/".join(CONTEXT_KEYS), what
        )
        return
    limit, key, where = entry
    if needed > limit:
        raise ModelError(
            f"{what} = {needed} exceeds the model's context ({limit} positions, {key} in {where})"
        )


# ---- dropout ---------------------------------------------------------------------------------------------
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


# ---- scalar heads ----------------------------------------------------------------------------------------
def new_scalar_head(hidden_size: int, seed: int = 0) -> nn.Linear:
    """``nn.Linear(d, 1)`` in float32 with weight ~ N(0, 1/(d+1)) and bias 0 (Stiennon et al., 2020)."""
    head = nn.Linear(hidden_size, 1)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.weight.normal_(0.0, 1.0 / math.sqrt(hidden_size + 1), generator=generator)
        head.bias.zero_()
    return head


def hidden_size_of(model: PreTrainedModel) -> int:
    """The width d of a model's final hidden states."""
    config = model.config
    size = getattr(config, "hidden_size", None) or getattr(config.get_text_config(), "hidden_size", None)
    if size is None:
        raise ValueError(f"cannot find hidden_size in the config of {type(model).__name__}")
    return int(size)


def save_head(head: nn.Linear, path: str | Path, kind: str) -> None:
    """Write ``value_head.safetensors`` and ``value_head.json`` (format, kind, hidden size) into ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {
        "weight": head.weight.detach().cpu().contiguous(),
        "bias": head.bias.detach().cpu().contiguous(),
    }
    save_file(tensors, str(path / HEAD_WEIGHTS))
    meta = {"format": HEAD_FORMAT, "version": 1, "kind": kind, "hidden_size": head.in_features}
    (path / HEAD_CONFIG).write_text(json.dumps(meta, indent=2) + "\n")


def load_head(path: str | Path, hidden_size: int) -> nn.Linear:
    """The head saved by `save_head` in ``path``; checks its width against the backbone's."""
    path = Path(path)
    tensors = load_file(str(path / HEAD_WEIGHTS))
    if tuple(tensors["weight"].shape) != (1, hidden_size):
        raise ValueError(
            f"{path / HEAD_WEIGHTS}: head weight {tuple(tensors['weight'].shape)} != (1, {hidden_size})"
        )
    head = nn.Linear(hidden_size, 1)
    head.load_state_dict({k: v.float() for k, v in tensors.items()})
    return head


def _head_for(path: str | Path, hidden_size: int, new_head: bool, seed: int) -> nn.Linear:
    if (Path(path) / HEAD_WEIGHTS).is_file():
        return load_head(path, hidden_size)
    if not new_head:
        raise ModelError(
            f"{Path(path) / HEAD_WEIGHTS} not found: {path} is not a reward model or critic saved by postrl "
            "(pass new_head=True to start a head on this model)"
        )
    log.info("initialised a new scalar head on %s", path)
    return new_scalar_head(hidden_size, seed)


def _head_values(head: nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """hidden: [B, T, d] → values [B, T] in float32."""
    return head(hidden.to(head.weight.dtype)).squeeze(-1)


class ScalarHeadModel(nn.Module):
    """A transformer trunk plus a scalar head: the reward model, or a critic that is a separate model.

    ``backbone`` is a Hugging Face base model (e.g. ``LlamaModel``, the ``.base_model`` of a causal LM).
    """

    def __init__(self, backbone: PreTrainedModel, head: nn.Linear | None = None, seed: int = 0) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head if head is not None else new_scalar_head(hidden_size_of(backbone), seed)
        self.head.to(next(backbone.parameters()).device)

    @property
    def config(self) -> Any:
        """The backbone's Hugging Face config."""
        return self.backbone.config

    @classmethod
    def from_causal_lm(cls, lm: PreTrainedModel, seed: int = 0) -> ScalarHeadModel:
        """A new head on ``lm``'s trunk. The trunk is SHARED with ``lm``: pass ``copy.deepcopy(lm)`` for a
        separate critic or reward model."""
        return cls(lm.base_model, seed=seed)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """input_ids, attention_mask: [B, T] → values [B, T] (float32), one per position."""
        if position_ids is None:
            position_ids = position_ids_from_mask(attention_mask)
        out = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        )
        return _head_values(self.head, out.last_hidden_state)  # (B, T, d) → (B, T)

    def score(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The scalar at each row's last real token (left pad + right pad safe): [B, T] → [B]."""
        return gather_last(self.forward(input_ids, attention_mask, position_ids), attention_mask)

    def save_pretrained(self, path: str | Path, kind: str = "reward") -> None:
        """Backbone in HF format (safetensors) plus the head files into directory ``path``."""
        self.backbone.save_pretrained(str(path))
        save_head(self.head, path, kind)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        dtype: str | torch.dtype | None = "float32",
        device: str | torch.device = "cpu",
        trust_remote_code: bool = False,
        new_head: bool = False,
        seed: int = 0,
        *,
        what: str = "reward_model",
    ) -> ScalarHeadModel:
        """Load a saved `ScalarHeadModel`; with ``new_head=True`` a plain (causal) LM directory gets a fresh
        head (e.g. the SFT model as the start of a reward model). ``what`` is the config key for errors."""
        backbone = _from_pretrained(AutoModel, path, what, dtype, trust_remote_code)
        backbone = set_dropout_off(backbone.to(device))
        return cls(backbone, _head_for(path, hidden_size_of(backbone), new_head, seed))


class PolicyWithValueHead(nn.Module):
    """A causal LM with a value head on the same trunk (the shared actor–critic option of PPO)."""

    def __init__(self, lm: PreTrainedModel, head: nn.Linear | None = None, seed: int = 0) -> None:
        super().__init__()
        self.lm = lm
        self.head = head if head is not None else new_scalar_head(hidden_size_of(lm), seed)
        self.head.to(next(lm.parameters()).device)

    @property
    def config(self) -> Any:
        """The LM's Hugging Face config."""
        return self.lm.config

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        logits_to_keep: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids, attention_mask: [B, T] → (logits [B, T, V], values [B, T] float32).

        ``logits_to_keep`` > 0 computes logits only for the last that many positions ([B, k, V]).
        """
        if position_ids is None:
            position_ids = position_ids_from_mask(attention_mask)
        extra = {"logits_to_keep": logits_to_keep} if logits_to_keep else {}  # not every model accepts it
        out = self.lm(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            output_hidden_states=True,
            use_cache=False,
            **extra,
        )
        return out.logits, _head_values(self.head, out.hidden_states[-1])  # final (normed) hidden states

    def save_pretrained(self, path: str | Path) -> None:
        """The LM in HF format (loadable by ``AutoModelForCausalLM``) plus the value-head files."""
        self.lm.save_pretrained(str(path))
        save_head(self.head, path, "value")

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        dtype: str | torch.dtype | None = "float32",
        device: str | torch.device = "cpu",
        trust_remote_code: bool = False,
        new_head: bool = False,
        seed: int = 0,
        *,
        what: str = "model",
    ) -> PolicyWithValueHead:
        """Load a saved policy + value head; ``new_head=True`` starts a head on a plain causal LM."""
        lm = load_causal_lm(path, dtype, device, trust_remote_code, what=what)
        return cls(lm, _head_for(path, hidden_size_of(lm), new_head, seed))
