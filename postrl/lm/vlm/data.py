"""Rows with pictures, in TRL's vision formats, → token ids and pixel values.

A row holds ``images`` (a list; TRL's ``image`` column, one picture, works too) as PIL images, file paths
(relative to the data file's folder) or ``{"path": ...}`` / ``{"bytes": ...}`` dicts, and a ``prompt``:
conversational (a user turn whose content lists ``{"type": "image"}`` and ``{"type": "text", "text": ...}``,
rendered with the processor's chat template and the generation prompt) or a string (``<image>`` placeholders
prepended when it has none). SFT rows add a ``completion`` (a string or an assistant turn); ``messages`` rows
(the last turn the assistant's) are split into the two. Other columns (``answer``) go to the reward functions.

The processor expands each ``<image>`` into the model's number of placeholder tokens, which therefore sit in
the prompt only: a completion that holds one is refused, and sampling never draws one (`postrl.lm.vlm.rollout`).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from postrl.lm.data import DataError, read_records
from postrl.lm.rollout import left_pad
from postrl.lm.tasks import get_task
from postrl.lm.vlm.inputs import collate_inputs, picture_inputs, same_count_per_row

log = logging.getLogger(__name__)


@dataclass
class VLMExample:
    """One row, encoded: prompt ids (image placeholders expanded), its pictures and (SFT) completion ids."""

    prompt_ids: list[int]
    inputs: dict[str, Tensor]
    """every tensor the processor gave for this row but ids, mask and labels (`postrl.lm.vlm.inputs`):
    ``pixel_values`` [n_images, C, H, W] or the model's layout, ``image_sizes``, ``token_type_ids`` [1, P] ..."""
    completion_ids: list[int]
    """the completion's tokens and EOS (empty for prompt-only rows)"""
    row: dict[str, Any]
    """the row's other columns (answer, kind, ...) and its ``where`` (file:line)"""

    @property
    def pixel_values(self) -> Tensor:
        return self.inputs["pixel_values"]


def load_vlm_rows(source: str, split: str = "train", task_kwargs: dict[str, Any] | None = None) -> list[dict]:
    """Rows of a JSONL/JSON/Parquet file (``where`` = file:line, ``base`` = its folder) or ``task:NAME``."""
    if source.startswith("task:"):
        task = get_task(source[len("task:") :], **(task_kwargs or {}))
        return [{**r, "where": f"{source}[{split}]: row {i}"} for i, r in enumerate(task.sft_rows(split))]
    base = str(Path(source).expanduser().parent)
    return [{**record, "where": where, "base": base} for where, record in read_records(source, split)]


def load_image(value: Any, base: str | None, where: str) -> Any:
    """A PIL RGB image from a PIL image, a path (relative to ``base``) or a ``{"path"}``/``{"bytes"}`` dict."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, Image.Image):
        return value.convert("RGB")
    if isinstance(value, dict) and value.get("bytes") is not None:
        source: Any = io.BytesIO(value["bytes"])
    elif isinstance(value, dict) and value.get("path"):
        source = value["path"]
    elif isinstance(value, str):
        source = value
    else:
        raise DataError(f"{where}: field 'images': expected a path or a picture, got {type(value).__name__}")
    if isinstance(source, str):
        path = Path(source).expanduser()
        source = path if path.is_absolute() or base is None else Path(base) / path
        if not source.is_file():
            raise DataError(f"{where}: field 'images': no such file {source}")
    try:
        with Image.open(source) as image:
            return image.convert("RGB")
    except Image.DecompressionBombError as err:  # not an OSError: a header claiming a huge size
        raise DataError(
            f"{where}: field 'images': the picture is larger than Pillow's safety limit (PIL.Image."
            f"MAX_IMAGE_PIXELS; a damaged file or a decompression bomb): {err}"
        ) from None
    except (UnidentifiedImageError, OSError) as err:
        named = (
            f" {source}" if isinstance(source, Path) else ""
        )  # Pillow's "image file is truncated" names none
        raise DataError(f"{where}: field 'images': not a readable picture{named}: {err}") from None


def _text_of(value: Any) -> str:
    """Text of a completion: a string, or the last message's content (a string or a list of text parts)."""
    if isinstance(value, str):
        return value
    content = value[-1]["content"] if isinstance(value, list) and value else value
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def _image_slots(prompt: Any) -> int:
    if isinstance(prompt, str):
        return -1
    return sum(
        1
        for message in prompt
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, dict) and part.get("type") == "image"
    )


def split_row(row: dict[str, Any], kind: str) -> tuple[Any, Any, list[Any]]:
    """(prompt, completion or None, images) of a row, checked; errors name the row's ``where``."""
    where = row.get("where", "row")
    images = row.get("images", [row["image"]] if row.get("image") is not None else None)
    if not images:
        raise DataError(f"{where}: no 'images' (or 'image') column: a vision-language model needs pictures")
    images = images if isinstance(images, list) else [images]
    if "prompt" not in row and kind == "sft" and isinstance(row.get("messages"), list) and row["messages"]:
        prompt, completion = row["messages"][:-1], row["messages"][-1:]
    elif "prompt" in row:
        prompt, completion = row["prompt"], row.get("completion")
    else:
        raise DataError(f"{where}: missing field 'prompt'" + (" (or 'messages')" if kind == "sft" else ""))
    if kind == "sft" and completion is None:
        raise DataError(f"{where}: missing field 'completion'")
    if not isinstance(prompt, (str, list)) or not prompt:
        raise DataError(f"{where}: field 'prompt': expected text or a list of messages")
    slots = _image_slots(prompt)
    if slots not in (-1, len(images)):
        raise DataError(f"{where}: the prompt has {slots} image slot(s) for {len(images)} picture(s)")
    return prompt, completion, images


