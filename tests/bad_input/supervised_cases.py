"""The bad-input cases of pretrain and sft: model, tokenizer, hub name, dtype, every data error, ranges, old key names, and
the issue #41 cases of pictures, chat templates and pickled weights."""

from __future__ import annotations

from tests.bad_input.case import CONTEXT, LONG, LONG_SFT, PT, C, Case, D

VLM = {"--model": "{ws}/vlm"}  # the workspace's tiny vision-language model

CASES: list[Case] = [
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
    # ---- an old key name (the config vocabulary was renamed): the error names the new one ------------------
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
    # ---- issue #41 items 5, 6, 8: pictures a text model cannot see, VLM rows the processor cannot take, a chat
    # template that refuses a row, a model folder whose only weights are a pickled pytorch_model.bin ---------
    C(
        "sft-data-images-text-model",
        "sft",
        "sft_images.jsonl:2",
        "'images'",
        "text-only",
        flags={"--data": D + "sft_images.jsonl"},
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
        "sft-model-pickled-bin",
        "sft",
        "{ws}/pickled",
        "pytorch_model.bin",
        "safetensors",
        flags={"--model": "{ws}/pickled"},
        overrides={"tokenizer": "{model}"},
    ),
]

# ---- issue #41 items 2, 3, 9, 12 and 15 for sft: a refused resume changes nothing, changed data is named, a run
# folder's trust_remote_code is not taken on resume, LoRA adapter folders that cannot load, VLM pictures the
# processor cannot take (not a picture, cut short, missing) --------------------------------------------------------
CASES += [
    C("sft-resume-damaged-finished-run", "sft", "step_00000001", out="damaged", resume=True, overwrite=False),
    C(
        "sft-resume-data-changed",
        "sft",
        "data={ws}/data/sft.jsonl changed since",
        out="changed",
        resume=True,
        overwrite=False,
    ),
    C(
        "sft-resume-trust-remote-code",
        "sft",
        "trust_remote_code: true",
        "--trust-remote-code",
        out="trusting",
        resume=True,
        overwrite=False,
    ),
    C(
        "sft-lora-adapter-base-gone",
        "sft",
        "{ws}/adapter_nobase",
        "no_such_base",
        flags={"--model": "{ws}/adapter_nobase"},
        overrides={"tokenizer": "{model}"},
    ),
    C(
        "sft-lora-adapter-weights-misfit",
        "sft",
        "{ws}/adapter_misfit",
        flags={"--model": "{ws}/adapter_misfit"},
        overrides={"tokenizer": "{model}"},
    ),
    C(
        "sft-vlm-not-a-picture",
        "sft",
        "vlm_not_picture.jsonl:2",
        "'images'",
        "not_a_picture.png",
        flags={**VLM, "--data": D + "vlm_not_picture.jsonl"},
    ),
    C(
        "sft-vlm-picture-cut-short",
        "sft",
        "vlm_cut_short.jsonl:2",
        "'images'",
        "cut_short.png",
        flags={**VLM, "--data": D + "vlm_cut_short.jsonl"},
    ),
    C(
        "sft-vlm-picture-missing",
        "sft",
        "vlm_missing_picture.jsonl:2",
        "'images'",
        "no_such.png",
        flags={**VLM, "--data": D + "vlm_missing_picture.jsonl"},
    ),
]
