"""Christiano's setting with a person on the page: headless Chromium (Selenium) plays the person who labels the
segment pairs a running `postrl control prefs` asks for, in the page the run serves, while the agent trains.

The scripted person cannot watch the clips: it decides each pair by the two segments' true returns, read from
the labelling folder's pairs file (equal returns: a tie), and presses 1, 2 or 0 for the side the page shows
them on. Everything else is what a person does: the page, the keys, the waits for new pairs."""

from __future__ import annotations

import json
import threading

import pytest

from benchmarks.label_page import browser_problem, label_run

problem = browser_problem()
if problem:
    pytest.skip(f"no browser to drive: {problem}", allow_module_level=True)

from postrl.control import prefs  # noqa: E402
from tests.control.test_prefs_labellers import free_port  # noqa: E402


def _run_with_browser(cfg, run_dir, port):
    stop, made = threading.Event(), []
    person = threading.Thread(
        target=label_run, args=(f"http://127.0.0.1:{port}", run_dir / "labelling", stop, made)
    )
    person.start()
    try:
        summary = prefs.run(cfg, run_dir)
    finally:
        stop.set()
        person.join(timeout=60)
    return summary, made


def test_a_person_in_the_browser_labels_a_running_prefs_run(tmp_path):
    """A short CartPole run (4 iterations, 24 pairs, wait=all): every pair the run asks for is shown and
    labelled in the browser, and the run trained r̂ on exactly those labels, as first-vs-second labels."""
    from tests.control.test_prefs import tiny_cartpole_cfg

    port, run = free_port(), tmp_path / "run"
    cfg = tiny_cartpole_cfg(
        "prefs.label_budget=24",
        "prefs.initial_labels=12",
        "labeller.source=page",
        f"labeller.page.port={port}",
        "labeller.page.wait=all",
        "labeller.page.clip_width=64",
    )
    summary, made = _run_with_browser(cfg, run, port)
    assert sorted(made) == list(range(24)) and summary["labels_used"] == 24
    rows = [json.loads(line) for line in (run / "labelling" / "preferences.jsonl").read_text().splitlines()]
    assert [r["labeller"] for r in rows] == ["ada"] * 24
    for row in rows:
        first, second = sum(row["first"]["true_rewards"]), sum(row["second"]["true_rewards"])
        assert row["label"] == (0.5 if first == second else float(first > second))


@pytest.mark.slow
def test_the_agent_learns_cartpole_from_labels_given_in_the_browser(tmp_path):
    """The preset at 30k steps with 100 labels given in the browser: the final policy's true return is well
    above the untrained policy's (measured on the same evaluation seeds)."""
    from postrl.control import ppo
    from postrl.control.envs import VecEnv
    from postrl.control.evaluation import evaluate_policy_episodes
    from postrl.runtime.config import load_config
    from postrl.runtime.seeding import seed_everything

    port = free_port()
    overrides = [
        "run.steps=30000",
        "run.eval_episodes=10",
        "prefs.label_budget=100",
        "prefs.initial_labels=50",
    ]
    page = ["labeller.source=page", f"labeller.page.port={port}", "labeller.page.wait=all"]
    cfg = load_config(prefs.ControlPrefsConfig, "configs/prefs-cartpole.yaml", [*overrides, *page])
    summary, made = _run_with_browser(cfg, tmp_path / "run", port)
    assert summary["labels_used"] == len(made) == 100

    seed_everything(cfg.run.seed)
    env = VecEnv(cfg.env, cfg.run.seed)
    untrained = float(sum(evaluate_policy_episodes(ppo.PPOLearner(cfg, env).actor, env, cfg, 10)) / 10)
    assert summary["true_return"] > max(150.0, 3 * untrained)
