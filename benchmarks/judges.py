"""Judges (RLAIF) and online DPO on the built-in ``reviews`` world. Ends with ONE JSON line of results.

1. What a small judge can do. From ``--labels`` labelled comparisons of the reviews task (the synthetic
   labeller: 10% label noise, ties at ½, 30% broken responses), postrl trains
   - a Bradley–Terry reward model (`postrl rm`, from the SFT policy), used as the judge ``rm:``;
   - a generative judge: `postrl sft` of the SFT policy on the same comparisons in the judge's prompt format
     (`postrl.lm.judges.judge_sft_rows`: each pair in both orders, the constitution below), used as ``lm:``;
   and measures each judge's agreement with the gold preference on ``--eval-pairs`` held-out pairs (the
   task's test split, gold ties |Δ| ≤ 0.05 left out, the two responses in a seeded random order), beside
   the untrained SFT policy as a generative judge, the trained one asked in one order only (no position
   debiasing), and the synthetic labeller that made the training labels.
2. Online DPO against offline DPO at an equal number of labels. From the SFT policy, β 0.1, lr 1e-4, the same
   pairs per step: offline DPO on ``steps × batch`` pairs of the task's generator labelled once (noise-free
   gold comparisons: label_noise 0, tie_tolerance 0), in ``steps`` steps (one pass) and in 2·``steps`` (two
   passes over the same labels); online DPO in ``steps`` steps on as many pairs sampled from the current
   policy and labelled by the gold comparison (``task:reviews``, hard labels); and, as RLAIF, online DPO with
   the reward model of part 1 as the judge (its 1,024 labels are the RM's; the people's labels are the 400 it
   learnt from). Gold reward of 256 responses sampled at temperature 1 on the held-out prompts (the same
   evaluation for every run) and the held-out KL to the SFT policy.

    .venv/bin/python benchmarks/judges.py --work runs/bench-judges --seed 0   # then --seed 1, --seed 2

Runs already finished in ``--work`` are reused (the SFT policy and the judges are the same for every seed; the
DPO runs are per seed). Measured 2026-12-05 on the shared 2-core machine (load average 8-20), defaults (400
labels, 477 held-out pairs, 64 steps × 16 pairs = 1,024 DPO labels), seeds 0, 1, 2; about 12 minutes for the
first seed, 4 for each further one.

Agreement with the gold preference on 477 held-out pairs (one set of judges):

    | judge                                             | agreement |
    | Bradley–Terry reward model (rm:), 400 labels      | 0.702     |
    | generative judge trained by SFT (lm:), 400 labels | 0.694     |
    |   the same, one order only (no debiasing)         | 0.633-0.639 (the three seeds' orders) |
    | the SFT policy as a generative judge (untrained)  | 0.499     |
    | the synthetic labeller (10% noise)                | 0.893     |

Gold reward (mean ± sd over 3 seeds) and KL to the SFT policy (mean), 1,024 labels each:

    | policy                                   | gold          | KL   |
    | SFT                                      | 0.151         | 0    |
    | offline DPO, 64 steps (one pass)         | 0.349 ± 0.022 | 0.55 |
    | offline DPO, 128 steps (two passes)      | 0.465 ± 0.038 | 0.81 |
    | online DPO, gold judge, 64 steps         | 0.552 ± 0.036 | 0.90 |
    | online DPO, RM judge (RLAIF), 64 steps   | 0.367 ± 0.027 | 0.77 |

Online minus offline at the same steps: +0.203 (standard error 0.018; seeds +0.227, +0.214, +0.169); against
offline with two passes over its labels: +0.087 (s.e. 0.029), at a somewhat larger KL (0.90 vs 0.81), so part
of the gain at equal steps is moving further from the reference. With the RM as the judge online DPO is no
better than offline DPO on gold labels: the 0.70-agreement judge caps it (its win rate against the reference,
by its own judgement, 0.59-0.65).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from _record import record

import postrl
from postrl.lm import base_model
from postrl.lm.data import write_jsonl
from postrl.lm.judges import JudgePrompt, judge_sft_rows, load_judge, pairwise_probability
from postrl.lm.judges.generative import GenerativeJudge
from postrl.lm.tasks import get_task
from postrl.lm.tasks import review_language as lang

CONSTITUTION = (
    "be positive about the subject",
    "use words that fit it",
    "be fluent, complete, not repetitive",
)
TASK = {"perturb_fraction": 0.3}
RUN = {"device": "cpu", "threads": 1, "keep_last": 1}


def _stage(stage: str, name: str, work: Path, **kwargs: Any) -> dict[str, Any]:
    """A finished run's summary, or ``postrl <stage>`` run into ``work/name``."""
    out = work / name
    if (out / "summary.json").is_file():
        return json.loads((out / "summary.json").read_text())
    tic = time.perf_counter()
    summary = postrl.run_stage(stage, out=out, overwrite=True, **kwargs).summary
    print(f"{name}: {time.perf_counter() - tic:.0f} s", flush=True)
    return summary


