"""Reward functions for the RL trainers (GRPO, PPO-RLHF): loading them from specs, calling them the way TRL's
`GRPOTrainer` does, and checking what they return.

A reward function follows TRL's contract: it is called with keyword arguments only,

    fn(prompts=..., completions=..., completion_ids=..., trainer_state=..., **columns) -> list[float | None]

``prompts`` as the data holds them (strings, or message lists for conversational data); ``completions`` the
decoded completions, as strings, or for conversational prompts as one-message lists
``[{"role": "assistant", "content": text}]``; ``completion_ids`` the token ids of each completion; every other
column of the sample's dataset row by its name (e.g. ``answer``, ``ground_truth``), as lists aligned with the
completions. The easiest signature that takes all of it is TRL's ``def fn(completions, **kwargs)``. ``None``
means "this function has no reward for this sample" (e.g. a math reward on a coding prompt): the sample's
reward is the weighted sum of the other functions' values. An ``async def`` function is awaited; several run
concurrently. Three kinds of spec name a function:

    task:NAME              the built-in task's reward (`postrl.lm.tasks`), e.g. ``task:arithmetic`` (a verifier)
    module:function        any importable function (``my_pkg.rewards:length_penalty``), or a file
                           (``path/to/rewards.py:fn``); looked up by attribute name, never ``eval``-ed
    rm:PATH                a trained reward model (a `ScalarHeadModel` folder written by ``postrl rm``),
                           scoring prompt + completion + EOS at the last real token, as it was trained

Several functions combine as a weighted sum. Whatever a function returns is checked before it is used: an
exception, a wrong length, a value that is neither a number nor None, NaN or inf stops the run with a
`RewardError` that names the function and shows the offending prompt and completion.
"""

from __future__ import annotations

import asyncio
import difflib
import importlib
import importlib.util
import inspect
import logging
import math
import sys
import traceback
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from postrl.lm.tasks.base import completion_text
from postrl.runtime.errors import UserError

log = logging.getLogger(__name__)

RewardCallable = Callable[..., Sequence[float | None] | Awaitable[Sequence[float | None]]]
CALL_KEYWORDS: tuple[str, ...] = ("prompts", "completions", "completion_ids", "trainer_state")
"""The keywords every reward call carries besides the data's columns (TRL's `GRPOTrainer` contract)."""


class RewardError(UserError, ValueError):
    """A reward spec cannot be loaded, or a reward function failed or returned unusable values."""


@dataclass(frozen=True)
class RewardFunction:
    """A loaded reward function with its name (for metrics and errors) and weight in the sum."""

    name: str
    fn: RewardCallable
    weight: float = 1.0
    is_verifier: bool = False
    """0/1 correctness (a built-in task with answers): its mean is an accuracy."""


@dataclass(frozen=True)
class TrainerState:
    """What a reward function reads as ``trainer_state`` (the fields of transformers' `TrainerState` that
    curriculum rewards use), e.g. to ramp a penalty up over training."""

    global_step: int = 0
    """optimizer steps taken so far"""
    max_steps: int = 0
    """the run's total optimizer steps"""


# ---- loading ----------------------------------------------------------------------------------------------
def _task_reward(name: str, task_kwargs: dict[str, Any] | None) -> tuple[RewardCallable, bool]:
    from postrl.lm.tasks import get_task

    task = get_task(name, **(task_kwargs or {}))
    first = (task.prompt_rows("test")[:1] or [{}])[0]
    return task.reward_fn, "answer" in first


def _import_problem(err: BaseException, target: str) -> str:
    """What went wrong while importing the user's ``target`` (a file or a module), with file:line."""
    if isinstance(err, SyntaxError):
        return f"{err.filename}:{err.lineno}: {type(err).__name__}: {err.msg}"
    if isinstance(err, ModuleNotFoundError) and err.name:
        return f"{target} imports module {err.name!r}, which is not installed (or not on the path)"
    frames = [f for f in traceback.extract_tb(err.__traceback__) if not f.filename.startswith("<frozen")]
    at = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"importing {target} raised {type(err).__name__}{at}: {err}"


