"""Evaluation of a `postrl rm` reward model (`postrl.lm.reward_model`): held-out accuracy, margin, ECE and
gold agreement of preference pairs, and the mean and std of its scores on SFT-policy samples, exported next
to the model as ``reward_norm.json`` for PPO's reward normalisation (Ziegler et al. 2019, §2.2; "The N+
implementation details of RLHF with PPO", Huang et al. 2024)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from postrl.lm.reward_model.pairs import LOSSES, collate_pairs, pair_scores
from postrl.lm.trainer import to_device
from postrl.runtime.checkpoint import write_dir_atomically

NORM_FILE = "reward_norm.json"


@dataclass(frozen=True)
class NormConfig:
    """Score statistics on SFT samples (what PPO normalises rewards with)."""

    samples: int = 256
    """Responses sampled from the policy on train prompts and scored (0: skip)."""
    policy: str | None = None
    """Causal LM that samples them (default: `model`, the SFT checkpoint the RM starts from)."""
    max_new_tokens: int = 24
    """Longest sampled response (use PPO's)."""
    temperature: float = 1.0
    """Sampling temperature (use PPO's)."""

    CHECKS = {"samples": ">= 0", "max_new_tokens": ">= 1", "temperature": "> 0"}  # valid ranges


# ---- held-out metrics ----------------------------------------------------------------------------------
def expected_calibration_error(diff: torch.Tensor, bins: int = 10) -> float:
    """ECE of P(chosen ≻ rejected) = σ(r_c − r_l): confidence σ(|Δ|) ∈ [0.5, 1] against accuracy [Δ > 0],
    averaged over ``bins`` equal-width confidence bins weighted by their counts (Guo et al. 2017)."""
    confidence = torch.sigmoid(diff.abs())
    correct = (diff > 0).float()
    edges = torch.linspace(0.5, 1.0, bins + 1)
    which = torch.bucketize(confidence, edges[1:-1], right=True)  # (n,) bin index 0..bins−1
    ece = 0.0
    for k in range(bins):
        in_bin = which == k
        if in_bin.any():
            gap = (correct[in_bin].mean() - confidence[in_bin].mean()).abs()
            ece += float(in_bin.float().mean() * gap)
    return ece


@torch.no_grad()
def evaluate_pairs(
    model: torch.nn.Module,
    examples: Sequence[dict[str, Any]],
    pad_id: int,
    device: torch.device,
    loss: str,
    *,
    gold: Sequence[tuple[float, float]] | None = None,
    gold_tie: float = 0.0,
    bins: int = 10,
    batch_size: int = 64,
) -> dict[str, float]:
    """Held-out loss, accuracy and mean margin (on pairs whose label is not a tie), ECE, and with ``gold``
    ((g_chosen, g_rejected) per pair) the agreement with the gold ordering where |g_c − g_r| > ``gold_tie``
    and the Pearson correlation of scores with gold rewards."""
    was_training = model.training
    model.eval()
    diffs, targets, scores, total = [], [], [], 0.0
    for i in range(0, len(examples), batch_size):
        batch = to_device(collate_pairs(examples[i : i + batch_size], pad_id), device)
        chosen, rejected = pair_scores(model, batch)
        total += float(LOSSES[loss](chosen, rejected, batch)) * chosen.shape[0]
        diffs.append((chosen - rejected).cpu())
        targets.append(batch["target"].cpu())
        scores.append(torch.stack((chosen, rejected), -1).cpu())
    model.train(was_training)
    diff, target, score = torch.cat(diffs), torch.cat(targets), torch.cat(scores)  # (n,), (n,), (n, 2)
    oriented = torch.where(target >= 0.5, diff, -diff)[target != 0.5]  # Δ toward the labelled winner
    metrics = {
        "heldout_loss": total / max(1, len(examples)),
        "heldout_accuracy": float((oriented > 0).float().mean()) if oriented.numel() else float("nan"),
        "heldout_margin": float(oriented.mean()) if oriented.numel() else float("nan"),
        "heldout_ece": expected_calibration_error(oriented, bins) if oriented.numel() else float("nan"),
    }
    if gold is not None:
        g = torch.tensor(gold, dtype=torch.float32)  # (n, 2)
        gd = g[:, 0] - g[:, 1]
        decided = gd.abs() > gold_tie
        agree = (diff[decided] > 0) == (gd[decided] > 0)
        metrics["gold_accuracy"] = float(agree.float().mean()) if agree.numel() else float("nan")
        metrics["gold_correlation"] = float(torch.corrcoef(torch.stack((score.flatten(), g.flatten())))[0, 1])
    return metrics


# ---- normalisation statistics --------------------------------------------------------------------------
@torch.no_grad()
def score_policy_samples(
    rm: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[str],
    norm: NormConfig,
    *,
    policy: str,
    seed: int,
    device: torch.device,
    task: Any,
    trust_remote_code: bool = False,
) -> dict[str, float]:
    """Mean and std of the RM's scores (and, for a built-in task, of the gold reward) on ``norm.samples``
    responses sampled from the causal LM ``policy`` (a folder or hub name), one per prompt cycling through
    ``prompts``, with a generator seeded ``seed``."""
    # models and rollout import transformers (seconds): deferred so that `postrl rm --help` stays quick
    from postrl.lm.models import load_causal_lm
    from postrl.lm.rollout import RolloutEngine, SamplingConfig

    n = norm.samples
    sampler = load_causal_lm(policy, device=device, trust_remote_code=trust_remote_code)
    engine = RolloutEngine(
        sampler.eval(),
        tokenizer,
        SamplingConfig(max_new_tokens=norm.max_new_tokens, temperature=norm.temperature),
    )
    generator = torch.Generator(device=device).manual_seed(seed)
    chosen = [prompts[i % len(prompts)] for i in range(n)]
    scores, gold = [], []
    rm.eval()
    for i in range(0, n, 64):
        rollout = engine.generate(chosen[i : i + 64], generator=generator)
        scores.append(rm.score(rollout.input_ids, rollout.attention_mask).float().cpu())
        if task is not None:
            gold += task.gold_reward(rollout.prompts, rollout.texts)
    s = torch.cat(scores)
    stats = {"mean": float(s.mean()), "std": float(s.std()), "n": n}
    if gold:
        g = torch.tensor(gold)
        stats.update({"gold_mean": float(g.mean()), "gold_std": float(g.std())})
    return stats


def export_reward_model(rm: Any, tokenizer: Any, path: Path, norm: dict[str, float] | None) -> Path:
    """``save_pretrained`` the RM (a one-label ``*ForSequenceClassification``, which TRL and
    ``AutoModelForSequenceClassification`` load), the tokenizer and postrl's ``reward_norm.json`` into
    ``path`` atomically (`postrl.runtime.checkpoint.write_dir_atomically`)."""

    def write(tmp: Path) -> None:
        rm.save_pretrained(tmp, kind="reward", pad_token_id=tokenizer.pad_token_id)
        tokenizer.save_pretrained(str(tmp))
        if norm is not None:
            (tmp / NORM_FILE).write_text(json.dumps(norm, indent=2) + "\n")

    return write_dir_atomically(path, write)


def read_reward_norm(path: str | Path) -> dict[str, float] | None:
    """The ``reward_norm.json`` of an exported reward model, or None."""
    file = Path(path) / NORM_FILE
    return json.loads(file.read_text()) if file.is_file() else None
