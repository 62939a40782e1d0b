"""Vision-language models: the built-in tiny LLaVA, and loading any Hugging Face image-text-to-text model.

The built-in model is a standard `transformers` ``LlavaForConditionalGeneration``: a small CLIP vision tower
(32 × 32 pictures in 8 × 8 patches: 16 patch features and the CLS one), LLaVA's two-layer projector and a tiny
Llama, with a postrl byte-level BPE tokenizer that has an ``<image>`` token and a chat template that renders
TRL's ``{"type": "image"}`` content. `save_vlm` writes model and processor with ``save_pretrained``, so that
``AutoModelForImageTextToText`` and ``AutoProcessor`` load the folder back like any hub checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForImageTextToText,
    AutoProcessor,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

from postrl.lm.models import ModelError, hub_reachable, load_error, model_source, set_dropout_off
from postrl.lm.models.loading import load_pretrained
from postrl.lm.models.tiny import check_heads
from postrl.lm.tokenizer import ROLE_TOKENS, build_tokenizer

IMAGE_TOKEN = "<image>"
VLM_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{ raise_exception('unknown chat role: ' + message['role']) }}"
    "{%- endif -%}"
    "<|{{ message['role'] }}|>"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}<image>"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}{{ eos_token }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)
"""The postrl chat template (`postrl.lm.tokenizer`) with TRL's list content: ``{"type": "image"}`` becomes
``<image>`` (the processor expands it to one placeholder per image feature), ``{"type": "text"}`` its text."""


@dataclass(frozen=True)
class TinyVLMConfig:
    """Shape of the built-in tiny vision-language model (LLaVA: CLIP vision tower, projector, Llama)."""

    image_size: int = 32
    """pictures are resized and centre-cropped to image_size × image_size"""
    patch_size: int = 8
    """the vision tower's patches: (image_size / patch_size)² features per picture, plus CLS"""
    vision_hidden_size: int = 64
    """vision tower width"""
    vision_layers: int = 2
    """vision tower layers"""
    hidden_size: int = 128
    """language model width d"""
    n_layers: int = 2
    """language model decoder layers"""
    n_heads: int = 4
    """attention heads of both towers"""
    intermediate_size: int = 512
    """language model MLP width"""
    max_position_embeddings: int = 256
    """longest sequence, image placeholders included"""
    vocab_size: int = 320
    """BPE vocabulary of the tokenizer (bytes, special tokens, merges)"""

    CHECKS = {"image_size": ">= 8", "patch_size": ">= 1", "vocab_size": ">= 265"}

    def __post_init__(self) -> None:
        check_heads(self.hidden_size, self.n_heads, "hidden_size")
        check_heads(self.vision_hidden_size, self.n_heads, "vision_hidden_size")


def build_vlm_tokenizer(corpus: list[str], vocab_size: int = 320) -> Any:
    """The postrl BPE tokenizer trained on ``corpus``, with the role tokens and ``<image>`` as special tokens
    and `VLM_CHAT_TEMPLATE`."""
    tokenizer = build_tokenizer(corpus, vocab_size=vocab_size)
    tokenizer.add_special_tokens({"additional_special_tokens": [*ROLE_TOKENS, IMAGE_TOKEN]})
    tokenizer.chat_template = VLM_CHAT_TEMPLATE
    return tokenizer


def build_processor(tokenizer: Any, config: TinyVLMConfig) -> LlavaProcessor:
    """LLaVA's processor: CLIP-style resizing and scaling to [−1, 1], ``<image>`` expanded to one placeholder
    per vision feature (CLS included: ``vision_feature_select_strategy`` "full")."""
    from transformers.models.clip.image_processing_pil_clip import (
        CLIPImageProcessorPil,
    )  # needs no torchvision

    size = config.image_size
    images = CLIPImageProcessorPil(
        size={"shortest_edge": size},
        crop_size={"height": size, "width": size},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    return LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        patch_size=config.patch_size,
        vision_feature_select_strategy="full",
        num_additional_image_tokens=1,
        chat_template=VLM_CHAT_TEMPLATE,
        image_token=IMAGE_TOKEN,
    )


