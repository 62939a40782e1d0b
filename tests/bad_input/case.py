"""The `Case` type of the bad-input table, each command's valid tiny command line (`FLAGS`) and budget
(`BUDGETS`), and the shared pieces of case templates.

Each `Case` is one command line that a user could type with one mistake in it. The promise it checks
(issue text): every command resolves its config, opens and checks its data, model, tokenizer and reward
functions, and checks numeric ranges *before* it creates or writes into the run folder; a bad input is one
line ``postrl: error: …`` naming what is at fault, exit status 2, no traceback, every file untouched.

Command lines are templates: ``{ws}`` is the workspace (tiny models, data files, reward files, configs),
``{model}`` a tiny Llama with its tokenizer, ``{model_notok}`` the same without a tokenizer, ``{rm}`` a tiny
reward model, and ``{out}`` a copy of a run folder of the command (finished, interrupted with a corrupt
checkpoint, or a folder that is not a run). Every case carries the command's tiny budget, so that a case the
code fails to refuse still ends in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

D, R = "{ws}/data/", "{ws}/rewards/"  # data files and reward-function files

# ---- the tiny budget of every command (a case's overrides replace these keys) ----------------------------
LM = {"run.device": "cpu", "run.threads": 1}
TRAIN = {
    "run.steps": 1,
    "run.eval_every": 0,
    "train.batch_size": 2,
    "train.eval_examples": 2,
    "optim.warmup_steps": 0,
}
FIT = 64  # train.max_length of SFT and RM: the tiny model has 128 positions, the default is 1024
BUDGETS: dict[str, dict[str, Any]] = {
    "control train": {
        "env.n_envs": 1,
        "ppo.n_steps": 64,
        "ppo.batch_size": 64,
        "ppo.epochs": 1,
        "run.eval_episodes": 1,
    },
    "control prefs": {"env.n_envs": 1, "run.eval_episodes": 1},
    "control eval": {},
    "pretrain": {
        "model.n_layers": 1,
        "model.hidden_size": 32,
        "model.n_heads": 2,
        "model.intermediate_size": 64,
        "model.max_position_embeddings": 128,
        "vocab_size": 300,
        "corpus_lines": 400,
        **TRAIN,
        **LM,
    },
    "sft": {**TRAIN, "train.max_length": FIT, "eval_size": 2, **LM},
    "rm": {**TRAIN, "train.max_length": FIT, "eval_size": 2, "norm.samples": 0, "plots": False, **LM},
    "ppo": {
        "data": D + "prompts.jsonl",
        "run.steps": 1,
        "run.eval_every": 0,
        "batch_size": 2,
        "ppo.epochs": 1,
        "ppo.minibatches": 1,
        "max_prompt_length": 32,
        "sampling.max_new_tokens": 4,
        "eval_size": 2,
        "reward.normalize": "none",
        "optim.warmup_steps": 0,
        "critic_optim.warmup_steps": 0,
        "plots": False,
        **LM,
    },
    "grpo": {
        "rewards": "[" + R + "good.py:reward]",
        "run.steps": 1,
        "run.eval_every": 0,
        "grpo.group_size": 2,
        "grpo.prompts_per_step": 2,
        "sampling.max_new_tokens": 4,
        "max_prompt_length": 32,
        "eval_size": 2,
        "eval_at_start": False,
        "optim.warmup_steps": 0,
        **LM,
    },
    "dpo": {
        **TRAIN,
        "train.max_length": FIT,
        "eval_size": 2,
        "eval_samples": 2,
        "sampling.max_new_tokens": 4,
        "plots": False,
        **LM,
    },
    "kto": {
        **TRAIN,
        "train.max_length": FIT,
        "eval_size": 2,
        "eval_samples": 2,
        "sampling.max_new_tokens": 4,
        "plots": False,
        **LM,
    },
    "control bench": {"env.n_envs": 1, "ppo.n_steps": 64, "ppo.batch_size": 64, "ppo.epochs": 1},
    "demo": {
        "from_scratch": True,  # the pretrain.* budgets below apply only then (else: the built-in base model)
        "compare_sft": False,
        "eval_prompts": 2,
        "eval_samples": 2,
        "threads": 1,
        "pretrain.corpus_lines": 400,
        "pretrain.vocab_size": 300,
        "pretrain.run.steps": 1,
        "sft.run.steps": 1,
        "rm.run.steps": 1,
        "rm.norm.samples": 0,
        "ppo.run.steps": 1,
        "grpo.run.steps": 1,
    },
}

# flags of a valid command line (a case's flags replace these; None removes one, True is a bare flag)
FLAGS: dict[str, dict[str, Any]] = {
    "control train": {"--algo": "ppo", "--env": "CartPole-v1", "--total-steps": "64", "--out": "{out}"},
    "control prefs": {"--env": "CartPole-v1", "--total-steps": "64", "--out": "{out}"},
    "control eval": {"--episodes": "1"},
    "pretrain": {"--out": "{out}"},
    "sft": {"--model": "{model}", "--data": D + "sft.jsonl", "--out": "{out}"},
    "rm": {"--model": "{model}", "--data": D + "prefs.jsonl", "--out": "{out}"},
    "ppo": {"--model": "{model}", "--reward-model": "{rm}", "--out": "{out}"},
    "grpo": {"--model": "{model}", "--data": D + "prompts.jsonl", "--out": "{out}"},
    "dpo": {"--model": "{model}", "--data": D + "prefs.jsonl", "--out": "{out}"},
    "kto": {"--model": "{model}", "--data": D + "kto.jsonl", "--out": "{out}"},
    "control bench": {"--config": "ppo-cartpole", "--seeds": "0", "--workers": "1", "--out": "{out}"},
    "demo": {"--quick": True, "--out": "{out}"},
}
COMMANDS = tuple(c for c in FLAGS if c not in ("control eval", "control bench"))
"""The commands that leave a run folder (each has a finished run in the workspace)."""


@dataclass(frozen=True)
class Case:
    """One bad command line and what its one-line error must contain."""

    id: str
    cmd: str
    expect: tuple[str | tuple[str, ...], ...]
    """Substrings of the error line; a tuple is a set of alternatives (one of them must appear)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    flags: dict[str, Any] = field(default_factory=dict)
    positional: tuple[str, ...] = ()
    out: str = "finished"
    """The run folder --out points at (`tests.bad_input.workspace`): finished, interrupted (corrupt checkpoint
    only), damaged (finished, every checkpoint corrupt), a run of the command named in `RUN_KINDS`, notarun,
    or none (a folder that does not exist yet)."""
    resume: bool = False
    """Resume the run folder (LM stages: --resume --out DIR; control: --resume DIR), no budget or flags."""
    overwrite: bool = True
    """Also run the case with --overwrite appended."""
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, ws: Path, out: Path, overwrite: bool = False) -> list[str]:
        """The command line with the templates filled in."""
        fill = {
            "ws": str(ws),
            "model": str(ws / "model"),
            "model_notok": str(ws / "model_notok"),
            "rm": str(ws / "rm"),
            "out": str(out),
        }
        argv = [*self.cmd.split(), *self.positional]
        if self.resume:
            flags: dict[str, Any] = {"--out": "{out}", "--resume": True}
            if self.cmd.startswith("control"):
                flags = {"--resume": "{out}"}
            overrides: dict[str, Any] = dict(self.overrides)
        else:
            flags = {**FLAGS[self.cmd], **self.flags}
            overrides = {**BUDGETS[self.cmd], **self.overrides}
        for flag, value in flags.items():
            if value is True:
                argv.append(flag)
            elif value is not None:
                argv += [flag, value]
        argv += [f"{key}={_yaml(value)}" for key, value in overrides.items()]
        if overwrite:
            argv.append("--overwrite")
        return [arg.format(**fill) for arg in argv]


def _yaml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def C(id: str, cmd: str, *expect: str | tuple[str, ...], **kw: Any) -> Case:  # noqa: N802
    return Case(id, cmd, tuple(expect), **kw)


CT, PT = "control train", "pretrain"
FINISHED = ("finished", "--resume", "--overwrite")
CONTEXT = ("max_position_embeddings", "128")
LONG = {"train.max_length": 200, "train.overlong": "error"}  # above the tiny model's 128 positions
LONG_SFT, LONG_PREFS = {"--data": D + "sft_long.jsonl"}, {"--data": D + "prefs_long.jsonl"}
