"""What a round of `postrl loop` does besides training: sample pairs from the current policy, label them, and
report where the policy stands (gold reward, KL to the start, the reward model's accuracy on the policy's
own samples)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from postrl.feedback.config import LoopConfig
from postrl.lm.data import load_rows
from postrl.lm.evaluation import complete, evaluate_preference_policy
from postrl.lm.judges import load_judge, preference_rows
from postrl.lm.models import load_causal_lm
from postrl.lm.rewards import load_reward_fn
from postrl.lm.tasks import SyntheticLabeller, get_task
from postrl.lm.tokenizer import load_tokenizer
from postrl.runtime.errors import UserError

TIE = 0.05  # gold rewards this close are not counted in the reward model's accuracy (the labeller's tie)


@dataclass
class World:
    """The prompts pairs are sampled for and, for a built-in task, its gold reward and labeller."""

    train: list[Any]
    heldout: list[Any]
    task: Any = None
    judge: Any = None
    """the labeller when it is a judge (loaded by `check_labeller`, before anything is written)"""

    @property
    def has_gold(self) -> bool:
        return self.task is not None and hasattr(self.task, "gold_reward")


def load_world(cfg: LoopConfig) -> World:
    """The prompts of ``cfg.data`` (a task's train and test split, or a file's rows, the last tenth held out)."""
    if cfg.data.startswith("task:"):
        task = get_task(cfg.data[len("task:") :], **cfg.task)
        return World(task.prompts("train"), task.prompts("test"), task)
    prompts = [row["prompt"] for row in load_rows(cfg.data, "prompts")]
    cut = max(1, len(prompts) // 10)
    if len(prompts) < 2:
        raise UserError(f"data: {cfg.data} holds {len(prompts)} prompt(s); the loop needs at least 2")
    return World(prompts[:-cut], prompts[-cut:])


def sample_pairs(model_dir: str, world: World, n: int, cfg: LoopConfig, seed: int) -> list[dict[str, Any]]:
    """``n`` pairs {"prompt", "responses": [a, b]} of two different samples of ``model_dir`` (the train prompts
    cycled from a seed-dependent start; pairs whose two samples are the same are drawn again)."""
    model, tokenizer = load_causal_lm(model_dir, what="policy"), load_tokenizer(model_dir, what="policy")
    kwargs = {"max_new_tokens": cfg.max_new_tokens, "greedy": False, "temperature": cfg.temperature}
    pairs: list[dict[str, Any]] = []
    start = seed * 7919 % len(world.train)
    for attempt in range(4):
        want = n - len(pairs)
        prompts = [
            world.train[(start + len(pairs) + attempt * n + i) % len(world.train)] for i in range(want)
        ]
        first = complete(model, tokenizer, prompts, seed=seed * 10 + 2 * attempt, **kwargs)
        second = complete(model, tokenizer, prompts, seed=seed * 10 + 2 * attempt + 1, **kwargs)
        pairs += [
            {"prompt": p, "responses": [a, b]}
            for p, a, b in zip(prompts, first, second, strict=True)
            if a.strip() != b.strip() and a.strip() and b.strip()
        ]
        if len(pairs) >= n:
            return pairs[:n]
    if not pairs:
        raise UserError(f"model {model_dir}: every pair of samples was the same; raise temperature")
    return pairs


def label_pairs(
    pairs: list[dict[str, Any]], world: World, cfg: LoopConfig, seed: int
) -> list[dict[str, Any]]:
    """TRL preference rows (prompt/chosen/rejected/target) for ``pairs`` from the synthetic labeller or a
    judge (``cfg.labeller``; the page is `rounds.py`'s: people label in their own time)."""
    prompts = [p["prompt"] for p in pairs]
    firsts, seconds = [p["responses"][0] for p in pairs], [p["responses"][1] for p in pairs]
    if cfg.labeller == "synthetic":
        labeller = SyntheticLabeller(world.task.labeller_config, seed=seed)
        gold_a, gold_b = world.task.gold_reward(prompts, firsts), world.task.gold_reward(prompts, seconds)
        return [labeller.label(*row) for row in zip(prompts, firsts, seconds, gold_a, gold_b, strict=True)]
    probabilities = world.judge(prompts, firsts, seconds)
    rows = [{"prompt": p, "first": a, "second": b} for p, a, b in zip(prompts, firsts, seconds, strict=True)]
    return preference_rows(rows, probabilities)


def check_labeller(cfg: LoopConfig, world: World) -> None:
    """Refuse a labeller the world cannot serve, before anything is written."""
    if cfg.labeller == "synthetic" and not (world.has_gold and hasattr(world.task, "labeller_config")):
        raise UserError(
            f"labeller=synthetic needs a built-in task with a gold reward and a labeller (task:reviews); "
            f"data={cfg.data} has none: use labeller=page or a judge spec"
        )
    if cfg.labeller not in ("synthetic", "page"):
        try:
            world.judge = load_judge(cfg.labeller)
        except UserError as err:
            raise UserError(f"labeller: {err}") from err


def report(policy_dir: str, world: World, cfg: LoopConfig, rm_dir: Path | None, seed: int) -> dict[str, Any]:
    """Where ``policy_dir`` stands: its gold reward on held-out prompts (when the task has one), its KL to the
    starting model, and the reward model's accuracy on pairs of the policy's own samples (the gold order,
    ties within 0.05 left out): where an offline reward model is exploited, this falls."""
    if not world.has_gold:
        return {"gold_reward": None, "kl_to_start": None, "rm_accuracy_on_policy": None}
    model, tokenizer = load_causal_lm(policy_dir, what="policy"), load_tokenizer(policy_dir, what="policy")
    start = load_causal_lm(cfg.model, what="model").eval()
    kwargs = {"n": cfg.eval_size, "max_new_tokens": cfg.max_new_tokens, "temperature": cfg.temperature}
    first = evaluate_preference_policy(model, tokenizer, world.task, reference=start, seed=seed, **kwargs)
    out = {
        "gold_reward": first["gold_reward"],
        "gold_reward_sd": first["gold_reward_sd"],
        "kl_to_start": first["kl_to_ref"],
        "rm_accuracy_on_policy": None,
    }
    if rm_dir is not None:
        prompts = [world.heldout[i % len(world.heldout)] for i in range(cfg.eval_size)]
        sample = {"max_new_tokens": cfg.max_new_tokens, "greedy": False, "temperature": cfg.temperature}
        a = complete(model, tokenizer, prompts, seed=seed + 1, **sample)
        b = complete(model, tokenizer, prompts, seed=seed + 2, **sample)
        rm = load_reward_fn(f"rm:{rm_dir}").fn
        gold = zip(world.task.gold_reward(prompts, a), world.task.gold_reward(prompts, b), strict=True)
        scores = zip(rm(prompts, a), rm(prompts, b), strict=True)
        agree = [
            (ga > gb) == (sa > sb)
            for (ga, gb), (sa, sb) in zip(gold, scores, strict=True)
            if abs(ga - gb) > TIE
        ]
        out["rm_accuracy_on_policy"] = sum(agree) / len(agree) if agree else None
        out["rm_pairs_on_policy"] = len(agree)
    return out


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """``rows`` as JSONL, written whole or not at all."""
    from postrl.runtime.checkpoint import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