def train_models(a: argparse.Namespace, work: Path) -> dict[str, str]:
    """The SFT policy, the labelled comparisons, the reward model and the generative judge."""
    opt = {"lr": 3e-4, "warmup_steps": 10, "min_lr_ratio": 0.1, "betas": [0.9, 0.95]}
    _stage(
        "sft",
        "sft",
        work,
        model=str(base_model.path()),
        data="task:reviews",
        task=TASK,
        eval_size=0,
        train={"batch_size": 32, "max_length": 48},
        optim=opt,
        run={**RUN, "steps": a.sft_steps, "eval_every": a.sft_steps, "save_every": 0},
    )
    sft = str(work / "sft" / "model")
    labels = distinct_pairs(a.labels, {})
    write_jsonl(labels, work / "labels.jsonl")
    write_jsonl(judge_sft_rows(labels, JudgePrompt(CONSTITUTION)), work / "judge_sft.jsonl")
    _stage(
        "rm",
        "rm",
        work,
        config="rm-reviews",
        model=sft,
        data=str(work / "labels.jsonl"),
        eval_data="task:reviews",
        run={**RUN, "steps": a.rm_steps, "eval_every": a.rm_steps, "save_every": 0},
    )
    _stage(
        "sft",
        "sft-judge",
        work,
        model=sft,
        data=str(work / "judge_sft.jsonl"),
        eval_data=str(work / "judge_sft.jsonl"),
        eval_size=0,
        train={"batch_size": 32, "max_length": 128},
        optim=opt,
        run={**RUN, "steps": a.judge_steps, "eval_every": a.judge_steps, "save_every": 0},
    )
    return {"sft": sft, "rm": str(work / "rm" / "model"), "judge": str(work / "sft-judge" / "model")}


