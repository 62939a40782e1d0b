"""Multi-turn rollouts with each episode's KV cache kept across turns vs the whole conversation re-prefilled at
every turn (issue #35 item 2): `postrl.lm.agents.rollout.sample_episodes` with ``kv_cache="reuse"`` and
``"prefill"``, the same episodes (same seed: the benchmark checks that both paths write the same tokens), timed
in turn (reuse, prefill, reuse, prefill, …) so that both see the same load. Ends with ONE JSON line (also
written to benchmarks/results/turn_cache.json).

Models: the built-in tiny Llama (`postrl/lm/base_model`, d = 128, 2 layers, 0.6 M parameters) and a random-init
Llama of ~100 M parameters (d = 768, 12 layers, MLP 3072, the built-in tokenizer; by default 4 episodes of at
most 4 turns, as a CPU prefills its conversations slowly); both run through postrl's fast decoder (`postrl.lm.fast.llama.FastLlama`). Environments: guess_number in [1, 100] (the random model
never writes a number, so its episodes run to the turn budget) and calculator (a reply without a tool call
ends the episode: the built-in model, not trained to call the tool, mostly ends after one turn, where there is
nothing to reuse). Reported per cell: episodes, turns and policy tokens per second (median of ``--repeats``),
and prefilled tokens per rollout (what each path runs through the model besides decoding).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/turn_cache.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch
from _record import record
from transformers import LlamaConfig, LlamaForCausalLM

from postrl.lm.agents import EpisodeBudget, make_env
from postrl.lm.agents.rollout import sample_episodes
from postrl.lm.base_model import BASE_LM
from postrl.lm.models import load_causal_lm
from postrl.lm.rollout import SamplingConfig
from postrl.lm.tokenizer import load_tokenizer


def random_llama(tokenizer: Any, seed: int = 0) -> torch.nn.Module:
    """A ~100 M-parameter Llama, random init (float32, eval mode)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        num_key_value_heads=12, intermediate_size=3072, max_position_embeddings=2048,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


def prefilled_tokens(rollout: Any, kv_cache: str) -> int:
    """Tokens each episode runs through the model besides decoding, summed: its first prompt, then per later
    turn either the observation and the reply's last token (reuse; at most one reply token is not yet in the
    cache) or the whole conversation so far (prefill). Counted per episode (a prompt shared by several is
    prefilled once by both paths)."""
    total = 0
    for i, ep in enumerate(rollout.episodes):
        prompt = int(rollout.attention_mask[i, : rollout.prompt_len].sum())
        columns = [(rollout.token_turns[i] == k).nonzero()[:, 0] for k in range(len(ep.actions))]
        total += prompt
        for k in range(1, len(ep.actions)):
            start, previous_end = int(columns[k].min()), int(columns[k - 1].max()) + 1
            total += start - previous_end + 1 if kv_cache == "reuse" else prompt + start
    return total


def one(model: Any, tokenizer: Any, env_id: str, options: dict, args: argparse.Namespace, kv: str) -> tuple:
    envs = [make_env(env_id, **options) for _ in range(args.episodes)]
    seeds = list(range(args.episodes))
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=1.0)
    budget = EpisodeBudget(max_turns=args.max_turns, max_tokens=args.max_turns * args.max_new_tokens)
    gen = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    out = sample_episodes(model, tokenizer, envs, sampling, budget, gen, seeds, kv_cache=kv)
    return time.perf_counter() - start, out


def cell(model: Any, tokenizer: Any, env_id: str, options: dict, args: argparse.Namespace) -> dict:
    """Both paths on one model and environment, interleaved ``args.repeats`` times."""
    times: dict[str, list[float]] = {"reuse": [], "prefill": []}
    outs: dict[str, Any] = {}
    one(model, tokenizer, env_id, options, args, "reuse")  # warm-up
    for _ in range(args.repeats):
        for kv in times:
            seconds, outs[kv] = one(model, tokenizer, env_id, options, args, kv)
            times[kv].append(seconds)
    same = torch.equal(outs["reuse"].input_ids, outs["prefill"].input_ids)
    ref = outs["reuse"]
    turns = sum(len(ep.actions) for ep in ref.episodes)
    tokens = int(ref.action_mask.sum())
    result: dict[str, Any] = {
        "episodes": len(ref.episodes),
        "turns_per_episode": round(turns / len(ref.episodes), 2),
        "policy_tokens": tokens,
        "same_episodes": same,
    }
    for kv, seconds in times.items():
        s = statistics.median(seconds)
        result[kv] = {
            "seconds": round(s, 3),
            "episodes_per_s": round(len(ref.episodes) / s, 2),
            "turns_per_s": round(turns / s, 2),
            "tokens_per_s": round(tokens / s, 1),
            "prefilled_tokens": prefilled_tokens(outs[kv], kv),
            "all_seconds": [round(x, 3) for x in seconds],
        }
    result["speedup"] = round(result["prefill"]["seconds"] / result["reuse"]["seconds"], 2)
    print(f"  {env_id}: {json.dumps(result)}", file=sys.stderr)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=16, help="episodes per rollout (one batch)")
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=12, help="most tokens per reply")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--big-episodes", type=int, default=4, help="--episodes for random100m")
    parser.add_argument("--big-max-turns", type=int, default=4, help="--max-turns for random100m")
    parser.add_argument("--models", nargs="+", default=["builtin", "random100m"])
    args = parser.parse_args()
    tokenizer = load_tokenizer(BASE_LM.path())
    envs = {"guess_number": {"high": 100}, "calculator": {}}
    result: dict[str, Any] = {"settings": vars(args), "threads": torch.get_num_threads()}
    with torch.no_grad():
        for name in args.models:
            model = load_causal_lm(BASE_LM.path()) if name == "builtin" else random_llama(tokenizer)
            params = sum(p.numel() for p in model.parameters())
            print(f"{name}: {params / 1e6:.1f} M parameters", file=sys.stderr)
            settings = args
            if name == "random100m":  # a CPU prefills ~100 M-parameter conversations slowly: a smaller batch
                settings = argparse.Namespace(
                    **{**vars(args), "episodes": args.big_episodes, "max_turns": args.big_max_turns}
                )
            result[name] = {
                "parameters": params,
                "episodes": settings.episodes,
                "max_turns": settings.max_turns,
            }
            for env_id, options in envs.items():
                result[name][env_id] = cell(model, tokenizer, env_id, options, settings)
    record("turn_cache", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
