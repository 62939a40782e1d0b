"""Data for the LM trainers, from rows to tokens: chat rendering, length limits, tokenising, packing, padding.

Conversational rows go through the tokenizer's chat template. Prompts longer than a limit are counted and
reported with an example row, then dropped, truncated (from the left: the end of a prompt is next to the
answer) or refused, as configured: never silently. Prompts are encoded once, the way generation encodes them
(`encode_prompts`), and every batch is in the rollout layout: prompts left-padded, responses right-padded.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from postrl.lm.data.sources import TEXT_FIELDS, DataError

log = logging.getLogger(__name__)

IGNORE_INDEX = -100
OVERLONG_POLICIES = ("drop", "truncate", "error")


# ---- chat rendering --------------------------------------------------------------------------------------
def _last_content(value: str | list[dict[str, str]]) -> str:
    return value if isinstance(value, str) else value[-1]["content"]


def _tokenizer_name(tokenizer: Any) -> str:
    """Where the tokenizer was loaded from (its folder or hub name), for errors."""
    return str(getattr(tokenizer, "name_or_path", "") or "(in memory)")


def _render_prompt(value: str | list[dict[str, str]], tokenizer: Any, where: str, field: str) -> str:
    if isinstance(value, str):
        return value
    if getattr(tokenizer, "chat_template", None) is None:
        raise DataError(
            f"{where}: field '{field}': conversational data needs a tokenizer with a chat template, and the "
            f"tokenizer at {_tokenizer_name(tokenizer)} has none; give one that has (the `tokenizer` key), "
            "or use text prompts"
        )
    try:
        return tokenizer.apply_chat_template(value, tokenize=False, add_generation_prompt=True)
    except Exception as err:  # raised by the tokenizer's own Jinja template (jinja2's types are optional)
        raise DataError(
            f"{where}: field '{field}': the chat template of the tokenizer at {_tokenizer_name(tokenizer)} "
            f"refused it: {err}"
        ) from None


def render_rows(rows: Sequence[dict[str, Any]], kind: str, tokenizer: Any) -> list[dict[str, Any]]:
    """Plain-text rows: conversational prompts through the chat template (with the generation prompt),
    conversational answers as their last message's content; ``messages`` and ``text`` rows become
    prompt/completion. Other columns are kept. A template's refusal names the row's ``where`` (a `Row`'s
    file:line; else ``row i``) and the tokenizer's folder."""
    out = []
    for i, row in enumerate(rows):
        where = getattr(row, "where", None) or f"row {i}"
        row, field = dict(row), "prompt"
        if kind == "sft" and "messages" in row and "prompt" not in row:
            field = "messages"
            messages = row.pop("messages")
            row["prompt"], row["completion"] = messages[:-1] or "", messages[-1]["content"]
        elif kind == "sft" and "text" in row and "prompt" not in row:
            row["prompt"], row["completion"] = "", row.pop("text")
        row["prompt"] = _render_prompt(row["prompt"], tokenizer, where, field) if row["prompt"] else ""
        for answer in TEXT_FIELDS[kind][1:]:
            row[answer] = _last_content(row[answer])
        out.append(row)
    return out


# ---- length limits ---------------------------------------------------------------------------------------
def _report_overlong(
    lengths: Sequence[int], max_length: int, overlong: str, what: str, action: str
) -> list[int]:
    """Indices of rows longer than ``max_length``; warns with a count and an example (raises for "error")."""
    if overlong not in OVERLONG_POLICIES:
        raise DataError(f"overlong must be one of {OVERLONG_POLICIES}; got {overlong!r}")
    long_rows = [i for i, n in enumerate(lengths) if n > max_length]
    if long_rows:
        first = long_rows[0]
        message = (
            f"{len(long_rows)} of {len(lengths)} {what} are longer than {max_length} tokens "
            f"(e.g. row {first}: {lengths[first]} tokens)"
        )
        if overlong == "error":
            raise DataError(message + "; raise the limit or set overlong to 'drop' or 'truncate'")
        log.warning("%s; %s", message, "dropped" if overlong == "drop" else action)
    return long_rows


def apply_length_limit(
    ids: Sequence[list[int]], max_length: int, overlong: str = "drop", what: str = "prompts"
) -> tuple[list[list[int]], list[int]]:
    """Enforce ``max_length`` tokens: returns (kept sequences, their row indices).

    "drop" removes overlong rows, "truncate" keeps their last ``max_length`` tokens, "error" raises
    `DataError`. Any overlong row is reported (count and an example row) in a warning.
    """
    long_rows = set(
        _report_overlong([len(s) for s in ids], max_length, overlong, what, "truncated from the left")
    )
    keep = [i for i in range(len(ids)) if overlong == "truncate" or i not in long_rows]
    return [list(ids[i][-max_length:]) for i in keep], keep


