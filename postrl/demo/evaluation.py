"""The demo's common evaluation: every checkpoint on the same held-out prompts (loss, arithmetic exact match,
the reviews' gold reward, reward-model score and KL to the SFT policy), and the gold-reward frontier's points."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from postrl.lm.data import tokenize_sft
from postrl.lm.dpo.frontier import best_of_n
from postrl.lm.evaluation import evaluate_preference_policy, evaluate_task
from postrl.lm.models import load_causal_lm
from postrl.lm.rewards import load_reward_fn
from postrl.lm.tasks import get_task
from postrl.lm.tokenizer import load_tokenizer
from postrl.lm.trainer import heldout_loss, make_batches
from postrl.runtime.logging import read_jsonl

CHECKPOINTS = ("pretrain", "sft", "ppo", "grpo", "sft-vs-ppo", "sft-vs-grpo")
COLUMNS = ("heldout_loss", "heldout_accuracy", "gold_reward", "rm_score", "kl_to_ref", "kl_to_ref_arithmetic")


@dataclass
class HeldOut:
    """What every checkpoint is evaluated against: the tasks, the SFT tokenizer, the reference (the SFT
    policy), the reward model's scores and the held-out demonstrations as batches."""

    arithmetic: Any
    reviews: Any
    tokenizer: Any
    reference: torch.nn.Module
    rm: Any
    batches: list[dict[str, torch.Tensor]]

    @classmethod
    def load(cls, cfg: Any, out: Path) -> HeldOut:
        """The held-out world of the demo in ``out`` (its SFT model and reward model), from config ``cfg``."""
        arithmetic = get_task("arithmetic", **cfg.grpo.task)
        reviews = get_task("reviews", **cfg.ppo.task)
        tokenizer = load_tokenizer(out / "sft" / "model")
        reference = load_causal_lm(out / "sft" / "model").eval()
        rm = load_reward_fn(f"rm:{out / 'rm' / 'model'}").fn
        demos = arithmetic.sft_rows("test")[:256] + reviews.sft_rows("test")[:256]
        examples = tokenize_sft(demos, tokenizer, 64, "truncate")
        batches = [
            make_batches(examples[i : i + 64], tokenizer.pad_token_id) for i in range(0, len(examples), 64)
        ]
        return cls(arithmetic, reviews, tokenizer, reference, rm, batches)


def evaluate_checkpoint(model: torch.nn.Module, held: HeldOut, cfg: Any) -> dict[str, Any]:
    """One checkpoint's row of `COLUMNS`, plus a few samples of each task."""
    arith = evaluate_task(
        model,
        held.tokenizer,
        held.arithmetic,
        n=cfg.eval_prompts,
        max_new_tokens=cfg.grpo.sampling.max_new_tokens,
    )
    prefs = evaluate_preference_policy(
        model,
        held.tokenizer,
        held.reviews,
        reference=held.reference,
        reward_model=held.rm,
        n=cfg.eval_samples,
        max_new_tokens=cfg.ppo.sampling.max_new_tokens,
        seed=cfg.seed,
    )
    arith_kl = evaluate_preference_policy(
        model,
        held.tokenizer,
        held.arithmetic,
        reference=held.reference,
        n=min(cfg.eval_samples, cfg.eval_prompts),
        max_new_tokens=cfg.grpo.sampling.max_new_tokens,
        seed=cfg.seed,
    )
    return {
        "heldout_loss": heldout_loss(model, held.batches),
        "heldout_accuracy": arith["reward"],
        "heldout_accuracy_n": arith["n"],
        "gold_reward": prefs["gold_reward"],
        "gold_reward_sd": prefs.get("gold_reward_sd"),
        "gold_reward_n": cfg.eval_samples,
        "heldout_rewards": arith["rewards"],  # per prompt, and per response below: for paired comparisons
        "gold_rewards": prefs["gold_rewards"],
        "rm_score": prefs["rm_score"],
        "kl_to_ref": prefs["kl_to_ref"],
        "kl_to_ref_arithmetic": arith_kl["kl_to_ref"],
        "samples": {"arithmetic": arith["samples"], "reviews": prefs["samples"]},
    }


def evaluate_checkpoints(
    cfg: Any, out: Path, names: Sequence[str] = CHECKPOINTS
) -> dict[str, dict[str, Any]]:
    """Held-out loss, arithmetic exact match (greedy), and on review prompts the gold reward, RM score and
    KL to the SFT policy (sampled), for every checkpoint ``out/NAME/model`` of ``names`` that exists; the
    same prompts for all."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    held = HeldOut.load(cfg, out)
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        path = out / name / "model"
        if not path.is_dir():
            continue
        results[name] = evaluate_checkpoint(load_causal_lm(path).eval(), held, cfg)
    return results


def frontier(cfg: Any, out: Path, evaluation: dict[str, dict]) -> list[dict[str, Any]]:
    """Points ``{"method", "kl", "gold", "proxy", "step" or "n"}`` on review prompts: the SFT policy (the common
    evaluation, KL 0), every held-out check PPO and DPO logged while training (their trainer's evaluator, the
    same on both: sampled responses, KL to the SFT policy summed over each response), and best-of-n from
    the SFT policy ranked by the reward model (n = 1, 2, 4 … ``cfg.frontier_max_n``; KL log n − (n − 1)/n)."""
    points: list[dict[str, Any]] = []
    if "sft" in evaluation:
        sft = evaluation["sft"]
        points.append(
            {"method": "sft", "step": 0, "kl": 0.0, "gold": sft["gold_reward"], "proxy": sft["rm_score"]}
        )
    keys = ("heldout_kl", "heldout_gold_reward", "heldout_rm_score")
    for name, label in (("ppo", f"PPO (β {cfg.ppo.kl.beta:g})"), ("dpo", f"DPO (β {cfg.dpo.dpo.beta:g})")):
        path = out / name / "metrics.jsonl"
        for row in read_jsonl(path) if path.is_file() else []:
            if all(isinstance(row.get(k), (int, float)) for k in keys):
                kl, gold, proxy = (row[k] for k in keys)
                points.append({"method": label, "step": row["step"], "kl": kl, "gold": gold, "proxy": proxy})
    sft_model, rm_model = out / "sft" / "model", out / "rm" / "model"
    if cfg.frontier_max_n and sft_model.is_dir() and rm_model.is_dir():
        ns = [2**i for i in range(cfg.frontier_max_n.bit_length()) if 2**i <= cfg.frontier_max_n]
        points += best_of_n(
            sft_model,
            rm_model,
            get_task("reviews", **cfg.ppo.task),
            ns=ns,
            prompts=cfg.frontier_prompts,
            max_new_tokens=cfg.ppo.sampling.max_new_tokens,
            seed=cfg.seed,
        )
    return points
