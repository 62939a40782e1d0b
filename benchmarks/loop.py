"""The notes' claim about the preference loop, measured (issue 34 item 4). Ends with ONE JSON line.

"Collecting new feedback can help cover behavior that was absent from earlier data": on the built-in reviews world,
with the same total label budget, ``postrl loop`` with one offline round (every label collected from the SFT policy
up front) beside K rounds (each round's labels sampled from the policy the previous round made), both with the
synthetic labeller (10% noise) and DPO as the policy update, for each seed. Reported per run (the last row of its
``rounds.jsonl``): the gold reward of the final policy on held-out prompts, its KL to the SFT policy, and the
reward model's accuracy on pairs of the final policy's own samples (in the gold order), where an offline reward
model is exploited. The policy update has the same number of DPO steps per label in both arms, so the offline arm
trains as long in total.

Gold reward at matched KL. The final policies end at different KLs to the SFT policy, and gold reward moves
with KL (it rises, peaks and falls as the policy over-optimises its reward: Gao et al. 2022), so the arms are
also compared on the reward/KL frontier: each run keeps a checkpoint every ``--path-every`` DPO steps of every
round, and its path, the (KL to the SFT policy, gold reward) of the SFT policy and of each checkpoint in
training order, is measured on the same ``--path-size`` held-out prompts with the same sampling seed. A run's
gold at a KL is read linearly off the first segment of its path to reach it (`value_at_kl`: the policy as the
run first got that far; the KL of iterative DPO falls back at the start of some rounds, and the estimate is
noisy), at ``--kl-points`` KLs evenly spaced up to the largest KL every run reaches (``matched_kl``: per seed,
the mean, and the rounds arm's gain with its standard error over the seeds). ``peak`` is each run's best
checkpoint by gold (an oracle stop) and its KL.

The SFT policy is ``--sft`` or the one `benchmarks/judges.py` builds (the built-in base, 150 SFT steps on the
reviews demonstrations) in ``--work``.

    .venv/bin/python benchmarks/loop.py --seeds 0 1 2 --rounds 3 --labels 600

Measured 2026-12-06 (``OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/loop.py --seeds 0 1 2 --rounds 3
--labels 600``, 11 min 15 s for the six runs and their paths, load average 2.1–3.3 on the 2-CPU AMD EPYC, another
job on the other core; two runs gave the same numbers): gold reward at matched KL, seeds 0 / 1 / 2 (the SFT
policy's gold on the same samples 0.110):

    KL     offline                    rounds                  rounds − offline, mean ± se
    1.32   0.360 / 0.338 / 0.377      0.379 / 0.251 / 0.278   −0.056 ± 0.037
    2.64   0.089 / 0.158 / 0.386      0.504 / 0.213 / 0.207   +0.097 ± 0.173
    3.96   −0.000 / −0.002 / 0.214    0.412 / 0.088 / 0.348   +0.212 ± 0.101
    5.28   −0.227 / −0.165 / 0.037    0.310 / 0.147 / 0.297   +0.369 ± 0.085

Best checkpoint by gold: offline 0.434 / 0.347 / 0.418 at KL 0.83 / 1.17 / 0.59 (mean 0.400), rounds 0.513 /
0.335 / 0.369 at KL 2.79 / 3.56 / 4.71 (mean 0.406). Final policies: gold −0.553 / −0.234 / 0.074 offline,
0.355 / 0.221 / 0.047 rounds, at KL 7.63 / 5.73 / 5.16 and 6.31 / 4.19 / 8.80; the reward model's accuracy on
the final policy's samples 0.755 / 0.661 / 0.667 offline, 0.722 / 0.723 / 0.677 rounds (means 0.694, 0.707).
Reading: equal peaks; the offline arm's gold falls past KL ≈ 1, the rounds arm's far more slowly, so at KL ≥ 3.96
the rounds arm is ahead on every seed. Read at the last crossing of each KL or the mean of all crossings, the
gains are −0.019 / +0.097 / +0.277 / +0.319 and −0.030 / +0.097 / +0.249 / +0.350 (same four KLs).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import record  # noqa: E402

import postrl  # noqa: E402
from postrl.lm import base_model  # noqa: E402
from postrl.lm.dpo.frontier import frontier_points, value_at_kl  # noqa: E402
from postrl.lm.tasks import get_task  # noqa: E402

RUN = {"device": "cpu", "threads": 1, "keep_last": 1, "save_every": 0}


def sft_model(work: Path, steps: int) -> str:
    """The reviews SFT policy (as `benchmarks/judges.py` makes it), reused when it exists."""
    out = work / "sft"
    if not (out / "summary.json").is_file():
        postrl.run_stage(
            "sft", out=out, overwrite=True, model=str(base_model.path()), data="task:reviews",
            task={"perturb_fraction": 0.3}, eval_size=0, train={"batch_size": 32, "max_length": 48},
            optim={"lr": 3e-4, "warmup_steps": 10, "min_lr_ratio": 0.1, "betas": [0.9, 0.95]},
            run={**RUN, "steps": steps, "eval_every": steps},
        )  # fmt: skip
    return str(out / "model")


def arm(sft: str, out: Path, rounds: int, labels: int, seed: int, a: argparse.Namespace) -> dict:
    """One `postrl loop` run: the last row of its report and its path, the (KL, gold reward) of every
    ``--path-every``-th DPO step of every round, each measured on the same ``--path-size`` held-out prompts with
    the same sampling seed."""
    per_round = labels // rounds
    dpo_steps = max(1, round(a.dpo_steps_per_label * per_round))
    run = {**RUN, "steps": dpo_steps, "eval_every": dpo_steps, "save_every": a.path_every, "keep_last": 0}
    summary = postrl.loop(
        out=out, overwrite=True, model=sft, rounds=rounds, labels_per_round=per_round, seed=seed,
        eval_size=a.eval_size, rm={"run": {**RUN, "steps": a.rm_steps, "eval_every": a.rm_steps}},
        policy={"run": run, "eval_samples": 64},
    )  # fmt: skip
    updates = {f"round {k}": out / f"round_{k:02d}" / "policy" for k in range(1, rounds + 1)}
    points = frontier_points(updates, sft, None, get_task("reviews"), n=a.path_size, seed=a.path_seed)
    path = [{"round": p["method"], "step": p["step"], "kl": p["kl"], "gold": p["gold"]} for p in points]
    return {
        "seed": seed,
        "rounds": rounds,
        "dpo_steps_per_round": dpo_steps,
        **summary["final"],
        "path": path,
    }


def matched_kl(runs: dict[str, list[dict]], points: int) -> list[dict]:
    """Each run's gold reward at ``points`` KLs evenly spaced up to the largest KL every run's path reaches
    (`value_at_kl`), per seed and the mean, and the rounds arm's gain over the offline one at each."""
    reach = min(max(p["kl"] for p in r["path"]) for arm in runs.values() for r in arm)
    kls = [math.floor(100 * reach * j / points) / 100 for j in range(1, points + 1)]
    gold = {
        name: [value_at_kl([(p["kl"], p["gold"]) for p in r["path"]], kls) for r in arm]
        for name, arm in runs.items()
    }  # name → per seed → per KL
    table = []
    for j, kl in enumerate(kls):
        row = {name: [g[j] for g in per_seed] for name, per_seed in gold.items()}
        gains = [r - o for o, r in zip(row["offline"], row["rounds"], strict=True)]
        table.append(
            {
                "kl": kl,
                **row,
                "gain": gains,
                **{f"{name}_mean": statistics.mean(v) for name, v in row.items()},
                "gain_mean": statistics.mean(gains),
                "gain_se": statistics.stdev(gains) / math.sqrt(len(gains)) if len(gains) > 1 else None,
            }
        )
    return table


