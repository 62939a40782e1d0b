"""The LM's return on FrozenLake as text, from a warm start, vs random and vs tabular Q-learning (issue #35,
Show (b)). Ends with ONE JSON line (also written to benchmarks/results/agents_frozenlake.json).

Why a warm start: from the built-in tiny Llama (`postrl/lm/base_model`, pretrained on arithmetic text) GRPO on
the lake never reached the goal in 30 steps (benchmarks/agents.py --parts frozenlake): the base model rarely
writes an action, so no episode of a group earns a reward and every advantage is 0. Here, per seed, all through
postrl's entry points:

1. warm start: SFT (sft-arithmetic's lr 1e-3, batch 64) for ``--sft-steps`` steps on ``--demos`` scripted
   episodes of the deterministic 4×4 lake played in the text environment itself (`make_env("frozenlake")`:
   the same rendering and action parsing as training), each turn a row: the conversation so far in the
   rollout's own token layout (the first prompt, each reply ended by EOS, each observation as the chat template
   renders it) and the action's name. ``--script safe``: uniformly random among the actions that do not step
   into a hole (the rules, not the way: the warm start knows the format and the holes, not where the goal is);
   ``--script epsilon``: ε-optimal (`agents_pictures.demo_rows`' player: with probability ``--epsilon`` a random
   action, kept in the history only, else the shortest path's, each such turn a row);
2. GRPO from the warm start for ``--steps`` steps (benchmarks/agents_credit.py's arm ``trajectory``: 4 seeds ×
   G = 4 episodes of ≤ 8 turns of ≤ 6 tokens, the lake's return, 1 at the goal, the only reward, β 0, AdamW
   at a constant ``--lr``, 5e-5: at agents_credit's 2e-4 it collapses from the weak warm start, below);
3. each model (base, warm start, warm start + GRPO) plays one greedy episode (the lake is deterministic: it is
   every greedy episode) and ``--eval-episodes`` sampled ones (temperature 1, as trained) on held-out seeds:
   greedy return, sampled success rate, and the share of replies in which an action was read; beside them the
   uniformly random policy (Monte Carlo, 400 episodes of ≤ 8 steps) and the greedy policy of tabular
   Q-learning (`postrl.control.tabular`, 500 episodes), whose return is the optimum 1.0.

A finished GRPO run in the workdir is kept (a rerun only evaluates it), and so is each seed's warm start. Other
settings than the defaults (seeds, script, SFT or GRPO steps, lr) write agents_frozenlake-<those settings>.json.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/agents_frozenlake.py --seeds 0 1 2 \
        --workdir /tmp/agents-frozenlake

Measured 2026-12-06 00:00-00:21 UTC on the shared 2-core machine (load average 2.0-3.5; an SFT warm start took
9-28 s, 40 GRPO steps 21-34 s), with the command above (--workdir /tmp/fl-a) and, each with its own workdir:
``--seeds 0 1 2 3 4 5 6 7 8 9``; ``--lr 2e-4``; ``--sft-steps 20 --lr 2e-4``; ``--script safe --sft-steps 20``;
``--script safe --sft-steps 20 --steps 80`` (every run repeats to the last digit: one thread, seeded).
- defaults, seeds 0 1 2: base model greedy return 0, sampled success 0 (an action in 25% of its replies); warm
  start greedy 1 / 0 / 1, sampled 0.344 / 0.000 / 0.281 (mean 0.208); warm start + GRPO greedy 1 / 1 / 1 (the
  optimum), sampled 0.891 / 0.297 / 0.891 (mean 0.693); uniformly random actions 0.0025; tabular Q-learning's
  greedy policy 1.0, the optimum. Seed 1's warm start never reached the goal in 64 samples: its first reward in
  GRPO came at step 33, and it ended at 0.297.
- seeds 0-9, defaults: GRPO's greedy return is 1 on all ten seeds (the warm start's on 2), sampled success
  0.831 (sd 0.196, lowest 0.297) vs 0.095 for the warm starts.
- ``--lr 2e-4`` from the same warm starts: seeds 0 and 2 collapse (greedy 0, sampled 0, an action in ≤ 0.6% of
  the replies), seed 1 ends at 0.422. The first step earns a reward (2-3 of 16 episodes) and its update drops
  it to 0; every later step earns none, so its gradient is exactly 0 (grad_norm 0), yet the replies keep
  drifting (16 → 48 tokens per episode in 10 steps): AdamW's momentum repeats the first update (bias-corrected,
  about 6× its size over 30 steps) and nothing pulls back.
- ``--sft-steps 20 --lr 2e-4``: the warm start already has greedy return 1 on every seed and sampled success
  0.906; GRPO raises it to 0.979 (1.000 / 0.969 / 0.969).
- ``--script safe --sft-steps 20``, a warm start that knows the rules but not the way (0 sampled success and
  greedy 0 on every seed): after 40 GRPO steps greedy 0 / 1 / 1, sampled 0.016 / 0.297 / 0.141; after 80
  steps greedy 1 / 1 / 1, sampled 0.344 / 0.984 / 0.859 (mean 0.729): GRPO alone finds the way (a GRPO run of
  80 steps took 53-55 s).
CliffWalking, whose 13-move episode in the full text grid (first prompt 173 tokens, each observation 115) is
about 1,700 tokens, past the built-in model's 512 positions, is benchmarks/agents_cliffwalking.py: the same
code (``main(world)``) with the world's local view.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from _record import record
from agents import LAKE, q_learning_lake_return
from agents_credit import finished, sft_from_base
from agents_credit import train as grpo
from agents_pictures import shortest_path_actions
from transformers import AutoModelForCausalLM, AutoTokenizer

from postrl.lm.agents import EpisodeBudget, GymTextEnv, make_env, run_episode
from postrl.lm.agents.config import HELDOUT_SEED
from postrl.lm.agents.rollout import observation_text, sample_episodes
from postrl.lm.base_model import BASE_LM
from postrl.lm.rollout import SamplingConfig

MAX_NEW_TOKENS = 6
"""as agents_credit.train samples"""
SUFFIXED = ("seeds", "script", "epsilon", "demos", "sft_steps", "steps", "lr")
"""the settings that name the results file when not at their defaults"""
STEPS = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
"""the grid worlds' moves by name, as (row, column) steps"""


