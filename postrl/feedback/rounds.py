"""`postrl loop`: the loop the notes put around the reward model (Christiano et al. 2017; Ouyang et al. 2022):
"alternates preference collection, reward learning, and policy learning. Collecting new feedback can help cover
behavior that was absent from earlier data."

    round k:  sample labels_per_round pairs from the current policy π_{k-1}      OUT/round_k/pairs.jsonl
              label them (synthetic labeller, a judge, or people on the page)     OUT/round_k/labels.jsonl
              reward model on every label so far                                  OUT/round_k/rm/
              policy update from π_{k-1}: DPO on the round's pairs, or PPO        OUT/round_k/policy/
              against the round's reward model (KL to the starting model)
              report: gold reward, KL to the start, the reward model's accuracy   OUT/rounds.jsonl
              on π_k's own samples

The reward model is trained again from the starting model's trunk on all labels so far each round (the same
objective as continuing it on them; no order effects between rounds). One round with rounds × labels is the
offline pipeline the loop is measured against (`benchmarks/loop.py`).

Resumable between and inside rounds: every file is written whole (temp + rename) and skipped when present, a
stage that finished (its summary.json) is skipped, one that was interrupted resumes from its checkpoint
(`postrl <stage> --resume`). With labeller=page the loop stops at a round's labelling and prints the `postrl
label` command; `postrl loop --resume` goes on with the labels the round has.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from postrl.feedback.config import LoopConfig
from postrl.feedback.measure import (
    World,
    check_labeller,
    label_pairs,
    load_world,
    read_jsonl,
    report,
    sample_pairs,
    write_jsonl,
)
from postrl.runtime.checkpoint import atomic_write_text, delete_folder
from postrl.runtime.config import to_dict
from postrl.runtime.errors import UserError

ROUNDS_FILE = "rounds.jsonl"


def run_loop(
    cfg: LoopConfig,
    out: str | Path,
    run_stage: Callable[..., Any],
    resume: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run (or resume) the loop in ``out``; returns the summary (also ``out/summary.json``), or, when people
    must label a round first, ``{"waiting_for_labels": PAIRS_FILE, ...}``. ``run_stage``: `postrl.api.run_stage`,
    given by the caller (the loop drives the stages as a user's script does, and the API imports the loop)."""
    out = Path(out)
    world = _check(cfg, out, resume, overwrite)
    if overwrite and out.exists():
        delete_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    _write_config(cfg, out, resume)
    rows = read_jsonl(out / ROUNDS_FILE) if (out / ROUNDS_FILE).is_file() else []
    if not rows:  # round 0: the starting policy
        rows = _add_row(out, rows, {"round": 0, "labels": 0, **report(cfg.model, world, cfg, None, cfg.seed)})
    policy = cfg.model
    for k in range(1, cfg.rounds + 1):
        here = out / f"round_{k:02d}"
        labels = _labels(cfg, world, policy, here, k)
        if labels is None:
            return _waiting(out, here)
        rm_dir = _reward_model(run_stage, cfg, out, k, policy)
        policy = _policy(run_stage, cfg, here, policy, rm_dir)
        if len(rows) <= k:
            total = sum(len(read_jsonl(out / f"round_{j:02d}" / "labels.jsonl")) for j in range(1, k + 1))
            measured = report(policy, world, cfg, rm_dir, cfg.seed + k)
            rows = _add_row(out, rows, {"round": k, "labels": total, **measured})
    summary = {"rounds": rows, "final": rows[-1], "policy": policy, "out": str(out)}
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    return summary


def _check(cfg: LoopConfig, out: Path, resume: bool, overwrite: bool) -> World:
    """Everything that can be refused before the run folder is touched."""
    if resume and overwrite:
        raise UserError("--resume and --overwrite contradict each other: choose one")
    if (out / "summary.json").is_file() and not overwrite:
        raise UserError(f"{out} is a finished loop (summary.json): --overwrite runs it again")
    if out.exists() and any(out.iterdir()) and not (resume or overwrite):
        raise UserError(f"{out} exists: --resume continues it, --overwrite starts it again")
    if resume and not (out / "config.yaml").is_file():
        raise UserError(f"{out}: nothing to resume (no config.yaml)")
    if not Path(cfg.model).is_dir():
        raise UserError(f"model: {cfg.model} is not a model folder (the SFT policy to start from)")
    world = load_world(cfg)
    check_labeller(cfg, world)
    return world


