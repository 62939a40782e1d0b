"""Reward functions for the RL trainers (GRPO, PPO-RLHF): loading them from specs and checking what they return.

A reward function has TRL's signature

    fn(prompts: list[str], completions: list[str], **columns) -> list[float]

one float per completion; ``columns`` are the other fields of each sample's dataset row, as lists aligned with
the completions (e.g. ``answer``). Three kinds of spec name one:

    task:NAME              the built-in task's reward (`postrl.lm.tasks`), e.g. ``task:arithmetic`` (a verifier)
    module:function        any importable function (``my_pkg.rewards:length_penalty``), or a file
                           (``path/to/rewards.py:fn``); looked up by attribute name, never ``eval``-ed
    rm:PATH                a trained reward model (a `ScalarHeadModel` folder written by ``postrl rm``),
                           scoring prompt + completion + EOS at the last real token, as it was trained

Several functions combine as a weighted sum. Whatever a function returns is checked before it is used: an
exception, a wrong length, a value that is not a number, NaN or inf stops the run with a `RewardError` that
names the function and shows the offending prompt and completion.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import math
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from postrl.runtime.errors import UserError

RewardCallable = Callable[..., Sequence[float]]


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
    """Refuse, before training, a reward function that cannot be called as ``fn(prompts, completions,
    **columns)``. With ``columns`` (the data's columns other than the prompt) the call is bound exactly;
    without, any argument after the first two must be one a column can fill by name."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature: their first call will tell
        return
    try:
        if columns is not None:
            signature.bind([], [], **dict.fromkeys(columns, []))
            return
        bound = signature.bind_partial([], [])
    except TypeError as err:
        given = f" with the data's columns ({', '.join(columns) or 'none'})" if columns is not None else ""
        raise RewardError(
            f"reward function {name} cannot be called as fn(prompts, completions, **columns){given}: {err}; "
            "define it as def fn(prompts, completions, **columns)"
        ) from None
    for param in list(signature.parameters.values())[len(bound.arguments) :]:
        if param.kind is param.POSITIONAL_ONLY and param.default is param.empty:
            raise RewardError(
                f"reward function {name}: its argument {param.name!r} is positional-only, but postrl passes "
                "only prompts and completions by position (columns go by name)"
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
    def __call__(self, prompts: Sequence[Any], completions: Sequence[str], **columns: Any) -> list[float]:
        from postrl.lm.data import encode_completions, encode_prompts, join_prompt_response, render_rows

        rows = render_rows([{"prompt": p} for p in prompts], "prompts", self.tokenizer)
        prompt_ids = encode_prompts(self.tokenizer, [r["prompt"] for r in rows])
        completion_ids = encode_completions(self.tokenizer, [str(c) for c in completions])
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
def _sample(prompts: Sequence[Any], completions: Sequence[str], i: int) -> str:
    return f"sample {i}: prompt={str(prompts[i])[:200]!r}, completion={str(completions[i])[:200]!r}"


def _find_failing_sample(
    fn: RewardFunction, prompts: Sequence[Any], completions: Sequence[str], columns: dict[str, list[Any]]
) -> int | None:
    """The first sample on which ``fn`` raises when called alone (only used to report an error)."""
    for i in range(len(completions)):
        try:
            fn.fn([prompts[i]], [completions[i]], **{k: [v[i]] for k, v in columns.items()})
        except Exception:
            return i
    return None


def _call(
    fn: RewardFunction, prompts: Sequence[Any], completions: Sequence[str], columns: dict[str, list[Any]]
) -> Sequence[Any]:
    try:
        return fn.fn(list(prompts), list(completions), **columns)
    except Exception as err:
        failing = _find_failing_sample(fn, prompts, completions, columns)
        where = _sample(prompts, completions, failing if failing is not None else 0)
        which = "on" if failing is not None else "on a batch that starts with"
        raise RewardError(
            f"reward function {fn.name} raised {type(err).__name__}: {err} ({which} {where})"
        ) from err


def _check_values(
    fn: RewardFunction, values: Any, prompts: Sequence[Any], completions: Sequence[str]
) -> torch.Tensor:
    """The values as float64 [N]; a wrong length, a non-number, NaN or inf raises `RewardError`."""
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
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise RewardError(
                f"reward function {fn.name} returned {value!r}, not a number, for {_sample(prompts, completions, i)}"
            ) from None
        if not math.isfinite(number):
            raise RewardError(
                f"reward function {fn.name} returned {number} for {_sample(prompts, completions, i)}"
            )
        out.append(number)
    return torch.tensor(out, dtype=torch.float64)


def reward_terms(
    fns: Sequence[RewardFunction],
    prompts: Sequence[Any],
    completions: Sequence[str],
    columns: dict[str, list[Any]] | None = None,
) -> dict[str, torch.Tensor]:
    """Each function's checked, unweighted rewards: name → float32 [N]."""
    columns = dict(columns or {})
    for key, value in columns.items():
        if len(value) != len(completions):
            raise ValueError(f"column {key!r} has {len(value)} values for {len(completions)} completions")
    terms = {}
    for fn in fns:
        values = _check_values(fn, _call(fn, prompts, completions, columns), prompts, completions)
        terms[fn.name] = values.float()
    return terms


def combine(fns: Sequence[RewardFunction], terms: dict[str, torch.Tensor]) -> torch.Tensor:
    """Σ_k w_k · r_k over the functions' terms → float32 [N]."""
    return torch.stack([fn.weight * terms[fn.name].double() for fn in fns]).sum(0).float()


def compute_rewards(
    fns: Sequence[RewardFunction],
    prompts: Sequence[Any],
    completions: Sequence[str],
    columns: dict[str, list[Any]] | None = None,
) -> torch.Tensor:
    """The weighted sum of the checked rewards → float32 [N] (see `reward_terms` for the checks)."""
    return combine(fns, reward_terms(fns, prompts, completions, columns))
