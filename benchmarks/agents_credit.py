"""Per-turn vs trajectory credit on guess_number, from a warm start (issue #35, Show (c)). Ends with ONE JSON line,
also written to benchmarks/results/agents_credit-<reward>.json.

Why a warm start: from the built-in tiny Llama (`postrl/lm/base_model`) the game is first a format to learn
(its held-out success is 0: it writes no number in range), and 30 steps of 16 episodes end below what a player
guessing at random within the hints reaches (0.63 in 4 turns): every arm learned the format, none the game,
and nine seeds could not tell them apart (benchmarks/agents.py). Here every arm starts from one SFT warm start
made by postrl itself: 400 scripted episodes of that random-within-the-hints player on the TRAINING secrets,
each turn a prompt (the conversation so far, in the rollout's own token layout) and its guess. The warm start
plays the format but not the search; bisection solves every secret of [1, 15] in ≤ 4 turns, so there is room.

Arms, the same samples per step (16 episodes) and steps, per seed: GRPO crediting the trajectory (4 seeds ×
G = 4), GRPO crediting each turn (`env.credit=turn`), PPO with its critic at the turn boundaries and GAE over
turns (preset `ppo-guess-number`, 16 seeds × 1, 2 epochs). ``--reward success``: 1 at the secret (the game's
default); ``--reward interval``: each guess earns the share of the information its hint wins (a solved episode
earns 1), per-turn feedback that per-turn credit can use and trajectory credit sums away. Each model plays 240
sampled episodes (temperature 1, as trained) and 24 greedy ones of unseen seeds twice: ``train``, seeds from
10,000 on, which draw the training secrets (training used seeds 0 … 255), and ``heldout``, which draw the
held-out secrets 5, 10 and 15 that no training seed draws: success rate, turns to solve (solved episodes) and
return. The summary gives each arm's mean over seeds with a 95% t-interval, and each per-turn arm's paired
difference from trajectory credit (same seed, same warm start) with its 95% t-interval. A finished run in the
workdir is kept (a rerun only evaluates it), and so is the warm start (its seconds are then null).

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/agents_credit.py --reward interval --steps 60 \
        --seeds 0 1 2 3 4 --workdir runs/agents-credit
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/agents_credit.py --reward success --steps 60 \
        --seeds 0 1 2 3 4 --workdir runs/agents-credit
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/agents_credit.py --reward success --steps 60 \
        --arms trajectory turn --seeds 0 1 2 3 4 5 6 7 8 9 --workdir runs/agents-credit
    for reward in success interval; do OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/agents_credit.py \
        --reward $reward --steps 60 --arms ppo trajectory --seeds $(seq 0 19) \
        --workdir runs/agents-credit; done

Measured 2026-12-05 (load average 11-15 on the shared 2 cores; the warm start's SFT, 150 steps, took 139 s):
- 5 seeds × 60 steps × 16 episodes from the warm start (success on the training secrets 0.412, held-out 0.283;
  base model 0.029 / 0.013). Reward interval, training secrets: GRPO trajectory 0.593 [0.546, 0.641], GRPO
  per-turn 0.583 [0.518, 0.649], paired difference −0.010 [−0.035, +0.015] (a tie, to ±0.025); PPO with the turn
  critic 0.627 [0.484, 0.769], difference +0.033 [−0.128, +0.194]. Reward success: trajectory 0.526 [0.482,
  0.570], per-turn 0.607 [0.505, 0.710], difference +0.082 [−0.029, +0.192]; PPO 0.650 [0.493, 0.807],
  difference +0.124 [−0.008, +0.257]. Turns to solve 2.68-2.79 in every arm, no difference from trajectory
  credit (all intervals hold 0). Held-out secrets: every arm ends BELOW the warm start (0.07-0.15 vs 0.283):
  the training secrets never include 5, 10 or 15, so the policy learns not to answer them (the game's prior
  over secrets is learnable, and RL learns it). A GRPO run took 21-71 s, a PPO run 151-413 s (2 epochs and a
  critic as large as the policy).
- More seeds (20:00-20:12 UTC, load 3-6): GRPO per-turn vs trajectory, reward success, 10 seeds: +0.030
  [−0.037, +0.098] (a tie). PPO vs trajectory, 20 seeds (20:13-20:26 UTC, load 3-4.5): reward success
  +0.100 [+0.052, +0.148], reward interval +0.049 [+0.002, +0.096] (PPO wins both; at 12 seeds +0.063
  [−0.006, +0.131] and +0.041 [−0.022, +0.104]); held-out secrets with reward success, PPO −0.053 [−0.074,
  −0.032]. At load 3-6 a GRPO run took 6-24 s, a PPO run 31-90 s.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _record import record
from transformers import AutoModelForCausalLM, AutoTokenizer

from postrl.lm.agents import EpisodeBudget, make_env
from postrl.lm.agents.config import HELDOUT_SEED, EnvConfig
from postrl.lm.agents.rollout import observation_text, sample_episodes
from postrl.lm.base_model import BASE_LM
from postrl.lm.grpo import GRPOConfig, GRPOLossConfig, run_grpo
from postrl.lm.ppo import PPOConfig, run_ppo
from postrl.lm.rollout import SamplingConfig
from postrl.lm.sft import SFTConfig, run_sft
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig
from postrl.runtime.config import load_config

MAX_TURNS, MAX_NEW_TOKENS, EPISODES_PER_STEP = 4, 6, 16
EVAL_EPISODES = 240
ARMS = ("trajectory", "turn", "ppo")
HELDOUT_SECRETS = (5, 10, 15)
"""the multiples of 5 in [1, 15]: `GuessNumberEnv`'s held-out secrets (heldout_every=5)"""
T_95 = [
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
]
"""Student's t, 97.5% quantile, for 1 … 15 degrees of freedom; beyond, the normal's 1.96 plus 2.4/df (≤ 0.1%
off)"""