def _write_config(cfg: LoopConfig, out: Path, resume: bool) -> None:
    """``out/config.yaml``; on resume, a config that differs from the one the loop started with is refused."""
    import yaml

    text = yaml.safe_dump(to_dict(cfg), sort_keys=False)
    path = out / "config.yaml"
    if resume and path.is_file():
        before = yaml.safe_load(path.read_text())
        changed = sorted(k for k in set(before) | set(to_dict(cfg)) if before.get(k) != to_dict(cfg).get(k))
        if changed:
            raise UserError(
                f"{path}: the loop started with other values of {', '.join(changed)}; resume it as it was"
            )
        return
    atomic_write_text(path, text)


def _add_row(out: Path, rows: list[dict[str, Any]], row: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [*rows, row]
    write_jsonl(out / ROUNDS_FILE, rows)
    shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}
    print(f"postrl loop: round {row['round']}: {shown}", file=sys.stderr)
    return rows


def _labels(cfg: LoopConfig, world: World, policy: str, here: Path, k: int) -> list[dict[str, Any]] | None:
    """The round's labelled pairs (``here/labels.jsonl``), sampling and labelling them when missing; None when
    people have not labelled them yet."""
    done = here / "labels.jsonl"
    if done.is_file():
        return read_jsonl(done)
    here.mkdir(parents=True, exist_ok=True)
    pairs_file = here / "pairs.jsonl"
    if not pairs_file.is_file():
        write_jsonl(
            pairs_file, sample_pairs(policy, world, cfg.labels_per_round, cfg, seed=cfg.seed * 1000 + k)
        )
    pairs = read_jsonl(pairs_file)
    if cfg.labeller == "page":
        page = here / "page" / "preferences.jsonl"
        if not page.is_file() or not read_jsonl(page):
            return None
        rows = read_jsonl(page)
    else:
        rows = label_pairs(pairs, world, cfg, seed=cfg.seed * 1000 + k)
    write_jsonl(done, rows)
    return rows


def _waiting(out: Path, here: Path) -> dict[str, Any]:
    pairs = here / "pairs.jsonl"
    command = f"postrl label --pairs {pairs} --out {here / 'page'}"
    print(
        f"postrl loop: {here.name} waits for people's labels: run\n    {command}\nlabel the pairs, stop the "
        f"page, then\n    postrl loop --out {out} --resume",
        file=sys.stderr,
    )
    return {"waiting_for_labels": str(pairs), "command": command}


def _stage(run_stage: Callable[..., Any], stage: str, config: str, run_dir: Path, **overrides: Any) -> Path:
    """Run ``stage`` into ``run_dir`` (skipped when finished, resumed when interrupted); its model folder."""
    if not (run_dir / "summary.json").is_file():
        interrupted = any((run_dir / "checkpoints").glob("step_*")) if run_dir.is_dir() else False
        run_stage(stage, config, out=run_dir, resume=interrupted, overwrite=run_dir.exists() and not interrupted,
                  **overrides)  # fmt: skip
    return run_dir / "model"


def _reward_model(run_stage: Callable[..., Any], cfg: LoopConfig, out: Path, k: int, policy: str) -> Path:
    """The round's reward model, trained from the starting model on the labels of rounds 1 … k."""
    here = out / f"round_{k:02d}"
    every = here / "labels_so_far.jsonl"
    if not every.is_file():
        write_jsonl(
            every, [r for j in range(1, k + 1) for r in read_jsonl(out / f"round_{j:02d}" / "labels.jsonl")]
        )
    run = {"seed": cfg.seed, "save_every": 0, **cfg.rm.get("run", {})}
    overrides = {**cfg.rm, "run": run, "model": cfg.model, "data": str(every), "norm": {"policy": policy}}
    return _stage(run_stage, "rm", cfg.rm_config, here / "rm", **overrides)


def _policy(run_stage: Callable[..., Any], cfg: LoopConfig, here: Path, policy: str, rm_dir: Path) -> str:
    """The round's policy update from ``policy``: DPO on the round's pairs, or PPO against its reward model."""
    run = {"seed": cfg.seed, **cfg.policy.get("run", {})}
    config = cfg.policy_config or f"{cfg.policy_stage}-reviews"
    if cfg.policy_stage == "dpo":
        overrides = {**cfg.policy, "run": run, "model": policy, "data": str(here / "labels.jsonl"),
                     "reward_model": str(rm_dir)}  # fmt: skip
    else:
        overrides = {
            **cfg.policy,
            "run": run,
            "model": policy,
            "ref_model": cfg.model,
            "reward_model": str(rm_dir),
        }
    return str(_stage(run_stage, cfg.policy_stage, config, here / "policy", **overrides))
