"""`postrl grpo`: Group Relative Policy Optimization (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

No critic: each prompt gets a group of G sampled responses and the group's own rewards are the baseline,
A_i = (r_i − mean_g r) / (std_g r + ε) (or without the std: Dr. GRPO, Liu et al. 2025, arXiv:2503.20783).
One step:

    B prompts ──generate(π_old) × G──▶ Rollout [B·G, P+T] + log π_old ──reward fns──▶ r [B·G]
      ──core advantages (grpo.advantage)──▶ A [B·G]   (+ log π_ref from the frozen reference when β > 0)
      ──μ epochs × minibatches × micro-batches: core.grpo_loss (clip ε / ε_high, β·k3)──▶ AdamW steps

The family. The members differ only in the advantage (``grpo.advantage``), the importance weight w
(``grpo.importance_level``) and the aggregation (``grpo.loss_type``); the per-token loss is always

    ℓ_it = −min(w_it A_i, clip(w_it, 1 − ε, 1 + ε_high) A_i) + β k3_it          (core.grpo_loss)

    member       advantage A_i                       weight w                aggregation L
    GRPO         (r_i − mean_g r)/(std_g r + ε_A)    ρ_it = π_it/π_old,it    (1/B) Σ_i (1/|o_i|) Σ_t ℓ_it
    Dr. GRPO     r_i − mean_g r                      ρ_it                    Σ_it ℓ_it / (B·T_max)
    RLOO         r_i − Σ_{j≠i} r_j / (G − 1)         ρ_it, or π(o_i)/π_old(o_i)   as GRPO
                                                     (sequence_sum: TRL's RLOOTrainer)
    REINFORCE++  whiten_batch(r_i − mean_g r)        ρ_it                    as GRPO
    GSPO         as GRPO                             exp(mean_t log ρ_it)    as GRPO
    DAPO         as GRPO, on r + overlong penalty    ρ_it, ε_high 0.28, β 0  Σ_it ℓ_it / Σ_i |o_i|

GRPO: Shao et al. 2024, configs/grpo-arithmetic.yaml; Dr. GRPO: Liu et al. 2025; RLOO: Ahmadian et al.
2024, configs/rloo-arithmetic.yaml; REINFORCE++-baseline: Hu 2025; GSPO: Zheng et al. 2025,
configs/gspo-arithmetic.yaml; DAPO: Yu et al. 2025, configs/dapo-arithmetic.yaml (with dynamic sampling:
groups whose rewards are all equal are replaced). TRL's GRPOTrainer default is DAPO's aggregation alone
(configs/grpo-trl-arithmetic.yaml).

β > 0 puts the k3 KL to the frozen reference in the loss for every member (TRL's RLOOTrainer puts β·Σ_t
(log π_old − log π_ref) in the reward instead; at β = 0 the two are the same algorithm, and no reference is
loaded).

Old log-probs. π_old is the policy that sampled, so the sampling log-probs recorded by the rollout engine are
log π_old and no extra forward is needed. That is what μ = 1 uses (the ratio is then 1 up to float rounding of
the decode path, so the clip fraction is 0 and the loss value is ≈ 0 while its gradient is not). With μ > 1
the batch is re-scored teacher-forced once before the first update, so the ratio measures the policy's change
only, not the small numeric difference between the decode and the training forward.

Distributed (torchrun): every rank draws the same global prompts and takes its share of whole groups (so group
statistics are exact), samples them with its own generator, the loss normaliser is the global count
(all-reduce), gradients are averaged by DDP and only rank 0 writes. With ``run.parallel: fsdp`` the policy (and
reference) are sharded (FSDP2): sampling and scoring run inside `dist.gathered` (whole weights on every rank),
the training forward through FSDP. On the same global batch, N ranks take the same update as 1 process
(tests/dist); with minibatches > 1 too when each rank's rows are a multiple of them.
Options from DAPO (Yu et al. 2025, arXiv:2503.14476): clip-higher (``clip_eps_high``), token-level loss
(``loss_type: token``), dynamic sampling and the soft overlong penalty.

This file: the batch → loss, GRPO's part of the on-policy update PPO shares (`GRPOObjective`, run by
`postrl.lm.onpolicy`; the policy's forward is injected: a causal LM's, `text_policy`, or a VLM's), and
:class:`GRPO`, the algorithm the LM trainers' shared loop runs (`postrl.lm.spine`). The configs are in
`config.py`; loading and checking a run's input in `build.py`; the prompt stream, sampling, rewards, the batch (`collect`) and evaluation in `rollouts.py`.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from postrl.lm.grpo.build import build_grpo_run, check_grpo_config
from postrl.lm.grpo.config import GRPOConfig, is_correction
from postrl.lm.grpo.engine import VLLMEngine
from postrl.lm.grpo.lanes import AsyncEngine, GenerationLane
from postrl.lm.grpo.objective import (
    GRPOObjective as GRPOObjective,
)
from postrl.lm.grpo.objective import (
    PolicyForward as PolicyForward,
)
from postrl.lm.grpo.objective import (
    backward_grpo_minibatch as backward_grpo_minibatch,
)
from postrl.lm.grpo.objective import (
    grpo_batch_loss as grpo_batch_loss,
)
from postrl.lm.grpo.objective import (
    loss_normalizer as loss_normalizer,
)
from postrl.lm.grpo.objective import (
    loss_of as loss_of,
)
from postrl.lm.grpo.objective import (
    optimise_grpo as optimise_grpo,
)
from postrl.lm.grpo.objective import (
    policy_log_probs as policy_log_probs,
)
from postrl.lm.grpo.objective import (
    text_policy as text_policy,
)
from postrl.lm.grpo.objective import (
    update_grpo as update_grpo,
)
from postrl.lm.grpo.rollouts import PromptStream, Run, collect, evaluate_grpo_heldout
from postrl.lm.recipe import Setup
from postrl.lm.spine import LoopState, Parts
from postrl.lm.trainer import export_on_main, make_optimizer
from postrl.runtime import distributed as dist
from postrl.runtime.logging import read_jsonl
from postrl.runtime.plots import plot_curves

log = logging.getLogger(__name__)
# Said once per run, and only when it holds: with minibatches > 1 every minibatch after the first is taken
# by a policy that has moved, so its ratio leaves 1 even at epochs=1.
MU_ONE_NOTE = (
    "grpo: one update per batch (grpo.epochs=1, grpo.minibatches=1), so the ratio is 1: clip_fraction 0 and "
    "loss ~0 are expected, the gradient is not 0"
)


def grpo_step(
    run: Run, optimizer: torch.optim.Optimizer, stream: PromptStream, step: int
) -> dict[str, float]:
    """One GRPO step: collect a batch, μ epochs of the clipped objective; metrics averaged over ranks."""
    start = time.perf_counter()
    batch, metrics, inputs = collect(run, stream, step)
    middle = time.perf_counter()
    g, max_len = replace(run.cfg.grpo, is_correction=is_correction(run.cfg)), run.cfg.sampling.max_new_tokens
    policy = run.engine.policy(inputs, batch.input_ids.shape[0])
    objective = GRPOObjective(run.policy, policy, g, max_len, run.cfg.optim.max_grad_norm)
    stats = update_grpo(objective, optimizer, batch, g)
    metrics.update(stats)
    metrics["time_train"] = time.perf_counter() - middle
    metrics["time_step"] = time.perf_counter() - start
    metrics["tokens_per_second"] = metrics["generated_tokens"] / metrics["time_step"]
    return dist.reduce_metrics(metrics)


# ---- the algorithm the shared loop runs ---------------------------------------------------------------------
class GRPO:
    """GRPO as a `postrl.lm.spine` algorithm: a step samples, rewards and optimises; a checkpoint holds the
    policy, AdamW, the schedule, the prompt stream's position and the count of generated tokens."""

    name = "grpo"

    def __init__(self, run: Run, lane: GenerationLane | None = None) -> None:
        self.run, self.lane = run, lane
        self.optimizer, self.scheduler = make_optimizer(run.inner, run.cfg.optim, run.cfg.run.steps)
        if hasattr(run.engine, "weights_changed"):  # an engine with its own copy of the weights (vLLM)
            self.optimizer.register_step_post_hook(lambda *_: run.engine.weights_changed())
        self.stream = PromptStream(run.engine.prompt_count("train"), run.cfg.run.seed)
        self.generated_tokens = 0.0  # over all ranks, since step 0 (the summary's tokens_per_second)
        self.steps_done = 0  # the step an evaluation reports (it follows a step, or is the one at step 0)

    def step(self, step: int) -> dict[str, float]:
        if self.lane is not None and self.lane.process is None:
            self.lane.start(step, self.stream)  # here, not at build: a resumed run starts at its own step
        metrics = grpo_step(self.run, self.optimizer, self.stream, step)
        self.steps_done = step + 1
        if self.lane is not None:  # sending the new weights is part of the step, and of its time
            start = time.perf_counter()
            self.lane.published(self.steps_done)
            metrics["time_step"] += time.perf_counter() - start
            metrics["tokens_per_second"] = metrics["generated_tokens"] / metrics["time_step"]
        metrics["lr"] = self.scheduler.get_last_lr()[0]  # the lr this step used
        self.scheduler.step()
        self.generated_tokens += metrics["generated_tokens"] * dist.world_size()
        return metrics

    def bar(self, metrics: dict[str, float]) -> dict[str, float]:
        return {"reward": metrics["reward_mean"], "kl": metrics["kl"]}

    def evaluate(self) -> dict[str, float]:
        return evaluate_grpo_heldout(self.run, self.steps_done)

    def parts(self) -> Parts:
        extra = {"position": self.stream.position, "generated_tokens": self.generated_tokens}
        if self.lane is not None:
            extra["lane"] = self.lane.state()
        modules, optimizers = {"policy": self.run.policy}, {"policy": self.optimizer}
        return Parts(modules, optimizers, {"sched": self.scheduler}, extra, self.run.engine.write_files())

    def load_extra(self, extra: dict[str, Any]) -> None:
        count = self.run.engine.prompt_count("train")
        self.stream = PromptStream(count, self.run.cfg.run.seed, int(extra["position"]))
        self.generated_tokens = float(extra["generated_tokens"])
        if self.lane is not None and "lane" in extra:
            self.lane.load(extra["lane"])


