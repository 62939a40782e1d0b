"""postrl: reinforcement learning from policy gradients to LLM post-training.

From Python, one function per training stage (the twins of the ``postrl`` commands, `postrl.api`)::

    import postrl

    result = postrl.grpo("grpo-arithmetic", model="runs/sft/model", out="runs/grpo", rewards=[reward_len])
    print(result.summary, result.model_path)

``postrl.pretrain``, ``postrl.sft``, ``postrl.rm``, ``postrl.ppo``, ``postrl.grpo`` (and any stage the command
has), ``postrl.Result``, ``postrl.UserError``; Gymnasium control the Stable-Baselines3 way in `postrl.control`
(``train``, ``load``, ``evaluate``). Every name loads on first use, so ``import postrl`` imports no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_SUBPACKAGES = ("api", "control", "core", "lm", "runtime", "cli", "demo")


def __getattr__(name: str) -> Any:
    """``postrl.sft`` and the other stages, ``Result``, ``UserError``: from `postrl.api`, on first use."""
    if name in _SUBPACKAGES:
        return importlib.import_module(f"postrl.{name}")
    if name.startswith("__"):
        raise AttributeError(name)
    api = importlib.import_module("postrl.api")  # cheap: the stage table and the config loader, no torch
    if name in api.__all__ or name in api.stages():
        return getattr(api, name)
    raise AttributeError(f"module 'postrl' has no attribute {name!r}")


def __dir__() -> list[str]:
    api = importlib.import_module("postrl.api")
    return sorted({*globals(), *_SUBPACKAGES, *api.__all__, *api.stages()})
