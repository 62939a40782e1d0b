"""Agents (issue #35): GRPO and PPO over episodes of the built-in text environments, from the built-in tiny Llama
(`postrl/lm/base_model`, pretrained on arithmetic text: it writes numbers, so guesses and action numbers are
within its reach). Ends with ONE JSON line (also written to benchmarks/results/agents.json, or agents_<parts>.json for other
parts than the default two).

    game        guess_number in [1, 15] (bisection solves it in ≤ 4 turns), ≤ 4 turns of ≤ 6 tokens, the same
                episodes per step (16) and steps, per seed: GRPO with trajectory credit vs per-turn credit
                (env.credit=turn; 4 seeds × G = 4) vs PPO with the critic at the turn boundaries and GAE over
                turns (preset ppo-guess-number; 16 seeds × 1, 2 epochs); held-out greedy success rate and
                turns to solve on 32 unseen secrets, and the untrained model's.
    frozenlake  the deterministic 4×4 lake as text (≤ 8 turns): the LM's held-out greedy return after GRPO vs a
                uniformly random choice of action (Monte Carlo, 400 episodes) vs the greedy policy of tabular
                Q-learning (`postrl.control.tabular`, 500 episodes), whose return is the optimum 1.0.

    calculator  SFT from the base model (pretrained on sums WITHOUT carries) on 400 two-digit sums that carry,
                with the add tool (the call, then the answer after the tool's result) or without it (the answer),
                the same steps and batch (sft-arithmetic's lr 1e-3, batch 64); held-out greedy accuracy of
                100 calculator episodes (≤ 3 turns of ≤ 80 tokens), and how often the tool-trained model's
                reply writes the tool's result when the tool is made to answer wrong (``reads_tool``).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/agents.py --steps 30 --seeds 0 1 2 --workdir /tmp/agents
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/agents.py --parts game --steps 30 --seeds 3 4 5 6 7 8 \
        --workdir /tmp/agents
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/agents.py --parts calculator --steps 600 --seeds 0 1 2 \
        --workdir /tmp/agents

Measured 2026-12-05 with these commands on the shared 2-core machine (load average 12-20), before guess_number
held out secrets (its 32 "held-out" seeds then drew the 15 training secrets; now they draw 5, 10 and 15, which no
training seed draws). Per-turn vs trajectory credit from an SFT warm start, with success and turns measured on
fresh episodes of the training secrets and on the held-out ones: benchmarks/agents_credit.py.
- game, 30 steps × 16 episodes (08:18 UTC, load ~22): held-out success (32 secrets) untrained 0.00; GRPO
  trajectory credit 0.156 0.062 0.031 (mean 0.083, return −0.154); GRPO per-turn credit 0.188 0.031 0.031 (mean
  0.083, return −0.182); PPO with the critic at turn boundaries 0.250 0.062 0.156 (mean 0.156, return −0.061);
  solved in 1.0-3.0 turns. A PPO run took 181-304 s, a GRPO run 24-123 s (2 epochs and a critic as large as
  the policy). Three seeds and 32 episodes cannot tell the arms apart (the seeds' spread is as large as the
  gaps).
- game, seeds 3-8 (08:44 UTC, load ~26): mean success (sd over seeds) GRPO trajectory 0.172 (0.115), GRPO
  per-turn 0.109 (0.055), PPO critic 0.109 (0.055); mean turns to solve 1.87, 1.52, 1.95. Over the nine seeds
  no arm is ahead: seeds 0-2 favoured PPO, seeds 3-8 trajectory credit.
- frozenlake, 30 steps: GRPO 0.0 0.0 0.0 (the base model rarely writes an action; it never reached the goal),
  uniformly random actions 0.0025, Q-learning's greedy policy 1.0 (the optimum).
- calculator, 600 SFT steps, seeds 0 1 2 (2026-12-06 00:07-00:25 UTC, load 1.1-2.5): with the tool 0.95 0.96
  0.93 (mean 0.947), without it 0.60 0.51 0.76 (mean 0.623), the same 600 steps × 64 rows; wall 302-311 s per
  tool run (69-token demonstrations: the 64-token call and EOS, or the 3-digit answer and EOS) vs 45-47 s.
  At 200 steps (seed 0, 2026-12-05) the tool lost, 0.13 vs 0.55: nothing in the library was wrong (the tool's
  result is rendered in training exactly as in the episodes, 117 tokens within the 128-token limit; the loss
  covers the call and the answer and none of the tool's tokens; the padding-free forward equals the padded
  one), the answer turn was undertrained: SFT's loss is the mean over a batch's target tokens (TRL's), so a
  demonstration's 4-token answer is 6% of its loss, and after 200 steps the model wrote the right answer after
  the right tool result for only 28% of the TRAINING sums (12% held out). Trained on the answer rows alone for
  200 steps it writes it for 96% of held-out sums; with a per-row mean loss, 38%; at 600 steps, 95%. The
  model does not only copy: when the tool is made to answer a wrong number, its reply writes that number for
  33%, 54%, 17% of held-out sums (``reads_tool``; the rest are neither the sum nor the tool's number), so it
  reads the result together with the question rather than copying it.

Rollouts with the KV cache kept across turns vs re-prefilled: benchmarks/turn_cache.py.
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

import gymnasium as gym
import torch
from _record import record
from transformers import AutoModelForCausalLM, AutoTokenizer

from postrl.control.tabular import greedy_path, q_learning
from postrl.lm.agents import EpisodeBudget, make_env, run_episode
from postrl.lm.agents.config import EnvConfig
from postrl.lm.agents.games import add, carrying_sum
from postrl.lm.agents.rollout import observation_text, sample_episodes
from postrl.lm.agents.tools import call_tool
from postrl.lm.base_model import BASE_LM
from postrl.lm.data import encode_prompts
from postrl.lm.grpo import GRPOConfig, GRPOLossConfig, run_grpo
from postrl.lm.grpo.episodes import HELDOUT_SEED
from postrl.lm.ppo import PPOConfig, run_ppo
from postrl.lm.rollout import SamplingConfig
from postrl.lm.sft import SFTConfig, run_sft
from postrl.lm.spine import RunConfig
from postrl.lm.tasks.arithmetic import is_correct
from postrl.lm.trainer import OptimConfig
from postrl.runtime.config import load_config

GAME = {"id": "guess_number", "options": {"high": 15}, "max_turns": 4, "max_tokens": 24}
LAKE = {"id": "frozenlake", "options": {}, "max_turns": 8, "max_tokens": 48}
CALC = {"id": "calculator", "options": {}, "max_turns": 3, "max_tokens": 160}
MAX_NEW_TOKENS = 6
EVAL_EPISODES = 32
EPISODES_PER_STEP = 16


def train(env: dict[str, Any], credit: str, seed: int, steps: int, out: Path) -> tuple[Path, float]:
    """GRPO for ``steps`` steps (4 seeds × G = 4 episodes, β 0, AdamW 2e-4 constant); the model and seconds."""
    cfg = GRPOConfig(
        model=str(BASE_LM.path()),
        env=EnvConfig(**env, n_train=256, n_eval=0, credit=credit),
        sampling=SamplingConfig(max_new_tokens=MAX_NEW_TOKENS),
        grpo=GRPOLossConfig(group_size=4, prompts_per_step=4, beta=0.0, advantage="grpo"),
        optim=OptimConfig(lr=2e-4, warmup_steps=0, min_lr_ratio=1.0, betas=(0.9, 0.95), max_grad_norm=1.0),
        run=RunConfig(
            steps=steps, eval_every=10**6, save_every=steps, log_every=1, device="cpu", threads=1, seed=seed
        ),
    )
    start = time.perf_counter()
    run_grpo(cfg, out, overwrite=True)
    return out / "model", time.perf_counter() - start


def train_ppo(env: dict[str, Any], seed: int, steps: int, out: Path) -> tuple[Path, float]:
    """PPO over episodes with the preset ppo-guess-number (16 episodes per step, a critic at each turn's start,
    GAE over turns, β 0, AdamW 2e-4 constant) for ``steps`` steps; the model and seconds."""
    cfg = load_config(
        PPOConfig, "ppo-guess-number",
        [f"model={BASE_LM.path()}", f"run.steps={steps}", f"run.seed={seed}", "run.eval_every=1000000",
         f"run.save_every={steps}", "run.device=cpu", "env.n_eval=0", "plots=false"],
    )  # fmt: skip
    preset = {key: getattr(cfg.env, key) for key in env}
    assert preset == env and cfg.batch_size == EPISODES_PER_STEP, "the preset plays another game"
    start = time.perf_counter()
    run_ppo(cfg, out, overwrite=True)
    return out / "model", time.perf_counter() - start


def evaluate(
    model_path: Path, env: dict[str, Any], episodes: int = EVAL_EPISODES, max_new_tokens: int = MAX_NEW_TOKENS
) -> dict[str, float]:
    """Greedy episodes on the held-out seeds: success rate, turns of the solved ones, mean return."""
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    envs = [make_env(env["id"], **env["options"]) for _ in range(episodes)]
    seeds = [HELDOUT_SEED + i for i in range(episodes)]
    sampling = SamplingConfig(max_new_tokens=max_new_tokens, greedy=True)
    budget = EpisodeBudget(env["max_turns"], env["max_tokens"])
    out = sample_episodes(model, tokenizer, envs, sampling, budget, torch.Generator().manual_seed(0), seeds)
    solved = [ep for ep in out.episodes if ep.terminated and ep.rewards[-1] > 0]
    return {
        "success": len(solved) / episodes,
        "turns_solved": statistics.mean(len(ep.actions) for ep in solved) if solved else float("nan"),
        "return": statistics.mean(ep.total_reward for ep in out.episodes),
    }


def part_game(seeds: list[int], steps: int, workdir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"untrained": evaluate(BASE_LM.path(), GAME)}
    for credit in ("trajectory", "turn", "ppo"):
        runs = []
        for seed in seeds:
            run_dir = workdir / f"game-{credit}-{seed}"
            if credit == "ppo":  # the critic at each turn's start, GAE over turns
                model, seconds = train_ppo(GAME, seed, steps, run_dir)
            else:
                model, seconds = train(GAME, credit, seed, steps, run_dir)
            runs.append({"seed": seed, "seconds": round(seconds, 1), **evaluate(model, GAME)})
            print(json.dumps({"game": credit, **runs[-1]}), file=sys.stderr)
        out[credit] = {
            "runs": runs,
            "success_mean": statistics.mean(r["success"] for r in runs),
            "success_sd": statistics.stdev(r["success"] for r in runs) if len(runs) > 1 else 0.0,
            "return_mean": statistics.mean(r["return"] for r in runs),
            # the seeds' mean turns to solve, over the seeds that solved any held-out episode
            "turns_solved_mean": statistics.mean(solved) if (solved := solved_turns(runs)) else math.nan,
        }
    return out


def solved_turns(runs: list[dict[str, Any]]) -> list[float]:
    return [r["turns_solved"] for r in runs if not math.isnan(r["turns_solved"])]


def random_lake_return(episodes: int = 400) -> float:
    env, rng = make_env("frozenlake"), random.Random(0)
    names = env.names
    total = 0.0
    for i in range(episodes):
        ep = run_episode(env, lambda m, n: rng.choice(names), EpisodeBudget(LAKE["max_turns"], 10**6), seed=i)
        total += ep.total_reward
    return total / episodes


def q_learning_lake_return() -> float:
    lake = gym.make("FrozenLake-v1", is_slippery=False)
    q, _ = q_learning(lake, episodes=500, alpha=0.5, gamma=0.99, epsilon=0.2, seed=0)
    path = greedy_path(lake, q, max_steps=LAKE["max_turns"])
    return 1.0 if path[-1] == 15 else 0.0  # state 15 is the goal G of the 4×4 map


def part_lake(seeds: list[int], steps: int, workdir: Path) -> dict[str, Any]:
    runs = []
    for seed in seeds:
        model, seconds = train(LAKE, "trajectory", seed, steps, workdir / f"lake-{seed}")
        runs.append({"seed": seed, "seconds": round(seconds, 1), **evaluate(model, LAKE)})
        print(json.dumps({"frozenlake": runs[-1]}), file=sys.stderr)
    return {
        "untrained": evaluate(BASE_LM.path(), LAKE),
        "grpo": {"runs": runs, "return_mean": statistics.mean(r["return"] for r in runs)},
        "random_return": random_lake_return(),
        "q_learning_return": q_learning_lake_return(),
    }


def calculator_rows(tool: bool, n: int) -> list[dict[str, str]]:
    """SFT demonstrations of ``n`` training sums that carry (seeds 0 … n − 1, as the environment draws them):
    with the tool, two rows per sum (the call; then, after its result, the answer); without it, the answer."""
    tokenizer = AutoTokenizer.from_pretrained(BASE_LM.path())
    rows = []
    for seed in range(n):
        a, b = carrying_sum(random.Random(seed), 2)
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What is {a}+{b}?"}], add_generation_prompt=True, tokenize=False
        )
        if not tool:
            rows.append({"prompt": prompt, "completion": f"{a + b}"})
            continue
        result = str(call_tool(add, {"a": a, "b": b}, 1.0))
        rows.append({"prompt": prompt, "completion": add_call(a, b)})
        rows.append({"prompt": tool_context(tokenizer, prompt, a, b, result), "completion": result})
    return rows


def add_call(a: int, b: int) -> str:
    return f"<tool_call>{json.dumps({'name': 'add', 'arguments': {'a': a, 'b': b}})}</tool_call>"


def tool_context(tokenizer: Any, prompt: str, a: int, b: int, result: str) -> str:
    """The episode up to the final reply: the prompt, the call add(a, b), and ``result`` as the tool's answer."""
    observation = observation_text(tokenizer, [{"role": "tool", "name": "add", "content": result}])
    return prompt + add_call(a, b) + tokenizer.eos_token + observation


