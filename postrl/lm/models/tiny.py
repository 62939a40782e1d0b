"""The built-in tiny Llama: its shape and a freshly initialised ``LlamaForCausalLM``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from postrl.runtime.errors import ConfigError


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

    def __post_init__(self) -> None:
        check_heads(self.hidden_size, self.n_heads, "hidden_size")


def check_heads(width: int, heads: int, key: str) -> None:
    """A width splits evenly into attention heads (transformers refuses the model otherwise)."""
    if isinstance(width, int) and isinstance(heads, int) and heads >= 1 and width % heads:
        raise ConfigError(
            f"'{key}' ({width}) must be a multiple of 'n_heads' ({heads}): each head gets width/n_heads"
        )


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