def build_tiny_vlm(
    tokenizer: Any, config: TinyVLMConfig | None = None, *, seed: int = 0
) -> tuple[LlavaForConditionalGeneration, LlavaProcessor]:
    """A freshly initialised tiny ``LlavaForConditionalGeneration`` (no dropout, tied embeddings, weights
    fixed by ``seed``; the global RNG untouched) and its processor around ``tokenizer``."""
    c = config or TinyVLMConfig()
    if c.image_size % c.patch_size:
        raise ModelError(f"image_size {c.image_size} is not a multiple of patch_size {c.patch_size}")
    vision = CLIPVisionConfig(
        hidden_size=c.vision_hidden_size,
        intermediate_size=4 * c.vision_hidden_size,
        num_hidden_layers=c.vision_layers,
        num_attention_heads=c.n_heads,
        image_size=c.image_size,
        patch_size=c.patch_size,
        attention_dropout=0.0,
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_heads,
        max_position_embeddings=c.max_position_embeddings,
        attention_dropout=0.0,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    llava = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        image_seq_length=(c.image_size // c.patch_size) ** 2 + 1,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(llava)
    return model, build_processor(tokenizer, c)


def save_vlm(model: torch.nn.Module, processor: Any, path: str | Path) -> Path:
    """Model and processor with ``save_pretrained`` into one folder (safetensors weights)."""
    path = Path(path)
    model.save_pretrained(str(path))
    processor.save_pretrained(str(path))
    return path


def checkpoint_files(model: torch.nn.Module, processor: Any) -> Callable[[Path], None]:
    """What a trainer's checkpoint folder gets besides the weights so that ``from_pretrained`` loads it too:
    the (unwrapped) ``model``'s config and the processor."""

    def hf_files(folder: Path) -> None:
        model.config.save_pretrained(str(folder))
        processor.save_pretrained(str(folder))

    return hf_files


def is_vlm(path_or_name: str | Path) -> bool:
    """Whether ``path_or_name`` is a local model folder of an image-text-to-text architecture (its
    config.json's ``model_type`` is one ``AutoModelForImageTextToText`` maps); False for anything else."""
    config = Path(path_or_name).expanduser() / "config.json"
    if not config.is_file():
        return False
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("model_type") in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES


def load_processor(path_or_name: str | Path, trust_remote_code: bool = False, *, what: str = "model") -> Any:
    """``AutoProcessor.from_pretrained`` with postrl's checks: a tokenizer with EOS (pad = EOS when none)
    and left padding; a failure is a `ModelError` naming ``what``."""
    source, local = model_source(path_or_name, what)
    try:
        processor = AutoProcessor.from_pretrained(
            source, trust_remote_code=trust_remote_code, local_files_only=local or not hub_reachable()
        )
    except (OSError, ValueError) as err:
        raise load_error(what, path_or_name, local, err) from err
    tokenizer = getattr(processor, "tokenizer", None)
    if tokenizer is None or getattr(processor, "image_processor", None) is None:
        raise ModelError(f"{what} '{path_or_name}': its processor has no tokenizer and image processor")
    if tokenizer.eos_token_id is None:
        raise ModelError(f"{what} '{path_or_name}': its tokenizer has no eos_token")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return processor


def load_vlm(
    path_or_name: str | Path,
    dtype: Any = "float32",
    device: str | torch.device = "cpu",
    trust_remote_code: bool = False,
    *,
    what: str = "model",
) -> tuple[torch.nn.Module, Any]:
    """(model, processor) of any Hugging Face image-text-to-text model, dropout off (as `load_causal_lm`)."""
    model = load_pretrained(AutoModelForImageTextToText, path_or_name, what, dtype, trust_remote_code)
    set_dropout_off(model.to(device))
    return model, load_processor(path_or_name, trust_remote_code, what=what)


def image_token_id(model: torch.nn.Module, processor: Any) -> int:
    """The id of the image placeholder token (the model's config, else the processor's)."""
    config = model.config
    for key in ("image_token_id", "image_token_index"):
        if isinstance(getattr(config, key, None), int):
            return int(getattr(config, key))
    token = getattr(processor, "image_token", None)
    if token is None:
        raise ModelError(f"{type(model).__name__}: cannot tell its image placeholder token")
    return int(processor.tokenizer.convert_tokens_to_ids(token))
