"""Language models: loading any Hugging Face causal LM, the tiny built-in Llama, and scalar heads.

Layout conventions shared with the rollout engine and the trainers: a batch is ``input_ids [B, T]`` with
``attention_mask [B, T]`` (1 = real token); prompts are LEFT-padded and responses RIGHT-padded, so real
tokens are not aligned to either edge. Positions therefore always come from the mask
(`position_ids_from_mask`) and a sequence's last real token from `last_token_index`, never from a column.

Scalar heads (critic values, reward-model scores) are ``nn.Linear(d, 1)`` on the final hidden states,
initialised N(0, 1/(d+1)) with bias 0 as in Stiennon et al. (2020), kept in float32. A head is saved next to
its backbone as ``value_head.safetensors`` plus ``value_head.json``; the backbone is saved in plain Hugging
Face format (safetensors), so any HF tool can load it.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedModel

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
def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | str:
    """A torch dtype from "float32"/"bf16"/... or a dtype; "auto"/None keep the checkpoint's dtype."""
    if dtype is None or dtype == "auto":
        return "auto"
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)} or 'auto'")
    return DTYPES[dtype]


def _looks_local(path_or_name: str | Path) -> bool:
    """A filesystem path rather than a hub name ("org/model" has exactly one slash and no leading ./ or /)."""
    text = str(path_or_name)
    return isinstance(path_or_name, Path) or text.startswith(("/", ".", "~")) or text.count("/") > 1


def _hub_kwargs(path_or_name: str | Path, dtype: Any, trust_remote_code: bool) -> dict[str, Any]:
    local = Path(path_or_name).expanduser().is_dir()
    if not local and _looks_local(path_or_name):
        raise FileNotFoundError(f"no model directory at {path_or_name}")
    return {"dtype": resolve_dtype(dtype), "trust_remote_code": trust_remote_code, "local_files_only": local}


def _from_pretrained(auto_cls: Any, path_or_name: str | Path, **kwargs: Any) -> PreTrainedModel:
    try:
        return auto_cls.from_pretrained(str(Path(path_or_name).expanduser()), **kwargs)
    except OSError as err:
        where = "local directory" if kwargs["local_files_only"] else "hub name (needs network access)"
        raise OSError(f"could not load a model from {path_or_name!r} as a {where}: {err}") from err


def load_causal_lm(
    path_or_name: str | Path,
    dtype: str | torch.dtype | None = "float32",
    device: str | torch.device = "cpu",
    trust_remote_code: bool = False,
    disable_dropout: bool = True,
) -> PreTrainedModel:
    """Any Hugging Face causal LM, from a local directory or (online) a hub name.

    ``trust_remote_code`` runs the repository's own Python and is therefore off unless the user asks.
    ``disable_dropout`` (default) zeroes every dropout, as RL needs log-probs that do not change between
    sampling and training (Ziegler et al., 2019).
    """
    kwargs = _hub_kwargs(path_or_name, dtype, trust_remote_code)
    model = _from_pretrained(AutoModelForCausalLM, path_or_name, **kwargs).to(device)
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
        raise FileNotFoundError(
            f"{Path(path) / HEAD_WEIGHTS} not found; pass new_head=True to start a head on this model"
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
    ) -> ScalarHeadModel:
        """Load a saved `ScalarHeadModel`; with ``new_head=True`` a plain (causal) LM directory gets a fresh
        head (e.g. the SFT model as the start of a reward model)."""
        kwargs = _hub_kwargs(path, dtype, trust_remote_code)
        backbone = set_dropout_off(_from_pretrained(AutoModel, path, **kwargs).to(device))
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
    ) -> PolicyWithValueHead:
        """Load a saved policy + value head; ``new_head=True`` starts a head on a plain causal LM."""
        lm = load_causal_lm(path, dtype, device, trust_remote_code)
        return cls(lm, _head_for(path, hidden_size_of(lm), new_head, seed))
