"""Does from-scratch pretraining reach the SFT band on every seed? (issue #23, item 1) Yes, since the recipe
leaves out the sums that carry: 5 of 5 seeds (the first table).

For each pretraining seed S: `postrl pretrain` with the built-in base model's recipe (`base_model.recipe(S)`,
= DemoConfig.pretrain), then the demo's SFT stage from that model (DemoConfig().sft wired as `postrl demo
--from-scratch seed=S` wires it: model = the pretrained folder, run.seed = S, one thread). Beside them, the
demo's SFT stage from the shipped base model (postrl/lm/base_model) on SFT seeds 0 1 2: the range of its
held-out accuracy is "the SFT band", and a pretraining seed reaches the band when its SFT accuracy is at least
the band's lower end.

Per run: the pretraining's held-out loss (the tasks' test demonstrations in the question format, which the
corpus never shows, hence a loss far above the corpus loss) and CPU seconds; the pretrained model's greedy
exact match on 500 held-out sums written as bare equations ("47+38=", the corpus's format: did it learn the
sums?) and on the task's questions ("What is 47+38?", expected ~0); after SFT, greedy exact match on the same
500 held-out questions as the demo's report (8 new tokens) and SFT's own held-out loss.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/pretrain_seeds.py \
        [--seeds 0 1 2 3 4] [--shipped-seeds 0 1 2] [--workdir runs/bench-pretrain-seeds]

A finished run folder (summary.json) is reused, so the seeds can be run one invocation at a time. Prints a
Markdown table and ends with ONE JSON line.

**The recipe now** (`equations=rounds carries=false`: every train problem that does not carry from its units
digits, once per round, a random sign before the result), measured 2026-12-04 00:00 - 00:50 UTC beside other
runs (load 2.5 - 6; CPU seconds inflated by it), each seed `--seeds S --shipped-seeds` in a clone with the
recipe; the SFT band is the demo's SFT on SFT seeds 0 1 2 from the seed-0 model, which is the shipped one
(SHA-256 e0415f4e..., remade by `python -m postrl.lm.base_model` bit for bit): 0.544 / 0.488 / 0.470.

| pretrain seed | held-out loss | CPU s | equation acc. | question acc. | SFT held-out loss | SFT acc. (500) | in band |
|---|---|---|---|---|---|---|---|
| 0 (= shipped) | 9.716 | 276.3 | 0.362 | 0.000 | 0.452 | 0.544 | yes |
| 1 | 10.326 | 274.6 | 0.248 | 0.000 | 0.345 | 0.650 | yes |
| 2 | 10.554 | 301.9 | 0.332 | 0.004 | 0.300 | 0.682 | yes |
| 3 | 9.129 | 319.1 | 0.108 | 0.000 | 0.264 | 0.698 | yes |
| 4 | 9.477 | 290.7 | 0.054 | 0.012 | 0.329 | 0.692 | yes |

5 of 5 (the equation probe, "47+38=" with no space and carries included, is a weak signal here). Every
model adds without carrying; SFT's 200 demonstrations (85 of which carry) teach the question format and
some of the carry, and what the seed decides is how much, within 0.54 - 0.70, no longer whether the sums
were learnt at all. The tables below are the corpora before it.

Measured 2026-12-03 on the shared 2-core machine, load average 7-16 throughout (CPU seconds are one thread's,
inflated by the load; wall ~2.2x CPU), code of commit 0f3f038 (seed 3: load 13 → 8), SFT band = 0.258 - 0.332:

| run | pretrain held-out loss | pretrain CPU s | equation acc. | question acc. | SFT held-out loss | SFT acc. (500) | in band |
|---|---|---|---|---|---|---|---|
| shipped base, SFT seed 0 | 11.668 | - | 0.586 | 0.000 | 0.837 | 0.282 | yes |
| shipped base, SFT seed 1 | 11.668 | - | 0.586 | 0.000 | 0.687 | 0.332 | yes |
| shipped base, SFT seed 2 | 11.668 | - | 0.586 | 0.000 | 0.885 | 0.258 | yes |
| pretrain seed 0 (= shipped, same SHA-256) | 11.668 | 292.8 | 0.586 | 0.000 | 0.837 | 0.282 | yes |
| pretrain seed 1 | 9.397 | 287.0 | 0.058 | 0.002 | 1.252 | 0.078 | **no** |
| pretrain seed 2 | 10.076 | 278.8 | 0.948 | 0.000 | 0.269 | 0.652 | yes (far above) |
| pretrain seed 3 | 9.819 | 294.1 | 0.326 | 0.010 | 1.125 | 0.164 | **no** |
| pretrain seed 1, --set run.steps=1600 | 9.623 | 592.1 | 0.426 | 0.000 | 1.594 | 0.086 | **no** |
| seed 1, --set optim.lr=1e-3 optim.warmup_steps=200 | 12.734 | 304.8 | 0.026 | 0.000 | 1.079 | 0.080 | **no** |
| seed 3, --set optim.lr=1e-3 optim.warmup_steps=200 | 11.719 | 306.4 | 0.886 | 0.000 | 1.440 | 0.082 | **no** |
| seed 1, --set corpus_mix=[0.6,0.3,0.1] | 10.710 | 302.1 | 0.894 | 0.000 | 0.617 | 0.366 | yes |
| seed 3, --set corpus_mix=[0.6,0.3,0.1] | 9.441 | 296.7 | 0.074 | 0.000 | 1.063 | 0.158 | **no** |
| seed 0, --set corpus_mix=[0.6,0.3,0.1] | 10.206 | 288.9 | 0.412 | 0.000 | 1.429 | 0.156 | **no** |
| seed 2, --set corpus_mix=[0.6,0.3,0.1] | 8.883 | 298.0 | 0.968 | 0.000 | 1.315 | 0.168 | **no** |
| seed 1, --set optim.weight_decay=0.3 | 9.417 | 293.9 | 0.310 | 0.008 | 0.333 | 0.610 | yes (far above) |
| seed 3, --set optim.weight_decay=0.3 | 10.535 | 295.1 | 0.386 | 0.002 | 1.198 | 0.144 | **no** |

Seed 4 was not measured (no time left). The recipe reaches the band on 2 of the 4 seeds measured (0 and 2;
1 and 3 miss), and the SFT accuracy after it spans 0.08 - 0.65: the seed decides how well the sums are
learnt (equation accuracy 0.59 / 0.06 / 0.95 / 0.33 on seeds 0-3), and even learnt sums need not carry over to
the question format (seed 1 at 1600 steps: equations 0.43, SFT 0.09; seed 0: equations 0.59, SFT 0.28). SFT
itself erases the equation skill (0.02 - 0.04 after it on every run). The pretraining held-out loss (question
format, never in the corpus) does not predict any of this: seed 1 has the lowest.

Recipe variants on the two missing seeds (1 and 3), measured 2026-12-03 16:06-16:32 UTC, code of commit
1fd6ccb, two seeds at once (four processes on the 2 cores for the first two variants), with other sessions'
jobs (load average 2.0 - 5.6; CPU seconds as before, 294 - 306 a pretraining; wall 1.0 - 3.3x CPU), with
`--workdir /tmp/scratch/runs --seeds S --set ...` (the band above reused): a lower peak lr with a 4x warmup
(optim.lr=1e-3 optim.warmup_steps=200), a larger arithmetic share of the corpus (corpus_mix = 0.6 arithmetic,
0.3 reviews, 0.1 generic; the PretrainConfig key added for this, default = the recipe's 0.4 / 0.4 / 0.2) and
3x the weight decay (optim.weight_decay=0.3). None reaches the band on both seeds. Seed 3 misses under all
three (SFT 0.08 / 0.16 / 0.14); seed 1 reaches it with corpus_mix (0.37) and with weight decay 0.3 (0.61).
Whether the sums are learnt is a lottery on the seed that the recipe moves but does not remove (equation
accuracy, seed 1 / seed 3: recipe 0.06 / 0.33; lower lr 0.03 / 0.89; corpus_mix 0.89 / 0.07; weight decay
0.31 / 0.39), and learnt sums are neither necessary nor sufficient for SFT (lower lr, seed 3: equations 0.89,
SFT 0.08; weight decay, seed 1: equations 0.31, SFT 0.61). corpus_mix on seeds 0 and 2 (16:30-16:37, load
2.0 - 2.5) loses both (SFT 0.156 and 0.168; seed 2 learns 97% of the equations): it reaches the band on 1 of
4 seeds, worse than the recipe (2 of 4). Not measured: seed 4, lower lr and weight decay 0.3 on seeds 0, 2,
combinations, more steps with a variant.

Measured 2026-12-03 17:38-18:23 UTC (code of commit 79985ad and after; the stages used here did not change),
two runs at a time under `nice -n 15`, load 1.4-3.6:

| run | equation acc. | SFT acc. (500) | in band |
|---|---|---|---|
| pretrain seed 4 (the recipe) | 0.306 | 0.770 | yes |
| seed 1, equations in 5 surface forms* | 0.116 | 0.170 | **no** |
| seed 3, equations in 5 surface forms* | 0.210 | 0.102 | **no** |
| seed 0, --set run.steps=1600 corpus_mix=[0.6,0.3,0.1] | 0.882 | 0.128 | **no** |
| seed 1, the same | 0.576 | 0.252 | **no** (by 0.006) |
| seed 2, the same | 0.990 | 0.478 | yes |
| seed 3, the same | 0.828 | 0.418 | yes |

(*) "47+38=85", "38+47=85", "47 + 38 = 85", "47 plus 38 equals 85", "the sum of 47 and 38 equals 85", drawn
at random per line (a patched `equation_lines`, not kept): a sum circuit that is not tied to one surface form
might carry over to the question better; it did not. The recipe reaches the band on **3 of 5 seeds** (0, 2,
4); twice the steps with 60% arithmetic (535-545 CPU-s a run, twice the recipe's) on 2 of 4 (seed 4 not
run). Which seeds fail moves with the recipe; how many does not.

Where the lottery is: SFT seeds on the same pretrained model move its SFT accuracy by at most 0.07 (shipped
0.282 / 0.332 / 0.258 on SFT seeds 0 / 1 / 2; recipe seed 1's model 0.078 / 0.054 / 0.062 on SFT seeds 1 / 2 /
0; recipe seed 3's 0.164 / 0.226 / 0.232 on 3 / 0 / 1; the 1600-step seed 0's 0.128 / 0.136 / 0.200 on 0 / 1 /
2), so it is the pretrained model that decides, and not through its equation accuracy (0.88 → 0.13 and 0.31 →
0.77 above). SFT changes do not rescue a failing model: lr 3e-4 instead of 1e-3 (seed 1 0.074, seed 3 0.112,
seed 3 at lr 1e-3 + warmup 200: 0.080, seed 1 at 1600 steps: 0.066) and 1,000 demonstrations instead of 200
(seed 1 0.088, seed 3 0.382, seed 0 0.668: the ranking of the models stays).

Two more on the two failing seeds (19:12-19:32 UTC, two at a time, load 1-2): a 4-layer model
(`--set model.n_layers=4`, ~500 CPU-s a run): seed 1 SFT 0.074 (equations 0.14), seed 3 0.322 (0.98); every
train problem in the corpus (a fresh permutation of all 5,000 per round instead of 8,000 draws with repeats,
which leave ~1,000 out; a patched `equation_lines`, not kept): seed 1 0.092 (0.05), seed 3 **0.502** (0.11).
Seed 3 reaches the band three ways (60% arithmetic with 1600 steps, 4 layers, even coverage), seed 1 only with
weight decay 0.3 (0.610) or 60% arithmetic (0.366), each of which loses other seeds.

Even coverage on every seed (19:33-19:40 UTC, two at a time, load 1-2; 253-272 CPU-s a run, as the recipe):

| seed | equation acc. | SFT acc. (500) | in band |
|---|---|---|---|
| 0 | 0.858 | 0.274 | yes |
| 1 | 0.046 | 0.092 | **no** |
| 2 | 0.544 | 0.424 | yes |
| 3 | 0.108 | 0.502 | yes |
| 4 | 0.916 | 0.626 | yes |
| 1, with weight decay 0.3 | 0.058 | 0.054 | **no** |

**4 of 5 seeds**, the best recipe measured (the current one: 3 of 5), at the same cost; seed 0's model (the
one that would be shipped) lands at 0.274, next to today's 0.282. Not adopted in the session that measured it:
it remakes the shipped base model and so every number of the demo, and seed 1 still misses.

Why seeds fail (2026-12-03 20:20-21:30 UTC, next session; code of commit f94325d with a patched
`equation_lines`, two runs at a time under `nice -n 5`, load 0.2-2): the answers of SFT'd models that fail
have the right length and first digit but a wrong last digit (recipe seed 1: last digit right on 0.17 of
the questions; seed 2, in the band: 0.95), so the units-digit sum does not carry over from "47+38=85" to
"What is 47+38? 85". Two failure modes, told apart by an SFT whose questions end in "=" instead of "?"
(`task.arithmetic.prompt_format="What is {a}{op}{b}="`): a model that learnt the sums but not for "?"
(even coverage + space, weight decay 0.3, seed 4: 0.24 with "?", 0.87-0.91 with "="), and one that did
not learn them (the same with 3-digit sums added, seed 1: 0.16 with "?", 0.31 with "="). Neither SFT lr
3e-4 (seed 4: 0.24, seed 1: 0.47) nor 400 SFT steps (0.24, 0.14) rescues either.

| variant (800 steps unless said) | seed | equation acc. | SFT acc. (500) |
|---|---|---|---|
| even coverage + result after a space ("47+38= 85", as the task writes " 85") | 1 | 0.514 | 0.114 |
| the same | 3 | 0.364 | 0.870 |
| the same, 1200 / 1600 steps | 1 | 0.396 / 0.068 | 0.130 / 0.120 |
| the same + half the lines 3-digit sums | 1 | 0.100 | 0.722 |
| even + space, weight decay 0.3 | 0 1 2 3 4 | 0.39 0.09 0.55 0.20 0.53 | 0.704 0.844 0.828 0.952 **0.240** |
| even + space + 3-digit sums, weight decay 0.3 | 1 4 | 0.07 0.19 | **0.156** 0.838 |
| even + space, the sign before the result "=", ":" or ";" at random, weight decay 0.3 | 0 1 2 3 4 | 0.98 0.01 0.92 0.23 0.99 | 0.794 0.984 0.728 0.862 0.736 |
| **the same, weight decay 0.1: `--set equations=rounds`** (21:46 - 22:00, commit b2f8d29) | 0 1 2 3 4 | 0.99 0.01 0.64 0.63 0.99 | 0.936 0.944 0.662 0.886 0.894 |

(equation accuracy is greedy on "47+38=" with no line before it, which some models that answer questions
well do not complete: seed 1's 0.01 then SFT 0.98; it is a weak signal.) The signs are
`PretrainConfig.equations = "rounds"` now (the runs before the last row used a patched `equation_lines` that
writes the same lines, checked line for line on seeds 0, 1, 4; the last row is this script, `--set
equations=rounds`): the sign drawn per line makes the sums not hang on "=", so a question's "?" is one more
sign for SFT to map. Every seed's SFT lands at 0.66 - 0.94 (weight decay 0.3: 0.73 - 0.98; the recipe: 0.08
- 0.77), and every pretrained model still scores 0.000 - 0.060 on the questions, so pretraining does not
solve the task. The weight-decay-0.3 seed-0 model on SFT seeds 0 / 1 / 2: 0.794 / 0.882 / 0.816, and two of
its seeds land below that range (seed 2 0.728, seed 4 0.736), from SFT's noisy end more than the model
(held-out accuracy every 25 steps, constant lr 1e-3, seed 4: 0.88 0.945 0.93 0.955 0.96 0.94 0.91 0.73;
every seed is at 0.87 - 0.90 after 25 steps).

Not adopted, because of what it does to the rest of the demo: `postrl demo` on seeds 0 1 2 from the
weight-decay-0.3 seed-0 model (`python benchmarks/demo.py`, the model and provenance copied into a clone,
21:27 - 21:41 UTC, beside other runs: load 1.3 - 3.2), mean (min - max), against the README's table from
the shipped model:

| comparison | this base (wd 0.3) | rounds, wd 0.1, PPO beta 0.2 | shipped base (README) |
|---|---|---|---|
| SFT accuracy vs pretrained | 0.831 (0.794 - 0.882), 3/3 | 0.909 (0.886 - 0.936), 3/3 | 0.291 (0.258 - 0.332), 3/3 |
| RM pair accuracy | 0.761 (0.746 - 0.778), 3/3 | 0.747 (0.730 - 0.761), 3/3 | 0.758 (0.748 - 0.771), 3/3 |
| PPO gold gain over SFT | 0.620 (0.170 - 0.917), **2/3** | 0.507 (0.305 - 0.663), 3/3 | 0.763 (0.667 - 0.868), 3/3 |
| PPO gold gain over continued SFT | 0.646 (0.271 - 0.969), 3/3 | 0.353 (0.031 - 0.644), **2/3** | 0.685 (0.525 - 0.841), 3/3 |
| DPO gold gain over SFT | 0.397 (0.337 - 0.439), 3/3 | 0.326 (0.212 - 0.412), 3/3 | 0.519 (0.476 - 0.605), 3/3 |
| GRPO accuracy gain over SFT | 0.139 (0.076 - 0.178), 3/3 | 0.061 (0.020 - 0.086), **2/3** | 0.147 (0.106 - 0.220), 3/3 |
| GRPO accuracy gain over continued SFT | 0.073 (0.042 - 0.112), 3/3 | 0.092 (0.062 - 0.134), 3/3 | 0.215 (0.170 - 0.274), 3/3 |

(the middle column: `--set equations=rounds` seed 0's model, copied in the same way, `python
benchmarks/demo.py --seeds 0 1 2 ppo.kl.beta=0.2`, 22:08 - 22:16 UTC, load 1-2; GRPO reaches 0.970 in both.)

An SFT at 0.83 leaves GRPO 0.17 to gain, and continued SFT keeps most of it (0.90), so its margin over
continued SFT falls to a third; PPO games the reward model on seed 2 (responses of 5.5 tokens, RM score 4.6,
gold -0.03). PPO with KL beta 0.2 on the same SFT and reward models (evaluated as the report does):
gain over SFT 0.622 / 0.609 / 0.529, over continued SFT 0.674 / 0.535 / 0.630, clear on 3/3
(with actor lr 3e-5 instead: seed 2 +0.175 against 2 SE 0.162). Adopting this pretraining means
re-balancing the demo's RL stages around a strong SFT (a harder RL task for GRPO, PPO's beta), which the
README's numbers would then have to be measured again for.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import resource
import time
from pathlib import Path
from typing import Any

from _record import record

from postrl.demo import ARITHMETIC, DemoConfig, copy_base_model
from postrl.lm import base_model
from postrl.lm.evaluation import complete, evaluate_task
from postrl.lm.models import load_causal_lm
from postrl.lm.pretrain import PretrainConfig, run_pretrain
from postrl.lm.sft import run_sft
from postrl.lm.tasks import get_task
from postrl.lm.tokenizer import load_tokenizer
from postrl.runtime.config import from_dict, merge_overrides
from postrl.runtime.config_values import to_dict

N_EVAL = 500  # held-out prompts, as the demo's report (DemoConfig.eval_prompts)


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def timed(fn, *args, **kwargs) -> tuple[Any, float]:
    """``fn``'s result and the CPU seconds (user + system, this process) it took."""
    started = cpu_seconds()
    result = fn(*args, **kwargs)
    return result, round(cpu_seconds() - started, 1)


