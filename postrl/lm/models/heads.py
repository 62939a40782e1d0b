"""Scalar heads: critic values and reward-model scores on a causal LM's trunk.

A head is ``nn.Linear(d, 1)`` on the final hidden states, initialised N(0, 1/(d+1)) with bias 0 as in Stiennon
et al. (2020), kept in float32. A `ScalarHeadModel` (reward model, separate critic) is saved as its
architecture's ``*ForSequenceClassification`` with one label (`postrl.lm.models.seq_cls`), the format of TRL's
reward models that ``AutoModelForSequenceClassification`` loads; such folders (TRL's among them) load back as
a `ScalarHeadModel`, and so does postrl's older format: a backbone plus ``value_head.safetensors`` and
``value_head.json``, still written for a policy's value head (`PolicyWithValueHead`).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel, PreTrainedModel

from postrl.lm.models.layout import gather_last, position_ids_from_mask
from postrl.lm.models.loading import ModelError, load_causal_lm, load_pretrained, set_dropout_off
from postrl.lm.models.lora import has_lora, save_merged
from postrl.lm.models.seq_cls import (
    is_sequence_classifier,
    load_sequence_classifier,
    save_sequence_classifier,
)

log = logging.getLogger(__name__)

HEAD_WEIGHTS = "value_head.safetensors"
HEAD_CONFIG = "value_head.json"
HEAD_FORMAT = "postrl.scalar_head"


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


def _require_head(path: str | Path, what: str) -> None:
    """Before the trunk is loaded: a folder without a scalar head is not a reward model or critic (a name that
    is no folder is left to the loader, which says whether it is a hub name)."""
    if Path(path).is_dir() and not (Path(path) / HEAD_WEIGHTS).is_file() and not is_sequence_classifier(path):
        raise ModelError(
            f"{what}={path}: not a reward model: it has neither postrl's {HEAD_WEIGHTS} nor a one-label "
            "*ForSequenceClassification head (as TRL's RewardTrainer saves); give the model/ folder of a "
            "`postrl rm` run, or a TRL reward model"
        )


def _head_for(path: str | Path, hidden_size: int, new_head: bool, seed: int) -> nn.Linear:
    if (Path(path) / HEAD_WEIGHTS).is_file():
        return load_head(path, hidden_size)
    log.info("initialised a new scalar head on %s", path)
    return new_scalar_head(hidden_size, seed)


def _head_values(head: nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """hidden: [B, T, d] → values [B, T] in float32."""
    return head(hidden.to(head.weight.dtype)).squeeze(-1)


def _save_hf(model: PreTrainedModel, path: str | Path) -> None:
    """``save_pretrained``, or for a model with LoRA adapters its merged weights (`save_merged`): a trunk
    and its head load as one model, without peft."""
    if has_lora(model):
        save_merged(model, path)
    else:
        model.save_pretrained(str(path))


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

    def save_pretrained(
        self, path: str | Path, kind: str = "reward", pad_token_id: int | None = None
    ) -> None:
        """``path`` as a one-label ``*ForSequenceClassification`` folder (LoRA adapters merged in) with
        ``pad_token_id`` in its config (pass the tokenizer's: that class finds each row's last token by it);
        a head with a bias other than 0 (a critic's) also keeps its exact files (`save_head`). An architecture
        transformers has no such class for is saved as backbone plus head files."""
        bias = float(self.head.bias.detach().abs().max()) if self.head.bias is not None else 0.0
        if not save_sequence_classifier(self.backbone, self.head, path, pad_token_id):
            log.info("%s has no sequence-classification class: saved as backbone + %s", path, HEAD_WEIGHTS)
            _save_hf(self.backbone, path)
        elif bias != 0.0:
            log.info(
                "%s: the %s head's bias (%.4g) has no place in a sequence classifier's score, which gives "
                "values less it; postrl reads the exact head from %s", path, kind, float(self.head.bias.detach()), HEAD_WEIGHTS,
            )  # fmt: skip
        else:
            return  # the sequence classifier holds the whole head
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
        """Load a saved `ScalarHeadModel`: postrl's head files when the folder has them, else a one-label
        sequence classifier (postrl's export, TRL's reward model); with ``new_head=True`` a plain (causal) LM
        directory gets a fresh head (e.g. the SFT model as the start of a reward model). ``what`` is the
        config key for errors."""
        if not new_head:
            _require_head(path, what)
        if is_sequence_classifier(path):  # loaded as what it is: its `score` is no unexpected key of a trunk
            backbone, head = load_sequence_classifier(path, what, dtype, trust_remote_code)
            if (Path(path) / HEAD_WEIGHTS).is_file():
                head = load_head(path, hidden_size_of(backbone))  # the exact head (a bias the score lacks)
        else:
            backbone = load_pretrained(AutoModel, path, what, dtype, trust_remote_code)
            head = _head_for(path, hidden_size_of(backbone), new_head, seed)
        return cls(set_dropout_off(backbone.to(device)), head)


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
        """The LM in HF format (loadable by ``AutoModelForCausalLM``; LoRA adapters merged in) plus the
        value-head files."""
        _save_hf(self.lm, path)
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
        if not new_head and Path(path).is_dir() and not (Path(path) / HEAD_WEIGHTS).is_file():
            raise ModelError(f"{what}={path}: no {HEAD_WEIGHTS}: not a policy saved with its value head")
        lm = load_causal_lm(path, dtype, device, trust_remote_code, what=what)
        return cls(lm, _head_for(path, hidden_size_of(lm), new_head, seed))
