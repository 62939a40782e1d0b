"""A vision-language policy learns in an environment that returns pictures (issue #35 item 2): the built-in tiny
LLaVA (`postrl/lm/vlm/base_model`, aligned on captions of shapes only) on ``frozenlake_pictures``, the
deterministic 4×4 lake whose every observation is its 32×32 frame (one 8-pixel patch per cell) and a line of
text that never says where the agent is. Ends with ONE JSON line (also benchmarks/results/agents_pictures.json).

Per seed, all through postrl's entry points (`run_sft` and `run_grpo` hand a VLM folder to `postrl.lm.vlm`):

1. warm start: ``--demos`` scripted episodes played in the picture environment itself, ε-optimal (with
   probability ``--epsilon`` a uniformly random action, else the shortest path's, ties to the lower action
   number), each turn whose action was the optimal one an SFT row (the conversation so far with all its
   pictures → the action's name); random turns stay in the history only, so the rows cover states off the
   shortest path and every target is optimal. SFT for ``--sft-steps`` steps, kept short so that the start is
   imperfect;
2. GRPO from that checkpoint for ``--grpo-steps`` steps: ``--prompts-per-step`` groups of G = ``--group-size``
   episodes (≤ 6 turns of ≤ 4 tokens), the environment's return (1 at the goal) the only reward, trajectory
   credit, β 0;
3. greedy return (the lake is deterministic: one greedy episode is every greedy episode) and the success rate of
   ``--eval-episodes`` sampled episodes (temperature 1) of the SFT start and the GRPO end; the uniformly random
   policy's success rate by Monte Carlo (the same ≤ 6 turns).

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/agents_pictures.py --seeds 0 1 2 \
        --workdir /tmp/agents-pictures

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/agents_pictures.py --seeds 0 1 2 \
        --sft-steps 120 --workdir /tmp/agents-pictures-sft120

Each model also plays the same held-out episodes with every picture black (``blank_``): the text never says
where the agent is, but its own replies so far do (the lake is deterministic), so success alone would not show
that the policy looks. Episodes are at most 6 turns: the optimum's 6 moves take 225 of the tiny LLaVA's 256
positions (the first prompt 59, a turn 33; a reply that is no action is answered by a 59-token observation);
the rollout cuts an episode that fills them (``sampled_cut_at_context``) and SFT drops rows longer.

Measured 2026-12-06 on the shared 2-core machine, seeds 0 1 2 (the files hold each run's load):
- ``--sft-steps 120`` (02:59-03:06 UTC, load average 1.6-2.6; SFT 75-99 s, GRPO 23-24 s; a first run at
  02:50-02:57, load 2.0-3.2, gave the same numbers to the last digit): the SFT start greedy 1 / 1 / 1 (the
  optimum), sampled success 0.531 / 0.641 / 0.391; after 30 GRPO steps (480 episodes) greedy 1 / 1 / 1,
  sampled 0.812 / 0.766 / 0.891 (mean 0.823); uniformly random actions 0.00025. With black pictures every one
  of these six models scores 0, greedy and sampled: they act on what they see.
- defaults, 30 SFT steps (03:06-03:09 UTC, load 1.6-2.3; SFT 31-33 s, GRPO 22-24 s; the same numbers as a run
  at 02:46-02:49 without the black pictures): the SFT start has not learned to look: greedy 0 on every seed
  (seed 0 answers "down" three times, into the hole), sampled 0 / 0 / 0, a third of its sampled episodes cut
  at the context by replies that are no action; GRPO from it: greedy 0, sampled 0 / 0.016 / 0: on each seed
  one episode of 480 reached the goal, so 29 of 30 steps had no reward to learn from.
- before two fixes (02:18-02:22 UTC, load 1.0-2.1, 8 turns): SFT trained the 256-position model on rows of
  up to 512 tokens and the rollout ran episodes to 504 positions (both now held to the model's positions):
  SFT start greedy 0 / 1 / 1, sampled 0.047 / 0.016 / 0.031; GRPO greedy 1 / 1 / 0, sampled 0.094 / 0.094 /
  0.000. The 8-turn budget with the fixes (02:42-02:46 UTC): sampled 0 everywhere, episodes cut after about 4
  turns; hence 6.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch
from _record import record
from PIL import Image

from postrl.lm.agents import EpisodeBudget, make_env
from postrl.lm.agents.config import HELDOUT_SEED, EnvConfig
from postrl.lm.agents.pictures import PictureGymEnv, sample_picture_episodes
from postrl.lm.grpo import GRPOConfig, GRPOLossConfig, run_grpo
from postrl.lm.rollout import SamplingConfig
from postrl.lm.sft import SFTConfig, run_sft
from postrl.lm.spine import RunConfig
from postrl.lm.trainer import OptimConfig, TrainConfig
from postrl.lm.vlm import base_model, load_vlm

ENV_ID = "frozenlake_pictures"
SUFFIXED = ("sft_steps", "grpo_steps")
"""the settings that name the results file when not at their defaults"""
MAX_TURNS = 6
"""the optimum's 6 moves take 225 of the tiny LLaVA's 256 positions (59 the first prompt, 33 a turn): a 7th turn
does not fit"""
MAX_NEW_TOKENS = 4
POSITIONS = 256
"""the built-in tiny LLaVA's context (max_position_embeddings)"""
MOVES = {0: (0, -1), 1: (1, 0), 2: (0, 1), 3: (-1, 0)}
"""FrozenLake's actions (left, down, right, up) as (row, column) steps"""


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def shortest_path_actions(env: PictureGymEnv) -> dict[int, int]:
    """The first action of a shortest path to the goal from every state that reaches it (BFS back from G)."""
    desc = env.env.unwrapped.desc.astype(str)
    rows, cols = desc.shape
    goal = next(r * cols + c for r in range(rows) for c in range(cols) if desc[r, c] == "G")
    dist, queue = {goal: 0}, deque([goal])
    while queue:  # BFS on the reversed moves: dist[s] = steps from s to the goal
        s = queue.popleft()
        for dr, dc in MOVES.values():
            r, c = s // cols - dr, s % cols - dc
            if 0 <= r < rows and 0 <= c < cols and desc[r, c] not in "HG" and r * cols + c not in dist:
                dist[r * cols + c] = dist[s] + 1
                queue.append(r * cols + c)
    best = {}
    for s, d in dist.items():
        if s == goal:
            continue
        for a, (dr, dc) in MOVES.items():  # the lowest action number that goes one step closer
            r = min(max(s // cols + dr, 0), rows - 1)
            c = min(max(s % cols + dc, 0), cols - 1)
            if dist.get(r * cols + c) == d - 1:
                best[s] = a
                break
    return best


def demo_rows(n: int, epsilon: float, seed: int, folder: Path) -> list[dict[str, Any]]:
    """SFT rows of ``n`` ε-optimal episodes in the picture environment (module docstring, step 1); each state's
    frame is saved once as ``folder/state<s>.png`` and named relative to the data file."""
    env, rng = make_env(ENV_ID), random.Random(seed)
    best = shortest_path_actions(env)
    rows = []
    for episode in range(n):
        messages, _ = env.reset(seed=episode)
        history: list[dict[str, Any]] = []
        images: list[str] = []
        for _ in range(MAX_TURNS):
            state = int(env.env.unwrapped.s)
            picture = folder / f"state{state}.png"
            if not picture.is_file():
                env.picture().save(picture)
            images.append(picture.name)
            history += [
                {"role": m["role"], "content": [{"type": "image"}, m["content"][1]]} for m in messages
            ]
            optimal = rng.random() >= epsilon
            action = env.names[best[state] if optimal else rng.randrange(env.n_actions)]
            if optimal:
                rows.append({"prompt": list(history), "completion": action, "images": list(images)})
            history.append({"role": "assistant", "content": action})
            messages, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
    return rows


def sft(args: argparse.Namespace, seed: int, data: Path, out: Path) -> dict[str, Any]:
    cfg = SFTConfig(
        model=str(base_model.path()), data=str(data), eval_data=str(data), eval_size=0,
        train=TrainConfig(batch_size=args.sft_batch, max_length=POSITIONS),  # longer rows dropped
        optim=OptimConfig(lr=args.sft_lr, warmup_steps=0, min_lr_ratio=1.0, betas=(0.9, 0.95)),
        run=RunConfig(steps=args.sft_steps, seed=seed, eval_every=10**6, save_every=args.sft_steps,
                      log_every=5, device="cpu", threads=1),
    )  # fmt: skip
    tic = time.perf_counter()
    summary = run_sft(cfg, out, overwrite=True)
    seconds = round(time.perf_counter() - tic, 1)
    return {"seconds": seconds, "steps": args.sft_steps, "examples": summary["train_examples"]}


def grpo(args: argparse.Namespace, seed: int, start: Path, out: Path) -> dict[str, Any]:
    cfg = GRPOConfig(
        model=str(start),
        env=EnvConfig(id=ENV_ID, n_train=1000, n_eval=0, max_turns=MAX_TURNS,
                      max_tokens=MAX_TURNS * MAX_NEW_TOKENS, credit="trajectory"),
        sampling=SamplingConfig(max_new_tokens=MAX_NEW_TOKENS),
        grpo=GRPOLossConfig(group_size=args.group_size, prompts_per_step=args.prompts_per_step, beta=0.0),
        optim=OptimConfig(lr=args.grpo_lr, warmup_steps=0, min_lr_ratio=1.0, betas=(0.9, 0.95),
                          max_grad_norm=1.0),
        run=RunConfig(steps=args.grpo_steps, seed=seed, eval_every=10**6, save_every=args.grpo_steps,
                      log_every=1, device="cpu", threads=1),
    )  # fmt: skip
    tic = time.perf_counter()
    summary = run_grpo(cfg, out, overwrite=True)
    return {
        "seconds": round(time.perf_counter() - tic, 1),
        "steps": args.grpo_steps,
        "train_seconds": summary.get("train_seconds"),
        "episodes": args.grpo_steps * args.group_size * args.prompts_per_step,
    }


class BlankPictures(PictureGymEnv):
    """The lake with every picture black: what the policy does without seeing (the text and its own replies
    are all it has; in the deterministic lake the replies so far do tell where it is)."""

    def picture(self) -> Image.Image:
        return Image.new("RGB", super().picture().size)


def evaluate(model_dir: Path, episodes: int, seed: int) -> dict[str, float]:
    """Greedy return and the success rate of ``episodes`` sampled episodes (temperature 1), held-out seeds;
    ``blank_``: the same with black pictures."""
    model, processor = load_vlm(str(model_dir))
    model.eval()
    budget = EpisodeBudget(MAX_TURNS, MAX_TURNS * MAX_NEW_TOKENS)
    result = {}
    passes = (("greedy", True, 1), ("sampled", False, episodes))
    for name, greedy, n in [*passes, *((f"blank_{name}", greedy, n) for name, greedy, n in passes)]:
        blank = name.startswith("blank")
        envs = [
            BlankPictures("FrozenLake-v1", is_slippery=False) if blank else make_env(ENV_ID) for _ in range(n)
        ]
        seeds = [HELDOUT_SEED + i for i in range(n)]
        sampling = SamplingConfig(max_new_tokens=MAX_NEW_TOKENS, greedy=greedy)
        out = sample_picture_episodes(
            model, processor, envs, sampling, budget, torch.Generator().manual_seed(seed), seeds
        )
        returns = [ep.total_reward for ep in out.episodes]
        result[f"{name}_return"] = statistics.mean(returns)
        if name == "sampled":
            result["sampled_turns"] = statistics.mean(len(ep.actions) for ep in out.episodes)
            infos = [ep.infos[-1] for ep in out.episodes]
            result["sampled_cut_at_context"] = sum(i.get("cut") == "context" for i in infos)
            result["longest_positions"] = int(out.attention_mask.sum(-1).max())
    return result


def random_success(episodes: int = 4000) -> float:
    """Success rate of uniformly random actions within ``MAX_TURNS`` (Monte Carlo)."""
    env, rng = make_env(ENV_ID), random.Random(0)
    wins = 0
    for i in range(episodes):
        env.env.reset(seed=i)
        for _ in range(MAX_TURNS):
            _, reward, terminated, truncated, _ = env.env.step(rng.randrange(env.n_actions))
            if terminated or truncated:
                wins += reward > 0
                break
    return wins / episodes


def one_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    work = args.workdir / f"seed{seed}"
    work.mkdir(parents=True, exist_ok=True)
    rows = demo_rows(args.demos, args.epsilon, seed, work)
    data = work / "demos.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result: dict[str, Any] = {"seed": seed, "sft_rows": len(rows), "load_start": _load()}
    result["sft"] = sft(args, seed, data, work / "sft")
    result["sft"].update(evaluate(work / "sft" / "model", args.eval_episodes, seed))
    result["grpo"] = grpo(args, seed, work / "sft" / "model", work / "grpo")
    result["grpo"].update(evaluate(work / "grpo" / "model", args.eval_episodes, seed))
    result["load_end"] = _load()
    print(json.dumps(result), file=sys.stderr, flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--demos", type=int, default=300, help="scripted episodes for SFT")
    parser.add_argument("--epsilon", type=float, default=0.3, help="the scripts' random-action rate")
    parser.add_argument("--sft-steps", type=int, default=30)
    parser.add_argument("--sft-batch", type=int, default=32)
    parser.add_argument("--sft-lr", type=float, default=1e-3)
    parser.add_argument("--grpo-steps", type=int, default=30)
    parser.add_argument("--grpo-lr", type=float, default=1e-4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--eval-episodes", type=int, default=64)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/postrl-agents-pictures"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    tic = time.perf_counter()
    runs = [one_seed(args, seed) for seed in args.seeds]

    def mean(stage: str, key: str) -> float:
        return statistics.mean(r[stage][key] for r in runs)

    result = {
        "benchmark": "agents_pictures",
        "env": ENV_ID,
        "max_turns": MAX_TURNS,
        "seeds": args.seeds,
        "settings": {k: v for k, v in vars(args).items() if k not in ("seeds", "workdir")},
        "random_success": random_success(),
        "optimum": 1.0,
        **{f"{s}_{k}": mean(s, k) for s in ("sft", "grpo") for k in ("greedy_return", "sampled_return")},
        "runs": runs,
        "wall_seconds": round(time.perf_counter() - tic, 1),
    }
    changed = [
        f"{k.replace('_', '-')}{getattr(args, k)}"
        for k in SUFFIXED
        if getattr(args, k) != parser.get_default(k)
    ]
    record("-".join(["agents_pictures", *changed]), result)  # other settings: a file of their own
    print(json.dumps(result))


if __name__ == "__main__":
    main()