def distinct_pairs(n: int, options: dict[str, Any]) -> list[dict[str, Any]]:
    """The first ``n`` labelled train pairs of the task whose two answers differ (postrl's data check refuses
    a pair that states no preference)."""
    rows = get_task("reviews", **TASK, **options, n_pairs_train=n + n // 10 + 10).preference_rows("train")
    rows = [r for r in rows if r["chosen"] != r["rejected"]][:n]
    assert len(rows) == n
    return rows


def heldout_pairs(n: int, seed: int) -> list[tuple[str, str, str, bool]]:
    """(prompt, first, second, first is gold-better): the task's test pairs, gold ties left out, the two
    responses in a seeded random order."""
    rows = get_task("reviews", **TASK, n_pairs_test=n, label_noise=0.0, tie_tolerance=0.05).preference_rows(
        "test"
    )
    rng = random.Random(seed)
    out = []
    for r in rows:
        if r["target"] == 0.5:
            continue
        swap = rng.random() < 0.5
        first, second = (r["rejected"], r["chosen"]) if swap else (r["chosen"], r["rejected"])
        out.append((r["prompt"], first, second, not swap))
    return out


def agreement(p: list[float], truth: list[bool]) -> float:
    """Share of pairs where the judge's side (p > ½) is the gold one; p = ½ counts half."""
    return sum(0.5 if x == 0.5 else float((x > 0.5) == t) for x, t in zip(p, truth, strict=True)) / len(p)


def judge_agreement(models: dict[str, str], pairs: list[tuple[str, str, str, bool]]) -> dict[str, float]:
    prompts, first, second, truth = (list(x) for x in zip(*pairs, strict=True))
    prompt = JudgePrompt(CONSTITUTION)
    out = {}
    for name, spec in (
        ("rm", f"rm:{models['rm']}"),
        ("generative_trained", f"lm:{models['judge']}"),
        ("generative_untrained_sft", f"lm:{models['sft']}"),
    ):
        judge = load_judge(spec, constitution=CONSTITUTION)
        out[name] = agreement(judge(prompts, first, second), truth)
    one_order = GenerativeJudge.from_folder(models["judge"], prompt)
    logps = one_order.answer_log_probs([prompt.render(*x) for x in zip(prompts, first, second, strict=True)])
    out["generative_trained_one_order"] = agreement([pairwise_probability(*r) for r in logps.tolist()], truth)
    labeller = get_task("reviews", **TASK).labeller_config
    from postrl.lm.tasks.labeller import SyntheticLabeller

    synthetic = SyntheticLabeller(labeller, seed=1)
    gold = [
        (lang.gold_reward_one(p, a), lang.gold_reward_one(p, b))
        for p, a, b in zip(prompts, first, second, strict=True)
    ]
    out["synthetic_labeller"] = agreement([synthetic.target(ga, gb) for ga, gb in gold], truth)
    return out


def dpo_runs(
    a: argparse.Namespace, work: Path, models: dict[str, str]
) -> dict[str, tuple[str, dict[str, Any]]]:
    """``{name: (run folder, summary)}``: offline DPO (one pass over ``steps × batch`` pairs, and two passes
    over the same pairs: more steps, no more labels), online DPO with the gold judge and with the RM judge."""
    n = a.steps * a.batch
    run = {**RUN, "eval_every": a.steps, "save_every": 0, "log_every": 4, "seed": a.seed}
    common = {
        "model": models["sft"],
        "dpo": {"beta": 0.1},
        "eval_samples": 256,
        "sampling": {"max_new_tokens": 24, "temperature": 1.0},
    }
    offline = work / f"offline-pairs-s{a.seed}.jsonl"
    pool = distinct_pairs(n * (a.seed + 1), {"label_noise": 0.0, "tie_tolerance": 0.0})
    write_jsonl(pool[-n:], offline)  # seed k: the k-th n pairs of the task's generator
    out = {}
    for name, passes in (("offline", 1), ("offline_2_passes", 2)):
        folder = f"dpo-{name.replace('_', '-')}-s{a.seed}"
        out[name] = (
            folder,
            _stage(
                "dpo",
                folder,
                work,
                config="dpo-reviews",
                data=str(offline),
                eval_data="task:reviews",
                task=TASK,
                train={"batch_size": a.batch, "max_length": 48},
                run={**run, "steps": passes * a.steps},
                **common,
            ),
        )
    for name, judge, labels in (
        ("online_gold", "task:reviews", "hard"),
        ("online_rm", f"rm:{models['rm']}", "soft"),
    ):
        folder = f"online-dpo-{name}-s{a.seed}"
        out[name] = (
            folder,
            _stage(
                "online-dpo",
                folder,
                work,
                config="online-dpo-reviews",
                judge=judge,
                labels=labels,
                task=TASK,
                train={"batch_size": a.batch, "max_length": 64},
                run={**run, "steps": a.steps},
                eval_judge_prompts=64,
                **common,
            ),
        )
    return out


def gold_of(model_dir: str, n: int = 256) -> float:
    """Mean gold reward of ``n`` responses sampled (temperature 1, seed 0) from ``model_dir`` on the task's
    held-out prompts in turn: one evaluation for every run (the offline run reads its pairs from a file, so
    its own evaluation has no gold reward)."""
    from postrl.lm.evaluation import complete
    from postrl.lm.models import load_causal_lm
    from postrl.lm.tokenizer import load_tokenizer

    task = get_task("reviews", **TASK)
    prompts = [task.prompts("test")[i % len(task.prompts("test"))] for i in range(n)]
    model, tokenizer = load_causal_lm(model_dir), load_tokenizer(model_dir)
    texts = complete(model, tokenizer, prompts, max_new_tokens=24, greedy=False, temperature=1.0, seed=0)
    return sum(task.gold_reward(prompts, texts)) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--work", default="runs/bench-judges", help="folder of the runs (reused when finished)"
    )
    parser.add_argument("--labels", type=int, default=400, help="labelled comparisons the judges learn from")
    parser.add_argument("--eval-pairs", type=int, default=500, help="held-out pairs for agreement with gold")
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--rm-steps", type=int, default=60)
    parser.add_argument("--judge-steps", type=int, default=300)
    parser.add_argument("--steps", type=int, default=64, help="DPO steps (offline and online)")
    parser.add_argument("--batch", type=int, default=16, help="pairs per DPO step (online: prompts per step)")
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    models = train_models(a, work)
    agree = judge_agreement(models, heldout_pairs(a.eval_pairs, a.seed))
    print("judge agreement with gold:", json.dumps(agree), flush=True)
    runs = dpo_runs(a, work, models)
    table = {"sft": {"gold": gold_of(models["sft"]), "kl": 0.0}}
    for name, (folder, s) in runs.items():
        table[name] = {"gold": gold_of(str(work / folder / "model")), "kl": s.get("heldout_kl")}
        table[name] |= {"steps": s.get("steps"), "judge_win_rate": s.get("heldout_judge_win_rate")}
    gain = table["online_gold"]["gold"] - table["offline"]["gold"]
    result = {
        "judge_agreement": agree,
        "dpo": table,
        "online_minus_offline_gold": gain,
        "dpo_labels": a.steps * a.batch,
        "judge_labels": a.labels,
        "seed": a.seed,
    }
    record(f"judges-s{a.seed}", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
