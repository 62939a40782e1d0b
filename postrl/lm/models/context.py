"""A model's context length, read from its config: the check that refuses lengths beyond it, and the clip
of a length ceiling to it."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from postrl.lm.models.loading import ModelError
from postrl.runtime import notices

log = logging.getLogger(__name__)

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


def fit_context(
    model_or_config: Any, ceiling: int, key: str, reserved: int = 0, reserved_what: str = ""
) -> int:
    """The length ceiling ``key`` takes on this model: ``ceiling``, or the model's context less ``reserved``
    positions when that is smaller, with one logged line saying so.

    A length key is a ceiling that rows are held to (dropped, truncated or refused by the stage's overlong
    policy), as TRL's ``max_length`` is, so a ceiling above the model's context is clipped to it instead of
    refused: rows that fit the model run, and only a row longer than the model can take meets the policy.
    ``reserved`` is the positions that come after the ceiling's tokens (``reserved_what`` names its key, e.g.
    "sampling.max_new_tokens (64)"); `ModelError` when they leave no position. A model whose config gives
    no context length keeps ``ceiling`` (logged).
    """
    entry = _context_entry(model_or_config)
    if entry is None:
        keys = "/".join(CONTEXT_KEYS)
        notices.defer(
            log, logging.INFO, f"the model's config has no context length ({keys}); {key} not clipped"
        )
        return ceiling
    limit, field, where = entry
    room = limit - reserved
    context = f"the model's context ({limit} positions, {field} in {where})"
    if room < 1:
        raise ModelError(f"{reserved_what} leaves no position for {key} in {context}")
    if ceiling <= room:
        return ceiling
    less = f" less {reserved_what}" if reserved else ""
    notices.defer(log, logging.WARNING, f"{key} ({ceiling}) is clipped to {room}, {context}{less}")
    return room


def check_vocab(model: Any, tokenizer: Any, what: str = "tokenizer") -> None:
    """Raise `ModelError` when ``tokenizer`` has more tokens than ``model`` has embedding rows: an id past
    them indexes outside the table (an IndexError deep in a forward, after the run began). ``what`` names
    the key that chose the tokenizer."""
    embeddings = getattr(model, "get_input_embeddings", lambda: None)()
    rows = getattr(embeddings, "num_embeddings", None)
    if rows is not None and len(tokenizer) > rows:
        raise ModelError(
            f"{what}: the tokenizer has {len(tokenizer)} tokens but the model's embeddings have {rows} rows "
            "(ids past them index outside the table): use the model's own tokenizer"
        )
