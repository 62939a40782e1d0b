"""`postrl online-dpo`: online DPO (Guo et al. 2024, arXiv:2402.04792). Offline DPO fits pairs sampled once,
from another policy; online DPO labels pairs of the policy's own current samples, so the labels follow the
policy as it moves (on-policy feedback, with a judge in place of a person: RLAIF). One step:

    B prompts ──π_θ samples 2 responses each──▶ judge: p = P(y₁ ≻ y₂ | x)  (`pairs.sample_judged_pairs`)
      ──Σ log π_ref of both (no gradients)──▶ reference log-probs [B, 2]
      ──Σ log π_θ, core.dpo_loss(target p) ──▶ AdamW step  (`postrl.lm.dpo.algorithm.dpo_train_step`)

The loss, its micro-batching and the reference pass are DPO's own (`postrl.lm.dpo`); only the data differs:
made each step instead of read from a file. Evaluation: the held-out samples' KL to the reference, gold reward
and RM score (`postrl.lm.evaluation.sample_metrics`, as DPO), and the judge's win rate of a policy sample over
a reference sample on held-out prompts (``heldout_judge_win_rate``: ½ at the start).

Resume: the prompt order is a function of (seed, position) and each step's sampling generator of (seed, step);
a checkpoint holds the policy, AdamW, the schedule and the position, so a resumed run equals a straight one.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from postrl.lm.dpo.algorithm import STAT_KEYS, dpo_train_step
from postrl.lm.dpo.build import reference_pair_log_probs
from postrl.lm.evaluation import PromptSet
from postrl.lm.judges import Judge, load_judge
from postrl.lm.online_dpo.config import OnlineDPOConfig
from postrl.lm.online_dpo.pairs import judge_win_rate, sample_judged_pairs, step_generator
from postrl.lm.recipe import Setup, run_recipe
from postrl.lm.rollout import RolloutEngine, response_forward
from postrl.lm.spine import LoopState, Parts
from postrl.lm.trainer import export_on_main, iterate_batches, make_optimizer, model_parts
from postrl.runtime import distributed as dist
from postrl.runtime.errors import UserError
from postrl.runtime.logging import read_jsonl
from postrl.runtime.plots import plot_curves

log = logging.getLogger(__name__)


class OnlineDPO:
    """Online DPO as a `postrl.lm.spine` algorithm: a step samples, judges and takes one DPO step."""

    name = "online-dpo"

    def __init__(self, setup: Setup, judge: Judge, evaluate_samples: Any) -> None:
        cfg, x = setup.cfg, setup.extra
        self.cfg, self.tokenizer, self.device = cfg, setup.tokenizer, setup.info.device
        self.model = dist.wrap_model(setup.policy, setup.info, cfg.run.parallel)
        self.reference, self.judge, self.task = x["reference"], judge, x["task"]
        self.prompts, self.heldout = x["prompts"], x["heldout"]
        self.evaluate_samples = evaluate_samples
        self.optimizer, self.scheduler = make_optimizer(dist.unwrap(self.model), cfg.optim, cfg.run.steps)
        self.position = 0
        self.batches = iterate_batches(len(self.prompts.rows), cfg.train.batch_size, cfg.run.seed)
        self.forward = response_forward(self.model, cfg.sampling.use_fast)
        self.ref_forward = response_forward(self.reference, cfg.sampling.use_fast, gradients=False)
        self.engine = RolloutEngine(dist.unwrap(self.model), self.tokenizer, cfg.sampling)
        self.model.train()

    def step(self, step: int) -> dict[str, float]:
        cfg, pad = self.cfg, self.tokenizer.pad_token_id
        self.position, indices = next(self.batches)
        self.position += 1
        prompts = [self.prompts.rows[i]["prompt"] for i in indices]
        tic = time.perf_counter()
        with dist.gathered(self.model):  # sampling reads whole weights
            pairs, sampled = sample_judged_pairs(
                self.engine, self.judge, cfg.judge, prompts, step_generator(self.device, cfg.run.seed, step),
                cfg.labels == "hard",
            )  # fmt: skip
        sample_seconds = time.perf_counter() - tic
        ref = reference_pair_log_probs(self.ref_forward, pairs, pad, self.device, cfg.dpo.ref_batch_size)
        out = dpo_train_step(
            self.model,
            self.forward,
            self.optimizer,
            pairs,
            ref,
            list(range(len(pairs))),
            cfg,
            pad,
            self.device,
        )
        out |= self.sample_stats(prompts, sampled)
        out["time_sample_judge"] = sample_seconds
        out["time_step"] = time.perf_counter() - tic
        out["lr"] = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        return out

    def sample_stats(self, prompts: list[str], sampled: dict[str, Any]) -> dict[str, float]:
        """The step's samples: length, the judge's mean confidence 2|p − ½|, identical pairs, gold reward."""
        p = sampled["p"]
        out = {
            "sample_length": float(sampled["lengths"].mean()),
            "judge_confidence": sum(abs(2 * x - 1) for x in p) / len(p),
            "identical_pairs": sum(a == b for a, b in zip(sampled["first"], sampled["second"], strict=True))
            / len(p),
        }
        if self.task is not None:
            gold = self.task.gold_reward([*prompts, *prompts], [*sampled["first"], *sampled["second"]])
            out["sample_gold_reward"] = sum(gold) / len(gold)
        return out

    def bar(self, metrics: dict[str, float]) -> dict[str, float]:
        return {"loss": metrics["loss"], "conf": metrics["judge_confidence"]}

    def evaluate(self) -> dict[str, float]:
        """Held-out sampled-response metrics and the judge's win rate against the reference."""
        inner, cfg = dist.unwrap(self.model), self.cfg
        out: dict[str, float] = {}
        with dist.gathered(self.model):
            if self.evaluate_samples is not None:
                out.update(self.evaluate_samples(inner))
            texts = self.heldout.texts
            if cfg.eval_judge_prompts and texts:
                chosen = [texts[i % len(texts)] for i in range(cfg.eval_judge_prompts)]
                out["heldout_judge_win_rate"] = judge_win_rate(
                    inner, self.reference, self.tokenizer, self.judge, chosen, cfg.sampling, cfg.run.seed
                )
        return out

    def parts(self) -> Parts:
        return model_parts(self.model, self.optimizer, self.scheduler, self.tokenizer, self.position)

    def load_extra(self, extra: dict[str, Any]) -> None:
        self.position = int(extra["position"])
        self.batches = iterate_batches(
            len(self.prompts.rows), self.cfg.train.batch_size, self.cfg.run.seed, self.position
        )


