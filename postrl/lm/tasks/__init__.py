"""Built-in tasks: small generated worlds with prompts, demonstrations, rewards and a hidden gold reward.

task = get_task("arithmetic", digits=2, ops="+-")
task.prompts("train"); task.sft_rows("test"); task.reward_fn(prompts=..., completions=..., answer=[...])
"""

from __future__ import annotations

from typing import Any

from postrl.lm.tasks.arithmetic import ArithmeticConfig, ArithmeticTask, is_correct, parse_last_number
from postrl.lm.tasks.base import KINDS, SPLITS, Task, TaskError, build_config
from postrl.lm.tasks.corpus import build_corpus
from postrl.lm.tasks.labeller import LabellerConfig, SyntheticLabeller
from postrl.lm.tasks.reviews import ReviewsConfig, ReviewsTask
from postrl.lm.tasks.shapes import ShapesConfig, ShapesTask

TASKS: dict[str, tuple[type[Task], type]] = {
    "arithmetic": (ArithmeticTask, ArithmeticConfig),
    "reviews": (ReviewsTask, ReviewsConfig),
    "shapes": (ShapesTask, ShapesConfig),
}


def list_tasks() -> list[str]:
    """Names of the built-in tasks."""
    return sorted(TASKS)


def get_task(name: str, **kwargs: Any) -> Task:
    """The task ``name`` built with config options ``kwargs`` (an unknown name or option raises `TaskError`)."""
    if name not in TASKS:
        raise TaskError(f"unknown task {name!r}; available: {', '.join(list_tasks())}")
    task_cls, config_cls = TASKS[name]
    config = build_config(config_cls, kwargs, f"{name}.")
    try:
        return task_cls(config)
    except ValueError as err:  # a combination of options the task refuses (its own checks)
        raise TaskError(f"task {name}: {err}") from None


__all__ = [
    "KINDS",
    "SPLITS",
    "TASKS",
    "ArithmeticConfig",
    "ArithmeticTask",
    "LabellerConfig",
    "ReviewsConfig",
    "ReviewsTask",
    "ShapesConfig",
    "ShapesTask",
    "SyntheticLabeller",
    "Task",
    "TaskError",
    "build_corpus",
    "get_task",
    "is_correct",
    "list_tasks",
    "parse_last_number",
]