def _summarize(algo: GRPO, state: LoopState) -> dict[str, Any]:
    """The run's summary: the last evaluation (and the first, as ``*_start``), the last step's reward and KL,
    and the throughput over training steps (evaluation and checkpoints excluded)."""
    evals, metrics = state.last_eval, state.last_metrics
    start = {f"{k}_start": v for k, v in state.start_eval.items()}
    return {
        "heldout_accuracy": evals.get("heldout_accuracy"),
        **evals,
        **start,
        "kl_to_ref": metrics.get("kl") if algo.run.ref is not None else None,
        "reward_mean": metrics.get("reward_mean"),
        "steps": state.step,
        "train_seconds": round(state.train_seconds, 3),
        "seconds_per_step": state.train_seconds / max(1, state.step),
        "tokens_per_second": algo.generated_tokens / max(1e-9, state.train_seconds),
    }


def _plot_run(run_dir: Path) -> Path | None:
    """``RUN_DIR/curves.png``: reward, held-out accuracy (greedy and sampled), KL, entropy, length."""
    keys = [
        "reward_mean",
        "heldout_accuracy",
        "heldout_accuracy_sampled",
        "heldout_reward",
        "kl",
        "entropy",
        "completion_length_mean",
    ]
    rows = read_jsonl(run_dir / "metrics.jsonl")
    return plot_curves(rows, keys, run_dir / "curves.png", title="GRPO")