STEP_KEYS = ("loss", *STAT_KEYS, "judge_confidence", "sample_length", "sample_gold_reward")


class OnlineDPORecipe:
    """Online DPO as a `postrl.lm.recipe.Recipe`: policy, reference, prompts and judge loaded and checked
    before the run folder is touched."""

    eval_at_start = True

    def check(self, cfg: OnlineDPOConfig) -> None:
        if cfg.run.parallel not in dist.PARALLEL:
            raise UserError(f"run.parallel must be one of {dist.PARALLEL}, got {cfg.run.parallel!r}")
        room = cfg.train.max_length - cfg.sampling.max_new_tokens
        if room < 1:
            raise UserError(
                f"train.max_length ({cfg.train.max_length}) - sampling.max_new_tokens "
                f"({cfg.sampling.max_new_tokens}) leaves no room for a prompt"
            )
        if cfg.sampling.greedy:
            raise UserError(
                "sampling.greedy must be false: online DPO needs two different samples per prompt"
            )

    def load(self, setup: Setup) -> None:
        from postrl.lm.evaluation import reward_model_scorer  # deferred: transformers
        from postrl.lm.online_dpo.data import load_prompts

        setup.load_policy()
        cfg = setup.cfg
        prompts, heldout, task = load_prompts(cfg, setup.tokenizer)
        judge = load_judge(
            cfg.judge, device=setup.info.device, constitution=cfg.judge_constitution, model=cfg.judge_model
        )
        setup.extra.update(
            prompts=prompts, heldout=heldout, task=task, judge=judge, reference=setup.load_reference(),
            scorer=reward_model_scorer(cfg, setup.info.device),
        )  # fmt: skip

    def build(self, setup: Setup, resumed: bool) -> OnlineDPO:
        from postrl.lm.evaluation import sample_metrics  # deferred: transformers

        cfg, x = setup.cfg, setup.extra

        def evaluate_samples(inner: torch.nn.Module) -> dict[str, float]:
            held = PromptSet(x["heldout"].rows)
            return sample_metrics(inner, x["reference"], setup.tokenizer, held, cfg, x["task"], x["scorer"])

        return OnlineDPO(setup, x["judge"], evaluate_samples if cfg.eval_samples else None)

    def finish(self, setup: Setup, algo: OnlineDPO, state: LoopState) -> dict[str, Any]:
        export_on_main(algo.model, setup.tokenizer, setup.run_dir / "model")
        if setup.info.is_main and setup.cfg.plots:
            plot_online_dpo(setup.run_dir)
        return summarize(setup.cfg, state)


def summarize(cfg: OnlineDPOConfig, state: LoopState) -> dict[str, Any]:
    """The last evaluation (and the first, as ``*_start``), the last step's metrics, labels used, timing."""
    start = {f"{k}_start": v for k, v in state.start_eval.items()}
    last = {k: state.last_metrics[k] for k in STEP_KEYS if k in state.last_metrics}
    return {
        **state.last_eval,
        **start,
        **last,
        "steps": state.step,
        "pairs_labelled": state.step * cfg.train.batch_size,
        "judge": cfg.judge,
        "beta": cfg.dpo.beta,
        "train_seconds": round(state.train_seconds, 3),
        "seconds_per_step": state.train_seconds / max(1, state.step),
    }


def run_online_dpo(
    cfg: OnlineDPOConfig, run_dir: str | Path, resume: bool = False, overwrite: bool = False
) -> dict[str, Any]:
    """Train with online DPO, export ``RUN_DIR/model`` (HF format), write the run folder, return the summary."""
    return run_recipe(OnlineDPORecipe(), cfg, run_dir, resume=resume, overwrite=overwrite)


def plot_online_dpo(run_dir: Path) -> Path | None:
    """``RUN_DIR/curves.png``: the loss, the judge's confidence, the samples' gold reward, and the held-out
    win rate against the reference, gold reward and KL."""
    keys = ["loss", "reward_accuracy", "judge_confidence", "sample_gold_reward", "heldout_judge_win_rate"]
    keys += ["heldout_gold_reward", "heldout_kl"]
    return plot_curves(
        read_jsonl(run_dir / "metrics.jsonl"), keys, run_dir / "curves.png", title="Online DPO"
    )
