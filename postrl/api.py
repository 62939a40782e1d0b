"""postrl from Python: one function per training stage, the twin of its command.

    import postrl

    result = postrl.sft("sft-arithmetic", model="runs/pretrain/model", out="runs/sft", run={"steps": 50})
    result.run_dir, result.summary["final_loss"], result.model_path

``postrl.dpo`` too, and any stage of the command's table by its name (``-`` as ``_``). Each function takes what
its command takes, in Python:

- ``config``: a preset name (``"grpo-arithmetic"``), a YAML file, a config object (``GRPOConfig(...)``) or a
  dict: the command's ``--config``;
- keyword overrides, nested (``optim={"lr": 1e-5}``) or dotted (``**{"optim.lr": 1e-5}``): the command's
  ``key=value`` arguments, applied after the config;
- ``data=`` (and ``eval_data=``): a file, ``task:NAME``, a ``datasets`` name, or rows in memory (a list of dicts,
  a ``datasets.Dataset``) in TRL's formats; ``rewards=``: specs (``"file.py:fn"``, ``"task:arithmetic"``) or
  Python functions on TRL's reward contract (``def reward_len(completions, **kwargs)``);
- ``out=`` (the run folder), ``resume=``, ``overwrite=`` as the flags; ``on_iteration=`` a callback
  ``fn(info) -> bool`` called after every step (`postrl.runtime.callbacks`: returning ``False`` stops early).

The config is resolved by the command's loader and the stage's own ``run_*`` function runs it, so every check
and message is the command's; a bad input raises `postrl.UserError` (the CLI prints the same message as
``postrl: error: ...``). Rows in memory and Python functions are recorded in ``config.yaml`` by name
(``memory:<hash>``, ``callable:module.qualname``) with a note: a resume needs them passed again.

The stages are the registry `postrl.lm.stages.STAGES`, which the command reads too: a stage registered there is
also ``postrl.<name>`` here, with no further code.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from postrl.lm.stages import STAGES, get_stage
from postrl.runtime import notices
from postrl.runtime.config import load_config, to_dict
from postrl.runtime.errors import UserError
from postrl.runtime.overrides import apply_overrides, plain

__all__ = [
    "Result",
    "UserError",
    "dpo",
    "grpo",
    "loop",
    "ppo",
    "pretrain",
    "rm",
    "run_stage",
    "sft",
    "stages",
]

DATA_KEYS = ("data", "eval_data")
NOTE = "# postrl: {what} given in memory to the Python API: pass {arg} again to resume this run\n"


@dataclass(frozen=True)
class Result:
    """What a training function returns: where the run is, its summary and its exported model."""

    run_dir: Path
    """The run folder (config.yaml, metrics.jsonl, summary.json, checkpoints/, curves.png, model/)."""
    summary: dict[str, Any]
    """summary.json's metrics (the command prints the same dict)."""
    model_path: Path | None
    """The exported Hugging Face folder (``run_dir/model``), loadable by ``from_pretrained``; None if none."""
    config: Any = dataclasses.field(repr=False)
    """The resolved config object the run used (config.yaml holds the same)."""


def stages() -> list[str]:
    """The training stages the API offers, by their Python names (``postrl.<name>``: the command's name with
    ``_`` for ``-``, e.g. ``postrl vlm-pretrain`` is ``postrl.vlm_pretrain``)."""
    return [stage.python_name for stage in STAGES.values()]


# ---- Python values -------------------------------------------------------------------------------------------
def _reward_specs(rewards: Any) -> tuple[list[str], dict[str, Callable[..., Any]]]:
    """Reward specs for the config, and the ``callable:`` ones' functions (named by their qualified names)."""
    items = list(rewards) if isinstance(rewards, (list, tuple)) else [rewards]
    specs, functions = [], {}
    for item in items:
        if isinstance(item, (str, os.PathLike)):
            specs.append(os.fspath(item))
            continue
        if not callable(item):
            raise UserError(f"rewards: expected spec strings or functions, got {type(item).__name__}")
        module = getattr(item, "__module__", None) or "builtins"
        name = f"{module}.{getattr(item, '__qualname__', None) or type(item).__qualname__}"
        spec = f"callable:{name}"
        if spec in functions:  # two functions of the same name (e.g. two lambdas): numbered in order
            spec = f"{spec}#{len(specs)}"
        functions[spec] = item
        specs.append(spec)
    return specs, functions