@dataclass(frozen=True)
class World:
    """A grid world this benchmark plays: its results file, its episodes (agents_credit.train's env: id,
    options, max_turns, max_tokens), the scripted player's best action in each state, and the two references."""

    name: str
    env: dict[str, Any]
    best_actions: Callable[[GymTextEnv], dict[int, int]]
    random_return: Callable[[], float]
    optimum: Callable[[], float]
    """tabular Q-learning's greedy return"""


def random_return(env_spec: dict[str, Any], episodes: int = 400) -> float:
    """Mean return of uniformly random actions within the episodes' turns (Monte Carlo)."""
    env, rng = make_env(env_spec["id"], **env_spec["options"]), random.Random(0)
    budget = EpisodeBudget(env_spec["max_turns"], 10**6)
    total = 0.0
    for i in range(episodes):
        total += run_episode(env, lambda m, n: rng.choice(env.names), budget, seed=i).total_reward
    return total / episodes


LAKE_WORLD = World(
    "agents_frozenlake", LAKE, shortest_path_actions, lambda: random_return(LAKE), q_learning_lake_return
)


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def safe_actions(env: GymTextEnv, state: int) -> list[int]:
    """The actions that do not step into a hole or off the cliff from ``state`` (bumping into the edge stays:
    it is safe)."""
    cells = env.cells()
    rows, cols = len(cells), len(cells[0])
    safe = []
    for a, name in enumerate(env.names):
        dr, dc = STEPS[name]
        r = min(max(state // cols + dr, 0), rows - 1)
        c = min(max(state % cols + dc, 0), cols - 1)
        if cells[r][c] not in "HC":
            safe.append(a)
    return safe


def scripted_rows(world: World, n: int, script: str, epsilon: float, seed: int) -> list[dict[str, str]]:
    """SFT rows of ``n`` scripted episodes (seeds 0 … n − 1) in the text world (module docstring, step 1)."""
    tokenizer = AutoTokenizer.from_pretrained(BASE_LM.path())
    env, rng = make_env(world.env["id"], **world.env["options"]), random.Random(seed)
    best = world.best_actions(env)
    rows = []
    for episode in range(n):
        messages, _ = env.reset(seed=episode)
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        for _ in range(world.env["max_turns"]):
            state = int(env.env.unwrapped.s)
            if script == "safe":
                keep, action = True, rng.choice(safe_actions(env, state))
            else:
                keep = rng.random() >= epsilon
                action = best[state] if keep else rng.randrange(env.n_actions)
            name = env.names[action]
            if keep:
                rows.append({"prompt": prompt, "completion": name})
            observation, _, terminated, truncated, _ = env.step(name)
            if terminated or truncated:
                break
            prompt += name + tokenizer.eos_token + observation_text(tokenizer, observation)
    return rows


def warm_start(world: World, args: argparse.Namespace, seed: int, work: Path) -> dict[str, Any]:
    """SFT of the base model on this seed's scripted episodes (agents_credit's recipe), once per workdir (seconds
    None: found there)."""
    out = work / "warm"
    if (out / "model" / "config.json").exists():
        return {"model": out / "model", "seconds": None}
    rows = scripted_rows(world, args.demos, args.script, args.epsilon, seed)
    data = work / "scripted.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    seconds = sft_from_base(data, out, args.sft_steps, seed, max_length=512)  # the model's positions
    return {"model": out / "model", "seconds": round(seconds, 1), "rows": len(rows)}


def evaluate(world: World, model_path: Path, episodes: int) -> dict[str, float]:
    """Greedy return, sampled return (the lake's: the success rate), the share of replies read as an action
    and of sampled episodes the world ended (held-out seeds), and the longest conversation in positions."""
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    spec = world.env
    budget = EpisodeBudget(spec["max_turns"], spec["max_tokens"])
    result = {}
    for name, greedy, n in (("greedy", True, 1), ("sampled", False, episodes)):
        envs = [make_env(spec["id"], **spec["options"]) for _ in range(n)]
        seeds = [HELDOUT_SEED + i for i in range(n)]
        sampling = SamplingConfig(max_new_tokens=MAX_NEW_TOKENS, greedy=greedy)
        out = sample_episodes(
            model, tokenizer, envs, sampling, budget, torch.Generator().manual_seed(0), seeds
        )
        result[f"{name}_return"] = statistics.mean(ep.total_reward for ep in out.episodes)
        if not greedy:
            infos = [info for ep in out.episodes for info in ep.infos]
            result["sampled_action_rate"] = sum(not i.get("invalid") for i in infos) / max(len(infos), 1)
            result["sampled_terminated"] = statistics.mean(ep.terminated for ep in out.episodes)
            result["sampled_cut_at_context"] = sum(i.get("cut") == "context" for i in infos)
            result["longest_positions"] = int(out.attention_mask.sum(-1).max())
    return result


def one_seed(world: World, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    work = args.workdir / f"seed{seed}"
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"seed": seed, "load_start": _load()}
    warm = warm_start(world, args, seed, work)
    result["warm_start"] = {k: v for k, v in warm.items() if k != "model"}
    result["warm_start"].update(evaluate(world, warm["model"], args.eval_episodes))
    print(json.dumps({"seed": seed, "warm_start": result["warm_start"]}), file=sys.stderr, flush=True)
    run_dir = work / "grpo"
    kept = finished(run_dir, args.steps)
    seconds = grpo("trajectory", warm["model"], world.env, seed, args.steps, run_dir, lr=args.lr)
    result["grpo"] = {
        "seconds": None if kept else round(seconds, 1),
        **evaluate(world, run_dir / "model", args.eval_episodes),
    }
    result["load_end"] = _load()
    print(json.dumps(result), file=sys.stderr, flush=True)
    return result


def main(world: World = LAKE_WORLD, doc: str = __doc__) -> None:
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--script", choices=["safe", "epsilon"], default="epsilon", help="the scripted player"
    )
    parser.add_argument("--epsilon", type=float, default=0.3, help="--script epsilon's random-action rate")
    parser.add_argument("--demos", type=int, default=400, help="scripted episodes for SFT")
    parser.add_argument("--sft-steps", type=int, default=10)
    parser.add_argument("--steps", type=int, default=40, help="GRPO steps of 16 episodes")
    parser.add_argument("--lr", type=float, default=5e-5, help="GRPO's learning rate (AdamW, constant)")
    parser.add_argument("--eval-episodes", type=int, default=64)
    parser.add_argument("--workdir", type=Path, default=Path(f"/tmp/postrl-{world.name.replace('_', '-')}"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    tic = time.perf_counter()
    base = evaluate(world, BASE_LM.path(), args.eval_episodes)
    runs = [one_seed(world, args, seed) for seed in args.seeds]

    def mean(stage: str, key: str) -> float:
        return statistics.mean(r[stage][key] for r in runs)

    result = {
        "benchmark": world.name,
        "env": world.env,
        "seeds": args.seeds,
        "settings": {k: v for k, v in vars(args).items() if k not in ("seeds", "workdir")},
        "base": base,
        "random_return": world.random_return(),
        "q_learning_return": world.optimum(),
        **{
            f"{s}_{k}": mean(s, k)
            for s in ("warm_start", "grpo")
            for k in ("greedy_return", "sampled_return")
        },
        "runs": runs,
        "wall_seconds": round(time.perf_counter() - tic, 1),
    }
    changed = [
        f"{k.replace('_', '-')}{'-'.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in vars(args).items()
        if k in SUFFIXED and v != parser.get_default(k)
    ]
    record("-".join([world.name, *changed]), result)  # other warm starts: a file of their own
    print(json.dumps(result))


if __name__ == "__main__":
    main()
