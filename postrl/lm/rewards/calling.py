"""Calling reward functions as TRL's `GRPOTrainer` does and checking what they return: each function's
terms (NaN where it returned None), their weighted sum, and a `RewardError`, one line, that names the function
(its spec and file:function), the step (from the trainer state) and the offending prompt and completion for an
exception, a wrong length, a non-number, NaN or inf.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import traceback
from collections.abc import Awaitable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import torch

from postrl.lm.rewards.contract import CALL_KEYWORDS, RewardError, RewardFunction
from postrl.lm.tasks.base import completion_text

log = logging.getLogger(__name__)

Phase = Literal["training", "evaluation"]
"""Where a reward call happens, for the error line: a training step or a held-out evaluation."""


def is_conversational(prompt: Any) -> bool:
    """Whether ``prompt`` is a list of ``{"role", "content"}`` messages (TRL's conversational format)."""
    return (
        isinstance(prompt, list)
        and bool(prompt)
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)
    )


def _ids(row: Any) -> list[int]:
    return [int(t) for t in (row.tolist() if hasattr(row, "tolist") else row)]


def completion_ids_of(response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[list[int]]:
    """The ``completion_ids`` a reward function gets: each row's response tokens up to and including EOS,
    as TRL passes them. ``response_ids``, ``response_mask``: ``[B, T]`` as in a `Rollout`."""
    # as Python lists: a boolean index and a copy per row were two tensor ops per response
    rows = zip(response_ids.tolist(), response_mask.tolist(), strict=True)
    return [[t for t, keep in zip(ids, m, strict=True) if keep] for ids, m in rows]


def columns_of(rows: Sequence[dict[str, Any]], hidden: Sequence[str] = ("prompt",)) -> dict[str, list[Any]]:
    """The ``columns`` a reward function gets: every key of the data ``rows`` except ``hidden``, as a list
    aligned with the rows (None where a row lacks the key), in the order the keys first appear."""
    keys = dict.fromkeys(k for r in rows for k in r if k not in hidden)
    return {k: [r.get(k) for r in rows] for k in keys}


def reward_kwargs(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    columns: dict[str, Sequence[Any]] | None = None,
    *,
    completion_ids: Sequence[Sequence[int]] | None = None,
    trainer_state: Any = None,
) -> dict[str, Any]:
    """The keyword arguments of one reward call over a batch (TRL's contract, see `postrl.lm.rewards`).

    A text completion of a conversational prompt becomes ``[{"role": "assistant", "content": text}]``, as
    TRL decodes it; a completion already in that form is passed as it is.
    """
    columns = {key: list(value) for key, value in (columns or {}).items()}
    clash = [key for key in columns if key in CALL_KEYWORDS]
    if clash:
        raise RewardError(
            f"the data has a column named {clash[0]!r}, but reward functions get postrl's own "
            f"{clash[0]!r} under that name; rename the column"
        )
    given = {
        "prompts": prompts,
        **columns,
        **({} if completion_ids is None else {"completion_ids": completion_ids}),
    }
    for key, value in given.items():
        if len(value) != len(completions):
            raise ValueError(f"{key!r} has {len(value)} values for {len(completions)} completions")
    return {
        "prompts": list(prompts),
        "completions": [
            [{"role": "assistant", "content": c}] if isinstance(c, str) and is_conversational(p) else c
            for p, c in zip(prompts, completions, strict=True)
        ],
        "completion_ids": None if completion_ids is None else [_ids(row) for row in completion_ids],
        "trainer_state": trainer_state,
        **columns,
    }


def _run_async(awaitables: list[Awaitable[Any]]) -> list[Any]:
    """Await ``awaitables`` concurrently (as TRL's ``asyncio.gather``); an exception is returned in place."""

    async def gather() -> list[Any]:
        return await asyncio.gather(*awaitables, return_exceptions=True)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(gather())
    # called from inside a running event loop (a notebook): asyncio.run needs a thread of its own
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, gather()).result()


def _invoke(fns: Sequence[RewardFunction], kwargs: dict[str, Any]) -> list[Any]:
    """Each function's result on the batch, or the exception it raised; async functions awaited together."""
    results: list[Any] = []
    for fn in fns:
        try:
            results.append(fn.fn(**kwargs))
        except Exception as err:  # the user's code: the caller reports it with the function and sample
            results.append(err)
    pending = [k for k, result in enumerate(results) if inspect.isawaitable(result)]
    if pending:
        for k, result in zip(pending, _run_async([results[k] for k in pending]), strict=True):
            results[k] = result
    return results