@contextmanager
def _python_env(overrides: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """TRL's ``environment_factory=`` / ``tools=`` / ``reward_funcs=`` (and ``data=`` rows for it) as an
    environment registered for the run (`postrl.lm.agents.python_envs`): the overrides with ``env.id`` set."""
    if overrides.get("environment_factory") is None and not overrides.get("tools"):
        yield overrides
        return
    from postrl.lm.agents.python_envs import register_tool_env, release_tool_env  # deferred: torch

    values = dict(overrides)
    rows = values.pop("data", None)
    if isinstance(rows, (str, os.PathLike)):
        raise UserError(
            "data= with environment_factory=/tools= takes rows in memory (a list of dicts, a Dataset)"
        )
    env_id, n_rows = register_tool_env(
        values.pop("tools", None),
        values.pop("environment_factory", None),
        values.pop("reward_funcs", None),
        rows,
    )
    env = dict(values.get("env") or {})
    env["id"] = env_id
    if n_rows is not None:
        env.setdefault("n_train", n_rows)
    values["env"] = env
    try:
        yield values
    finally:
        release_tool_env(env_id)


@contextmanager
def _in_memory(overrides: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The overrides with rows in memory and Python reward functions replaced by their names, registered
    for the length of the ``with`` block."""
    from postrl.lm.data import sources  # deferred with everything that needs torch
    from postrl.lm.rewards.loading import CALLABLES

    values, names, functions = dict(overrides), [], {}
    for key in DATA_KEYS:
        value = values.get(key)
        if value is not None and not isinstance(value, (str, os.PathLike)):
            values[key] = sources.register_records(value, label=key)
            names.append(values[key])
    if values.get("rewards") is not None:
        values["rewards"], functions = _reward_specs(values["rewards"])
    CALLABLES.update(functions)
    try:
        yield values
    finally:
        for spec in functions:
            CALLABLES.pop(spec, None)
        for name in names:
            sources.release_records(name)


# ---- config ----------------------------------------------------------------------------------------------
def resolve_config(stage: str, config: Any, overrides: Mapping[str, Any], run_dir: Path, resume: bool) -> Any:
    """The stage's config, as the command resolves it: the config (or, on resume without one, the run's
    config.yaml), then the overrides; every key and value checked."""
    cls = get_stage(stage).config_class()
    path, base = None, None
    if config is None and resume and (run_dir / "config.yaml").is_file():
        path = run_dir / "config.yaml"
    elif isinstance(config, (str, os.PathLike)):
        path = config
    elif dataclasses.is_dataclass(config) and not isinstance(config, type):
        if not isinstance(config, cls):
            raise UserError(f"postrl.{stage}: config is a {type(config).__name__}, not a {cls.__name__}")
        base = to_dict(config)
    elif isinstance(config, Mapping):
        base = plain(config)
    elif config is not None:
        raise UserError(
            f"postrl.{stage}: config must be a preset name, a YAML path, a {cls.__name__} or a dict; "
            f"got {type(config).__name__}"
        )
    cfg = apply_overrides(cls, load_config(cls, path, base=base), overrides)
    own = path is not None and Path(path).resolve() == (run_dir / "config.yaml").resolve()
    if resume and own:  # the run folder's config: trusted no more than a script
        from postrl.runtime.run_inputs import check_resume  # deferred: torch

        check_resume(run_dir, to_dict(cfg), {str(key).split(".", 1)[0] for key in overrides}, stage)
    return cfg


def _config_text(run_dir: Path) -> str | None:
    path = run_dir / "config.yaml"
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _note_in_memory(run_dir: Path, cfg: Any, before: str | None) -> None:
    """Say at the top of config.yaml which of its values were Python objects (not saved with the run).
    ``before`` is the file's text before the run: unchanged, it is another run's config (this one was
    refused before it started) or already noted. (Not a comparison with ``cfg``: a run may write a value it
    fitted, e.g. a prompt length clipped to the model's context.)"""
    path = run_dir / "config.yaml"
    text, notes = _config_text(run_dir), ""
    if text is None or text == before:
        return
    values = to_dict(cfg)
    if any(str(values.get(k) or "").startswith("memory:") for k in DATA_KEYS):
        notes += NOTE.format(what="rows (data: memory:...) were", arg="data=")
    if any(str(spec).startswith("callable:") for spec in values.get("rewards") or []):
        notes += NOTE.format(what="reward functions (callable:...) were", arg="rewards=")
    if str((values.get("env") or {}).get("id") or "").startswith("python:"):
        notes += NOTE.format(what="the environment (python:...) was", arg="environment_factory=/tools=")
    if notes and not text.startswith(notes):
        from postrl.runtime.checkpoint import atomic_write_text  # deferred: torch

        atomic_write_text(path, notes + text)


# ---- running ---------------------------------------------------------------------------------------------
def run_stage(
    stage: str,
    config: Any = None,
    *,
    out: str | os.PathLike[str] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    on_iteration: Callable[[dict[str, Any]], Any] | None = None,
    **overrides: Any,
) -> Result:
    """Run training stage ``stage`` (``postrl <stage>`` on the command line); see the module docstring."""
    spec = get_stage(stage)
    stage = spec.name
    if isinstance(overrides.get("env"), str):  # postrl.grpo(env="frozenlake"), as `postrl grpo --env ID`
        overrides["env"] = {"id": overrides["env"]}
    if out is None:
        raise UserError(f"postrl.{stage}: out= is required (the run folder: a new one, or a run to resume)")
    if not isinstance(out, (str, os.PathLike)):
        raise UserError(f"postrl.{stage}: out= is the run folder's path, got {type(out).__name__} {out!r}")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # as the command does
    notices.discard()  # notices of an earlier refused input (`postrl.runtime.notices`)
    from postrl.runtime import callbacks
    from postrl.runtime import distributed as dist  # deferred: torch

    run_dir = Path(out)
    with _python_env(overrides) as with_env, _in_memory(with_env) as values:
        cfg = resolve_config(stage, config, values, run_dir, resume)
        run = spec.run_function()
        before = _config_text(run_dir)
        try:
            with callbacks.on_iteration(on_iteration):
                summary = run(cfg, run_dir, resume=resume, overwrite=overwrite)
        finally:
            if dist.is_main():
                _note_in_memory(run_dir, cfg, before)
    model = run_dir / "model"
    return Result(run_dir, summary, model if model.is_dir() else None, cfg)


def _call(stage: str, config: Any, kwargs: dict[str, Any]) -> Result:
    """`run_stage` for ``postrl.<stage>(config, **kwargs)``, the config also taken as ``config=``."""
    if "config" in kwargs:
        if config is not None:
            raise UserError(f"postrl.{stage}: the config is given twice (first argument and config=)")
        config = kwargs.pop("config")
    return run_stage(stage, config, **kwargs)


def pretrain(config: Any = None, /, **kwargs: Any) -> Result:
    """Pretrain the built-in tiny LM and its tokenizer from scratch (``postrl pretrain``)."""
    return _call("pretrain", config, kwargs)


def sft(config: Any = None, /, **kwargs: Any) -> Result:
    """Supervised fine-tuning on prompt/completion, messages or text rows (``postrl sft``)."""
    return _call("sft", config, kwargs)


def rm(config: Any = None, /, **kwargs: Any) -> Result:
    """Train a Bradley-Terry reward model on preference pairs (``postrl rm``)."""
    return _call("rm", config, kwargs)


def ppo(config: Any = None, /, **kwargs: Any) -> Result:
    """PPO-based RLHF against a reward model or reward functions (``postrl ppo``)."""
    return _call("ppo", config, kwargs)


def grpo(config: Any = None, /, **kwargs: Any) -> Result:
    """GRPO with reward functions, the group's rewards as the baseline (``postrl grpo``)."""
    return _call("grpo", config, kwargs)


def dpo(config: Any = None, /, **kwargs: Any) -> Result:
    """DPO/IPO on preference pairs against a frozen reference (``postrl dpo``)."""
    return _call("dpo", config, kwargs)


def loop(
    config: Any = None,
    /,
    *,
    out: str | os.PathLike[str],
    resume: bool = False,
    overwrite: bool = False,
    **overrides: Any,
) -> dict[str, Any]:
    """The preference loop (``postrl loop``): rounds of sample pairs → label → reward model → policy update;
    returns its summary (``summary["rounds"]``: the report of every round)."""
    from postrl.feedback.config import LoopConfig
    from postrl.feedback.rounds import run_loop  # deferred: torch
    from postrl.runtime.config import load_config

    path = config if isinstance(config, (str, os.PathLike)) else None
    base = plain(config) if isinstance(config, Mapping) else None
    cfg = apply_overrides(LoopConfig, load_config(LoopConfig, path, base=base), overrides)
    return run_loop(cfg, out, run_stage, resume=resume, overwrite=overwrite)


def __getattr__(name: str) -> Callable[..., Result]:
    """Any other stage of the command's table (e.g. one a later issue adds) as ``postrl.api.<name>``."""
    if name in stages():
        spec = get_stage(name)

        def stage(config: Any = None, /, **kwargs: Any) -> Result:
            return run_stage(spec.name, config, **kwargs)

        stage.__name__ = stage.__qualname__ = name
        stage.__doc__ = f"{spec.help[0].upper()}{spec.help[1:]} (``postrl {spec.name}``)."
        return stage
    raise AttributeError(f"module 'postrl.api' has no attribute {name!r}")
