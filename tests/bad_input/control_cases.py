"""The bad-input cases of control train, control prefs and control eval: ranges, keys, types, the env id, the config
file, a corrupt checkpoint, old key names."""

from __future__ import annotations

from tests.bad_input.case import CT, C, Case

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
    C("ct-env-backend-value", CT, "env.backend", "jax", "gymnasium", overrides={"env.backend": "jax"}),
    C(
        "ct-env-backend-numpy-pendulum",
        CT,
        "env.backend",
        "Pendulum-v1 has no batched numpy copy",
        flags={"--env": "Pendulum-v1"},
        overrides={"env.backend": "numpy"},
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
    C(
        "prefs-labeller-unknown",
        "control prefs",
        "labeller.source",
        "'oracle'",
        flags={"--labeller": "oracle"},
    ),
    C(
        "prefs-judge-no-module",
        "control prefs",
        "no_such_judges",
        flags={"--labeller": "fn:no_such_judges:f"},
    ),
    C("prefs-judge-no-function", "control prefs", "'no_such_fn'", flags={"--labeller": "fn:json:no_such_fn"}),
    C(
        "prefs-judge-rm-not-a-run",
        "control prefs",
        "not a prefs run",
        flags={"--labeller": "rm:{ws}/nothing"},
    ),
    C(
        "prefs-page-wait",
        "control prefs",
        "labeller.page.wait",
        overrides={"labeller.page.wait": "sometimes"},
    ),
    C("eval-not-a-run", "control eval", "{out}", positional=("{out}",), out="notarun", overwrite=False),
    C(
        "eval-no-such-folder",
        "control eval",
        "no_such_run",
        positional=("{ws}/no_such_run",),
        out="notarun",
        overwrite=False,
    ),
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
]

# ---- issue #41 items 2 and 9 for control train: a refused resume of a finished run changes nothing; a config.yaml
# whose env.id is a module:Env entry point is not imported on resume until --env names it again ---------------------
CASES += [
    C("ct-resume-damaged-finished-run", CT, "step_00000001", out="damaged", resume=True, overwrite=False),
    C(
        "ct-resume-env-entry-point",
        CT,
        "postrl_bad_input_envs:Corridor",
        "--env",
        out="entry-point",
        resume=True,
        overwrite=False,
    ),
]

# ---- control bench (a bench folder, not a run: --out points at a folder that must not be created) ---------------
CB = "control bench"
CASES += [
    C(
        "bench-target-not-a-number",
        CB,
        "--target",
        "abc",
        flags={"--target": "abc"},
        out="none",
        overwrite=False,
    ),
    C("bench-target-nan", CB, "--target", flags={"--target": "nan"}, out="none", overwrite=False),
    C("bench-seeds-empty", CB, "--seeds", flags={"--seeds": ""}, out="none", overwrite=False),
    C("bench-workers-negative", CB, "--workers", flags={"--workers": "-2"}, out="none", overwrite=False),
    C(
        "bench-unknown-preset",
        CB,
        "ppo-cartpol",
        flags={"--config": "ppo-cartpol"},
        out="none",
        overwrite=False,
    ),
    C("bench-unknown-key", CB, "ppo.lrr", overrides={"ppo.lrr": 1}, out="none", overwrite=False),
    C(
        "bench-out-under-a-file",
        CB,
        "sft.jsonl",
        flags={"--out": "{ws}/data/sft.jsonl/bench"},
        out="none",
        overwrite=False,
    ),
    C("bench-out-not-a-bench", CB, "{out}", out="notarun", overwrite=False),
]
