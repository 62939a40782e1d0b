"""Rollouts: sampling responses from a policy, scoring them teacher-forced, and the batch the losses take.

    engine.py         `generate` (batched sampling with a KV cache), the `Rollout` layout, `SamplingConfig`,
                      `RolloutEngine` (text prompts in, decoded responses out)
    sampling.py       log π_τ at given tokens, top-k / top-p draws, the mask after EOS
    scoring.py        `score`, `response_log_probs`: teacher-forced log π_τ of response tokens (and values)
    decoders.py       prefill-then-step decoders: the model's own HF forward, or one of `postrl.lm.fast`
    forwards.py       the teacher-forced forward a trainer picks once: full, shared prefix, fused, or chunked
    chunked.py        log π of chosen tokens with the output layer applied in chunks (no [B, T, V] logits)
    batch.py          `RolloutBatch`: the one batch of PPO and GRPO, from the rollout to the loss

`generate`, `score`, `response_forward`, `forward_log_probs`, `Rollout`, `RolloutEngine`, `SamplingConfig`, `token_log_probs` and
`RolloutBatch` are importable from here.
"""

from postrl.lm.rollout.batch import RolloutBatch as RolloutBatch
from postrl.lm.rollout.engine import Rollout as Rollout
from postrl.lm.rollout.engine import RolloutEngine as RolloutEngine
from postrl.lm.rollout.engine import SamplingConfig as SamplingConfig
from postrl.lm.rollout.engine import generate as generate
from postrl.lm.rollout.engine import left_pad as left_pad
from postrl.lm.rollout.forwards import ResponseForward as ResponseForward
from postrl.lm.rollout.forwards import forward_log_probs as forward_log_probs
from postrl.lm.rollout.forwards import response_forward as response_forward
from postrl.lm.rollout.sampling import mask_after_eos as mask_after_eos
from postrl.lm.rollout.sampling import sample_tokens as sample_tokens
from postrl.lm.rollout.sampling import token_log_probs as token_log_probs
from postrl.lm.rollout.scoring import ValueFn as ValueFn
from postrl.lm.rollout.scoring import response_log_probs as response_log_probs
from postrl.lm.rollout.scoring import score as score
from postrl.lm.rollout.scoring import score_values as score_values