def render_prompt(processor: Any, prompt: Any, n_images: int, where: str) -> str:
    """The prompt's text: conversational through the chat template (with the generation prompt), a string
    with ``<image>`` placeholders prepended when it has none; a string with as many as there are pictures is
    kept, any other count is a `DataError`."""
    token = processor.image_token
    if isinstance(prompt, str):
        placeholders = prompt.count(token)
        if placeholders not in (0, n_images):
            raise DataError(
                f"{where}: field 'prompt': {placeholders} {token} placeholders for {n_images} picture(s) in "
                f"'images'; give one per picture, or none (they are then put at the start)"
            )
        return prompt if placeholders else token * n_images + prompt
    try:
        return processor.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    except Exception as err:  # raised by the template itself (jinja2's types are optional)
        raise DataError(f"{where}: field 'prompt': the chat template refused it: {err}") from None


def encode_rows(
    processor: Any, rows: Sequence[dict[str, Any]], kind: str, max_length: int, overlong: str = "error"
) -> list[VLMExample]:
    """Rows → `VLMExample`s (pictures processed once); a row longer than ``max_length`` is a `DataError`, or
    with ``overlong="drop"`` left out (counted in one logged line). Truncation is refused: it would cut a
    picture's placeholders."""
    if overlong not in ("drop", "error"):
        raise DataError(
            f"train.overlong={overlong} is not taken for rows with pictures (truncating would cut a picture's"
            " placeholders): use drop or error"
        )
    tokenizer = processor.tokenizer
    image_id = tokenizer.convert_tokens_to_ids(processor.image_token)
    out, dropped = [], 0
    for row in rows:
        where = row.get("where", "row")
        prompt, completion, images = split_row(row, kind)
        pictures = [load_image(v, row.get("base"), where) for v in images]
        text = render_prompt(processor, prompt, len(pictures), where)
        encoded = processor(text=[text], images=pictures, return_tensors="pt")
        ids = encoded["input_ids"][0].tolist()
        completion_ids: list[int] = []
        if completion is not None:
            completion_ids = tokenizer(_text_of(completion), add_special_tokens=False)["input_ids"]
            completion_ids = [*completion_ids, tokenizer.eos_token_id]
            if image_id in completion_ids:
                raise DataError(f"{where}: field 'completion' holds the image token {processor.image_token}")
        if len(ids) + len(completion_ids) > max_length and overlong == "drop":
            dropped += 1
            continue
        if len(ids) + len(completion_ids) > max_length:
            raise DataError(
                f"{where}: {len(ids) + len(completion_ids)} tokens (image placeholders included) "
                f"exceed the length limit {max_length}"
            )
        keep = {
            k: v for k, v in row.items() if k not in ("images", "image", "prompt", "completion", "messages")
        }
        out.append(VLMExample(ids, picture_inputs(encoded), completion_ids, {**keep, "prompt": prompt}))
    if dropped:
        if not out:
            raise DataError(
                f"all {dropped} rows exceed the length limit {max_length} (image placeholders included)"
            )
        log.warning(
            "%d of %d rows longer than %d tokens dropped (overlong=drop)", dropped, len(rows), max_length
        )
    return out


def prompt_batch(
    examples: Sequence[VLMExample], pad_token_id: int
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Left-padded prompts (ids [B, P], mask [B, P]) and their processor inputs in row order (pictures
    [Σ n_images, ...], per-token ones left-padded [B, P, ...]: `postrl.lm.vlm.inputs.collate_inputs`)."""
    ids, mask = left_pad([e.prompt_ids for e in examples], pad_token_id)
    lengths = [len(e.prompt_ids) for e in examples]
    return ids, mask, collate_inputs([e.inputs for e in examples], lengths, ids.shape[1])


def sft_batch(examples: Sequence[VLMExample], pad_token_id: int) -> dict[str, Any]:
    """The rollout layout for supervised training: prompts left-padded [B, P], completions right-padded
    [B, T]; ``input_ids``/``attention_mask`` [B, P + T], ``prompt_len`` P, ``images`` (`prompt_batch`'s
    processor inputs: per-token ones span the prompt, the forward continues them over the completion),
    ``share``: whether rows with one prompt may run it once (`postrl.lm.vlm.rollout.vlm_response_logits`);
    not when the rows hold different numbers of pictures, whose batch tensors do not split by row."""
    ids, mask, images = prompt_batch(examples, pad_token_id)
    width = max(len(e.completion_ids) for e in examples)
    done = torch.tensor(
        [e.completion_ids + [pad_token_id] * (width - len(e.completion_ids)) for e in examples]
    )
    done_mask = torch.tensor(
        [[1] * len(e.completion_ids) + [0] * (width - len(e.completion_ids)) for e in examples]
    )
    return {
        "input_ids": torch.cat((ids, done), 1),
        "attention_mask": torch.cat((mask, done_mask), 1),
        "prompt_len": ids.shape[1],
        "images": images,
        "share": same_count_per_row([e.inputs for e in examples]),
    }