class GRPORecipe:
    """GRPO as a `postrl.lm.recipe.Recipe`: the policy, reference, prompts and reward functions
    (`build.build_run`), `GRPO`, the policy's export."""

    def check(self, cfg: GRPOConfig) -> None:
        """The world-size checks need the distributed set-up: `load` makes them."""

    def one_backward(self, cfg: GRPOConfig) -> list[str]:
        """What stops ``optim.step_in_backward``: several backwards per optimiser step."""
        return [f"it needs grpo.grad_accum=1, not {cfg.grpo.grad_accum}"] if cfg.grpo.grad_accum != 1 else []

    def load(self, setup: Setup) -> None:
        check_grpo_config(setup.cfg, setup.info.world_size)
        run = build_grpo_run(setup.cfg, setup.info)
        setup.cfg = run.cfg  # its max_prompt_length clipped to the model's context (build.build_run)
        setup.extra["run"] = run

    def build(self, setup: Setup, resumed: bool) -> GRPO:
        cfg = setup.cfg
        if cfg.grpo.epochs == 1 and cfg.grpo.minibatches == 1 and setup.info.is_main:
            log.info(MU_ONE_NOTE)
            print(MU_ONE_NOTE, file=sys.stderr)
        run = setup.extra["run"]
        if not cfg.lanes.enabled:
            return GRPO(run)
        lane = GenerationLane(cfg, run.engine)
        run.engine = AsyncEngine(run.engine, lane)
        return GRPO(run, lane)

    def finish(self, setup: Setup, algo: GRPO, state: LoopState) -> dict[str, Any]:
        if algo.lane is not None:
            algo.lane.stop()
        if isinstance(algo.run.engine, VLLMEngine):  # a launched vLLM server stops with its run
            algo.run.engine.close()
        export_on_main(algo.run.policy, algo.run.tokenizer, setup.run_dir / "model")
        if setup.info.is_main:
            _plot_run(setup.run_dir)
        return _summarize(algo, state)