def _import_file(path: Path, spec: str) -> ModuleType:
    if not path.is_file():
        raise RewardError(f"reward spec {spec!r}: no such file {path}")
    module_spec = importlib.util.spec_from_file_location(f"postrl_reward_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:
        raise RewardError(f"reward spec {spec!r}: {path} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(module_spec)
    # registered before it runs, as `import` does: dataclasses, pickling and typing look the module up by name
    sys.modules[module_spec.name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:  # the user's code: any failure is theirs to fix, reported with file:line
        del sys.modules[module_spec.name]
        raise RewardError(f"reward spec {spec!r}: {_import_problem(err, str(path))}") from err
    return module


def _import_target(target: str, spec: str) -> Any:
    """The module named ``target`` (dotted) or loaded from a ``.py`` file path."""
    if target.endswith(".py"):
        return _import_file(Path(target).expanduser(), spec)
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as err:
        if err.name and (target == err.name or target.startswith(err.name + ".")):
            raise RewardError(
                f"reward spec {spec!r}: cannot import module {target!r}: no such module (a file needs its "
                "path ending in .py, e.g. rewards/my_rewards.py:fn)"
            ) from None
        raise RewardError(f"reward spec {spec!r}: {_import_problem(err, target)}") from err
    except Exception as err:  # the user's code: any failure is theirs to fix
        raise RewardError(f"reward spec {spec!r}: {_import_problem(err, target)}") from err


def _missing_attribute(spec: str, owner: Any, where: str, part: str) -> RewardError:
    names = [n for n in dir(owner) if not n.startswith("_")]
    close = difflib.get_close_matches(part, names, n=3, cutoff=0.5)
    functions = [n for n in names if inspect.isfunction(getattr(owner, n, None))]
    hint = (
        f"did you mean {', '.join(close)}?" if close else f"its functions: {', '.join(functions) or 'none'}"
    )
    return RewardError(f"reward spec {spec!r}: {where} has no attribute {part!r}; {hint}")


def check_signature(fn: Callable[..., Any], name: str, columns: Sequence[str] | None = None) -> None:
    """Refuse, before training, a reward function that cannot take postrl's call: the keywords of
    `CALL_KEYWORDS` and each column by name. With ``columns`` (the data's columns other than the prompt) the
    call is bound exactly; without, every argument the fixed keywords leave open must be one a column can fill
    by name."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature: their first call will tell
        return
    fixed: dict[str, Any] = dict.fromkeys(CALL_KEYWORDS, [])
    try:
        if columns is not None:
            signature.bind(**fixed, **dict.fromkeys(columns, []))
            return
        bound = signature.bind_partial(**fixed)
    except TypeError as err:
        given = f" with the data's columns ({', '.join(columns) or 'none'})" if columns is not None else ""
        raise RewardError(
            f"reward function {name} cannot be called as fn(prompts=, completions=, completion_ids=, "
            f"trainer_state=, **columns){given}: {err}; postrl passes every argument by name, as TRL does: "
            "define it as def fn(completions, **kwargs) and name the columns it reads"
        ) from None
    for param in signature.parameters.values():
        if param.name not in bound.arguments and param.kind is param.POSITIONAL_ONLY:
            raise RewardError(
                f"reward function {name}: its argument {param.name!r} is positional-only, but postrl passes "
                "every argument by name (TRL's convention)"
            )


def _function_reward(spec: str, columns: Sequence[str] | None) -> RewardCallable:
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise RewardError(f"reward spec {spec!r}: expected 'module:function' or 'path/file.py:function'")
    obj, where = _import_target(target, spec), target
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise _missing_attribute(spec, obj, where, part)
        obj, where = getattr(obj, part), f"{where}:{part}"
    if not callable(obj):
        raise RewardError(f"reward spec {spec!r}: {attr} is a {type(obj).__name__}, not a function")
    check_signature(obj, spec, columns)
    return obj


class RewardModelScorer:
    """A trained reward model as a reward function: the score of prompt + completion + EOS at its last token.

    The layout is the reward model's training layout (`postrl.lm.data.collate_preferences`): the prompt as
    `encode_prompts` makes it (chat template for conversational prompts), the completion's tokens, then EOS.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, batch_size: int = 64) -> None:
        self.model, self.tokenizer, self.batch_size = model.eval(), tokenizer, batch_size

    @torch.no_grad()
    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        from postrl.lm.data import encode_completions, encode_prompts, join_prompt_response, render_rows

        rows = render_rows([{"prompt": p} for p in prompts], "prompts", self.tokenizer)
        prompt_ids = encode_prompts(self.tokenizer, [r["prompt"] for r in rows])
        # re-encoded from the text (not kwargs["completion_ids"]): the RM may have another tokenizer
        completion_ids = encode_completions(self.tokenizer, [completion_text(c) for c in completions])
        device = next(self.model.parameters()).device
        scores: list[float] = []
        for i in range(0, len(prompt_ids), self.batch_size):
            batch = join_prompt_response(
                prompt_ids[i : i + self.batch_size],
                completion_ids[i : i + self.batch_size],
                self.tokenizer.pad_token_id,
            )
            ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
            scores += self.model.score(ids, mask).float().tolist()  # (b,)
        return scores


def _reward_model(path: str, device: str | torch.device) -> RewardModelScorer:
    from postrl.lm.models import ScalarHeadModel
    from postrl.lm.tokenizer import load_tokenizer

    if not Path(path).expanduser().is_dir():
        raise RewardError(f"reward spec 'rm:{path}': no reward-model folder there (run `postrl rm` first)")
    try:
        model = ScalarHeadModel.from_pretrained(path, device=device, what="reward model")
        return RewardModelScorer(model, load_tokenizer(path, what="reward model's tokenizer"))
    except UserError as err:
        raise RewardError(f"reward spec 'rm:{path}': {err}") from err


def load_reward_fn(
    spec: str,
    weight: float = 1.0,
    *,
    task_kwargs: dict[str, Any] | None = None,
    device: str | torch.device = "cpu",
    columns: Sequence[str] | None = None,
) -> RewardFunction:
    """One `RewardFunction` from ``task:NAME``, ``rm:PATH`` or ``module:function`` (see the module docstring).

    A user's function is checked against the call postrl makes (`check_signature`); give ``columns`` (the
    prompt data's columns other than ``prompt``) to check that every argument it needs is there.
    """
    if spec.startswith("task:"):
        fn, verifier = _task_reward(spec[len("task:") :], task_kwargs)
        return RewardFunction(spec, fn, weight, verifier)
    if spec.startswith("rm:"):
        return RewardFunction(spec, _reward_model(spec[len("rm:") :], device), weight)
    return RewardFunction(spec, _function_reward(spec, columns), weight)


def load_reward_fns(
    specs: Sequence[str],
    weights: Sequence[float] | None = None,
    *,
    task_kwargs: dict[str, Any] | None = None,
    device: str | torch.device = "cpu",
    columns: Sequence[str] | None = None,
) -> list[RewardFunction]:
    """Load every spec; ``weights`` (default all 1) must match ``specs`` in length. Names are made unique.
    ``columns``: see `load_reward_fn`."""
    if not specs:
        raise RewardError("no reward function given")
    weights = [1.0] * len(specs) if weights is None else list(weights)
    if len(weights) != len(specs):
        raise RewardError(
            f"reward_weights has {len(weights)} weight(s) for {len(specs)} reward function(s) {list(specs)}: "
            "give one weight per reward function"
        )
    bad = [
        w for w in weights if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w)
    ]
    if bad:
        raise RewardError(f"reward weights must be finite numbers; got {bad[0]!r}")
    fns, seen = [], set()
    for spec, weight in zip(specs, weights, strict=True):
        fn = load_reward_fn(spec, float(weight), task_kwargs=task_kwargs, device=device, columns=columns)
        name = fn.name if fn.name not in seen else f"{fn.name}#{len(fns)}"
        seen.add(name)
        fns.append(RewardFunction(name, fn.fn, fn.weight, fn.is_verifier))
    return fns


# ---- calling and checking ---------------------------------------------------------------------------------
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
    return [ids[m.bool()].tolist() for ids, m in zip(response_ids.cpu(), response_mask.cpu(), strict=True)]


def reward_kwargs(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    columns: dict[str, Sequence[Any]] | None = None,
    *,
    completion_ids: Sequence[Sequence[int]] | None = None,
    trainer_state: Any = None,
) -> dict[str, Any]:
    """The keyword arguments of one reward call over a batch (TRL's contract, see the module docstring).

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


def _find_failing_sample(fn: RewardFunction, kwargs: dict[str, Any], n: int) -> int | None:
    """The first sample on which ``fn`` raises when called alone (only used to report an error)."""
    for i in range(n):
        one = {k: v if k == "trainer_state" or v is None else v[i : i + 1] for k, v in kwargs.items()}
        if isinstance(_invoke([fn], one)[0], BaseException):
            return i
    return None


def _failure(
    fn: RewardFunction, err: BaseException, kwargs: dict[str, Any], prompts: Sequence[Any], texts: list[str]
) -> RewardError:
    failing = _find_failing_sample(fn, kwargs, len(texts))
    where = _sample(prompts, texts, failing if failing is not None else 0)
    which = "on" if failing is not None else "on a batch that starts with"
    no_ids = kwargs["completion_ids"] is None and isinstance(err, TypeError)
    hint = "; note: this caller passed no completion_ids (None)" if no_ids else ""
    return RewardError(
        f"reward function {fn.name} raised {type(err).__name__}: {err} ({which} {where}){hint}"
    )


def _check_values(
    fn: RewardFunction, values: Any, prompts: Sequence[Any], completions: Sequence[str]
) -> torch.Tensor:
    """The values as float64 [N], NaN for None; a wrong length, a non-number, NaN or inf raises `RewardError`."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().reshape(-1).tolist()
    try:
        values = list(values)
    except TypeError:
        raise RewardError(
            f"reward function {fn.name} returned {type(values).__name__}; expected a list of floats"
        ) from None
    if len(values) != len(completions):
        raise RewardError(
            f"reward function {fn.name} returned {len(values)} values for {len(completions)} completions "
            f"(first {_sample(prompts, completions, 0)})"
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
                f"reward function {fn.name} returned {value!r}, not a number, for {_sample(prompts, completions, i)}"
            ) from None
        if not math.isfinite(number):
            raise RewardError(
                f"reward function {fn.name} returned {number} for {_sample(prompts, completions, i)} (return "
                "None for 'no reward for this sample')"
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
) -> dict[str, torch.Tensor]:
    """Each function's checked, unweighted rewards: name → float32 [N], NaN where it returned None.

    ``prompts`` as the data holds them (text or messages), ``completions`` the decoded texts, ``columns`` the
    data's other columns, ``completion_ids`` the completions' token ids (a function that reads them gets None
    when the caller gives none), ``trainer_state`` e.g. a `TrainerState`. See `reward_kwargs` for the call.
    """
    kwargs = reward_kwargs(
        prompts, completions, columns, completion_ids=completion_ids, trainer_state=trainer_state
    )
    texts = [completion_text(c) for c in completions]
    terms = {}
    for fn, result in zip(fns, _invoke(fns, kwargs), strict=True):
        if isinstance(result, BaseException):
            raise _failure(fn, result, kwargs, prompts, texts) from result
        terms[fn.name] = _check_values(fn, result, prompts, texts).float()
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
) -> torch.Tensor:
    """The weighted sum of the checked rewards → float32 [N] (see `reward_terms` and `combine`)."""
    terms = reward_terms(
        fns, prompts, completions, columns, completion_ids=completion_ids, trainer_state=trainer_state
    )
    return combine(fns, terms)
