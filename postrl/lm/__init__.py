"""postrl.lm: Part 2 of the notes on Hugging Face causal LMs — pretraining and SFT, a reward model, PPO-based
RLHF and GRPO, on one training loop and one rollout layout.

Bottom to top (a module imports only from the lines above it and from `postrl.core` / `postrl.runtime`):

    tasks/           built-in generated worlds: prompts, demonstrations, preference pairs, gold rewards
    models/          loading any HF causal LM, the tiny built-in Llama, scalar heads, positions from the mask
    tokenizer.py     the postrl byte-level BPE tokenizer, and loading any HF tokenizer
    data/            reading and validating rows (sources.py), rendering and tokenising them (tokens.py)
    fast/            the guests: fused decode-only forwards of Llama and GPT-2 (llama.py, gpt2.py)
    rollout/         sampling (engine.py, sampling.py), teacher-forced scoring (scoring.py), decoders,
                     shared prompts, the one batch of PPO and GRPO (batch.py)
    rewards/         reward functions on TRL's contract: specs, loading, calling, checking
    roles.py         `Roles`: policy, critic, reference and reward model, named by what they do
    evaluation.py    the LM stages' held-out evaluation: task accuracy and gold reward, sampled responses'
                     score, gold reward, KL to the reference and length (PPO, DPO, KTO)
    spine.py         the loop every LM trainer shares: steps, logging, evaluation, checkpoints, exact resume
    onpolicy.py      the on-policy update PPO and GRPO share: epochs × minibatches × grad_accum micro-batches
    master_adamw.py  AdamW for bfloat16 weights: float32 master weights and moments in the optimiser state
    trainer.py       the supervised algorithm (next-token loss), the optimiser and its schedule, batching
    pretrain.py      `postrl pretrain`: the tiny LM and its tokenizer from scratch on the generated corpus
    sft.py           `postrl sft`: supervised fine-tuning on prompt/completion data
    reward_model/    `postrl rm`: Bradley–Terry on preference pairs (algorithm.py, pairs.py, evaluation.py)
    ppo/             `postrl ppo`: RLHF with actor, critic, reward model and reference (algorithm.py,
                     advantages.py, config.py, build.py)
    grpo/            `postrl grpo`: group-relative advantages, no critic (algorithm.py, rollouts.py,
                     config.py, build.py)
    dpo/             `postrl dpo`: DPO/IPO on preference pairs against a frozen reference (algorithm.py,
                     config.py, build.py), and the gold-reward frontier (frontier.py)
    vlm/             vision-language models: the tiny built-in LLaVA, rows with pictures, sampling and scoring
                     with pixel values, SFT and GRPO on them (`postrl sft|grpo` hand a VLM folder there)
    commands.py      `postrl data export|check`
    stage_commands.py  `postrl pretrain|sft|rm|ppo|grpo|generate`: configs from YAML and flags, then the run

A package's `__init__` names its modules and re-exports its public names (``from postrl.lm.ppo import
run_ppo, PPOConfig``); inside the library a module imports a sibling directly, never its own package.
"""