def game(reward: str) -> dict[str, Any]:
    options = {"high": 15, "reward": reward}
    return {"id": "guess_number", "options": options, "max_turns": MAX_TURNS, "max_tokens": 24}


def scripted_rows(episodes: int, seed: int = 0) -> list[dict[str, str]]:
    """SFT rows of ``episodes`` training episodes (seeds 0 …) played by guessing uniformly at random among the
    numbers the hints leave: one row per turn, the conversation so far as the rollout lays it out (the first
    prompt, each reply ended by EOS, each hint as the chat template renders it) and the guess."""
    tokenizer = AutoTokenizer.from_pretrained(BASE_LM.path())
    rng, rows = random.Random(seed), []
    for episode in range(episodes):
        env = make_env("guess_number", high=15)
        messages, _ = env.reset(seed=episode)
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        for _ in range(MAX_TURNS):
            guess = str(rng.randint(env.lo, env.hi))
            rows.append({"prompt": prompt, "completion": guess})
            observation, _, terminated, _, _ = env.step(guess)
            if terminated:
                break
            prompt += guess + tokenizer.eos_token + observation_text(tokenizer, observation)
    return rows


def warm_start(workdir: Path, steps: int) -> tuple[Path, float | None]:
    """SFT of the base model on the scripted episodes, once per workdir: the model and the seconds it took (None:
    found in the workdir)."""
    out = workdir / "warm"
    if (out / "model" / "config.json").exists():  # made by an earlier run in this workdir
        return out / "model", None
    data = workdir / "scripted.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps(r) + "\n" for r in scripted_rows(400)))
    return out / "model", sft_from_base(data, out, steps, seed=0, max_length=128)


def sft_from_base(data: Path, out: Path, steps: int, seed: int, max_length: int) -> float:
    """SFT of the base model on the rows of ``data`` into ``out`` (sft-arithmetic's lr 1e-3, batch 64, 10 warm-up
    steps, no evaluation); the seconds it took."""
    cfg = load_config(
        SFTConfig, "sft-arithmetic",
        [f"model={BASE_LM.path()}", f"data={data}", f"run.steps={steps}", f"run.seed={seed}",
         "run.eval_every=1000000", f"run.save_every={steps}", "run.threads=1", "run.device=cpu",
         f"train.max_length={max_length}", "optim.warmup_steps=10", "eval_size=0"],
    )  # fmt: skip
    start = time.perf_counter()
    run_sft(cfg, out, overwrite=True)
    return time.perf_counter() - start


def train(
    arm: str, model: Path, env: dict[str, Any], seed: int, steps: int, out: Path, lr: float = 2e-4
) -> float:
    """One arm for ``steps`` steps of 16 episodes from ``model`` (kept when ``out`` holds a finished run of as
    many steps: a rerun only evaluates); the training seconds the run logged. ``lr``: GRPO's (PPO's is the
    preset's)."""
    if not finished(out, steps) and arm == "ppo":  # the critic at each turn's start, GAE over turns
        cfg = load_config(
            PPOConfig, "ppo-guess-number",
            [f"model={model}", f"run.steps={steps}", f"run.seed={seed}", "run.eval_every=1000000",
             f"run.save_every={steps}", "run.device=cpu", "env.n_eval=0", "plots=false",
             f"env.options={json.dumps(env['options'])}"],
        )  # fmt: skip
        assert cfg.env.options == env["options"] and cfg.batch_size == EPISODES_PER_STEP
        run_ppo(cfg, out, overwrite=True)
    elif not finished(out, steps):  # GRPO, 4 seeds × G = 4, β 0, AdamW constant lr
        cfg = GRPOConfig(
            model=str(model),
            env=EnvConfig(**env, n_train=256, n_eval=0, credit=arm),
            sampling=SamplingConfig(max_new_tokens=MAX_NEW_TOKENS),
            grpo=GRPOLossConfig(group_size=4, prompts_per_step=4, beta=0.0, advantage="grpo"),
            optim=OptimConfig(lr=lr, warmup_steps=0, min_lr_ratio=1.0, betas=(0.9, 0.95), max_grad_norm=1.0),
            run=RunConfig(
                steps=steps,
                eval_every=10**6,
                save_every=steps,
                log_every=1,
                device="cpu",
                threads=1,
                seed=seed,
            ),
        )
        run_grpo(cfg, out, overwrite=True)
    return last_metrics(out)["time"]


