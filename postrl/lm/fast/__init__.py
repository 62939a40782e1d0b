"""The fast paths of `postrl.lm.rollout`: fused decode-only forwards that agree with the Hugging Face forward
to float32 rounding (tests/lm). They are guests: `postrl.lm.rollout.decoders` picks one where it supports the
model (``sampling.backend``, ``auto`` by default, logged), else the model's own forward runs.

    llama.py   `FastLlama`: Llama-family models (fused projections, folded RMSNorm, preallocated KV cache)
    gpt2.py    `FastGPT2`: GPT-2 models, on the same KV cache and masks
    adapters.py  projections as the decoders read them: plain, or LoRA-wrapped with the adapters merged
"""
