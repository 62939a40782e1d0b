"""A scalar-head model in the ecosystem's format: a ``*ForSequenceClassification`` folder with one label.

This is what TRL's ``RewardTrainer`` writes and what TRL (its PPO ``reward_model`` and ``value_model``), vLLM's
reward/classify runners and most tools load with ``AutoModelForSequenceClassification``: the trunk under the
class's ``base_model_prefix`` (``model.`` for Llama) and ``score.weight`` ``[1, d]``, a Linear without bias,
applied to the final hidden state of the last token that is not ``config.pad_token_id``.

postrl's scalar head is ``nn.Linear(d, 1)`` with a bias (`postrl.lm.models.heads`). The bias of a reward
model never moves (Bradley–Terry losses see only differences of scores, so its gradient is 0 and it stays at
its initial 0): the folder reproduces its scores exactly. A head whose bias is not 0 (a PPO critic's) cannot
be written into ``score``; its exact head is then kept beside it as ``value_head.safetensors``, which postrl
reads first, and ``AutoModelForSequenceClassification`` gives its values less that constant (logged).
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import AutoModelForSequenceClassification, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING

from postrl.lm.models.loading import ModelError, load_pretrained
from postrl.lm.models.lora import has_lora, merged_state_dict, without_shared

log = logging.getLogger(__name__)


def sequence_classifier_class(config: Any) -> type[PreTrainedModel] | None:
    """The ``*ForSequenceClassification`` class of ``config``'s architecture (None if transformers has none)."""
    try:
        return MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING[type(config)]
    except KeyError:
        return None


def is_sequence_classifier(path: str | Path) -> bool:
    """Whether folder ``path`` holds a ``*ForSequenceClassification`` model (its config.json says so)."""
    file = Path(path).expanduser() / "config.json"
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError):
        return False
    names = config.get("architectures") if isinstance(config, dict) else None
    return isinstance(names, list) and any(str(n).endswith("ForSequenceClassification") for n in names)


def save_sequence_classifier(
    backbone: PreTrainedModel, head: nn.Linear, path: str | Path, pad_token_id: int | None
) -> bool:
    """Write ``backbone`` (LoRA adapters merged in) and ``head`` into ``path`` as its architecture's
    ``*ForSequenceClassification`` with ``num_labels=1`` and ``pad_token_id`` (what that class needs to find
    each row's last token). False, writing nothing, when transformers has no such class for the backbone."""
    cls = sequence_classifier_class(backbone.config)
    if cls is None:
        return False
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    weights = merged_state_dict(backbone) if has_lora(backbone) else backbone.state_dict()
    tensors = {f"{cls.base_model_prefix}.{k}": v for k, v in weights.items()}
    tensors["score.weight"] = (
        head.weight.detach().float()
    )  # as postrl keeps it; a bf16 trunk loads it as bf16
    save_file(without_shared(tensors), str(path / "model.safetensors"), {"format": "pt"})
    config = copy.deepcopy(backbone.config)
    config.architectures = [cls.__name__]
    config.num_labels = 1
    if pad_token_id is not None:
        config.get_text_config().pad_token_id = pad_token_id
    config.save_pretrained(str(path))
    return True


def load_sequence_classifier(
    path: str | Path, what: str, dtype: Any, trust_remote_code: bool
) -> tuple[PreTrainedModel, nn.Linear]:
    """(trunk, float32 head) of a one-label ``*ForSequenceClassification`` folder (e.g. TRL's reward model)."""
    model = load_pretrained(AutoModelForSequenceClassification, path, what, dtype, trust_remote_code)
    score = getattr(model, "score", None)
    if not isinstance(score, nn.Linear) or score.out_features != 1:
        labels = getattr(score, "out_features", None)
        raise ModelError(
            f"{what} '{path}': a sequence classifier with {labels or 'no'} score outputs; a reward model or "
            "critic has num_labels=1 (one scalar per sequence)"
        )
    head = nn.Linear(score.in_features, 1)
    with torch.no_grad():
        head.weight.copy_(score.weight.float())
        head.bias.copy_(score.bias.float() if score.bias is not None else torch.zeros(1))
    return model.base_model, head