def cached(run_dir: Path, make) -> dict[str, Any]:
    """``run_dir/bench.json`` if the run finished before, else ``make()`` recorded there."""
    record = run_dir / "bench.json"
    if (run_dir / "summary.json").is_file() and record.is_file():
        return json.loads(record.read_text())
    result = make()
    record.write_text(json.dumps(result, indent=2) + "\n")
    return result


def accuracies(model_dir: Path) -> dict[str, float]:
    """Greedy exact match on N_EVAL held-out sums: as questions (the task) and as bare equations (the corpus)."""
    model, tokenizer = load_causal_lm(model_dir).eval(), load_tokenizer(model_dir)
    task = get_task("arithmetic", **ARITHMETIC)
    new_tokens = DemoConfig().grpo.sampling.max_new_tokens
    question = evaluate_task(model, tokenizer, task, n=N_EVAL, max_new_tokens=new_tokens)["reward"]
    problems = task.problems("test")[:N_EVAL]
    texts = complete(model, tokenizer, [f"{a}{op}{b}=" for a, op, b in problems], max_new_tokens=new_tokens)
    # the answer is the completion's first number (the model may go on with another equation)
    firsts = [re.match(r"\s*(-?\d+)", t) for t in texts]
    hits = [m is not None and int(m.group(1)) == a + b for m, (a, _, b) in zip(firsts, problems, strict=True)]
    return {"accuracy": question, "equation_accuracy": sum(hits) / len(hits)}


