"""Coupled runs of postrl and TRL on TRL's toy GRPO task (issue 36): the same prompts and the same sampling
draws, so that the two trainers' accuracies are compared as pairs rather than as independent seeds.

Independent seeds of two trainers share no random numbers, and on this task the per-seed spread of held-out
accuracy (sd ~0.1) hides differences of a few points (STYLE.md, "Compare learning with a peer"). Here TRL's
worker (`benchmarks/grpo.py --trl-worker --coupled FILE`) is given, for each of postrl's seeds:
- postrl's prompt order: the training prompts rewritten in the order postrl's `PromptStream` draws them, with
  TRL's ``shuffle_dataset=False`` (its `RepeatSampler` then takes them in file order, two per step x G = 8);
- postrl's sampling draws: HF ``generate``'s one ``torch.multinomial(probs, 1)`` per decoded token is replaced,
  for the training generations only, by postrl's inverse-CDF draw (`coupled_draws`: one uniform per row from a
  generator seeded as postrl seeds that step's sampling, `postrl.lm.grpo.engine.sampling_seed`).
Both samplers then draw the same completions wherever their probabilities agree to float rounding, the rewards
and updates are those of each trainer (TRL's own loss, optimiser and loop), and a step's mean reward is equal
in both while the runs stay coupled; a flip at a near-tie moves the runs apart from then on.

    .venv/bin/python benchmarks/grpo_coupled.py --members grpo dapo_trl rloo --steps 60 --repeats 3

The output: per member, per seed, the steps whose mean reward agrees (|diff| < 1e-4) before the first that does
not, and the held-out greedy accuracy of both at the end, with the mean paired difference and its standard error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
from pathlib import Path

THIS = Path(__file__).resolve()


@contextlib.contextmanager
def coupled_draws(seed: int):
    """Within the block, ``torch.multinomial(probs, 1)`` draws as postrl's sampler does
    (`postrl.lm.rollout.sampling`): one uniform per row from a generator seeded with ``seed``, inverse CDF of
    the row's probabilities. Runs in TRL's environment (torch only)."""
    import torch

    original, generator = torch.multinomial, torch.Generator().manual_seed(seed)

    def draw(probs, num_samples, *args, **kwargs):
        if num_samples != 1 or probs.dim() != 2 or args or kwargs:
            return original(probs, num_samples, *args, **kwargs)
        probs = probs.float()
        cdf = probs.cumsum(-1)  # (B, V)
        u = torch.rand(probs.shape[0], 1, generator=generator, dtype=probs.dtype)
        return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_(max=probs.shape[-1] - 1)

    torch.multinomial = draw
    try:
        yield
    finally:
        torch.multinomial = original


def _coupling(train: Path, work: Path, seed: int, steps: int) -> tuple[Path, Path]:
    """TRL's side of one coupled seed: the prompts in postrl's draw order, and each step's sampling seed."""
    from postrl.lm.grpo.engine import sampling_seed
    from postrl.lm.grpo.rollouts import PromptStream

    rows = train.read_text().splitlines()
    order = PromptStream(len(rows), seed).take(2 * steps)  # 2 prompts per step, as the TRL task's runs
    ordered = work / f"train_order_{seed}.jsonl"
    ordered.write_text("".join(rows[i] + "\n" for i in order))
    seeds = [sampling_seed(seed, ("train", step, 0, 0)) for step in range(steps)]
    draws = work / f"draws_{seed}.json"
    draws.write_text(json.dumps({"seeds": seeds}))
    return ordered, draws


