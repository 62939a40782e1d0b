"""The table of bad inputs for `tests/test_bad_input.py`, and the workspace they point into.

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

import json
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

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
    "demo": {"--quick": True, "--out": "{out}"},
}
COMMANDS = tuple(c for c in FLAGS if c != "control eval")


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
    """The run folder --out points at: finished, interrupted (corrupt checkpoint only) or notarun."""
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

CASES: list[Case] = [
    # ---- control train: ranges, keys, types, the env id, the config file, a corrupt checkpoint -----------
    C("ct-batch-size-0", CT, "ppo.batch_size", overrides={"ppo.batch_size": 0}),
    C("ct-lr-negative", CT, "ppo.lr", overrides={"ppo.lr": -0.001}),
    C("ct-lr-nan", CT, "ppo.lr", overrides={"ppo.lr": "nan"}),
    C("ct-gamma-above-1", CT, "ppo.gamma", overrides={"ppo.gamma": 1.5}),
    C("ct-lam-negative", CT, "ppo.lam", overrides={"ppo.lam": -0.1}),
    C("ct-clip-eps-0", CT, "ppo.clip_eps", overrides={"ppo.clip_eps": 0}),
    C("ct-n-envs-0", CT, "env.n_envs", overrides={"env.n_envs": 0}),
    C("ct-total-steps-0", CT, ("run.steps", "--total-steps"), flags={"--total-steps": "0"}),
    C("ct-unknown-key", CT, "ppo.clip_epss", "ppo.clip_eps", overrides={"ppo.clip_epss": 0.1}),
    C("ct-wrong-type", CT, "ppo.epochs", "four", overrides={"ppo.epochs": "four"}),
    C("ct-unknown-env", CT, "CartPol-v1", "CartPole-v1", flags={"--env": "CartPol-v1"}),
    C("ct-missing-config-file", CT, "no_such.yaml", flags={"--config": "{ws}/configs/no_such.yaml"}),
    C(
        "ct-config-unknown-key",
        CT,
        "clip_epss",
        "ct_unknown_key.yaml",
        flags={"--config": "{ws}/configs/ct_unknown_key.yaml"},
    ),
    C("ct-lr-inf", CT, "ppo.lr", "inf", "finite", overrides={"ppo.lr": "inf"}),
    C("ct-activation", CT, "policy.activation", "gelu", "tanh", overrides={"policy.activation": "gelu"}),
    C("ct-discrete-obs", CT, "FrozenLake-v1", "Discrete(16)", "one-hot", flags={"--env": "FrozenLake-v1"}),
    C("ct-tuple-obs", CT, "Blackjack-v1", "Tuple(", flags={"--env": "Blackjack-v1"}),
    C(
        "ct-env-kwarg-value",
        CT,
        "env.kwargs",
        "max_episode_steps",
        overrides={"env.kwargs": "{{max_episode_steps: -5}}"},
    ),
    C("ct-config-not-utf8", CT, "not_utf8.yaml", "UTF-8", flags={"--config": "{ws}/configs/not_utf8.yaml"}),
    C(
        "ct-config-bad-yaml",
        CT,
        "broken.yaml:3:1",
        "starts at line 2",
        "invalid YAML",
        flags={"--config": "{ws}/configs/broken.yaml"},
    ),
    C("ct-config-directory", CT, "is a directory", flags={"--config": "{ws}/configs"}),
    C("ct-resume-corrupt-checkpoint", CT, "step_00000001", out="interrupted", resume=True, overwrite=False),
    # ---- control prefs and control eval -------------------------------------------------------------------
    C("prefs-noise-above-1", "control prefs", ("labeller.flip_prob", "--noise"), flags={"--noise": "1.5"}),
    C("prefs-unknown-key", "control prefs", "prefs.label_budgt", overrides={"prefs.label_budgt": 10}),
    C("eval-not-a-run", "control eval", "{out}", positional=("{out}",), out="notarun", overwrite=False),
    C(
        "eval-no-such-folder",
        "control eval",
        "no_such_run",
        positional=("{ws}/no_such_run",),
        out="notarun",
        overwrite=False,
    ),
    # ---- pretrain ---------------------------------------------------------------------------------------
    C("pretrain-batch-size-0", PT, "train.batch_size", overrides={"train.batch_size": 0}),
    C("pretrain-lr-0", PT, "optim.lr", overrides={"optim.lr": 0}),
    C("pretrain-steps-negative", PT, "run.steps", overrides={"run.steps": -5}),
    C("pretrain-warmup-negative", PT, "optim.warmup_steps", overrides={"optim.warmup_steps": -1}),
    C(
        "pretrain-max-length-over-context",
        PT,
        "train.max_length",
        CONTEXT,
        overrides={"train.max_length": 200},
    ),
    C("pretrain-unknown-key", PT, "model.n_layer", "model.n_layers", overrides={"model.n_layer": 2}),
    C("pretrain-wrong-type", PT, "train.batch_size", "abc", overrides={"train.batch_size": "abc"}),
    C("pretrain-missing-config-file", PT, "no_such.yaml", flags={"--config": "{ws}/configs/no_such.yaml"}),
    C(
        "pretrain-resume-corrupt-checkpoint",
        PT,
        "step_00000001",
        out="interrupted",
        resume=True,
        overwrite=False,
    ),
    # ---- sft: model, tokenizer, hub name, dtype, every data error, ranges -------------------------------------
    C("sft-model-missing", "sft", "no_such_model", flags={"--model": "{ws}/no_such_model"}),
    C("sft-model-without-tokenizer", "sft", "model_notok", "tokenizer", flags={"--model": "{model_notok}"}),
    C(
        "sft-hub-name-offline",
        "sft",
        "postrl-test/no-such-model",
        "HF_HUB_OFFLINE",
        flags={"--model": "postrl-test/no-such-model"},
        env={"HF_HUB_OFFLINE": "1"},
    ),
    C("sft-unknown-dtype", "sft", "run.dtype", "float8", "bfloat16", overrides={"run.dtype": "float8"}),
    C("sft-data-missing-file", "sft", "no_such.jsonl", flags={"--data": D + "no_such.jsonl"}),
    C("sft-data-malformed-json", "sft", "sft_bad_json.jsonl:3", flags={"--data": D + "sft_bad_json.jsonl"}),
    C(
        "sft-data-missing-column",
        "sft",
        "sft_no_completion.jsonl:2",
        "completion",
        flags={"--data": D + "sft_no_completion.jsonl"},
    ),
    C(
        "sft-data-empty-prompt",
        "sft",
        "sft_empty_prompt.jsonl:2",
        "prompt",
        flags={"--data": D + "sft_empty_prompt.jsonl"},
    ),
    C(
        "sft-data-empty-completion",
        "sft",
        "sft_empty_completion.jsonl:4",
        "completion",
        flags={"--data": D + "sft_empty_completion.jsonl"},
    ),
    C("sft-data-empty-file", "sft", "empty.jsonl", flags={"--data": D + "empty.jsonl"}),
    C(
        "sft-data-bad-record-at-line-500",
        "sft",
        "sft_late_bad.jsonl:500",
        "prompt",
        flags={"--data": D + "sft_late_bad.jsonl"},
    ),
    C("sft-data-prefs-rows", "sft", "prefs.jsonl:1", "completion", flags={"--data": D + "prefs.jsonl"}),
    C(
        "sft-eval-data-malformed-json",
        "sft",
        "sft_bad_json.jsonl:3",
        overrides={"eval_data": D + "sft_bad_json.jsonl"},
    ),
    C("sft-batch-size-0", "sft", "train.batch_size", overrides={"train.batch_size": 0}),
    C("sft-lr-inf", "sft", "optim.lr", "inf", overrides={"optim.lr": "inf"}),
    C("sft-betas-one-value", "sft", "optim.betas", "expected 2 values", overrides={"optim.betas": "[0.9]"}),
    C("sft-device-unknown", "sft", "run.device", "gpu", overrides={"run.device": "gpu"}),
    C("sft-override-below-a-scalar", "sft", "run.steps", overrides={"run.steps.x": 1}),
    C(
        "sft-task-option-type",
        "sft",
        "arithmetic.digits",
        "abc",
        flags={"--data": "task:arithmetic"},
        overrides={"task.digits": "abc"},
    ),  # fmt: skip
    C(
        "sft-task-option-range",
        "sft",
        "n_train",
        ">= 1",
        flags={"--data": "task:arithmetic"},
        overrides={"task.n_train": -5},
    ),  # fmt: skip
    C(
        "sft-task-options-not-a-mapping",
        "sft",
        "task.arithmetic",
        "mapping",
        flags={"--data": "task:arithmetic,task:reviews"},
        overrides={"task.arithmetic": 5},
    ),  # fmt: skip
    C(
        "sft-lora-bad-regex",
        "sft",
        "run.lora.target_modules",
        overrides={"run.lora.enabled": True, "run.lora.target_modules": "'(['"},
    ),  # fmt: skip
    C("sft-config-int-key", "sft", "config key 1", flags={"--config": "{ws}/configs/int_key.yaml"}),
    C(
        "sft-config-duplicate-key",
        "sft",
        "dup_key.yaml:3",
        "given twice",
        flags={"--config": "{ws}/configs/dup_key.yaml"},
    ),
    C(
        "sft-out-under-a-file",
        "sft",
        "is a file, not a folder",
        flags={"--out": "{ws}/data/sft.jsonl/run"},
        overwrite=False,
    ),
    C(
        "pretrain-heads",
        PT,
        "hidden_size",
        "n_heads",
        overrides={"model.hidden_size": 32, "model.n_heads": 3},
    ),
    C("sft-lr-nan", "sft", "optim.lr", overrides={"optim.lr": "nan"}),
    C("sft-grad-accum-0", "sft", "train.grad_accum", overrides={"train.grad_accum": 0}),
    # #41 item 14: train.max_length above the context is a ceiling clipped to it (TRL's), no longer an error;
    # a row that needs more than the model's 128 positions is, under train.overlong=error
    C("sft-row-over-context", "sft", "longer than 128 tokens", "overlong", overrides=LONG, flags=LONG_SFT),
    C("sft-unknown-key", "sft", "train.batchsize", "train.batch_size", overrides={"train.batchsize": 2}),
    C(
        "sft-config-wrong-type",
        "sft",
        "run.log_every",
        "sft_wrong_type.yaml",
        flags={"--config": "{ws}/configs/sft_wrong_type.yaml"},
    ),
    C("sft-missing-config-file", "sft", "no_such.yaml", flags={"--config": "{ws}/configs/no_such.yaml"}),
    C(
        "sft-resume-corrupt-checkpoint",
        "sft",
        "step_00000001",
        out="interrupted",
        resume=True,
        overwrite=False,
    ),
    # ---- rm -----------------------------------------------------------------------------------------------
    C("rm-data-sft-rows", "rm", "sft.jsonl:1", "chosen", flags={"--data": D + "sft.jsonl"}),
    C(
        "rm-data-missing-rejected",
        "rm",
        "prefs_no_rejected.jsonl:2",
        "rejected",
        flags={"--data": D + "prefs_no_rejected.jsonl"},
    ),
    C(
        "rm-data-target-above-1",
        "rm",
        "prefs_bad_target.jsonl:3",
        "target",
        flags={"--data": D + "prefs_bad_target.jsonl"},
    ),
    C(
        "rm-data-empty-chosen",
        "rm",
        "prefs_empty_chosen.jsonl:2",
        "chosen",
        flags={"--data": D + "prefs_empty_chosen.jsonl"},
    ),
    C("rm-model-missing", "rm", "no_such_model", flags={"--model": "{ws}/no_such_model"}),
    C("rm-batch-size-0", "rm", "train.batch_size", overrides={"train.batch_size": 0}),
    C("rm-norm-samples-negative", "rm", "norm.samples", overrides={"norm.samples": -1}),
    C("rm-unknown-dtype", "rm", "run.dtype", "float8", overrides={"run.dtype": "float8"}),
    C("rm-resume-corrupt-checkpoint", "rm", "step_00000001", out="interrupted", resume=True, overwrite=False),
    # ---- ppo (RLHF) -----------------------------------------------------------------------------------------
    C("ppo-kl-beta-negative", "ppo", "kl.beta", overrides={"kl.beta": -0.1}),
    C("ppo-gamma-above-1", "ppo", "gae.gamma", overrides={"gae.gamma": 1.1}),
    C("ppo-lam-negative", "ppo", "gae.lam", overrides={"gae.lam": -0.5}),
    C("ppo-clip-eps-0", "ppo", "ppo.clip_eps", overrides={"ppo.clip_eps": 0}),
    C("ppo-batch-size-0", "ppo", "batch_size", overrides={"batch_size": 0}),
    C("ppo-steps-0", "ppo", "run.steps", overrides={"run.steps": 0}),
    C("ppo-actor-lr-negative", "ppo", "optim.lr", overrides={"optim.lr": -1e-4}),
    C(
        "ppo-max-new-tokens-over-context",  # #41 item 14: 120 now clips the prompts' ceiling; 128 fills it
        "ppo",
        "sampling.max_new_tokens",
        CONTEXT,
        overrides={"sampling.max_new_tokens": 128},
    ),
    C("ppo-reward-model-missing", "ppo", "no_such_rm", flags={"--reward-model": "{ws}/no_such_rm"}),
    C(
        "ppo-reward-fn-syntax-error",
        "ppo",
        "syntax_error.py",
        overrides={"rewards": "[" + R + "syntax_error.py:reward]", "critic": "sft"},
    ),
    C(
        "ppo-reward-fn-wrong-signature",
        "ppo",
        "wrong_sig.py",
        "completions",
        overrides={"rewards": "[" + R + "wrong_sig.py:r]", "critic": "sft"},
    ),
    C(
        "ppo-data-missing-prompt",
        "ppo",
        "prompts_no_prompt.jsonl:1",
        "prompt",
        overrides={"data": D + "prompts_no_prompt.jsonl"},
    ),
    C("ppo-unknown-critic", "ppo", "critic", "reward_model", overrides={"critic": "value_head"}),
    C("ppo-unknown-dtype", "ppo", "run.dtype", "float8", overrides={"run.dtype": "float8"}),
    # ---- grpo ---------------------------------------------------------------------------------------------
    C("grpo-group-size-1", "grpo", "grpo.group_size", overrides={"grpo.group_size": 1}),
    C("grpo-beta-negative", "grpo", "grpo.beta", overrides={"grpo.beta": -0.04}),
    C("grpo-clip-eps-negative", "grpo", "grpo.clip_eps", overrides={"grpo.clip_eps": -0.2}),
    C("grpo-lr-0", "grpo", "optim.lr", overrides={"optim.lr": 0}),
    C("grpo-steps-0", "grpo", "run.steps", overrides={"run.steps": 0}),
    C("grpo-prompts-per-step-0", "grpo", "grpo.prompts_per_step", overrides={"grpo.prompts_per_step": 0}),
    C("grpo-temperature-negative", "grpo", "sampling.temperature", overrides={"sampling.temperature": -1.0}),
    C("grpo-top-p-above-1", "grpo", "sampling.top_p", overrides={"sampling.top_p": 1.5}),
    C(
        "grpo-prompt-plus-new-tokens-over-context",  # #41 item 14: 100 + 64 now clips max_prompt_length to 64
        "grpo",
        "max_prompt_length",
        "sampling.max_new_tokens",
        CONTEXT,
        overrides={"max_prompt_length": 100, "sampling.max_new_tokens": 128},
    ),
    C("grpo-unknown-dtype", "grpo", "run.dtype", "fp8", overrides={"run.dtype": "fp8"}),
    C(
        "grpo-hub-name-offline",
        "grpo",
        "postrl-test/no-such-model",
        "HF_HUB_OFFLINE",
        flags={"--model": "postrl-test/no-such-model"},
        env={"HF_HUB_OFFLINE": "1"},
    ),
    C(
        "grpo-reward-syntax-error",
        "grpo",
        "syntax_error.py",
        overrides={"rewards": "[" + R + "syntax_error.py:reward]"},
    ),
    C(
        "grpo-reward-file-imports-missing-module",
        "grpo",
        "imports_missing.py",
        "postrl_no_such_module",
        overrides={"rewards": "[" + R + "imports_missing.py:reward]"},
    ),
    C(
        "grpo-reward-no-such-module",
        "grpo",
        "postrl_no_such_module",
        overrides={"rewards": "[postrl_no_such_module:reward]"},
    ),
    C(
        "grpo-reward-missing-function",
        "grpo",
        "good.py",
        "nope",
        overrides={"rewards": "[" + R + "good.py:nope]"},
    ),
    C(
        "grpo-reward-wrong-signature",
        "grpo",
        "wrong_sig.py",
        "completions",
        overrides={"rewards": "[" + R + "wrong_sig.py:r]"},
    ),
    C(
        "grpo-reward-not-callable",
        "grpo",
        "not_callable.py",
        "reward",
        overrides={"rewards": "[" + R + "not_callable.py:reward]"},
    ),
    C("grpo-reward-weights-mismatch", "grpo", "reward_weights", overrides={"reward_weights": "[1.0, 2.0]"}),
    C(
        "grpo-data-malformed-json",
        "grpo",
        "prompts_bad_json.jsonl:2",
        flags={"--data": D + "prompts_bad_json.jsonl"},
    ),
    C(
        "grpo-data-empty-prompt",
        "grpo",
        "prompts_empty_prompt.jsonl:3",
        "prompt",
        flags={"--data": D + "prompts_empty_prompt.jsonl"},
    ),
    C(
        "grpo-config-out-of-range",
        "grpo",
        "grpo.clip_eps",
        "grpo_bad_range.yaml",
        flags={"--config": "{ws}/configs/grpo_bad_range.yaml"},
    ),
    C(
        "grpo-resume-corrupt-checkpoint",
        "grpo",
        "step_00000001",
        out="interrupted",
        resume=True,
        overwrite=False,
        overrides={"rewards": "[" + R + "good.py:reward]"},  # named again (#41 item 9), as a resume must
    ),
    # ---- dpo ----------------------------------------------------------------------------------------------
    C("dpo-beta-0", "dpo", "dpo.beta", overrides={"dpo.beta": 0}),
    C("dpo-unknown-loss-type", "dpo", "dpo.loss_type", "hinge", overrides={"dpo.loss_type": "hinge"}),
    C("dpo-old-beta", "dpo", "'beta'", "'dpo.beta'", overrides={"beta": 0.1}),
    C("dpo-data-sft-rows", "dpo", "sft.jsonl:1", "chosen", flags={"--data": D + "sft.jsonl"}),
    C(
        "dpo-data-target-above-1",
        "dpo",
        "prefs_bad_target.jsonl:3",
        "target",
        flags={"--data": D + "prefs_bad_target.jsonl"},
    ),
    C("dpo-model-missing", "dpo", "no_such_model", flags={"--model": "{ws}/no_such_model"}),
    C("dpo-ref-model-missing", "dpo", "no_such_ref", overrides={"ref_model": "{ws}/no_such_ref"}),
    C("dpo-reward-model-missing", "dpo", "no_such_rm", overrides={"reward_model": "{ws}/no_such_rm"}),
    C("dpo-pair-over-context", "dpo", "longer than 128 tokens", "overlong", overrides=LONG, flags=LONG_PREFS),
    C(
        "dpo-resume-corrupt-checkpoint",
        "dpo",
        "step_00000001",
        out="interrupted",
        resume=True,
        overwrite=False,
    ),
    # ---- demo ---------------------------------------------------------------------------------------------
    C("demo-unknown-key", "demo", "pretrain.train.batchsize", overrides={"pretrain.train.batchsize": 2}),
    C("demo-sft-lr-negative", "demo", "sft.optim.lr", overrides={"sft.optim.lr": -1}),
    C("demo-grpo-group-size-1", "demo", "grpo.grpo.group_size", overrides={"grpo.grpo.group_size": 1}),
    C("demo-ppo-kl-beta-negative", "demo", "ppo.kl.beta", overrides={"ppo.kl.beta": -0.1}),
    C("demo-missing-config-file", "demo", "no_such.yaml", flags={"--config": "{ws}/configs/no_such.yaml"}),
    # ---- an old key name (the config vocabulary was renamed): the error names the new one ------------------
    C("ct-old-total-steps", CT, "'run.total_steps'", "'run.steps'", overrides={"run.total_steps": 64}),
    C("ct-old-n-epochs", CT, "'ppo.n_epochs'", "'ppo.epochs'", overrides={"ppo.n_epochs": 1}),
    C("ct-old-clip-vf", CT, "'ppo.clip_vf'", "'ppo.vf_clip'", overrides={"ppo.clip_vf": 0.2}),
    C(
        "ct-old-key-in-config-file",
        CT,
        "'run.keep_checkpoints'",
        "'run.keep_last'",
        "ct_old_key.yaml",
        flags={"--config": "{ws}/configs/ct_old_key.yaml"},
    ),
    C(
        "prefs-old-checkpoint-every",
        "control prefs",
        "'run.checkpoint_every'",
        "'run.save_every'",
        overrides={"run.checkpoint_every": 1},
    ),
    C("pretrain-old-max-steps", PT, "'train.max_steps'", "'run.steps'", overrides={"train.max_steps": 5}),
    C("sft-old-max-steps", "sft", "'train.max_steps'", "'run.steps'", overrides={"train.max_steps": 5}),
    C("sft-old-train-optim", "sft", "'train.optim'", "'optim'", overrides={"train.optim.lr": 1e-3}),
    C("sft-old-eval-prompts", "sft", "'eval_prompts'", "'eval_size'", overrides={"eval_prompts": 2}),
    C("sft-old-device", "sft", "'device'", "'run.device'", overrides={"device": "cpu"}),
    C(
        "sft-old-key-in-config-file",
        "sft",
        "'train.save_every'",
        "'run.save_every'",
        "sft_old_key.yaml",
        flags={"--config": "{ws}/configs/sft_old_key.yaml"},
    ),
    C("rm-old-eval-pairs", "rm", "'eval_pairs'", "'eval_size'", overrides={"eval_pairs": 2}),
    C("rm-old-eval-every", "rm", "'train.eval_every'", "'run.eval_every'", overrides={"train.eval_every": 0}),
    C("ppo-old-actor-optim", "ppo", "'actor_optim'", "'optim'", overrides={"actor_optim.lr": 1e-5}),
    C(
        "ppo-old-reward-fns",
        "ppo",
        "'reward_fns'",
        "'rewards'",
        overrides={"reward_fns": "[" + R + "good.py:reward]", "critic": "sft"},
    ),
    C("ppo-old-eval-samples", "ppo", "'eval_samples'", "'eval_size'", overrides={"eval_samples": 2}),
    C("ppo-old-steps", "ppo", "'steps'", "'run.steps'", overrides={"steps": 1}),
    C("grpo-old-mu", "grpo", "'grpo.mu'", "'grpo.epochs'", overrides={"grpo.mu": 2}),
    C("grpo-old-max-steps", "grpo", "'max_steps'", "'run.steps'", overrides={"max_steps": 1}),
    C("grpo-old-eval-prompts", "grpo", "'eval_prompts'", "'eval_size'", overrides={"eval_prompts": 2}),
    C(
        "demo-old-sft-max-steps",
        "demo",
        "'sft.train.max_steps'",
        "'sft.run.steps'",
        overrides={"sft.train.max_steps": 1},
    ),
    C("demo-old-grpo-mu", "demo", "'grpo.grpo.mu'", "'grpo.grpo.epochs'", overrides={"grpo.grpo.mu": 1}),
    # ---- a valid command pointed at a finished run, without --resume or --overwrite -------------------------
    *[C(f"{cmd.replace(' ', '-')}-finished-run", cmd, *FINISHED, overwrite=False) for cmd in COMMANDS],
]

# ---- issue #41 items 4, 5 and 6: preference pairs with one answer twice, mixed formats, pictures a model cannot
# see or read, chat-template errors without a location; {ws}/vlm is a tiny vision-language model and
# {ws}/tok_nochat the tiny tokenizer without its chat template (tests/test_bad_input.py builds both)
SAME, MIXED = "'chosen' and 'rejected' are the same answer", "all text or all conversational"
VLM = {"--model": "{ws}/vlm"}
CASES += [
    C("dpo-data-same-answer", "dpo", "prefs_same.jsonl:3", SAME, flags={"--data": D + "prefs_same.jsonl"}),
    C("rm-data-same-answer", "rm", "prefs_same.jsonl:3", SAME, flags={"--data": D + "prefs_same.jsonl"}),
    C(
        "dpo-data-mixed-formats",
        "dpo",
        "prefs_mixed.jsonl:4",
        "'prompt'",
        MIXED,
        flags={"--data": D + "prefs_mixed.jsonl"},
    ),
    C(
        "rm-data-mixed-formats",
        "rm",
        "prefs_mixed.jsonl:4",
        "'prompt'",
        MIXED,
        flags={"--data": D + "prefs_mixed.jsonl"},
    ),
    C(
        "dpo-data-text-prompt-chat-answers",
        "dpo",
        "prefs_mixed_row.jsonl:2",
        "'rejected'",
        "'prompt' is text",
        flags={"--data": D + "prefs_mixed_row.jsonl"},
    ),
    C(
        "sft-data-images-text-model",
        "sft",
        "sft_images.jsonl:2",
        "'images'",
        "text-only",
        flags={"--data": D + "sft_images.jsonl"},
    ),
    C(
        "grpo-data-image-text-model",
        "grpo",
        "prompts_image.jsonl:3",
        "'image'",
        "text-only",
        flags={"--data": D + "prompts_image.jsonl"},
    ),
    C(
        "sft-vlm-two-placeholders-one-picture",
        "sft",
        "vlm_two_slots.jsonl:2",
        "'prompt'",
        "2 <image> placeholders for 1 picture",
        flags={**VLM, "--data": D + "vlm_two_slots.jsonl"},
    ),
    C(
        "sft-vlm-picture-over-pillows-limit",
        "sft",
        "vlm_bomb.jsonl:2",
        "'images'",
        "Pillow's safety limit",
        flags={**VLM, "--data": D + "vlm_bomb.jsonl"},
    ),
    C(
        "sft-data-chat-template-refuses",
        "sft",
        "sft_tool_role.jsonl:2",
        "'prompt'",
        "{model}",
        "unknown chat role",
        flags={"--data": D + "sft_tool_role.jsonl"},
    ),
    C(
        "dpo-data-no-chat-template",
        "dpo",
        "prefs_chat.jsonl:1",
        "'prompt'",
        "{ws}/tok_nochat",
        "chat template",
        flags={"--data": D + "prefs_chat.jsonl"},
        overrides={"tokenizer": "{ws}/tok_nochat"},
    ),
]

# ---- issue #41 item 9: a resume runs no code its run folder's config.yaml names unless the user names it again
CASES += [
    C(
        "grpo-resume-reward-code-not-named",
        "grpo",
        "names reward code",
        "good.py:reward",
        "'rewards=[",
        resume=True,
        overwrite=False,
    ),
]

# ---- issue #41 item 8: a model folder whose only weights are a pickled pytorch_model.bin -------------------
CASES += [
    C(
        "sft-model-pickled-bin",
        "sft",
        "{ws}/pickled",
        "pytorch_model.bin",
        "safetensors",
        flags={"--model": "{ws}/pickled"},
        overrides={"tokenizer": "{model}"},
    ),
]

# end to end through a real process as well: exit status 2 and no traceback
SUBPROCESS_CASES = ("ct-unknown-env", "sft-hub-name-offline", "grpo-reward-wrong-signature")


# ---- the workspace: data files, reward files, configs ---------------------------------------------------
def _jsonl(path: Path, rows: list[Any]) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def _sft(i: int) -> dict[str, str]:
    return {"prompt": f"What is {i}+{i}?", "completion": f" {2 * i}"}


def _pref(i: int) -> dict[str, str]:
    return {"prompt": f"Review {i}:", "chosen": " great food", "rejected": " bad"}


def _prompt(i: int) -> dict[str, str]:
    return {"prompt": f"What is {i}+1?", "answer": str(i + 1)}


def write_inputs(ws: Path) -> None:
    """Data files (good and bad), reward-function files and YAML configs under ``ws``."""
    data, rewards, configs = ws / "data", ws / "rewards", ws / "configs"
    for folder in (data, rewards, configs):
        folder.mkdir(parents=True)
    sft = [_sft(i) for i in range(40)]
    _jsonl(data / "sft.jsonl", sft)
    _jsonl(data / "prefs.jsonl", [_pref(i) for i in range(40)])
    _jsonl(data / "prompts.jsonl", [_prompt(i) for i in range(40)])
    _jsonl(data / "sft_bad_json.jsonl", [*sft[:2], '{"prompt": "What is 3+3?", "completion": ', *sft[3:10]])
    _jsonl(data / "sft_no_completion.jsonl", [sft[0], {"prompt": "What is 1+1?"}, *sft[2:10]])
    _jsonl(data / "sft_empty_prompt.jsonl", [sft[0], {"prompt": "", "completion": " 2"}, *sft[2:10]])
    _jsonl(
        data / "sft_empty_completion.jsonl",
        [*sft[:3], {"prompt": "What is 3+3?", "completion": ""}, *sft[4:10]],
    )
    _jsonl(
        data / "sft_late_bad.jsonl", [*[_sft(i % 50) for i in range(499)], {"prompt": 5, "completion": " 5"}]
    )
    (data / "empty.jsonl").write_text("")
    prefs = [_pref(i) for i in range(10)]
    _jsonl(data / "prefs_no_rejected.jsonl", [prefs[0], {"prompt": "Review:", "chosen": " good"}, *prefs[2:]])
    _jsonl(data / "prefs_bad_target.jsonl", [*prefs[:2], {**prefs[2], "target": 2.0}, *prefs[3:]])
    _jsonl(data / "prefs_empty_chosen.jsonl", [prefs[0], {**prefs[1], "chosen": ""}, *prefs[2:]])
    prompts = [_prompt(i) for i in range(10)]
    _jsonl(data / "prompts_no_prompt.jsonl", [{"question": "What is 1+1?", "answer": "2"}, *prompts[1:]])
    _jsonl(
        data / "prompts_bad_json.jsonl",
        [prompts[0], '{"prompt": "What is 2+1?", "answer": "3"', *prompts[2:]],
    )
    _jsonl(data / "prompts_empty_prompt.jsonl", [*prompts[:2], {"prompt": "", "answer": "1"}, *prompts[3:]])
    _write_issue_41_inputs(data, prefs, prompts)
    _write_pickled_model(ws / "pickled")
    long = " great food" * 80  # far more than the tiny model's 128 positions
    _jsonl(data / "sft_long.jsonl", [*sft[:3], {**sft[3], "completion": long}, *sft[4:10]])
    _jsonl(data / "prefs_long.jsonl", [*prefs[:3], {**prefs[3], "chosen": long}, *prefs[4:]])

    (rewards / "good.py").write_text(
        "def reward(prompts, completions, **columns):\n    return [0.0 for _ in completions]\n"
    )
    (rewards / "syntax_error.py").write_text(
        "def reward(prompts, completions, **columns)\n    return [0.0 for _ in completions]\n"
    )
    (rewards / "imports_missing.py").write_text(
        "import postrl_no_such_module\n\n\ndef reward(prompts, completions, **columns):\n"
        "    return [0.0 for _ in completions]\n"
    )
    (rewards / "wrong_sig.py").write_text("def r(x):\n    return [0.0]\n")
    (rewards / "not_callable.py").write_text("reward = 3\n")

    # the keys these set are outside every budget, whose overrides would otherwise mask them
    (configs / "ct_unknown_key.yaml").write_text("ppo:\n  clip_epss: 0.1\n")
    (configs / "not_utf8.yaml").write_bytes(b"\xff\xfe ppo: 1\n")
    (configs / "int_key.yaml").write_text("1: 2\n")
    (configs / "dup_key.yaml").write_text("run:\n  steps: 2\n  steps: 5\n")
    (configs / "broken.yaml").write_text("ppo:\n  lr: [0.1\n")
    (configs / "sft_wrong_type.yaml").write_text("run:\n  log_every: ten\n")
    (configs / "grpo_bad_range.yaml").write_text("grpo:\n  clip_eps: 0\n")
    (configs / "ct_old_key.yaml").write_text("run:\n  keep_checkpoints: 3\n")
    (configs / "sft_old_key.yaml").write_text("train:\n  save_every: 10\n")


def _write_issue_41_inputs(data: Path, prefs: list[dict[str, Any]], prompts: list[dict[str, Any]]) -> None:
    """Data files of the issue #41 cases: one pair with the same answer twice, mixed formats, pictures."""
    chat = [{"prompt": [{"role": "user", "content": p["prompt"]}], "chosen": [{"role": "assistant", "content": p["chosen"]}],
             "rejected": [{"role": "assistant", "content": p["rejected"]}]} for p in prefs]  # fmt: skip
    _jsonl(data / "prefs_same.jsonl", [*prefs[:2], {**prefs[2], "rejected": prefs[2]["chosen"]}, *prefs[3:]])
    _jsonl(data / "prefs_mixed.jsonl", [*prefs[:3], chat[3], *prefs[4:]])
    _jsonl(
        data / "prefs_mixed_row.jsonl", [prefs[0], {**prefs[1], "rejected": chat[1]["rejected"]}, *prefs[2:]]
    )
    _jsonl(data / "prefs_chat.jsonl", chat)
    sft = [_sft(i) for i in range(10)]
    _jsonl(data / "sft_images.jsonl", [sft[0], {**sft[1], "images": ["dots.png"]}, *sft[2:]])
    _jsonl(data / "prompts_image.jsonl", [*prompts[:2], {**prompts[2], "image": "dots.png"}, *prompts[3:]])
    tool = {"prompt": [{"role": "tool", "content": "x"}], "completion": " y"}
    user = [
        {"prompt": [{"role": "user", "content": r["prompt"]}], "completion": r["completion"]} for r in sft
    ]
    _jsonl(data / "sft_tool_role.jsonl", [user[0], tool, *user[2:]])
    Image.new("RGB", (32, 32), "white").save(data / "dots.png")
    _png_claiming(data / "bomb.png", 20000, 20000)
    pictured = [{"prompt": "<image>How many dots?", "completion": " 3", "images": ["dots.png"]}] * 10
    _jsonl(
        data / "vlm_two_slots.jsonl",
        [pictured[0], {**pictured[1], "prompt": "<image><image>How many?"}, *pictured[2:]],
    )
    _jsonl(data / "vlm_bomb.jsonl", [pictured[0], {**pictured[1], "images": ["bomb.png"]}, *pictured[2:]])


def _png_claiming(path: Path, width: int, height: int) -> None:
    """A 1×1 PNG whose header (IHDR, its CRC fixed) claims ``width`` × ``height`` pixels."""
    Image.new("RGB", (1, 1)).save(path)
    data = bytearray(path.read_bytes())
    start = data.index(b"IHDR")  # type (4) | width, height (4 + 4) | 5 more bytes | crc (4)
    data[start + 4 : start + 12] = struct.pack(">II", width, height)
    data[start + 17 : start + 21] = struct.pack(">I", zlib.crc32(bytes(data[start : start + 17])))
    path.write_bytes(bytes(data))


def _write_pickled_model(path: Path) -> None:
    """A tiny Llama folder whose weights are a pickled ``pytorch_model.bin`` that holds a Python object besides
    its tensors (training arguments, as old checkpoints often do): ``torch.load(weights_only=True)`` refuses it."""
    import argparse

    import torch

    path.mkdir()
    config = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 400}  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    weights = {"model.embed_tokens.weight": torch.zeros(400, 32), "args": argparse.Namespace(lr=1e-4)}
    torch.save(weights, path / "pytorch_model.bin")