def _sample(prompts: Sequence[Any], completions: Sequence[str], i: int) -> str:
    return f"sample {i}: prompt={str(prompts[i])[:200]!r}, completion={str(completions[i])[:200]!r}"


def _source(fn: RewardFunction) -> tuple[str, str] | None:
    """(file, qualified name) of the code behind ``fn``: the function, a bound method's function, or a
    callable object's ``__call__``; None when Python cannot tell (a builtin)."""
    code = inspect.unwrap(fn.fn)
    if not (inspect.isfunction(code) or inspect.ismethod(code)) and callable(code):
        code = type(code).__call__  # a callable object, e.g. `RewardModelScorer`
    try:
        file = inspect.getsourcefile(code)
    except TypeError:
        return None
    name = getattr(code, "__qualname__", None)
    return (file, name) if file and name else None


def _label(fn: RewardFunction) -> str:
    """The function as the error names it: its spec, and file:function where the spec does not say it."""
    source = _source(fn)
    if source is None:
        return fn.name
    file, name = source
    target, _, attr = fn.name.rpartition(":")
    if (
        target.endswith(".py")
        and attr == name
        and Path(target).expanduser().resolve() == Path(file).resolve()
    ):
        return fn.name  # a file spec already is file:function
    return f"{fn.name} ({file}:{name})"


def _when(trainer_state: Any, phase: Phase) -> str:
    """The step of a call, as the run's metrics and checkpoints count it (training step k + 1 takes the state
    after k steps; an evaluation after k steps is logged at step k); empty without a trainer state."""
    step, steps = getattr(trainer_state, "global_step", None), getattr(trainer_state, "max_steps", None)
    if step is None:
        return ""
    if phase == "evaluation":
        return f" in the held-out evaluation at step {step}"
    return f" in training step {step + 1}" + (f" of {steps}" if steps else "")


def _one_line(text: str) -> str:
    """A user's message on one line (the CLI's error is one line): newlines shown as \\n."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _raised_at(fn: RewardFunction, err: BaseException) -> str:
    """' at FILE:LINE', the deepest frame of the traceback in the function's own file ('' if none)."""
    source = _source(fn)
    frames = traceback.extract_tb(err.__traceback__)
    own = [f for f in frames if source is not None and f.filename == source[0]]
    return f" at {own[-1].filename}:{own[-1].lineno}" if own else ""


def _find_failing_sample(fn: RewardFunction, kwargs: dict[str, Any], n: int) -> int | None:
    """The first sample on which ``fn`` raises when called alone (only used to report an error)."""
    for i in range(n):
        one = {k: v if k == "trainer_state" or v is None else v[i : i + 1] for k, v in kwargs.items()}
        if isinstance(_invoke([fn], one)[0], BaseException):
            return i
    return None


def _failure(
    fn: RewardFunction,
    err: BaseException,
    kwargs: dict[str, Any],
    prompts: Sequence[Any],
    texts: list[str],
    when: str,
) -> RewardError:
    failing = _find_failing_sample(fn, kwargs, len(texts))
    where = _sample(prompts, texts, failing if failing is not None else 0)
    which = "on" if failing is not None else "on a batch that starts with"
    no_ids = kwargs["completion_ids"] is None and isinstance(err, TypeError)
    hint = "; note: this caller passed no completion_ids (None)" if no_ids else ""
    return RewardError(
        f"reward function {_label(fn)} raised {type(err).__name__}: {_one_line(str(err))}"
        f"{_raised_at(fn, err)}{when} ({which} {where}){hint}"
    )


