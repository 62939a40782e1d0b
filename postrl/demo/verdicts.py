"""Did each stage earn its place? Each stage's number against its baseline's, with two standard errors of the
difference (paired prompt by prompt where both checkpoints answered the same prompts) and a plain verdict."""

from __future__ import annotations

from typing import Any

# (stage, metric, baseline): what each stage must beat. A baseline is a checkpoint of the evaluation, or
# "chance" (a coin's pair accuracy, for the reward model). A new stage adds its rows here.
COMPARISONS = (
    ("sft", "heldout_accuracy", "pretrain"),
    ("rm", "heldout_accuracy", "chance"),
    ("ppo", "gold_reward", "sft"),
    ("ppo", "gold_reward", "sft-vs-ppo"),
    ("dpo", "gold_reward", "sft"),
    ("grpo", "heldout_accuracy", "sft"),
    ("grpo", "heldout_accuracy", "sft-vs-grpo"),
    ("vlm-sft", "heldout_accuracy", "vlm-align"),  # the vision branch (postrl.demo.vlm)
    ("vlm-grpo", "heldout_accuracy", "vlm-sft"),
    ("vlm-grpo", "heldout_accuracy", "vlm-sft-vs-grpo"),
)
BASELINE_TEXT = {
    "pretrain": "the pretrained model",
    "sft": "SFT",
    "chance": "chance",
    "sft-vs-ppo": "continued SFT for PPO's training time",
    "sft-vs-grpo": "continued SFT for GRPO's training time",
    "vlm-align": "the aligned VLM",
    "vlm-sft": "the VLM's SFT",
    "vlm-sft-vs-grpo": "the VLM's continued SFT for GRPO's training time",
}


PER_ITEM = {"heldout_accuracy": "heldout_rewards", "gold_reward": "gold_rewards"}
"""Where a row keeps a metric's per-prompt values (the same held-out prompts, in the same order, for every
checkpoint), so that two checkpoints compare prompt by prompt."""


def _paired_standard_error(metric: str, row: dict[str, Any], base_row: dict[str, Any]) -> float | None:
    """The standard error of the mean per-prompt difference between two checkpoints (a paired comparison:
    prompts that are hard for both do not count as noise), or None without per-prompt values of both."""
    xs, ys = row.get(PER_ITEM.get(metric, "")), base_row.get(PER_ITEM.get(metric, ""))
    if not isinstance(xs, list) or not isinstance(ys, list) or len(xs) != len(ys) or len(xs) < 2:
        return None
    d = [x - y for x, y in zip(xs, ys, strict=True)]
    mean = sum(d) / len(d)
    return (sum((v - mean) ** 2 for v in d) / (len(d) - 1) / len(d)) ** 0.5


def _standard_error(metric: str, row: dict[str, Any], value: float) -> float | None:
    """The standard error of one checkpoint's mean: binomial for an accuracy, sd/√n for the gold reward."""
    if metric == "heldout_accuracy" and row.get("heldout_accuracy_n"):
        return (value * (1 - value) / row["heldout_accuracy_n"]) ** 0.5
    if metric == "gold_reward" and row.get("gold_reward_sd") is not None and row.get("gold_reward_n"):
        return row["gold_reward_sd"] / row["gold_reward_n"] ** 0.5
    return None


def _rm_row(stages: dict[str, dict]) -> dict[str, Any]:
    rm = stages.get("rm", {})
    return {"heldout_accuracy": rm.get("heldout_accuracy"), "heldout_accuracy_n": rm.get("heldout_pairs")}


def verdicts(evaluation: dict[str, dict[str, Any]], stages: dict[str, dict]) -> list[dict[str, Any]]:
    """For each row of `COMPARISONS` whose numbers exist: the two values, the margin, two standard errors of
    the difference (paired, prompt by prompt, where both rows keep per-prompt values; else unpaired, from each
    mean's own standard error) and a verdict — ``clear`` (margin above 2 SE), ``within noise`` (above 0, not
    above 2 SE) or ``no`` (not above 0) — with a sentence that says it plainly."""
    out = []
    for stage, metric, base in COMPARISONS:
        row = _rm_row(stages) if stage == "rm" else evaluation.get(stage, {})
        value = row.get(metric)
        if base == "chance":
            base_row, base_value = {}, 0.5
        else:
            base_row = evaluation.get(base, {})
            base_value = base_row.get(metric)
        if not isinstance(value, (int, float)) or not isinstance(base_value, (int, float)):
            continue
        margin = value - base_value
        paired = _paired_standard_error(metric, row, base_row)
        ses = [_standard_error(metric, row, value), _standard_error(metric, base_row, base_value)]
        two_se = 2 * sum(se**2 for se in ses if se is not None) ** 0.5 if ses[0] is not None else None
        if paired is not None:
            two_se = 2 * paired
        if margin <= 0:
            verdict = "no"
        elif two_se is not None and margin <= two_se:
            verdict = "within noise"
        else:
            verdict = "clear"
        what = "held-out pair accuracy" if stage == "rm" else metric
        noise = (
            f"2 SE {two_se:.3f}{', paired' * (paired is not None)}"
            if two_se is not None
            else "no standard error"
        )
        plain = {
            "clear": f"better by {margin:+.3f} ({noise})",
            "within noise": f"ahead by {margin:+.3f}, within the noise ({noise}): not a clear gain",
            "no": f"DID NOT IMPROVE ({margin:+.3f}; {noise})",
        }[verdict]
        text = f"{stage}: {what} {value:.3f} vs {base_value:.3f} for {BASELINE_TEXT[base]}: {plain}"
        out.append(
            {
                "stage": stage,
                "metric": metric,
                "baseline": base,
                "value": value,
                "baseline_value": base_value,
                "margin": margin,
                "two_se": two_se,
                "paired": paired is not None,
                "verdict": verdict,
                "text": text,
            }
        )
    return out
