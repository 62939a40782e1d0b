"""The bad-input cases of ppo (RLHF) and grpo: ranges, reward functions, prompts, the context, old key names, a resume that
would run code its config.yaml names (issue #41 item 9)."""

from __future__ import annotations

from tests.bad_input.case import CONTEXT, C, Case, D, R

CASES: list[Case] = [
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
    # episodes in a text environment (#35 item 5): the env id, its options, what does not apply to episodes
    C("grpo-env-unknown", "grpo", "'frozenlak'", "did you mean frozenlake", flags={"--env": "frozenlak"}),
    C(
        "grpo-env-bad-option",
        "grpo",
        "guess_number",
        "colour",
        flags={"--env": "guess_number"},
        overrides={"rewards": "[]", "env.options.colour": "red"},
    ),
    C("grpo-env-with-rewards", "grpo", "env.id", "leave rewards empty", flags={"--env": "guess_number"}),
    C("grpo-env-unknown-credit", "grpo", "env.credit", "step", overrides={"env.credit": "step"}),
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
    # ---- an old key name (the config vocabulary was renamed): the error names the new one ------------------
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
    # ---- issue #41 items 5, 9: a picture for a text model; a resume that would run code config.yaml names --
    C(
        "grpo-data-image-text-model",
        "grpo",
        "prompts_image.jsonl:3",
        "'image'",
        "text-only",
        flags={"--data": D + "prompts_image.jsonl"},
    ),
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

# ---- issue #41 items 2, 6, 8, 12 and 13 for ppo and grpo: a refused resume of a finished run changes nothing,
# conversational prompts without a chat template, pickled weights, a LoRA adapter whose base is gone, a sequence
# classifier with 3 labels given as the reward model (a one-label one, TRL's RewardTrainer format, is good
# input: tests/lm/test_reward_export.py trains PPO with it as reward model and critic) --------------------------
GOOD = {"rewards": "[" + R + "good.py:reward]"}
CASES += [
    C(
        "grpo-resume-damaged-finished-run",
        "grpo",
        "step_00000001",
        out="damaged",
        resume=True,
        overwrite=False,
        overrides=GOOD,
    ),
    C(
        "grpo-data-chat-no-template",
        "grpo",
        "prompts_chat.jsonl:1",
        "{ws}/tok_nochat",
        "chat template",
        flags={"--data": D + "prompts_chat.jsonl"},
        overrides={"tokenizer": "{ws}/tok_nochat"},
    ),
    C(
        "grpo-model-pickled-bin",
        "grpo",
        "{ws}/pickled",
        "pytorch_model.bin",
        flags={"--model": "{ws}/pickled"},
        overrides={"tokenizer": "{model}"},
    ),
    C(
        "grpo-lora-adapter-base-gone",
        "grpo",
        "{ws}/adapter_nobase",
        "no_such_base",
        flags={"--model": "{ws}/adapter_nobase"},
        overrides={"tokenizer": "{model}"},
    ),
    C(
        "ppo-reward-model-three-labels",
        "ppo",
        "{ws}/rm_3labels",
        "3 score outputs",
        flags={"--reward-model": "{ws}/rm_3labels"},
    ),
]