# ---- tokenisation ----------------------------------------------------------------------------------------
def encode(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, without special tokens (an empty text gives [])."""
    texts = list(texts)
    return tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []


def special_prefix(tokenizer: Any) -> list[int]:
    """The ids a tokenizer puts before any text on its own: ``[bos]`` for Llama-style tokenizers, ``[]``
    for postrl's, GPT-2's or Qwen's."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return full[:start]
    return []


def encode_prompts(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Prompt ids as the model expects them: the tokenizer's own prefix (e.g. Llama's ``<s>``) plus the
    text's tokens, but no second BOS when the text already starts with it (a rendered chat template).
    An empty prompt becomes ``[bos]`` (or the prefix) so a language-modelling row has a first target.

    The rollout engine and every trainer should encode prompts with this one function.
    """
    prefix = special_prefix(tokenizer)
    bos_text, bos_id = getattr(tokenizer, "bos_token", None), getattr(tokenizer, "bos_token_id", None)
    out = []
    for text, ids in zip(texts, encode(tokenizer, texts), strict=True):
        if not text:
            out.append(list(prefix) or ([bos_id] if bos_id is not None else []))
        elif bos_text and text.startswith(bos_text):
            out.append(list(ids))
        else:
            out.append(list(prefix) + list(ids))
    return out


def encode_completions(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Completion ids: the text's tokens (no special prefix) followed by EOS."""
    return [list(ids) + [tokenizer.eos_token_id] for ids in encode(tokenizer, texts)]


def tokenize_sft(
    rows: Sequence[dict[str, Any]], tokenizer: Any, max_length: int, overlong: str = "drop"
) -> list[dict[str, list[int]]]:
    """SFT examples ``{"input_ids", "attention_mask", "labels"}`` from plain prompt/completion rows.

    input_ids = `encode_prompts` + `encode_completions` (text + EOS); labels = −100 on the prompt, the token
    ids elsewhere. The prompt is encoded exactly as generation encodes it (a Llama-style tokenizer's BOS
    included), so training and sampling see the same inputs; an empty prompt (``text`` rows) becomes
    ``[bos]``, so the first token is a target.
    Overlong examples (prompt + completion + EOS > max_length) are dropped, truncated (the completion's end
    is cut; examples whose prompt alone fills the limit are dropped) or refused, and reported.
    """
    prompts = encode_prompts(tokenizer, [r["prompt"] for r in rows])
    completions = encode_completions(tokenizer, [r["completion"] for r in rows])
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions, strict=True)]
    action = "completions cut at the limit (examples whose prompt fills it are dropped)"
    long_rows = set(_report_overlong(lengths, max_length, overlong, "SFT examples", action))
    examples = []
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        if i in long_rows and (overlong == "drop" or len(p) >= max_length):
            continue
        ids = (p + c)[:max_length]
        labels = ([IGNORE_INDEX] * len(p) + c)[:max_length]
        examples.append({"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels})
    return examples


def pack_examples(examples: Sequence[dict[str, list[int]]], max_length: int) -> list[dict[str, list[int]]]:
    """Greedy packing of whole examples, in order, into blocks of at most ``max_length`` tokens.

    Examples are never split; within a block they attend to each other (plain packing, no document mask).
    """
    blocks: list[dict[str, list[int]]] = []
    for e in examples:
        if not blocks or len(blocks[-1]["input_ids"]) + len(e["input_ids"]) > max_length:
            blocks.append({"input_ids": [], "attention_mask": [], "labels": []})
        for key in ("input_ids", "attention_mask", "labels"):
            blocks[-1][key] += e[key]
    return blocks


def tokenize_prompts(
    rows: Sequence[dict[str, Any]], tokenizer: Any, max_prompt_length: int, overlong: str = "drop"
) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """(kept rows, their prompt ids) for RL; rows keep every column for the reward functions.

    With ``overlong="truncate"`` the ids (not the row's text) are the truncated prompt: generate from them.
    """
    prompt_ids = encode_prompts(tokenizer, [r["prompt"] for r in rows])
    ids, keep = apply_length_limit(prompt_ids, max_prompt_length, overlong)
    return [rows[i] for i in keep], ids


def tokenize_preferences(
    rows: Sequence[dict[str, Any]], tokenizer: Any, max_prompt_length: int, overlong: str = "drop"
) -> list[dict[str, Any]]:
    """``{"prompt_ids", "chosen_ids", "rejected_ids", "target"}`` per kept row; responses end with EOS."""
    kept, prompt_ids = tokenize_prompts(rows, tokenizer, max_prompt_length, overlong)
    chosen = encode_completions(tokenizer, [r["chosen"] for r in kept])
    rejected = encode_completions(tokenizer, [r["rejected"] for r in kept])
    return [
        {"prompt_ids": p, "chosen_ids": c, "rejected_ids": r, "target": float(row.get("target", 1.0))}
        for p, c, r, row in zip(prompt_ids, chosen, rejected, kept, strict=True)
    ]


# ---- padding ---------------------------------------------------------------------------------------------
def pad(seqs: Sequence[Sequence[int]], pad_id: int, side: str = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """Pad lists of ids to one width: (ids [B, T] long, mask [B, T] long), padding on ``side``."""
    width = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        cols = slice(width - len(s), width) if side == "left" else slice(0, len(s))
        ids[i, cols] = torch.tensor(list(s), dtype=torch.long)
        mask[i, cols] = 1
    return ids, mask


def join_prompt_response(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int
) -> dict[str, torch.Tensor]:
    """The rollout layout: prompts LEFT-padded to P, responses RIGHT-padded to T, side by side.

    Returns ``input_ids`` and ``attention_mask`` [B, P+T], ``response_mask`` [B, T] (1 on response tokens).
    """
    prompt_ids, prompt_mask = pad(prompts, pad_id, side="left")  # (B, P)
    response_ids, response_mask = pad(responses, pad_id, side="right")  # (B, T)
    return {
        "input_ids": torch.cat([prompt_ids, response_ids], dim=1),
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
        "response_mask": response_mask,
    }


def collate_preferences(examples: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """One batch of 2B rows for a reward model: chosen rows 0..B−1, rejected rows B..2B−1, in the rollout
    layout of `join_prompt_response` (score each row at its last real token), plus ``target`` [B]."""
    prompts = [e["prompt_ids"] for e in examples] * 2
    responses = [e["chosen_ids"] for e in examples] + [e["rejected_ids"] for e in examples]
    batch = join_prompt_response(prompts, responses, pad_id)
    batch["target"] = torch.tensor([float(e["target"]) for e in examples], dtype=torch.float32)
    return batch
