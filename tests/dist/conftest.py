"""The tiny tokenizer and Llama of the LM tests, shared with the multi-process tests."""

from tests.lm.conftest import (  # noqa: F401  (pytest finds fixtures by name)
    tiny_corpus,
    tiny_lm,
    tiny_lm_dir,
    tiny_tokenizer,
    tiny_tokenizer_dir,
)
