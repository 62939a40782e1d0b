"""The gold-reward frontier: held-out gold reward (the hidden truth of a built-in task) and the reward model's
score (the proxy an RLHF method optimises) against the KL to the SFT policy, for every method on one chart.

Gao, Schulman and Hilton (2022, "Scaling laws for reward model overoptimization", arXiv:2210.10760) measured
exactly this with a gold reward model: as a policy moves away from the SFT policy (its KL grows), the proxy
score keeps rising while the gold reward rises, peaks and falls. postrl's built-in `reviews` task has a gold
reward, so every method can be put on the same axes:

- best-of-n from the SFT policy ranked by the reward model, n = 1 … 64, KL = log n − (n − 1)/n (the analytic KL
  of best-of-n sampling, Stiennon et al. 2020 / Gao et al. 2022);
- PPO-RLHF, DPO and GRPO/RLOO: each checkpoint of a run, its sampled held-out responses' gold reward,
  reward-model score and KL to the SFT policy (k1, summed over each response's tokens, averaged), all measured
  by the same evaluator (`postrl.lm.evaluation.evaluate_preference_policy`) on the same prompts.

A checkpoint's policy is read from its safetensors file (``model`` for SFT/DPO, ``actor`` for PPO, ``policy``
for GRPO) into the SFT model's architecture. `frontier_points` measures run folders, `best_of_n` the
baseline, `plot_frontier` draws the chart (the demo's report can call it with the demo's run folders).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch

POLICY_FILES = ("model.safetensors", "actor.safetensors", "policy.safetensors")
"""The policy's weights in a checkpoint folder: SFT and DPO, PPO (the actor), GRPO."""


def best_of_n_kl(n: int) -> float:
    """KL(π_best-of-n ‖ π) = log n − (n − 1)/n (Stiennon et al. 2020, appendix G.3)."""
    return math.log(n) - (n - 1) / n


def value_at_kl(path: Sequence[tuple[float, float]], kls: Sequence[float]) -> list[float | None]:
    """A run's value (e.g. gold reward) at each KL of ``kls``, read off its ``path`` of (KL, value) points in
    training order (the SFT policy first, at KL 0): linear between the two points of the first segment whose KL
    reaches it (the policy as the run first got that far from the SFT policy; a later dip of the noisy KL
    estimate does not count again); None where the run never reaches it. Two runs compared at the same KLs is
    the matched-KL comparison of a reward/KL frontier (Gao et al. 2022; Rafailov et al. 2023, fig. 2)."""
    if not path:
        raise ValueError("value_at_kl: the path has no points")
    return [_first_crossing(path, x) for x in kls]


def _first_crossing(path: Sequence[tuple[float, float]], x: float) -> float | None:
    if path[0][0] >= x:
        return path[0][1]
    for (kl_a, a), (kl_b, b) in pairwise(path):
        if kl_a < x <= kl_b:
            return a + (b - a) * (x - kl_a) / (kl_b - kl_a)
    return None


def load_policy(sft_model: str | Path, weights: str | Path) -> torch.nn.Module:
    """The SFT model's architecture with the weights of ``weights`` (a checkpoint's policy file, or a model
    folder), dropout off, eval mode."""
    from safetensors.torch import load_file

    from postrl.lm.models import load_causal_lm

    weights = Path(weights)
    if weights.is_dir() and (weights / "config.json").is_file():
        return load_causal_lm(weights).eval()
    model = load_causal_lm(sft_model)
    state = load_file(str(weights))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise ValueError(
            f"{weights}: not a policy of {sft_model} (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    model.tie_weights()
    return model.eval()


def checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, policy weights file) of every checkpoint of a run folder, in step order (run with
    ``run.keep_last=0`` to keep them all; the loop always saves the last step)."""
    run_dir = Path(run_dir)
    out = {}
    for folder in sorted((run_dir / "checkpoints").glob("step_*")):
        found = [folder / f for f in POLICY_FILES if (folder / f).is_file()]
        if found and (step := re.fullmatch(r"step_(\d+)", folder.name)):
            out[int(step.group(1))] = found[0]
    return sorted(out.items())


def _evaluate(
    policy: torch.nn.Module, reference: torch.nn.Module, tokenizer: Any, task: Any, scorer: Any, *, n: int,
    max_new_tokens: int, seed: int,
) -> dict[str, float]:  # fmt: skip
    """Gold reward, reward-model score and KL to ``reference`` of ``n`` held-out samples (temperature 1)."""
    from postrl.lm.evaluation import evaluate_preference_policy

    out = evaluate_preference_policy(
        policy, tokenizer, task, reference=reference, reward_model=scorer, n=n, max_new_tokens=max_new_tokens,
        seed=seed,
    )  # fmt: skip
    return {"gold": out["gold_reward"], "proxy": out["rm_score"], "kl": out["kl_to_ref"]}


def frontier_points(
    runs: dict[str, str | Path],
    sft_model: str | Path,
    reward_model: str | Path | None,
    task: Any,
    *,
    n: int = 256,
    max_new_tokens: int = 24,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One point per checkpoint of each run (``{method label: run folder}``), plus the SFT policy itself
    (method ``sft``, KL 0): ``{"method", "step", "kl", "gold", "proxy"}`` (proxy None without a
    ``reward_model``)."""
    from postrl.lm.models import ScalarHeadModel, load_causal_lm
    from postrl.lm.rewards.scorer import RewardModelScorer
    from postrl.lm.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(sft_model)
    reference = load_causal_lm(sft_model).eval()
    scorer = None
    if reward_model is not None:
        scorer = RewardModelScorer(
            ScalarHeadModel.from_pretrained(reward_model), load_tokenizer(reward_model)
        )
    kw = {"n": n, "max_new_tokens": max_new_tokens, "seed": seed}
    points = [{"method": "sft", "step": 0, **_evaluate(reference, reference, tokenizer, task, scorer, **kw)}]
    for label, run_dir in runs.items():
        for step, weights in checkpoints(run_dir):
            policy = load_policy(sft_model, weights)
            points.append(
                {"method": label, "step": step, **_evaluate(policy, reference, tokenizer, task, scorer, **kw)}
            )
    return points