def _check_values(
    fn: RewardFunction, values: Any, prompts: Sequence[Any], completions: Sequence[str], when: str = ""
) -> torch.Tensor:
    """The values as float64 [N], NaN for None; a wrong length, a non-number, NaN or inf raises `RewardError`
    (``when``: the step, see `_when`)."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().reshape(-1).tolist()
    try:
        values = list(values)
    except TypeError:
        raise RewardError(
            f"reward function {_label(fn)} returned {type(values).__name__}{when}; expected a list of floats"
        ) from None
    if len(values) != len(completions):
        raise RewardError(
            f"reward function {_label(fn)} returned {len(values)} values for {len(completions)} "
            f"completions{when} (first {_sample(prompts, completions, 0)})"
        )
    out = []
    for i, value in enumerate(values):
        if value is None:  # TRL: "no reward from this function for this sample", NaN in its term
            out.append(math.nan)
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise RewardError(
                f"reward function {_label(fn)} returned {_one_line(repr(value)[:200])}, not a number, for "
                f"{_sample(prompts, completions, i)}{when}"
            ) from None
        if not math.isfinite(number):
            raise RewardError(
                f"reward function {_label(fn)} returned {number} for {_sample(prompts, completions, i)}"
                f"{when} (return None for 'no reward for this sample')"
            )
        out.append(number)
    return torch.tensor(out, dtype=torch.float64)


def unscored(terms: dict[str, torch.Tensor]) -> torch.Tensor:
    """[N] bool: the samples for which every function returned None. `combine` gives them 0; TRL (since 1.6)
    also leaves them out of their group's mean and std and sets their advantage to 0."""
    return torch.stack(list(terms.values())).isnan().all(0)


def _warn_unscored(terms: dict[str, torch.Tensor], prompts: Sequence[Any], texts: list[str]) -> None:
    mask = unscored(terms)
    if mask.any():
        first = int(mask.nonzero()[0, 0])
        log.warning(
            "every reward function returned None for %d of %d samples (first: %s); their reward is 0: make "
            "sure at least one function scores every sample",
            int(mask.sum()),
            len(texts),
            _sample(prompts, texts, first),
        )


def reward_terms(
    fns: Sequence[RewardFunction],
    prompts: Sequence[Any],
    completions: Sequence[Any],
    columns: dict[str, Sequence[Any]] | None = None,
    *,
    completion_ids: Sequence[Sequence[int]] | None = None,
    trainer_state: Any = None,
    phase: Phase = "training",
) -> dict[str, torch.Tensor]:
    """Each function's checked, unweighted rewards: name → float32 [N], NaN where it returned None.

    ``prompts`` as the data holds them (text or messages), ``completions`` the decoded texts, ``columns`` the
    data's other columns, ``completion_ids`` the completions' token ids (a function that reads them gets None
    when the caller gives none), ``trainer_state`` e.g. a `TrainerState` (TRL passes its state on every call,
    evaluation included). See `reward_kwargs` for the call. An error names the step from ``trainer_state``
    and ``phase`` (a training step, or the held-out evaluation after ``global_step`` steps).
    """
    kwargs = reward_kwargs(
        prompts, completions, columns, completion_ids=completion_ids, trainer_state=trainer_state
    )
    texts = [completion_text(c) for c in completions]
    when = _when(trainer_state, phase)
    terms = {}
    for fn, result in zip(fns, _invoke(fns, kwargs), strict=True):
        if isinstance(result, BaseException):
            raise _failure(fn, result, kwargs, prompts, texts, when) from result
        terms[fn.name] = _check_values(fn, result, prompts, texts, when).float()
    if terms:
        _warn_unscored(terms, prompts, texts)
    return terms


def combine(fns: Sequence[RewardFunction], terms: dict[str, torch.Tensor]) -> torch.Tensor:
    """Σ_k w_k · r_k over the functions' terms → float32 [N], skipping the NaN (None) values as TRL's
    ``nansum`` does: a sample no function scored gets 0 (see `unscored`)."""
    weighted = torch.stack([fn.weight * terms[fn.name].double() for fn in fns])  # (K, N)
    return weighted.nansum(0).float()


def compute_rewards(
    fns: Sequence[RewardFunction],
    prompts: Sequence[Any],
    completions: Sequence[Any],
    columns: dict[str, Sequence[Any]] | None = None,
    *,
    completion_ids: Sequence[Sequence[int]] | None = None,
    trainer_state: Any = None,
    phase: Phase = "training",
) -> torch.Tensor:
    """The weighted sum of the checked rewards → float32 [N] (see `reward_terms` and `combine`)."""
    terms = reward_terms(
        fns, prompts, completions, columns,
        completion_ids=completion_ids, trainer_state=trainer_state, phase=phase,
    )  # fmt: skip
    return combine(fns, terms)
