"""The bad-input cases of rm and dpo (preference pairs): data, models, ranges, old key names, and the issue #41 cases of
pairs with one answer twice, mixed formats and a tokenizer without a chat template."""

from __future__ import annotations

from tests.bad_input.case import LONG, LONG_PREFS, C, Case, D

SAME, MIXED = "'chosen' and 'rejected' are the same answer", "all text or all conversational"

CASES: list[Case] = [
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
    # ---- dpo ----------------------------------------------------------------------------------------------
    C("dpo-beta-0", "dpo", "dpo.beta", overrides={"dpo.beta": 0}),
    C("dpo-unknown-loss-type", "dpo", "dpo.loss_type", "hinge", overrides={"dpo.loss_type": "hinge"}),
    # ---- an old key name (the config vocabulary was renamed): the error names the new one ------------------
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
    C("rm-old-eval-pairs", "rm", "'eval_pairs'", "'eval_size'", overrides={"eval_pairs": 2}),
    C("rm-old-eval-every", "rm", "'train.eval_every'", "'run.eval_every'", overrides={"train.eval_every": 0}),
    # ---- issue #41 items 4, 6: one answer twice, text and conversational rows mixed, no chat template ------
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

# ---- kto (TRL's unpaired format): labels, one kind only, batch size 1, data, models, resume ------------------
KTO_CHAT = {"--data": D + "kto_chat.jsonl"}
CASES += [
    C(
        "kto-data-label-string",
        "kto",
        "kto_label_string.jsonl:3",
        "'label'",
        flags={"--data": D + "kto_label_string.jsonl"},
    ),
    C(
        "kto-data-no-label",
        "kto",
        "kto_no_label.jsonl:2",
        "'label'",
        flags={"--data": D + "kto_no_label.jsonl"},
    ),
    C(
        "kto-data-no-completion",
        "kto",
        "kto_no_completion.jsonl:2",
        "'completion'",
        flags={"--data": D + "kto_no_completion.jsonl"},
    ),
    C(
        "kto-data-one-kind-only",
        "kto",
        "kto_one_kind.jsonl",
        "every row is desirable",
        flags={"--data": D + "kto_one_kind.jsonl"},
    ),
    C("kto-data-sft-rows", "kto", "sft.jsonl:1", "'label'", flags={"--data": D + "sft.jsonl"}),
    C("kto-data-mixed-formats", "kto", "kto_mixed.jsonl:4", MIXED, flags={"--data": D + "kto_mixed.jsonl"}),
    C(
        "kto-data-no-chat-template",
        "kto",
        "kto_chat.jsonl:1",
        "{ws}/tok_nochat",
        "chat template",
        flags=KTO_CHAT,
        overrides={"tokenizer": "{ws}/tok_nochat"},
    ),
    C(
        "kto-data-images-text-model",
        "kto",
        "kto_images.jsonl:2",
        "'images'",
        "text-only",
        flags={"--data": D + "kto_images.jsonl"},
    ),
    C("kto-batch-size-1", "kto", "train.batch_size", ">= 2", overrides={"train.batch_size": 1}),
    C("kto-beta-0", "kto", "kto.beta", overrides={"kto.beta": 0}),
    C("kto-desirable-weight-negative", "kto", "kto.desirable_weight", overrides={"kto.desirable_weight": -1}),
    C("kto-unknown-key", "kto", "kto.betta", "kto.beta", overrides={"kto.betta": 0.1}),
    C("kto-model-missing", "kto", "no_such_model", flags={"--model": "{ws}/no_such_model"}),
    C("kto-ref-model-missing", "kto", "no_such_ref", overrides={"ref_model": "{ws}/no_such_ref"}),
    C(
        "kto-model-pickled-bin",
        "kto",
        "{ws}/pickled",
        "pytorch_model.bin",
        flags={"--model": "{ws}/pickled"},
        overrides={"tokenizer": "{model}"},
    ),
    C(
        "kto-resume-corrupt-checkpoint",
        "kto",
        "step_00000001",
        out="interrupted",
        resume=True,
        overwrite=False,
    ),
]

# ---- issue #41 items 2, 3, 5 and 9 for the preference stages: a refused resume of a finished run changes nothing
# (its summary.json stays), a data file changed in place (or inputs.json damaged) is named before anything loads,
# trust_remote_code in a run folder's config.yaml is not taken on resume, pictures for a text-only model -------
CASES += [
    C("dpo-resume-damaged-finished-run", "dpo", "step_00000001", out="damaged", resume=True, overwrite=False),
    C("kto-resume-damaged-finished-run", "kto", "step_00000001", out="damaged", resume=True, overwrite=False),
    C(
        "dpo-resume-data-changed",
        "dpo",
        "data={ws}/data/prefs.jsonl changed since",
        out="changed",
        resume=True,
        overwrite=False,
    ),
    C(
        "kto-resume-data-changed",
        "kto",
        "data={ws}/data/kto.jsonl changed since",
        out="changed",
        resume=True,
        overwrite=False,
    ),
    C(
        "dpo-resume-inputs-json-damaged",
        "dpo",
        "inputs.json is damaged",
        out="inputs-damaged",
        resume=True,
        overwrite=False,
    ),
    C(
        "kto-resume-trust-remote-code",
        "kto",
        "trust_remote_code: true",
        "--trust-remote-code",
        out="trusting",
        resume=True,
        overwrite=False,
    ),
    C(
        "dpo-data-images-text-model",
        "dpo",
        "prefs_images.jsonl:3",
        "'images'",
        "text-only",
        flags={"--data": D + "prefs_images.jsonl"},
    ),
]
