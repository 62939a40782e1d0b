"""The bad-input cases of demo: its stages' keys and old key names."""

from __future__ import annotations

from tests.bad_input.case import C, Case

CASES: list[Case] = [
    # ---- demo ---------------------------------------------------------------------------------------------
    C("demo-unknown-key", "demo", "pretrain.train.batchsize", overrides={"pretrain.train.batchsize": 2}),
    C("demo-sft-lr-negative", "demo", "sft.optim.lr", overrides={"sft.optim.lr": -1}),
    C("demo-grpo-group-size-1", "demo", "grpo.grpo.group_size", overrides={"grpo.grpo.group_size": 1}),
    C("demo-ppo-kl-beta-negative", "demo", "ppo.kl.beta", overrides={"ppo.kl.beta": -0.1}),
    C("demo-missing-config-file", "demo", "no_such.yaml", flags={"--config": "{ws}/configs/no_such.yaml"}),
    C(
        # ---- an old key name (the config vocabulary was renamed): the error names the new one ------------------
        "demo-old-sft-max-steps",
        "demo",
        "'sft.train.max_steps'",
        "'sft.run.steps'",
        overrides={"sft.train.max_steps": 1},
    ),
    C("demo-old-grpo-mu", "demo", "'grpo.grpo.mu'", "'grpo.grpo.epochs'", overrides={"grpo.grpo.mu": 1}),
]

# ---- demo flags: --resume of a folder that is no demo, --out under a file, --config of a non-demo YAML -----------
CASES += [
    C("demo-resume-not-a-demo", "demo", "{out}", flags={"--resume": True}, out="notarun", overwrite=False),
    C(
        "demo-out-under-a-file",
        "demo",
        "sft.jsonl",
        flags={"--out": "{ws}/data/sft.jsonl/demo"},
        out="none",
        overwrite=False,
    ),
    C(
        "demo-config-of-another-command",
        "demo",
        "ct_unknown_key.yaml",
        flags={"--config": "{ws}/configs/ct_unknown_key.yaml"},
    ),
    C("demo-threads-0", "demo", "threads", overrides={"threads": 0}),
]
