"""Shared fixtures of the LM tests: a tiny tokenizer and a tiny Llama saved in Hugging Face format.

Session-scoped and small (vocab 400, d = 32, 2 layers) so every LM test can use a real model in milliseconds.
``tiny_lm`` is loaded fresh per test (through the same `load_causal_lm` path as a user's model), so a test
may train or modify it freely.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from postrl.lm.models import TinyLMConfig, build_tiny_lm, load_causal_lm
from postrl.lm.tasks import build_corpus
from postrl.lm.tokenizer import build_tokenizer, load_tokenizer

TINY_VOCAB = 400
TINY_LM_CONFIG = TinyLMConfig(
    n_layers=2, hidden_size=32, n_heads=4, intermediate_size=64, max_position_embeddings=128
)


@pytest.fixture(scope="session")
def tiny_corpus() -> list[str]:
    """2,000 lines of the generated pretraining corpus (seed 0)."""
    return build_corpus(n_lines=2000, seed=0)


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory, tiny_corpus: list[str]) -> Path:
    """A directory holding the postrl tokenizer (vocab 400) saved with ``save_pretrained``."""
    path = tmp_path_factory.mktemp("tiny_tokenizer")
    build_tokenizer(tiny_corpus, vocab_size=TINY_VOCAB).save_pretrained(str(path))
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir: Path):
    """The tiny tokenizer loaded back with ``AutoTokenizer`` (left padding). Do not mutate it."""
    return load_tokenizer(tiny_tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_lm_dir(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer, tiny_tokenizer_dir: Path) -> Path:
    """A directory with a freshly initialised tiny Llama (seed 0) and the tokenizer, as a user's model."""
    path = tmp_path_factory.mktemp("tiny_lm")
    model = build_tiny_lm(
        len(tiny_tokenizer),
        TINY_LM_CONFIG,
        seed=0,
        pad_token_id=tiny_tokenizer.pad_token_id,
        eos_token_id=tiny_tokenizer.eos_token_id,
        bos_token_id=tiny_tokenizer.bos_token_id,
    )
    model.save_pretrained(str(path))
    tiny_tokenizer.save_pretrained(str(path))
    return path


@pytest.fixture
def tiny_lm(tiny_lm_dir: Path):
    """The tiny Llama loaded with `load_causal_lm` (float32, CPU, dropout off); a fresh copy per test."""
    return load_causal_lm(tiny_lm_dir)
