"""Multi-turn sampling that keeps each conversation's KV cache from one turn to the next (issue #35 item 2).

`TurnSampler` samples a batch of conversations turn by turn. The first turn prefills the prompts (a prompt
shared by several rows, as a GRPO group's, once); every later turn appends to the cache only the tokens new to
each conversation: the end of its last reply that decoding never fed back (the last drawn token) and what came
after it (the observation, the tool result), instead of prefilling the whole conversation again. A turn
then costs its new tokens, not the conversation so far.

The cache has one row per live conversation, its columns in the order they were written. A turn's chunks are
left-padded to the longest, and decoding writes the same number of columns in every row, so a row has holes:
the chunk's padding, and the tokens it drew after its EOS (or beyond its token budget) while other rows went
on. The holes are masked out of attention (the decoder's ``forget``) and positions count a row's real tokens
only, so every row attends to exactly its conversation, token for token, as a re-prefill of it would
(tests/lm/test_agents_turns.py: equal tokens and log-probs). Conversations that ended leave the cache.

A decoder takes part by having ``append`` and ``forget`` next to ``prefill`` / ``step`` / ``select_rows``:
`postrl.lm.fast.llama.FastLlama`, `postrl.lm.fast.gpt2.FastGPT2` and `postrl.lm.rollout.decoders.HFDecoder`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch
from torch import Tensor

from postrl.lm.models import position_ids_from_mask
from postrl.lm.rollout.engine import Draw, decode, left_pad
from postrl.lm.rollout.forwards import distinct_prompts
from postrl.lm.rollout.sampling import mask_after_eos


def reuse_unsupported_reason(decoder: Any) -> str | None:
    """None when ``decoder`` can extend its cache turn after turn, else why not."""
    missing = [name for name in ("append", "forget") if not hasattr(decoder, name)]
    return f"{type(decoder).__name__} has no {' / '.join(missing)}" if missing else None


class TurnSampler:
    """Samples the next reply of each live conversation, their KV caches kept between calls.

    ``decoder`` is a fresh one from `postrl.lm.rollout.decoders.make_decoder` (on the live weights), ``device`` the model's;
    ``draw`` and ``eos_token_id`` as in `postrl.lm.rollout.generate`. One sampler serves one batch of
    conversations: the first `turn` starts them, later ones continue those still named. ``share_prompts``:
    prefill a first prompt held by several rows once (False where equal ids may go with other pictures).
    """

    def __init__(
        self,
        decoder: Any,
        draw: Draw,
        eos_token_id: int | None,
        pad_token_id: int,
        device: torch.device,
        share_prompts: bool = True,
    ) -> None:
        reason = reuse_unsupported_reason(decoder)
        if reason is not None:
            raise ValueError(f"the KV cache cannot be kept across turns: {reason}")
        self.decoder, self.draw, self.eos, self.pad = decoder, draw, eos_token_id, pad_token_id
        self.device = device  # the model's
        self.share_prompts = share_prompts  # False where equal ids may hold other inputs (pictures)
        self.rows: list[Hashable] = []  # the conversation of each cache row
        self.next_pos = torch.zeros(0, dtype=torch.long, device=self.device)  # (rows,) each row's real tokens
        self.pending: dict[
            Hashable, list[int]
        ] = {}  # drawn tokens kept in a conversation but not in the cache

    def turn(
        self,
        conversations: Sequence[Hashable],
        chunks: Sequence[Sequence[int]],
        max_new_tokens: int,
        limits: Sequence[int],
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Sample one reply per conversation: ``chunks[i]`` the tokens that came since its last reply (its
        whole prompt on the first turn), ``limits[i]`` the most of the drawn tokens it keeps (a budget).

        Returns (tokens [B, T], log π_τ [B, T], kept lengths [B]): a row keeps its tokens up to and
        including EOS, at most ``limits[i]``; the rest is dropped from its conversation and its cache.
        """
        if not conversations:
            raise ValueError("a turn needs at least one conversation")
        if self.rows:
            logits = self._extend(conversations, chunks, max_new_tokens)
        else:
            logits = self._start(chunks, max_new_tokens)
        start = self.decoder.length
        tokens, log_probs = decode(self.decoder, logits, max_new_tokens, self.draw, self.eos)  # (B, T)
        lengths = mask_after_eos(tokens, self.eos).sum(-1)
        lengths = torch.minimum(lengths, torch.tensor(list(limits), device=lengths.device))
        cached = lengths.clamp(max=tokens.shape[1] - 1)  # the last drawn token is never fed back
        self.decoder.forget(start, cached)
        self.next_pos = self.next_pos + cached
        rows = tokens.tolist()
        for c, row, n, k in zip(conversations, rows, lengths.tolist(), cached.tolist(), strict=True):
            self.pending[c] = row[k:n]
        self.rows = list(conversations)
        return tokens, log_probs, lengths

    def _start(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> Tensor:
        """Prefill the left-padded prompts, each distinct prompt once; next-token logits [B, V]."""
        ids, mask = (t.to(self.device) for t in left_pad(prompts, self.pad))
        unique, unique_mask, inverse = distinct_prompts(ids, mask)
        shared = self.share_prompts and unique.shape[0] < ids.shape[0]
        if shared:
            ids, mask = unique, unique_mask
        width = ids.shape[1] + max_new_tokens
        logits = self.decoder.prefill(ids, mask, position_ids_from_mask(mask), width)
        if shared:
            logits, mask = logits[inverse], mask[inverse]
            self.decoder.select_rows(inverse)
        self.next_pos = mask.sum(-1)
        return logits

    def _extend(
        self, conversations: Sequence[Hashable], chunks: Sequence[Sequence[int]], max_new_tokens: int
    ) -> Tensor:
        """Keep the rows of ``conversations`` (in their order) and append each one's pending tokens and
        chunk, left-padded; next-token logits [B, V]."""
        where = {c: i for i, c in enumerate(self.rows)}
        unknown = [c for c in conversations if c not in where]
        if unknown:
            raise ValueError(f"conversations {unknown} were not started by this sampler")
        index = torch.tensor([where[c] for c in conversations], device=self.device)
        if index.tolist() != list(range(len(self.rows))):
            self.decoder.select_rows(index)
            self.next_pos = self.next_pos[index]
        new = [self.pending.pop(c) + list(chunk) for c, chunk in zip(conversations, chunks, strict=True)]
        if any(not tokens for tokens in new):
            raise ValueError("every conversation's turn needs at least one new token")
        ids, mask = (t.to(self.device) for t in left_pad(new, self.pad))  # (B, S)
        positions = self.next_pos[:, None] + position_ids_from_mask(mask)  # (B, S), pads before the first
        width = self.decoder.length + ids.shape[1] + max_new_tokens
        logits = self.decoder.append(ids, mask, positions, width)
        self.next_pos = self.next_pos + mask.sum(-1)
        return logits