def recipe(seed: int, overrides: list[str]) -> PretrainConfig:
    """The base model's recipe on ``seed``, with ``key=value`` overrides as `postrl pretrain` takes them."""
    return from_dict(PretrainConfig, merge_overrides(to_dict(base_model.recipe(seed)), overrides))


def pretrain(workdir: Path, seed: int, overrides: list[str], tag: str) -> dict[str, Any]:
    run_dir = workdir / f"pretrain{tag}-{seed}"

    def make() -> dict[str, Any]:
        load = os.getloadavg()[0]
        summary, cpu = timed(run_pretrain, recipe(seed, overrides), run_dir, overwrite=True)
        return {
            "heldout_loss": summary["heldout_loss"],
            "cpu_seconds": cpu,
            "wall_seconds": summary["wall_seconds"],
            "load_before": round(load, 2),
            **accuracies(run_dir / "model"),
        }

    return cached(run_dir, make)


def sft(workdir: Path, name: str, model_dir: Path, seed: int) -> dict[str, Any]:
    """The demo's SFT stage (DemoConfig().sft wired as postrl.demo.wire does) from ``model_dir``."""
    run_dir = workdir / name
    r = dataclasses.replace
    stage = DemoConfig().sft
    cfg = r(stage, model=str(model_dir), run=r(stage.run, seed=seed, threads=1))

    def make() -> dict[str, Any]:
        summary, cpu = timed(run_sft, cfg, run_dir, overwrite=True)
        return {
            "sft_heldout_loss": summary["heldout_loss"],
            "sft_own_accuracy": summary.get("heldout_accuracy"),
            "sft_cpu_seconds": cpu,
            **{f"sft_{k}": v for k, v in accuracies(run_dir / "model").items()},
        }

    return cached(run_dir, make)


