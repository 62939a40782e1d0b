"""The postrl tokenizer: byte-level BPE trained on the generated corpus, saved in Hugging Face format.

Digits are split one per token (so arithmetic is learned digit by digit) and text is byte-level, so any
string encodes without an unknown token. Special tokens, in this order of ids: ``<pad>`` 0, ``<eos>`` 1,
``<bos>`` 2, ``<|system|>`` 3, ``<|user|>`` 4, ``<|assistant|>`` 5. Encoding adds NO special token
(``tokenizer(text)`` is exactly the text's tokens, as GPT-2's): callers append ``<eos>`` to completions and
may prepend ``<bos>`` themselves. Padding is on the left by default (prompts for generation).

The chat template renders ``<|user|>question<|assistant|>answer<eos>``; with ``add_generation_prompt`` it
ends with ``<|assistant|>``, so a rendered prompt plus a completion plus ``<eos>`` is exactly the rendered
conversation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from postrl.lm.models import ModelError, folder_or_hub_name, hub_reachable, load_error
from postrl.lm.tasks import build_corpus

log = logging.getLogger(__name__)

PAD, EOS, BOS = "<pad>", "<eos>", "<bos>"
ROLE_TOKENS: tuple[str, ...] = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS: tuple[str, ...] = (PAD, EOS, BOS, *ROLE_TOKENS)
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{ raise_exception('unknown chat role: ' + message['role']) }}"
    "{%- endif -%}"
    "<|{{ message['role'] }}|>{{ message['content'] }}"
    "{%- if message['role'] == 'assistant' -%}{{ eos_token }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS) + 1
"""The smallest vocabulary of the postrl tokenizer: the byte alphabet, the special tokens and one merge."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")
"""Files of which a tokenizer folder has at least one."""


def check_vocab_size(vocab_size: int, key: str = "vocab_size") -> None:
    """Refuse a vocabulary too small for the 256 byte symbols, the special tokens and one merge."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB_SIZE:
        raise ModelError(
            f"{key}={vocab_size!r} is too small: the postrl tokenizer needs at least {MIN_VOCAB_SIZE} "
            f"(256 byte symbols + {len(SPECIAL_TOKENS)} special tokens + 1 merge)"
        )


def train_bpe(corpus: Iterable[str], vocab_size: int = 512, min_frequency: int = 2) -> Tokenizer:
    """A raw `tokenizers.Tokenizer`: byte-level BPE with single-digit pre-tokens, trained on ``corpus``.

    Deterministic given the corpus (the trainer breaks ties in a fixed order). ``vocab_size`` counts the
    256 byte symbols and the special tokens, so it must be at least `MIN_VOCAB_SIZE` (`check_vocab_size`).
    """
    check_vocab_size(vocab_size)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(corpus), trainer=trainer)
    return tokenizer


def wrap_tokenizer(tokenizer: Tokenizer, model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """The Hugging Face tokenizer around a raw one: special tokens, left padding, chat template."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        additional_special_tokens=list(ROLE_TOKENS),
        padding_side="left",
        truncation_side="left",
        model_max_length=model_max_length,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def build_tokenizer(
    corpus: Iterable[str], vocab_size: int = 512, min_frequency: int = 2, model_max_length: int = 512
) -> PreTrainedTokenizerFast:
    """Train the postrl tokenizer on ``corpus`` (see the module docstring for its conventions)."""
    return wrap_tokenizer(train_bpe(corpus, vocab_size, min_frequency), model_max_length)


def build_default_tokenizer(
    n_lines: int = 20000, seed: int = 0, vocab_size: int = 512
) -> PreTrainedTokenizerFast:
    """The tokenizer of the built-in world: trained on `postrl.lm.tasks.build_corpus(n_lines, seed)`."""
    return build_tokenizer(build_corpus(n_lines, seed), vocab_size=vocab_size)


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    """``tokenizer.save_pretrained(path)``; returns the directory."""
    path = Path(path)
    tokenizer.save_pretrained(str(path))
    return path


def _tokenizer_source(path_or_name: str | Path, what: str) -> tuple[str, bool]:
    """`postrl.lm.models.folder_or_hub_name` for a tokenizer: a folder must hold a tokenizer file."""

    def problem(path: Path) -> str | None:
        if any((path / name).is_file() for name in TOKENIZER_FILES):
            return None
        return (
            f"the folder has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
            "set the `tokenizer` key to the folder or hub name of the model's tokenizer"
        )

    return folder_or_hub_name(path_or_name, what, "tokenizer", problem)


def load_tokenizer(
    path_or_name: str | Path,
    padding_side: str = "left",
    trust_remote_code: bool = False,
    *,
    what: str = "tokenizer",
    **kwargs: Any,
) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained`` with postrl's expectations checked.

    Padding goes on ``padding_side`` (left for generation). A tokenizer without a pad token (GPT-2, many
    Llamas) gets ``pad = eos``, and this is logged. A tokenizer without an EOS token is an error: postrl
    appends EOS to every completion. Every failure is a `ModelError` naming ``what`` (the config key).
    """
    source, local = _tokenizer_source(path_or_name, what)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            source,
            trust_remote_code=trust_remote_code,
            local_files_only=local or not hub_reachable(),
            **kwargs,
        )
    except (OSError, ValueError) as err:  # transformers' and the hub's errors for a bad path, name or file
        if "sentencepiece" in str(err):
            raise ModelError(
                f"{what} '{path_or_name}': converting this tokenizer needs sentencepiece: pip install sentencepiece"
            ) from err
        raise load_error(what, path_or_name, local, err) from err
    except (TypeError, AttributeError, KeyError) as err:  # e.g. a config.json that is not a mapping
        raise ModelError(f"{what} '{path_or_name}': cannot load it (a damaged folder?): {err}") from err
    if tokenizer.eos_token_id is None:
        raise ModelError(
            f"{what} '{path_or_name}' has no eos_token; postrl needs one to end completions "
            "(set eos_token in its tokenizer_config.json)"
        )
    if tokenizer.pad_token_id is None:
        log.warning(
            "tokenizer at %s has no pad token; using eos %r as pad", path_or_name, tokenizer.eos_token
        )
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = padding_side
    return tokenizer