def last_metrics(out: Path) -> dict[str, Any]:
    lines = (out / "metrics.jsonl").read_text().splitlines() if (out / "metrics.jsonl").exists() else []
    return json.loads(lines[-1]) if lines else {}


def finished(out: Path, steps: int) -> bool:
    return (out / "model" / "config.json").exists() and last_metrics(out).get("step") == steps


def evaluate(model_path: Path, env: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Sampled (temperature 1) and greedy episodes of unseen seeds: ``train`` draws the training secrets (seeds
    from 10,000 on; training used 0 … 255), ``heldout`` the held-out ones (5, 10, 15)."""
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    budget = EpisodeBudget(env["max_turns"], env["max_tokens"])

    def play(first_seed: int, n: int, greedy: bool) -> list[Any]:
        envs = [make_env(env["id"], **env["options"]) for _ in range(n)]
        sampling = SamplingConfig(max_new_tokens=MAX_NEW_TOKENS, greedy=greedy)
        seeds = [first_seed + i for i in range(n)]
        out = sample_episodes(
            model, tokenizer, envs, sampling, budget, torch.Generator().manual_seed(0), seeds
        )
        held = {e.secret for e in envs} <= set(HELDOUT_SECRETS)
        assert held == (first_seed >= HELDOUT_SEED), "a seed drew a secret of the other split"
        return out.episodes

    result = {}
    for split, first_seed in (("train", 10_000), ("heldout", HELDOUT_SEED)):
        episodes = play(first_seed, EVAL_EPISODES, greedy=False)
        solved = [ep for ep in episodes if ep.terminated]
        greedy = play(first_seed, 24, greedy=True)
        result[split] = {
            "success": len(solved) / len(episodes),
            "success_se": math.sqrt(len(solved) * (len(episodes) - len(solved)) / len(episodes))
            / len(episodes),
            "turns_solved": statistics.mean(len(ep.actions) for ep in solved) if solved else math.nan,
            "return": statistics.mean(ep.total_reward for ep in episodes),
            "greedy_success": sum(ep.terminated for ep in greedy) / len(greedy),
        }
    return result


def interval(values: list[float]) -> list[float]:
    """The mean and its 95% t-interval over seeds, [mean, low, high]."""
    mean = statistics.mean(values)
    df = len(values) - 1
    t = T_95[df - 1] if df <= len(T_95) else 1.96 + 2.4 / df
    half = t * statistics.stdev(values) / math.sqrt(len(values)) if df > 0 else 0.0
    return [mean, mean - half, mean + half]


def summary(runs: dict[str, list[dict[str, Any]]], split: str) -> dict[str, Any]:
    """Per arm, over seeds: mean [low, high] of success, turns to solve and return; for the per-turn arms the
    paired difference from trajectory credit (same seed)."""
    out: dict[str, Any] = {}
    keys = ("success", "turns_solved", "return")
    for arm, rows in runs.items():
        per_seed = {r["seed"]: r[split] for r in rows}
        out[arm] = {
            k: interval([v[k] for v in per_seed.values() if not math.isnan(v[k])] or [math.nan]) for k in keys
        }
        if arm != "trajectory" and "trajectory" in runs:
            base = {r["seed"]: r[split] for r in runs["trajectory"]}
            for k in keys:
                diffs = [v[k] - base[s][k] for s, v in per_seed.items() if s in base]
                out[arm][f"{k}_minus_trajectory"] = interval(
                    [d for d in diffs if not math.isnan(d)] or [math.nan]
                )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reward", choices=["success", "interval"], default="interval")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workdir", type=Path, default=Path("runs/agents-credit"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    env = game(args.reward)
    warm, sft_seconds = warm_start(args.workdir, args.sft_steps)
    result: dict[str, Any] = {
        "reward": args.reward,
        "steps": args.steps,
        "seeds": args.seeds,
        "episodes_per_step": EPISODES_PER_STEP,
        "eval_episodes": EVAL_EPISODES,
        "heldout_secrets": list(HELDOUT_SECRETS),
        "base": evaluate(BASE_LM.path(), env),
        "warm_start": {
            "sft_steps": args.sft_steps,
            "seconds": sft_seconds and round(sft_seconds, 1),
            **evaluate(warm, env),
        },
        "runs": {},
    }
    print(json.dumps({"base": result["base"], "warm_start": result["warm_start"]}), file=sys.stderr)
    for arm in args.arms:
        rows = []
        for seed in args.seeds:
            run_dir = args.workdir / f"{args.reward}-{arm}-{seed}"
            seconds = train(arm, warm, env, seed, args.steps, run_dir)
            rows.append({"seed": seed, "seconds": round(seconds, 1), **evaluate(run_dir / "model", env)})
            print(json.dumps({"arm": arm, **rows[-1]}), file=sys.stderr)
        result["runs"][arm] = rows
    result["summary"] = {split: summary(result["runs"], split) for split in ("train", "heldout")}
    arms = (
        "" if list(args.arms) == list(ARMS) else "-" + "-".join(args.arms)
    )  # a subset of the arms: a file of its own
    record(f"agents_credit-{args.reward}{arms}", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
