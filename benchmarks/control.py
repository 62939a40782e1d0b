#!/usr/bin/env python

"""Benchmarks of ``postrl.control`` against the goals of issue 3, optionally beside Stable-Baselines3.

Each task trains the preset ``configs/<algo>-<env>.yaml`` for a fixed budget and several seeds and reports
the deterministic evaluation return (20 episodes, seeds 10000 + 100·seed + i, as the SB3 harness), env
steps per second (training wall time, evaluation excluded), the env steps until the 20-episode moving
average first reaches the threshold, and peak memory. ``--with-sb3`` runs the peer harness
(``benchmarks/peers/sb3_bench.py``, in its own venv: ``make peers``) on the same task right after each postrl seed, so the
two throughputs are measured side by side on the same (shared, noisy) machine, and prints their ratio.
Also: the throughput ceiling (a random-action 8-env CartPole vector env), and the variance of the
REINFORCE gradient estimate with and without the learned baseline.

    python benchmarks/control.py --quick                       # a smoke version (minutes)
    python benchmarks/control.py --tasks ppo-cartpole --seeds 0 1 2 --with-sb3
    python benchmarks/control.py                               # every task, 3 seeds (hours on 2 cores)
    python benchmarks/control.py --tasks ppo-cartpole --ppo-backend autograd   # PPO without its fused path

The last line printed is one JSON object with every result.

For results over many seeds (the README's Part 1 table: 10 seeds per preset, IQM with a bootstrap interval, the
fraction of seeds meeting the goal, all seeds' curves) use ``postrl control bench --config PRESET --seeds
10-19`` (``postrl/control/bench.py``); this script's goals are that command's ``TARGETS``.

``--with-sbx`` runs SBX (Stable-Baselines Jax 0.28, JAX on the CPU, one XLA thread: ``peers/sbx_bench.py``, its
venv ``make peers``) the same way; ``--breakdown`` adds one ppo-cartpole run timed by parts (`time_breakdown`);
``--env-backend gymnasium`` runs CartPole without the batched numpy env (``env.backend``).

Measured 2026-12-06 06:23–06:26 UTC (issue 38 item 1, commit 23bf1f5) on an idle Intel Xeon (AVX-512, another
machine than the AMD EPYC below; load 1.69 at the start, 1.08 at the end; ceiling 150,142 steps/s), ``--tasks
ppo-cartpole --seeds 0 1 2 --no-variance --with-sb3 --with-sbx --breakdown``: postrl 26,641 / 25,707 / 26,342 env
steps/s, SB3 5,104 / 5,043 / 5,037, SBX 4,930 / 5,004 / 4,886: **vs SB3 5.22× / 5.10× / 5.23× wall (4.57× / 5.70×
/ 5.65× CPU time), vs SBX 5.40× / 5.14× / 5.39×**; evaluation 500 in all nine runs, steps to 475 postrl 45,688 /
48,792 / 37,296. Earlier runs of the code before 23bf1f5 (which only put ``core.gae``'s per-step arithmetic back
from an ``addcmul``), load 0.5–1.5: 5.52× / 5.32× / 5.16×, 5.25× / 5.24× / 5.20× and 5.10× / 5.31× / 5.44× SB3.
At the start of this session the code before (commit 06bc1b2) gave 20,725 / 20,829 / 22,108 env steps/s against
SB3's 4,515 / 4,570 / 4,686 (4.59× / 4.56× / 4.72×) on the same machine. What changed (2f43609, a6a5906, 9825c54): on a non-AMD
CPU the fused step's tanh is torch's, in place (here 4.9 us on a [256, 64] tensor against 6.3 + 3.4 for 2σ(2u) − 1; AMD
keeps the sigmoid form, chosen by the CPU's vendor so that a resume repeats the rounding); the global-norm clip
rides in fused Adam's ``grad_scale``; the per-call ``torch.no_grad()`` decorators (~5.5 us each, two per minibatch
step) gave way to detached views; the statistics go into one preallocated [N, k] buffer whose column views are
made once (``Tensor.split`` cost ~18 us a step); the output layer is computed out-major (W hᵀ: the [256, 64] ×
[64, 2] product 7.0 → 2.9 us) and its log-softmax runs along contiguous memory (6.1 → 1.3 us); whitening in one
process takes five ops instead of ``masked_whiten``'s fifteen; the post-update entropy runs the hand-written
forward; ``core.gae`` takes each step's views once. A minibatch step on a real rollout: 398 → ~320 us (20 steps of
one update, `/tmp` script); an iteration (rollout, GAE, update) 11.2 → ~9.2 ms. Where the 3.80 s of training go:
update 2.83 s (74%), vector env 0.35, actor 0.26, the rest of the rollout 0.14, GAE 0.09, the rest 0.12. Of a
minibatch step, the GEMMs take ~125 us (16 of them; a 256 × 64 × 64 product runs at ~145 GFLOP/s here), tanh and
its derivative ~33, the bias sums ~10, Adam ~5; the rest is ~65 ops' dispatch and the Python around them.

Measured 2026-12-06 03:12–03:15 UTC (issue 38 item 1) on an idle AMD EPYC (AVX-512; load 0.75 at the start, 1.4
at the end; ceiling 129,745 steps/s), after the fused step's tanh went back to 2σ(2u) − 1 (postrl/control/fast/
ppo_grad.py: torch's tanh kernel costs 2.55 ns per element on this CPU, its sigmoid 0.55; a minibatch step 601 →
455 us) and the batched hidden-layer pair was removed (no faster), ``--tasks ppo-cartpole --seeds 0 1 2
--no-variance --with-sb3 --with-sbx --breakdown``: postrl 18,845 / 19,194 / 18,723 env steps/s, SB3 4,331 /
4,378 / 4,253, SBX 4,851 / 4,977 / 4,918: **vs SB3 4.35× / 4.38× / 4.40× wall (4.04× / 5.04× / 4.82× CPU time),
vs SBX 3.88× / 3.86× / 3.81×**; evaluation 500 in all nine runs, steps to 475 39,392 / 26,288 / 79,704 (the same
as every run with this forward). The same code at 02:25 beside the code before it (tanh in place, the pair; 2
alternating runs each, seed 0, load 1.8): 19,573 / 18,937 vs 14,869 / 15,966 env steps/s (+24%). This CPU runs
postrl's GEMM-bound update slower than the one of 2026-12-05 (22,726 env steps/s before the change there, 15,400
here) and SB3's overhead-bound loop about as fast (4,800 there, 4,330 here). Where the 5.27 s of training go:
update 4.09 s (78%: 7,820 minibatch steps of ~523 us; its GEMMs, 13.6 MFLOP a step, would take ~136 us at the
100 GFLOP/s one core reaches on a 416 × 128 × 512 product, the rest is ~60 small ops at 1-9 us each), vector env
0.39, actor 0.30, the rest of the rollout 0.20, GAE 0.13, the rest 0.18. ≥ 5× SB3 is not met on this machine.

Measured 2026-12-05 06:11–06:18 UTC (issue 38 item 1), the same command at a lower load (5.98 at the start,
5.3 at the end; ceiling 73,608 steps/s): postrl 12,036 / 8,902 / 14,929 env steps/s, SB3 2,053 / 1,927 / 3,191,
SBX 2,246 / 1,749 / 3,231: **vs SB3 5.86× / 4.62× / 4.68× wall, 4.81× / 5.11× / 5.15× CPU time; vs SBX 5.36× /
5.09× / 4.62× wall, 5.01× / 5.32× / 4.87× CPU time**; evaluation 500 in all nine runs, steps to 475 as below.
SBX here runs JAX with one XLA thread (as postrl and SB3 one torch thread) and is no faster than SB3 on this
CPU. The run timed by parts: 8.95 s of training = update 6.93 s (77 %), vector env 0.69, actor 0.52, the rest
of the rollout 0.31, GAE 0.20, the rest 0.29. So ≥ 3× SBX holds on every seed; ≥ 5× SB3 on one seed in wall
time and two in CPU time (median 4.68× wall): what is left is the update's GEMMs.

Measured 2026-12-05 (issue 38 item 1) after CartPole's batched numpy env (``env.backend`` auto → numpy,
postrl/control/fast/cartpole.py; the same episodes bit for bit, so the same learning: seed 0 reaches the
20-episode average ≥ 475 at 39,392 steps and seed 2 at 79,704 with either backend), on the shared 2-core
machine at load 14.8 → 16.0 from other helpers' jobs (SB3 from ``make peers``' .venv-sb3, SBX 0.28 with
jax 0.10.2): ``--tasks ppo-cartpole --seeds 0 1 2 --no-variance --with-sb3 --with-sbx --breakdown``:
postrl 2,435 / 2,805 / 2,294 env steps/s, SB3 439 / 479 / 627, SBX 985 / 801 / 869: **vs SB3 5.55× / 5.86× /
3.66× wall, 4.76× / 6.03× / 5.14× CPU time; vs SBX 2.47× / 3.50× / 2.64× wall, 3.39× / 5.26× / 4.41× CPU
time** (a peer's CPU time is its whole process: interpreter, imports, JAX's compilation and the evaluation;
postrl's is train_from_config, evaluation included). Evaluation 500 in all nine runs; steps to 475: postrl
39,392 / 26,288 / 79,704, SB3 25,136 / 25,464 / 32,512, SBX 28,072 / 27,440 / 44,888. At this load the wall
ratios swing with the other jobs (postrl got 22–30 % of a core): the ≥ 3× against SBX is met on seed 1 only
in wall time, on all three in CPU time. Where the time of a run goes (``--breakdown``, same load, 56.9 s of
training): update 45.2 s (79 %: 7,820 minibatch steps of the hand gradient, GEMM-bound: mm and addmm are
half of an update's profile), vector env 3.5 s, the actor's forward and sampling 2.7 s, the rest of the
rollout (buffer writes, the critic's values) 2.1 s, GAE 1.3 s, logging and the rest 2.1 s. The env part with
``env.backend=gymnasium`` on seed 2 at the same load: 10.1 s of the vector env against 2.0 s batched (the
whole run 79.6 vs 53.5 s).

Measured 2026-12-03 on the shared 2-core machine (load ≈ 6 from other jobs: read the ratio only), the
fused path against the reference one, ``--quick --tasks ppo-cartpole --no-variance --ppo-backend autograd``
then ``… fused``: 3,247 vs 5,003 env steps/s (1.54×), 6.3 vs 5.0 CPU-s for 30,208 steps.

Measured 2026-12-03 (later) on the idle 2-core machine, after the hand gradient's op diet (tanh as 2σ(2u) − 1,
since torch's tanh kernel costs 4.2 ns per element here and its sigmoid 2.1; [N, 1] columns end to end; the clip
mask in 3 ops; the statistics as one concatenation and a GEMM mean: 1.65 → 1.10 ms per minibatch) and the
rollout's uniforms drawn once per rollout (10.8 ms of rollout per 256 steps, was 11.8),
``--tasks ppo-cartpole --seeds 0 1 2 --with-sb3 --no-variance`` (load 0.97 at the start; ceiling 36,485 steps/s):
postrl 6,484 / 6,406 / 6,340 env steps/s vs SB3 1,870 / 1,916 / 1,804: **3.47× / 3.34× / 3.52× wall,
3.42× / 3.72× / 3.88× CPU time**; eval 500 in all six runs; steps to a 20-episode average ≥ 475 33,064 / 31,664 /
33,472 vs 25,136 / 25,464 / 32,512; peak RSS 318–354 MB. A run before the rollout change (hand gradient only),
same command: 6,677 / 6,672 / 6,684 vs 2,107 / 2,101 / 2,049: 3.17× / 3.17× / 3.26× wall. An iteration now:
≈ 38.5 ms = rollout 10.9 (vector env 7.2) + update 26.7 (20 × ≈ 1.2 ms with clipping and Adam) + GAE and the
rest 0.9. With the same hand gradient, ``--tasks ppo-acrobot ppo-pendulum --seeds 0 1 2 --no-variance``:
ppo-acrobot 2e5 → −89.8 / −83.5 / −90.6 (goal −100), 4,875 steps/s; ppo-pendulum 2e5 → −143.1 / −125.0 / −177.7
(goal −200), 2,739 steps/s. The other algorithms on the same code, 3 seeds each
(``--tasks trpo-cartpole trpo-pendulum a2c-cartpole reinforce-cartpole reinforce-nobaseline-cartpole
--seeds 0 1 2``, with the variance study; a second job shared the machine, so their steps/s read low):
trpo-cartpole 2e5 → 500 / 500 / 500 (goal 475); trpo-pendulum 3e5 → −144.8 / −127.7 / −164.6 (goal −300);
a2c-cartpole 5e5 → 500 / 500 / 500 (goal 475); reinforce-cartpole 5e5 with the baseline → 500 / 500 / 500
(goal 400), without it → 330.1 / 500.0 / 485.6; the REINFORCE gradient's variance (trace of the covariance,
30 batches of 8 episodes, policy trained 5e4 steps) 2.96 without the baseline vs 0.26 with it: 11.4× lower.

Measured 2026-12-03 on the idle 2-core machine (load 0.47 at the start; ceiling 37,092 steps/s), after the
fused Adam kernel in FlatAdam and VecEnv stepping the sync vector env's sub-envs itself
(``--tasks ppo-cartpole --seeds 0 1 2 --with-sb3 --no-variance``): postrl 4,933 / 5,010 / 5,008 env steps/s vs
SB3 1,898 / 2,007 / 1,961: **2.60× / 2.50× / 2.55× wall, 2.66× / 2.81× / 2.86× CPU time** (SB3 uses ~1.2 cores:
57–61 CPU-s in ~50 s); eval 500 in all six runs; steps to a 20-episode average ≥ 475 49,096 / 28,160 / 32,496
vs 25,136 / 25,464 / 32,512. An iteration now: ~50 ms = rollout 12.7 (vector env 7.7) + GAE 0.7 + update 36.7
(20 × 1.64 ms of hand gradient, of which the two MLPs' GEMMs and tanh ≈ 1.0 ms; clipping 1.3, Adam 1.1 in
all). Tried and dropped: stacking actor and critic into batched GEMMs (bmm) — 1.00 vs 1.01 ms per
minibatch, no gain; tanh layers in the sigmoid form 2σ(2z) − 1 (σ 34 µs vs tanh 71 µs on 256×64, the ×2 and
−1 folded into the GEMMs) — the whole hand gradient went from 1.69–1.79 to 1.92 ms: the backward's σ'·4 and
the bias-corrected weight gradient cost more than the forward saves. Still short of 3× wall.

Measured 2026-12-02 evening on the idle 2-core machine (load < 1.6; ceiling 34,979–38,345 steps/s):
- ppo-cartpole, 1e5 steps, side by side with SB3 2.9 (``--tasks ppo-cartpole --seeds 0 --with-sb3``), after
  the hand-written minibatch gradient (postrl/control/fast/ppo_grad.py), FlatAdam.update and the numpy actor of
  the rollout loop (numpy_actor.NumpyActor): postrl 4,852 env steps/s vs SB3 1,995: **2.43× wall, 2.49× CPU
  time** (23.2 s vs 57.8 s), eval 500 both, steps to a 20-episode average ≥ 475 41,944 vs 25,136. Before the
  numpy actor: 4,598 vs 1,985 (2.32×, 2.39× CPU); before the op diet of ppo_grad: 3,658 vs 1,620 (2.26×); in
  the morning, with autograd: 2,770 vs 1,422 (1.95×). SB3's own speed moved
  1,422–1,985 between runs on this machine, so only the side-by-side ratio means anything. Seeds 0 1 2
  without SB3 (before the op diet): 4,348 / 4,325 / 4,334 steps/s, eval 500 / 500 / 500, steps to 475: 20,872 / 28,904 / 26,848.
  Where an iteration (256 env steps) goes now: 20 minibatch steps × ~1.9 ms (GEMMs and tanh ≈ 1 ms of
  each; tanh costs ≈ 5 ns per element here), the rollout ≈ 18 ms (CartPole's Python step ≈ 22 µs × 8 envs,
  the sync vector env ≈ 90 µs, the actor ≈ 60 µs per vector step, 175 µs in torch). Still short of 3×.
- Earlier (load 2–17 from other jobs, the ceiling read 1,500–5,900 steps/s): 1e5 steps, seeds 0 1 2:
  wall ratios 1.23 / 3.98 / 1.33 swung by the other jobs; CPU time 2.3× (load ≈ 9) and 2.0× (load ≈ 2).
- With the hand-written gradient, seeds 0 1 2: ppo-acrobot 2e5 → −86.3 / −82.3 / −80.4 (−100). ppo-pendulum
  2e5 at the zoo's lr 1e-3 → −594 / −146 / −172, and −635 / −572 / −608 for seeds 3 4 5: the Gaussian's σ
  collapsed and the return stalled near −600. The gradient is not the cause (checked against autograd at every
  one of 9,600 minibatch steps of a 6e4-step run: equal to 1.3e-6 relative); autograd's runs at 1e-3 gave
  −147 / −125 / −198 / −264 / −236 for seeds 0–4, so which seeds fail is float-rounding chaos. The preset now
  uses lr 3e-4: −136 / −125 / −183 (seeds 0 1 2; goal −200) and −243 / −189 / −152 (seeds 3 4 5).
- Morning, 3 seeds, autograd: ppo-acrobot 2e5 → −90.5 / −86.4 / −76.7 (−100); ppo-pendulum 2e5 (lr 1e-3)
  with the preset's reward normalisation → −146.9 / −124.5 / −198.2 (−200; without it seed 1 reached only
  −425); trpo-cartpole 2e5 → 500 / 500 / 500 (475). Seed 0 only: a2c-cartpole 5e5 → 500 (475); trpo-pendulum 3e5 → −144.9 (−300);
  reinforce-cartpole 5e5 → 500 with the baseline (400) and 330 ± 51 without it.
- REINFORCE gradient variance (trace of the covariance over 30 batches of 8 episodes, policy trained 5e4
  steps): 2.96 without the baseline, 0.26 with it: 11.4× lower with the learned baseline.

Measured along the way (moved here from the code's comments; re-measure with this script): PPO's
`ppo_actor_critic_loss` + `backward` through autograd 2.6 ms per 256-row minibatch vs 1.1 ms for the hand-written gradient
(`postrl/control/fast/ppo_grad.py`); a small torch op 3–8 µs of dispatch, a 256×64 GEMM ≈ 60 µs, torch's float32
tanh ≈ 4 ns per element and sigmoid half that; `torch.optim.Adam.step` ≈ 0.3 ms of Python per call, the update
as single-tensor ops ≈ 0.1 ms, the fused kernel ≈ 0.03 ms, the optimizer hook wrapper ≈ 60 µs; with 64×64 MLPs
a torch op ≈ 8 µs vs a numpy op ≈ 1 µs (the numpy actor), one blocked draw of the rollout's uniforms saves
≈ 20 µs per step; Gymnasium's info merging ≈ 40 µs of a ≈ 260 µs CartPole vector step; a numpy row write into
the buffer ≈ 1 µs vs ≈ 5 µs through torch.

How configs/ppo-pendulum.yaml was chosen (issue 24; moved here from the preset's comment). Tuned on seeds 0–4
(the README's Part 1 table reports seeds 10–19), final deterministic evaluation over 20 episodes, target −200:
- no gSDE, lr 3e-4, observations and rewards normalised, 2e5 steps (the preset before): 10 of 15 other seeds;
- gSDE, lr 1e-3, observations and rewards normalised, 1e5: −147 / −137 / −780 / −431 (seeds 0–3);
- gSDE, lr 1e-3, no normalisation (the zoo's exact entry), 1e5: −139 / −117 / −202 / −267 (seeds 0–3; the
  misses are bimodal: the pendulum is not swung up in some episodes);
- the same with the lr annealed: −166 / −216 (seeds 2, 3), so 1e5 steps stay short of 9 in 10;
- the preset (annealed, 2e5) was not run on the tuning seeds: the shared 2-core machine ran at load 9–13, and
  it went straight to the reporting seeds.
- Issue 38 item 4 (2026-12-05): at γ 0.9 the preset met −200 on 9 of 10 seeds (10–19) and on 6 of 8 others
  (misses −226, −225; bimodal episodes, some never swung up); 3e5 steps at γ 0.9 gave −180.3 / −200.8 (seeds
  20, 21). γ 0.9 values a state about ten steps ahead, less than a swing-up takes. Tried on seeds 100, 101,
  105 (``postrl control bench --config ppo-pendulum --seeds 100-109 ppo.gamma=G``, cut short at load 13–24):
  γ 0.95 → −146.1 ± 74.5 / −121.2 ± 64.9 / −154.8 ± 98.5, γ 0.98 → −142.2 ± 68.7 / −118.1 ± 63.8 /
  −157.9 ± 104.6 (20-episode evaluation; the same evaluation episodes for both), 75–82 CPU-s a seed; the two
  are not told apart on three seeds, and the preset takes γ 0.98 for the longer horizon. The fresh seeds
  200–219: ``python benchmarks/control_seeds.py --config ppo-pendulum --seeds 200-219`` →
  ``benchmarks/results/control_seeds-ppo-pendulum.json`` (docs/results/control.md renders it): 20/20 meet
  −200, mean −141.4 ± 20.2, IQM −142.0 [−149.3, −130.6], worst −185.0 (seed 213), 66–91 CPU-s a seed. Where a run's
  time goes (cProfile, 4e4 steps): the autograd update 76%, the Gymnasium vector env 10%, the actor 10%; a numpy
  Pendulum (as ``fast/cartpole.py`` for CartPole) would save under a tenth, so the run was left as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _record import record

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from postrl.control.bench import TARGETS  # noqa: E402 (after the sys.path line)

# task → (algo, env id, budget in env steps, goal on the evaluation return, SB3 harness config or None)
TASKS = {
    "ppo-cartpole": ("ppo", "CartPole-v1", 100_000, TARGETS["ppo-cartpole"], "cartpole_zoo"),
    "ppo-acrobot": ("ppo", "Acrobot-v1", 200_000, TARGETS["ppo-acrobot"], None),
    "ppo-pendulum": ("ppo", "Pendulum-v1", 200_000, TARGETS["ppo-pendulum"], None),
    "a2c-cartpole": ("a2c", "CartPole-v1", 500_000, TARGETS["a2c-cartpole"], None),
    "trpo-cartpole": ("trpo", "CartPole-v1", 200_000, TARGETS["trpo-cartpole"], None),
    "trpo-pendulum": ("trpo", "Pendulum-v1", 300_000, TARGETS["trpo-pendulum"], None),
    "reinforce-cartpole": ("reinforce", "CartPole-v1", 500_000, TARGETS["reinforce-cartpole"], None),
    "reinforce-nobaseline-cartpole": (
        "reinforce",
        "CartPole-v1",
        500_000,
        TARGETS["reinforce-cartpole"],
        None,
    ),
}
TASK_OVERRIDES = {"reinforce-nobaseline-cartpole": ["reinforce.baseline=false"]}
QUICK_BUDGET = {
    "ppo-cartpole": 30_000,
    "ppo-pendulum": 50_000,
    "trpo-cartpole": 40_000,
    "reinforce-cartpole": 50_000,
}
PEERS = ROOT / "benchmarks" / "peers"  # sb3_bench.py; its venv: `make peers`


def run_postrl(
    task: str, seed: int, steps: int, out_root: Path, ppo_backend: str = "auto", env_backend: str = "auto"
) -> dict:
    from postrl.control.commands import control_preset_path
    from postrl.control.loop import algorithm, train_from_config
    from postrl.runtime.config import load_config

    algo, env_id, _, goal, _ = TASKS[task]
    cfg = load_config(
        algorithm(algo).config,
        control_preset_path(algo, env_id),
        [
            f"run.steps={steps}",
            f"run.seed={seed}",
            "run.save_every=0",
            *TASK_OVERRIDES.get(task, []),
            *([f"ppo.backend={ppo_backend}"] if algo == "ppo" else []),
            f"env.backend={env_backend}",
        ],
    )
    cpu_start = time.process_time()
    summary = train_from_config(cfg, out_root / f"{task}-s{seed}", overwrite=True)
    cpu_seconds = time.process_time() - cpu_start  # CPU time, robust to other jobs on a shared machine
    keys = ("eval_return_mean", "eval_return_std", "steps_per_second", "steps_to_threshold", "peak_rss_mb")
    row = {"backend": "postrl", "task": task, "seed": seed, "env_steps": summary["env_steps"]}
    row.update({k: summary[k] for k in keys})
    row["cpu_seconds"] = round(cpu_seconds, 1)
    if algo == "ppo":
        row["ppo_backend"] = ppo_backend
    row["env_backend"] = env_backend
    row["goal_met"] = summary["eval_return_mean"] >= goal
    return row


def run_peer(config: str, seed: int, steps: int, python: str, peer: str = "sb3") -> dict | None:
    """One seed of the SB3 harness (``peer`` sb3) or its SBX runner (sbx) in its own interpreter; None (with
    a message) if it cannot run."""
    cmd = [
        python,
        str(PEERS / f"{peer}_bench.py"),
        "--config",
        config,
        "--seeds",
        str(seed),
        "--timesteps",
        str(steps),
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=3600).stdout
    except (OSError, subprocess.SubprocessError) as err:
        print(f"{peer}: could not run {cmd}: {err}", file=sys.stderr)
        return None
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = json.loads(out.strip().splitlines()[-1])
    return {
        "backend": peer,
        "task": config,
        "seed": seed,
        "env_steps": res["total_timesteps"],
        "eval_return_mean": res["eval_mean"],
        "eval_return_std": res["eval_std"],
        "steps_per_second": res["sps"],
        "steps_to_threshold": res["steps_to_threshold"],
        # the whole child process (start-up and imports too, which postrl's in-process figure leaves out)
        "cpu_seconds": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1),
    }


def env_ceiling(seconds: float = 3.0) -> float:
    """Env steps per second of an 8-env sync CartPole vector env under random actions (no learning)."""
    import gymnasium as gym

    env = gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="sync")
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2, size=(4096, 8))
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(actions[steps % 4096])
        steps += 1
    return steps * 8 / (time.perf_counter() - start)


def time_breakdown(steps: int, out_root: Path, env_backend: str = "auto") -> dict:
    """Where a ppo-cartpole run's training time goes: seconds in the vector env's step, the rollout's actor
    (the policy forward and sampling), the rest of the rollout (the buffer, the critic's values), GAE and the
    update (20 epochs of minibatch steps), by timers around those functions in one run of ``steps``."""
    from postrl.control import envs, ppo
    from postrl.control.fast import numpy_actor

    seconds: dict[str, float] = {}
    targets = [
        (envs.VecEnv, "step", "env_step"),
        (numpy_actor.NumpyActor, "act", "actor_act"),
        (ppo, "collect_rollout", "rollout"),
        (ppo, "gae", "gae"),
        (ppo.PPOLearner, "update", "update"),
    ]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in targets]

    def timed(fn, key):
        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - start

        return wrapper

    for (owner, name, key), (_, _, fn) in zip(targets, originals, strict=True):
        setattr(owner, name, timed(fn, key))
    try:
        row = run_postrl("ppo-cartpole", 0, steps, out_root, env_backend=env_backend)
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)
    train = row["env_steps"] / row["steps_per_second"]
    out = {k: round(v, 2) for k, v in seconds.items()}
    out["rollout_other"] = round(seconds["rollout"] - seconds["env_step"] - seconds.get("actor_act", 0.0), 2)
    out["train_seconds"] = round(train, 2)
    out["other"] = round(train - seconds["rollout"] - seconds["gae"] - seconds["update"], 2)
    out["env_backend"], out["env_steps"] = env_backend, row["env_steps"]
    return out


def reinforce_gradient_variance(train_steps: int, batches: int, out_root: Path) -> dict:
    """Trace of the covariance of the REINFORCE gradient over independent batches, G_t vs G_t − b(s_t).

    The policy and its baseline are first trained for ``train_steps``; then the same sampled batches are
    used for both estimators (a paired comparison).
    """
    import torch

    from postrl.control import reinforce
    from postrl.control.commands import control_preset_path
    from postrl.control.envs import VecEnv
    from postrl.control.loop import train_from_config
    from postrl.core import flat_grad, reinforce_loss
    from postrl.runtime.checkpoint import latest_checkpoint, load_checkpoint
    from postrl.runtime.config import load_config

    cfg = load_config(
        reinforce.ControlReinforceConfig,
        control_preset_path("reinforce", "CartPole-v1"),
        [f"run.steps={train_steps}"],
    )
    run_dir = out_root / "reinforce-variance"
    train_from_config(cfg, run_dir, overwrite=True)
    env = VecEnv(cfg.env, 0)
    agent = reinforce.build_reinforce(cfg, env)
    load_checkpoint(latest_checkpoint(run_dir / "checkpoints"), modules=agent.modules, restore_rng=False)
    grads = {"without_baseline": [], "with_baseline": []}
    for b in range(batches):
        episodes = reinforce.collect_episodes(env, agent.actor, seed=10**6 + b * env.n_envs)
        log_probs, _ = agent.actor.evaluate(episodes.obs, episodes.actions)
        for name, base in (("without_baseline", None), ("with_baseline", agent.baseline)):
            weights, _ = reinforce.policy_gradient_weights(episodes, cfg.reinforce, base)
            loss = reinforce_loss(log_probs, weights, episodes.mask)
            grads[name].append(flat_grad(loss, agent.actor, retain_graph=True))
    out = {name: float(torch.stack(g).var(dim=0).sum()) for name, g in grads.items()}
    out["variance_ratio"] = out["without_baseline"] / out["with_baseline"]
    out["policy_train_steps"] = train_steps
    out["batches"] = batches
    return out


def summarize(rows: list[dict]) -> dict:
    by_task: dict[str, dict] = {}
    for task in dict.fromkeys(r["task"] for r in rows if r["backend"] == "postrl"):
        mine = [r for r in rows if r["backend"] == "postrl" and r["task"] == task]
        by_task[task] = {
            "eval_return_per_seed": [round(r["eval_return_mean"], 1) for r in mine],
            "steps_to_threshold_per_seed": [r["steps_to_threshold"] for r in mine],
            "steps_per_second_mean": round(float(np.mean([r["steps_per_second"] for r in mine])), 1),
            "goal": TASKS[task][3],
            "goal_met_seeds": f"{sum(r['goal_met'] for r in mine)}/{len(mine)}",
            "env_steps": mine[0]["env_steps"],
        }
        for name in ("sb3", "sbx"):
            by_task[task].update(_peer_summary(name, mine, rows, TASKS[task][4]))
    return by_task


def _peer_summary(name: str, mine: list[dict], rows: list[dict], config: str | None) -> dict:
    """``{name: ...}``: the peer's results on ``config`` and postrl's speed ratio to it, seed by seed."""
    peer = [r for r in rows if r["backend"] == name and r["task"] == config]
    if not peer:
        return {}
    pairs = [(m, p) for m in mine for p in peer if p["seed"] == m["seed"]]
    ratios = [m["steps_per_second"] / p["steps_per_second"] for m, p in pairs]
    return {
        name: {
            "eval_return_per_seed": [p["eval_return_mean"] for p in peer],
            "steps_to_threshold_per_seed": [p["steps_to_threshold"] for p in peer],
            "steps_per_second_mean": round(float(np.mean([p["steps_per_second"] for p in peer])), 1),
            "speed_ratio_per_seed": [round(x, 2) for x in ratios],
            "speed_ratio_median": round(float(np.median(ratios)), 2),
        }
    }


def run_peers(args, task: str, seed: int, steps: int, row: dict) -> list[dict]:
    """The peers asked for (--with-sb3, --with-sbx) on ``task``'s harness config, right after postrl's
    ``row`` of the same seed; each result is printed with postrl's speed ratio to it."""
    config, out = TASKS[task][4], []
    wanted = [("sb3", args.with_sb3, args.peers_python), ("sbx", args.with_sbx, args.sbx_python)]
    for name, python in [(name, python) for name, on, python in wanted if on and config]:
        peer = run_peer(config, seed, steps, python, name)
        if peer is None:
            continue
        out.append(peer)
        ratio = row["steps_per_second"] / peer["steps_per_second"]
        cpu_ratio = peer["cpu_seconds"] / max(row["cpu_seconds"], 1e-9)
        note = f"  # postrl/{name} speed ratio {ratio:.2f} (wall), {cpu_ratio:.2f} (CPU time)"
        print(json.dumps(peer) + note, flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small budgets, one seed, a few tasks")
    p.add_argument("--tasks", nargs="+", choices=list(TASKS), default=None)
    p.add_argument("--seeds", nargs="+", type=int, default=None)
    p.add_argument(
        "--with-sb3", action="store_true", help="run the SB3 harness side by side (needs `make peers`)"
    )
    p.add_argument(
        "--peers-python", default=str(PEERS / ".venv-sb3" / "bin" / "python"), help="python of the SB3 venv"
    )
    p.add_argument("--with-sbx", action="store_true", help="run SBX (peers/sbx_bench.py) side by side")
    p.add_argument(
        "--sbx-python", default=str(PEERS / ".venv-sbx" / "bin" / "python"), help="python of the SBX venv"
    )
    p.add_argument("--no-variance", action="store_true", help="skip the REINFORCE gradient-variance study")
    p.add_argument(
        "--breakdown", action="store_true", help="also time one ppo-cartpole run's parts (time_breakdown)"
    )
    p.add_argument("--out-dir", default=None, help="keep the run folders here (default: a temp folder)")
    p.add_argument(
        "--ppo-backend",
        choices=("auto", "fused", "autograd"),
        default="auto",
        help="ppo.backend of the PPO tasks (autograd: without the fused path)",
    )
    p.add_argument(
        "--env-backend",
        choices=("auto", "gymnasium", "numpy"),
        default="auto",
        help="env.backend of every task (gymnasium: CartPole without the batched numpy env)",
    )
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    tasks = args.tasks or (list(QUICK_BUDGET) if args.quick else list(TASKS))
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    out_root = Path(args.out_dir or tempfile.mkdtemp(prefix="postrl-bench-"))
    load = os.getloadavg()[0]
    results: dict = {"seeds": seeds, "quick": args.quick, "load_average_at_start": round(load, 2)}
    results["env_ceiling_steps_per_second"] = round(env_ceiling(), 0)
    print(f"ceiling: random 8-env CartPole vector env {results['env_ceiling_steps_per_second']:.0f} steps/s")
    rows = []
    for task in tasks:
        steps = QUICK_BUDGET.get(task, TASKS[task][2] // 10) if args.quick else TASKS[task][2]
        for seed in seeds:
            row = run_postrl(task, seed, steps, out_root, args.ppo_backend, args.env_backend)
            rows.append(row)
            print(json.dumps(row), flush=True)
            rows += run_peers(args, task, seed, steps, row)
    results["tasks"] = summarize(rows)
    if not args.no_variance and (args.tasks is None or "reinforce-cartpole" in tasks):
        variance_steps, batches = (10_000, 10) if args.quick else (50_000, 30)
        results["reinforce_gradient_variance"] = reinforce_gradient_variance(
            variance_steps, batches, out_root
        )
    if args.breakdown:
        results["time_breakdown"] = time_breakdown(TASKS["ppo-cartpole"][2], out_root, args.env_backend)
        print(json.dumps({"time_breakdown": results["time_breakdown"]}), flush=True)
    results["runs"] = rows
    results["out_dir"] = str(out_root)
    record("control-quick" if args.quick else "control", results)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
