"""Pairs for language models: two sampled responses per prompt from a causal LM folder.

The prompts are any prompt source the trainers read (a JSONL file, ``task:reviews``; `postrl.lm.data`);
conversational prompts go through the tokenizer's chat template as the trainers render them, and their
responses are written as assistant turns, so the preferences file keeps the prompts' format. Pairs whose two
samples came out the same are left out (there is nothing to compare) and counted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from postrl.lm.data import load_rows, render_rows
from postrl.lm.evaluation import complete
from postrl.lm.models import check_vocab, load_causal_lm
from postrl.lm.tokenizer import load_tokenizer
from postrl.runtime.checkpoint import atomic_write_text
from postrl.runtime.errors import UserError


def sample_lm_pairs(
    model_dir: str,
    prompts: str,
    out_file: Path,
    n: int = 50,
    max_new_tokens: int = 48,
    temperature: float = 1.0,
    seed: int = 0,
) -> Path:
    """Write ``out_file``: up to ``n`` pairs ``{"prompt", "responses": [a, b]}`` sampled from ``model_dir``
    for the first ``n`` prompts of ``prompts`` (two independent samples at ``temperature``)."""
    if n < 1 or max_new_tokens < 1 or not temperature > 0:
        raise UserError("--n and --max-new-tokens must be ≥ 1 and --temperature > 0 to sample pairs")
    rows = load_rows(prompts, "prompts")[:n]
    tokenizer = load_tokenizer(model_dir, what="--model")
    texts = [r["prompt"] for r in render_rows(rows, "prompts", tokenizer)]
    model = load_causal_lm(model_dir, what="--model")
    check_vocab(model, tokenizer, "--model")
    kwargs = {"max_new_tokens": max_new_tokens, "greedy": False, "temperature": temperature}
    first = complete(model, tokenizer, texts, seed=seed, **kwargs)
    second = complete(model, tokenizer, texts, seed=seed + 1, **kwargs)
    pairs, same = [], 0
    for row, a, b in zip(rows, first, second, strict=True):
        if a.strip() == b.strip() or not a.strip() or not b.strip():
            same += 1
            continue
        if not isinstance(row["prompt"], str):
            a, b = [{"role": "assistant", "content": a}], [{"role": "assistant", "content": b}]
        pairs.append({"prompt": row["prompt"], "responses": [a, b]})
    if same:
        print(
            f"postrl label: left out {same} of {len(rows)} prompts whose two samples were the same or empty",
            file=sys.stderr,
        )
    if not pairs:
        raise UserError(f"--model {model_dir}: every pair of samples was the same; raise --temperature")
    atomic_write_text(out_file, "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs))
    return out_file