def _paired(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean of the paired differences a − b and its standard error."""
    d = [x - y for x, y in zip(a, b, strict=True)]
    se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
    return statistics.mean(d), se


def _coupled_steps(postrl_rewards: list[float], trl_rewards: list[float]) -> int:
    """Steps from the first on whose mean reward agrees in both runs (|diff| < 1e-4)."""
    n = 0
    for p, t in zip(postrl_rewards, trl_rewards, strict=False):
        if abs(p - t) >= 1e-4:
            break
        n += 1
    return n


def run_member(member: str, model: Path, train: Path, heldout: Path, work: Path, args, bench) -> dict:
    """``args.repeats`` coupled seeds of one member: postrl's run, then TRL's with postrl's prompts and draws."""
    extra = bench.FAMILY.get(member, ())
    beta = args.beta if member == "grpo" else 0.0
    trl_member = {"dapo_trl": "dapo"}.get(member, member)
    seeds, out = [], {"postrl": [], "trl": [], "coupled_steps": [], "loadavg": []}
    for k in range(args.repeats):
        seed = args.seed + k
        ordered, draws = _coupling(train, work, seed, args.steps)
        ns = argparse.Namespace(**{**vars(args), "seed": seed, "beta": beta, "member": trl_member})
        before = os.getloadavg()[0]
        p = bench._postrl_on_trl_task(model, train, heldout, work / f"postrl_{member}_{seed}", ns, extra)
        ns.coupled, ns.train_override = str(draws), str(ordered)
        t = bench._trl_run(model, train, heldout, work / f"trl_{member}_{seed}.json", ns)
        rows = [json.loads(line) for line in (work / f"postrl_{member}_{seed}" / "metrics.jsonl").open()]
        rewards_p = [r["reward_mean"] for r in rows if "reward_mean" in r]
        rewards_t = [r["reward"] for r in t["log_history"]]
        seeds.append(seed)
        out["postrl"].append(p["accuracy_curve"][-1][2])
        out["trl"].append(t["accuracy_curve"][-1][2])
        out["coupled_steps"].append(_coupled_steps(rewards_p, rewards_t))
        out["loadavg"].append([round(before, 2), round(os.getloadavg()[0], 2)])
        print(f"{member} seed {seed}: accuracy postrl {out['postrl'][-1]:.3f} TRL {out['trl'][-1]:.3f}, "
              f"coupled for {out['coupled_steps'][-1]} of {args.steps} steps", flush=True)  # fmt: skip
    diff, se = _paired(out["postrl"], out["trl"])
    return {
        "seeds": seeds,
        **out,
        "accuracy_postrl": statistics.mean(out["postrl"]),
        "accuracy_trl": statistics.mean(out["trl"]),
        "paired_difference": diff,
        "paired_se": se,
    }


def main() -> None:
    sys.path.insert(0, str(THIS.parent))
    import grpo as bench
    from _record import record

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", nargs="+", default=["grpo", "dapo_trl", "rloo"],
                        choices=["grpo", "dapo_trl", "rloo"], help="grpo: the TRL part's settings (beta "
                        "--beta); dapo_trl, rloo: the family part's (beta 0)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=60, help="GRPO steps of each run")
    parser.add_argument("--eval-every", type=int, default=60, help="steps between accuracy checks")
    parser.add_argument("--repeats", type=int, default=3, help="coupled seeds per member")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--beta", type=float, default=0.04, help="grpo member's KL coefficient (both)")
    parser.add_argument("--unbiased-kl", type=int, choices=[0, 1], default=1, help="as benchmarks/grpo.py")
    parser.add_argument("--lr", type=float, default=1e-4, help="AdamW lr of both")
    parser.add_argument("--sft-steps", type=int, default=100, help="SFT steps of the warm start")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--workdir", default="runs/bench-grpo-coupled", help="folder for models and runs")
    parser.add_argument("--trl-python", default=str(bench.PEERS / ".venv-trl" / "bin" / "python"))
    args = parser.parse_args()
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    model, train, heldout = bench._trl_task(work, args)
    result = {"steps": args.steps, "members": {}}
    for member in args.members:
        r = run_member(member, model, train, heldout, work, args, bench)
        result["members"][member] = r
    print(f"\n{'member':10}{'postrl':>9}{'TRL':>9}{'paired diff':>14}{'coupled steps (median)':>25}")
    for member, r in result["members"].items():
        print(f"{member:10}{r['accuracy_postrl']:>9.3f}{r['accuracy_trl']:>9.3f}"
              f"{r['paired_difference']:>+9.3f} ± {r['paired_se']:.3f}"
              f"{statistics.median(r['coupled_steps']):>17} of {args.steps}")  # fmt: skip
    record("grpo-coupled", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