def shipped(workdir: Path) -> Path:
    """The shipped base model copied as the demo copies it (its pretrain stage without --from-scratch)."""
    run_dir = workdir / "shipped"
    if not (run_dir / "summary.json").is_file():
        copy_base_model(None, run_dir)
    return run_dir / "model"


def table(rows: list[dict[str, Any]]) -> str:
    cols = ["run", "heldout_loss", "cpu_seconds", "equation_accuracy", "accuracy", "sft_heldout_loss",
            "sft_accuracy", "in_band"]  # fmt: skip
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        cells = [row.get(c) for c in cols]
        lines.append("| " + " | ".join(f"{c:.3f}" if isinstance(c, float) else str(c) for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2, 3, 4])
    parser.add_argument("--shipped-seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="override the recipe (e.g. run.steps=1600)"
    )
    parser.add_argument("--workdir", type=Path, default=Path("runs/bench-pretrain-seeds"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    started, load = time.perf_counter(), os.getloadavg()
    rows: list[dict[str, Any]] = []
    base = shipped(args.workdir)
    shipped_record = {"heldout_loss": base_model.provenance().get("heldout_loss"), **accuracies(base)}
    for seed in args.shipped_seeds:
        trained = sft(args.workdir, f"sft-shipped-{seed}", base, seed)
        rows.append({"run": f"shipped, SFT seed {seed}", **shipped_record, **trained})
    band = [r["sft_accuracy"] for r in rows]
    tag = "".join(f"-{o}" for o in args.set).replace("/", "_")  # the variant's run folders
    for seed in args.seeds:
        row = {"run": f"pretrain{tag} seed {seed}", **pretrain(args.workdir, seed, args.set, tag)}
        row.update(
            sft(args.workdir, f"sft{tag}-{seed}", args.workdir / f"pretrain{tag}-{seed}" / "model", seed)
        )
        rows.append(row)
        print(f"seed {seed}: {json.dumps(row)}", flush=True)
    for row in rows:
        row["in_band"] = bool(band) and row["sft_accuracy"] >= min(band)
    print(table(rows))
    scratch = [r for r in rows if r["run"].startswith("pretrain")]
    result = {
        "band": [min(band), max(band)] if band else None,
        "reached": sum(r["in_band"] for r in scratch),
        "seeds": len(scratch),
        "pretrain_cpu_seconds": [r["cpu_seconds"] for r in scratch],
        "load_average": [round(x, 2) for x in load] + [round(x, 2) for x in os.getloadavg()],
        "wall_seconds": round(time.perf_counter() - started, 1),
        "rows": rows,
    }
    record(f"pretrain_seeds{tag}", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
