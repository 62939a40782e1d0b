"""The LM training stages: one registry that the command line, the Python API and the demo all read.

A `Stage` names what a stage is made of: its config class, its run function (``run(cfg, run_dir, resume,
overwrite) -> summary``), the kind of rows its ``data`` holds, its help line and its command-line flags. Adding a
stage is one entry here: ``postrl <name>`` and ``postrl.<name>`` (``-`` as ``_``) follow with no further code.

Nothing here imports torch: a stage's module is imported when its config class or run function is asked for,
so ``postrl --help`` stays instant.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from postrl.runtime.errors import UserError

MODEL_AND_DATA = {"--model": "model", "--data": "data"}


@dataclass(frozen=True)
class Stage:
    """One training stage of the registry."""

    name: str
    """The command's name: ``postrl <name>``; in Python ``postrl.<python_name>``."""
    module: str
    """The module that holds the config class and the run function (imported on first use)."""
    config_name: str
    """The config dataclass's name in ``module``."""
    run_name: str
    """The run function's name in ``module``: ``run(cfg, run_dir, resume=False, overwrite=False) -> dict``."""
    help: str
    """One line: what the stage does (the command's help)."""
    data_kind: str | None = None
    """The kind of rows its ``data`` holds (`postrl.lm.data.load_rows`): sft, prefs, prompts, kto; None: none."""
    flags: Mapping[str, str] = field(default_factory=dict)
    """Command-line flags and the config keys they set (``{"--model": "model"}``)."""

    @property
    def python_name(self) -> str:
        """The Python API's name: ``postrl.vlm_pretrain`` for ``postrl vlm-pretrain``."""
        return self.name.replace("-", "_")

    def config_class(self) -> type:
        """The stage's config dataclass (imports its module)."""
        return getattr(importlib.import_module(self.module), self.config_name)

    def run_function(self) -> Callable[..., dict[str, Any]]:
        """The stage's run function (imports its module, and with it torch)."""
        return getattr(importlib.import_module(self.module), self.run_name)

    def load_data(self, source: str, split: str = "train") -> list[dict[str, Any]]:
        """The validated rows of ``source`` for this stage (as its run reads them, before tokenising)."""
        if self.data_kind is None:
            raise UserError(f"postrl {self.name} reads no data")
        from postrl.lm.data import load_rows  # deferred: torch

        return load_rows(source, self.data_kind, split)


STAGES: dict[str, Stage] = {
    s.name: s
    for s in (
        Stage(
            "pretrain", "postrl.lm.pretrain", "PretrainConfig", "run_pretrain",
            "pretrain the built-in tiny LM (and its tokenizer) on the generated corpus",
        ),
        Stage(
            "sft", "postrl.lm.sft", "SFTConfig", "run_sft",
            "supervised fine-tuning on prompt/completion data (loss on completions only)", "sft", MODEL_AND_DATA,
        ),
        Stage(
            "rm", "postrl.lm.reward_model", "RMConfig", "run_rm",
            "train a reward model on preference pairs (Bradley-Terry), with SFT-sample score statistics",
            "prefs", MODEL_AND_DATA,
        ),
        Stage(
            "ppo", "postrl.lm.ppo", "PPOConfig", "run_ppo",
            "PPO-based RLHF: actor, critic, frozen reward model and frozen reference (--env: over episodes)",
            "prompts", {**MODEL_AND_DATA, "--reward-model": "reward_model", "--env": "env.id"},
        ),
        Stage(
            "grpo", "postrl.lm.grpo", "GRPOConfig", "run_grpo",
            "GRPO: G sampled responses per prompt, the group's rewards as the baseline, no critic",
            "prompts", {**MODEL_AND_DATA, "--env": "env.id"},
        ),
        Stage(
            "vlm-pretrain", "postrl.lm.vlm.train", "VLMPretrainConfig", "run_vlm_pretrain",
            "build the built-in tiny vision-language model and align it on captions of the shapes pictures",
        ),
        Stage(
            "dpo", "postrl.lm.dpo", "DPOConfig", "run_dpo",
            "DPO/IPO on preference pairs: the policy's log-ratio to a frozen reference as the implicit reward",
            "prefs", MODEL_AND_DATA,
        ),
        Stage(
            "kto", "postrl.lm.kto", "KTOConfig", "run_kto",
            "KTO on unpaired desirable/undesirable responses: the implicit reward against the policy's KL",
            "kto", MODEL_AND_DATA,
        ),
        Stage(
            "online-dpo", "postrl.lm.online_dpo", "OnlineDPOConfig", "run_online_dpo",
            "online DPO: two samples per prompt from the current policy, labelled by a judge, DPO's loss",
            "prompts", {**MODEL_AND_DATA, "--judge": "judge"},
        ),
    )
}  # fmt: skip


def get_stage(name: str) -> Stage:
    """The stage of ``name``, its command's name or its Python name; an unknown name is a `UserError`."""
    for stage in STAGES.values():
        if name in (stage.name, stage.python_name):
            return stage
    raise UserError(
        f"unknown stage {name!r}; the stages: {', '.join(s.python_name for s in STAGES.values())}"
    )