@torch.no_grad()
def reads_tool(model_path: Path, n: int = 100) -> float:
    """Share of ``n`` held-out sums whose greedy final reply, after the right call and a WRONG tool result (a
    number drawn at random, never the sum), writes that result: 1 when the model copies the tool, 0 when it
    ignores it (it computes the sum from the question, or writes neither)."""
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    copied = 0
    for i in range(n):
        rng = random.Random(HELDOUT_SEED + i)
        a, b = carrying_sum(rng, 2)
        shown = rng.choice([s for s in range(20, 199) if s != a + b])
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What is {a}+{b}?"}], add_generation_prompt=True, tokenize=False
        )
        ids = torch.tensor(encode_prompts(tokenizer, [tool_context(tokenizer, prompt, a, b, str(shown))]))
        out = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        copied += is_correct(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True), shown)
    return copied / n


def part_calculator(seeds: list[int], steps: int, workdir: Path) -> dict[str, Any]:
    """SFT from the base model (pretrained on sums WITHOUT carries) on 400 carrying sums, with and without the
    add tool, the same steps and batch; held-out greedy accuracy of the calculator episodes (≤ 3 turns)."""
    out: dict[str, Any] = {}
    for tool in (True, False):
        name = "with_tool" if tool else "without_tool"
        data = workdir / f"calculator-{name}.jsonl"
        data.parent.mkdir(parents=True, exist_ok=True)
        data.write_text("".join(json.dumps(r) + "\n" for r in calculator_rows(tool, 400)))
        runs = []
        for seed in seeds:
            run_dir = workdir / f"calculator-{name}-{seed}"
            cfg = load_config(
                SFTConfig, "sft-arithmetic",
                [f"model={BASE_LM.path()}", f"data={data}", f"run.steps={steps}", f"run.seed={seed}",
                 "run.eval_every=1000000", f"run.save_every={steps}", "run.threads=1", "run.device=cpu",
                 "train.max_length=128", "optim.warmup_steps=10", "eval_size=0"],
            )  # fmt: skip
            start = time.perf_counter()
            run_sft(cfg, run_dir, overwrite=True)
            seconds = time.perf_counter() - start
            runs.append(
                {"seed": seed, "seconds": round(seconds, 1), **evaluate(run_dir / "model", CALC, 100, 80)}
            )
            if tool:
                runs[-1]["reads_tool"] = reads_tool(run_dir / "model")
            print(json.dumps({"calculator": name, **runs[-1]}), file=sys.stderr)
        out[name] = {"runs": runs, "accuracy_mean": statistics.mean(r["success"] for r in runs)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--parts", nargs="+", default=["game", "frozenlake"], choices=["game", "frozenlake", "calculator"]
    )
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/postrl-agents"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    result: dict[str, Any] = {
        "steps": args.steps,
        "seeds": args.seeds,
        "episodes_per_step": EPISODES_PER_STEP,
    }
    parts = {"game": part_game, "frozenlake": part_lake, "calculator": part_calculator}
    for name in args.parts:
        result[name] = parts[name](args.seeds, args.steps, args.workdir)
    name = "agents" if args.parts == ["game", "frozenlake"] else "agents_" + "_".join(args.parts)
    record(name, result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