@torch.no_grad()
def best_of_n(
    sft_model: str | Path,
    reward_model: str | Path,
    task: Any,
    *,
    ns: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    prompts: int = 128,
    max_new_tokens: int = 24,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Best-of-n from the SFT policy, ranked by the reward model: max(ns) samples for each of ``prompts``
    held-out prompt draws (cycling through the test prompts); for each n the samples are cut into max(ns)/n
    disjoint groups, the RM's favourite of each group is kept, and its gold reward and RM score averaged."""
    from postrl.lm.evaluation import complete
    from postrl.lm.models import ScalarHeadModel, load_causal_lm
    from postrl.lm.rewards.scorer import RewardModelScorer
    from postrl.lm.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(sft_model)
    policy = load_causal_lm(sft_model).eval()
    scorer = RewardModelScorer(ScalarHeadModel.from_pretrained(reward_model), load_tokenizer(reward_model))
    test = task.prompts("test")
    draws = [test[i % len(test)] for i in range(prompts)]
    k = max(ns)
    flat = [p for p in draws for _ in range(k)]  # prompt i's samples: rows i·k … i·k + k − 1
    texts = complete(
        policy, tokenizer, flat, max_new_tokens=max_new_tokens, greedy=False, seed=seed, batch_size=512
    )
    gold = torch.tensor(task.gold_reward(flat, texts)).view(prompts, k)
    proxy = torch.tensor(scorer(flat, texts)).view(prompts, k)
    out = []
    for n in ns:
        g, p = gold.view(prompts, k // n, n), proxy.view(prompts, k // n, n)
        best = p.argmax(-1, keepdim=True)
        out.append(
            {
                "method": "best-of-n",
                "n": n,
                "kl": best_of_n_kl(n),
                "gold": float(g.gather(-1, best).mean()),
                "proxy": float(p.gather(-1, best).mean()),
            }
        )
    return out


def plot_frontier(points: Sequence[dict[str, Any]], path: str | Path, title: str | None = None) -> Path:
    """Two panels against the KL to the SFT policy (nats): the gold reward (left) and the reward model's score,
    the proxy (right); one line per method (a run's checkpoints in step order; best-of-n in n order)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(p["method"] for p in points if p["method"] != "sft"))
    sft = [p for p in points if p["method"] == "sft"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for ax, key, label in (
        (axes[0], "gold", "gold reward (hidden truth)"),
        (axes[1], "proxy", "reward-model score (proxy)"),
    ):
        for method in methods:
            pts = [p for p in points if p["method"] == method]
            pts = sorted(pts, key=lambda p: p.get("n", p.get("step", 0)))
            xs, ys = [p["kl"] for p in pts], [p[key] for p in pts]
            if method != "best-of-n" and sft:  # every run starts at the SFT policy
                xs, ys = [0.0, *xs], [sft[0][key], *ys]
            style = {"marker": "o", "ms": 3, "lw": 1.5}
            if method == "best-of-n":
                style = {"marker": "s", "ms": 4, "lw": 2.0, "color": "black"}
            ax.plot(xs, ys, label=method, **style)
        ax.set_xlabel("KL to the SFT policy (nats per response)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title or "reviews: gold reward and proxy score against KL (held-out prompts)")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def frontier_chart(
    runs: dict[str, str | Path],
    sft_model: str | Path,
    reward_model: str | Path,
    path: str | Path,
    *,
    task: Any = None,
    samples: int = 256,
    bon_prompts: int = 128,
    seed: int = 0,
) -> tuple[Path, list[dict[str, Any]]]:
    """The whole frontier from run folders (e.g. the demo's ``{"PPO": out/"ppo", "DPO": out/"dpo"}``, each
    run with ``run.keep_last=0`` so that its checkpoints are the points): best-of-n from ``sft_model``, every
    checkpoint measured alike, the chart written to ``path``; returns (the chart, the points)."""
    if task is None:
        from postrl.lm.tasks import get_task

        task = get_task("reviews")
    points = frontier_points(runs, sft_model, reward_model, task, n=samples, seed=seed)
    points += best_of_n(sft_model, reward_model, task, prompts=bon_prompts, seed=seed)
    return plot_frontier(points, path), points