def peaks(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Each run's best point of its path (the checkpoint with the highest gold reward, and its KL): the top of
    its frontier, which only an oracle that reads the gold reward would stop at."""
    out = {}
    for name, arm in runs.items():
        best = [max(r["path"], key=lambda p: p["gold"]) for r in arm]
        gold = [p["gold"] for p in best]
        out[name] = {"gold": gold, "kl": [p["kl"] for p in best], "gold_mean": statistics.mean(gold)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--work", default="runs/bench-judges", help="folder of the SFT policy (built if missing)"
    )
    parser.add_argument("--out", default="runs/bench-loop", help="folder of the loop runs")
    parser.add_argument("--sft", help="the SFT policy (default: built in --work)")
    parser.add_argument("--sft-steps", type=int, default=150, help="SFT steps of the built policy")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=3, help="K of the iterated arm")
    parser.add_argument("--labels", type=int, default=600, help="total label budget of each arm")
    parser.add_argument("--rm-steps", type=int, default=150, help="reward-model steps per round")
    parser.add_argument("--dpo-steps-per-label", type=float, default=0.25, help="DPO steps per new label")
    parser.add_argument("--eval-size", type=int, default=256, help="held-out samples of each report")
    parser.add_argument(
        "--path-every", type=int, default=5, help="DPO steps between the points of a run's (KL, gold) path"
    )
    parser.add_argument("--path-size", type=int, default=1024, help="held-out samples of each path point")
    parser.add_argument("--path-seed", type=int, default=0, help="sampling seed of every path point")
    parser.add_argument("--kl-points", type=int, default=4, help="KLs of the matched-KL comparison")
    a = parser.parse_args()
    sft = a.sft or sft_model(Path(a.work), a.sft_steps)
    runs: dict[str, list[dict]] = {"offline": [], "rounds": []}
    for seed in a.seeds:
        for name, k in (("offline", 1), ("rounds", a.rounds)):
            runs[name].append(arm(sft, Path(a.out) / f"{name}-s{seed}", k, a.labels, seed, a))
            shown = {key: v for key, v in runs[name][-1].items() if key != "path"}
            print(name, json.dumps(shown), flush=True)

    def mean(name: str, key: str) -> float | None:
        values = [r[key] for r in runs[name] if r.get(key) is not None]
        return statistics.mean(values) if values else None

    keys = ("gold_reward", "kl_to_start", "rm_accuracy_on_policy")
    result = {
        "labels": a.labels,
        "rounds": a.rounds,
        "seeds": a.seeds,
        "runs": runs,
        "mean": {name: {k: mean(name, k) for k in keys} for name in runs},
        "gold_gain_of_rounds": [
            r["gold_reward"] - o["gold_reward"] for o, r in zip(*runs.values(), strict=True)
        ],
        "matched_kl": matched_kl(runs, a.kl_points),
        "peak": peaks(runs),
    }
    record("loop", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
