"""Who labels `postrl control prefs`: judges (a Python function, an earlier run's reward model) and people on
the labelling page while the agent trains (played here by a labeller that posts to the page's HTTP API; the
real browser is tests/label/test_prefs_browser.py)."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.label_page import by_true_return
from postrl.control import prefs
from postrl.control.prefs_judges import FunctionJudge, ReturnJudge, load_segment_judge
from postrl.control.prefs_reward import Segments, synthetic_labels
from postrl.runtime.config import ConfigError, load_config
from postrl.runtime.errors import UserError
from tests.control.test_prefs import assert_same_weights, interrupted_copy, tiny_cartpole_cfg

pytest.importorskip("starlette")


def _cfg(*overrides):
    tiny = ["prefs.label_budget=24", "prefs.initial_labels=12", "labeller.page.clip_width=64"]
    return tiny_cartpole_cfg(*tiny, *overrides)


def _segments(returns):
    """Segments of length 2 whose true returns are ``returns`` (obs 0: the pole angle of a person's eye)."""
    n = len(returns)
    rewards = torch.tensor([[r / 2, r / 2] for r in returns], dtype=torch.float32)
    obs = torch.zeros(n, 2, 4)
    return Segments(obs, torch.zeros(n, 2, dtype=torch.long), rewards, torch.ones(n, 2, dtype=torch.bool))


def by_return(first, second):
    """A function judge for the tests (``fn:tests.control.test_prefs_labellers:by_return``)."""
    a, b = float(first["true_rewards"].sum()), float(second["true_rewards"].sum())
    return 0.5 if a == b else float(a > b)


def test_a_function_judge_is_imported_by_module_path_and_called_per_pair():
    cfg = _cfg("labeller.source=fn:tests.control.test_prefs_labellers:by_return").labeller
    judge = load_segment_judge(cfg, 4, None)
    assert isinstance(judge, FunctionJudge)
    labels = judge(_segments([3.0, 1.0, 2.0]), _segments([1.0, 3.0, 2.0]))
    assert labels.tolist() == [1.0, 0.0, 0.5]
    # the synthetic labeller is the judge of the true returns: the same labels
    assert ReturnJudge()(_segments([3.0, 1.0, 2.0]), _segments([1.0, 3.0, 2.0])).tolist() == [1.0, 0.0, 0.5]


def test_a_judge_answer_that_is_no_probability_is_refused():
    judge = FunctionJudge(lambda a, b: 1.5, "fn:m:f")
    with pytest.raises(UserError, match=r"fn:m:f: returned 1.5"):
        judge(_segments([1.0]), _segments([2.0]))


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("oracle", "expected one of"),
        ("fn:no_such_module_x:f", "cannot import module 'no_such_module_x'"),
        ("fn:json:no_such_function", "has no function 'no_such_function'"),
        ("fn:json", "expected fn:MODULE:FUNCTION"),
        ("rm:/no/such/run", "not a prefs run folder"),
    ],
)
def test_a_bad_judge_spec_is_refused_before_the_run_folder(tmp_path, source, message):
    with pytest.raises(ConfigError, match=message):
        prefs.run(_cfg(f"labeller.source={source}"), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_an_earlier_runs_reward_model_judges_segments(tmp_path):
    """rm:RUN_DIR: the first run's ensemble labels the second run's pairs; on CartPole it must agree with the
    true returns (a fall is worse) on pairs that differ."""
    first = tmp_path / "teacher"
    prefs.run(_cfg(), first)
    summary = prefs.run(_cfg(f"labeller.source=rm:{first}", "run.seed=1"), tmp_path / "student")
    assert summary["labeller"] == f"rm:{first}" and summary["labels_used"] == 24
    judge = load_segment_judge(_cfg(f"labeller.source=rm:{first}").labeller, 4, _action_space())
    g = torch.Generator().manual_seed(0)
    obs = torch.randn(64, 10, 4, generator=g) * 0.05
    alive = torch.arange(10).expand(64, 10) < torch.randint(3, 11, (64, 1), generator=g)  # falls at 3..10
    seg = Segments(obs, torch.zeros(64, 10, dtype=torch.long), alive.float(), alive)
    one, two = seg.take(torch.arange(32)), seg.take(torch.arange(32, 64))
    p = judge(one, two)
    truth = synthetic_labels(one.true_returns(), two.true_returns())
    keep = truth != 0.5
    assert float(((p > 0.5) == (truth > 0.5))[keep].float().mean()) > 0.8
    with pytest.raises(ConfigError, match="do not fit"):
        prefs.run(_cfg(f"labeller.source=rm:{first}", "env.id=Acrobot-v1"), tmp_path / "acrobot")


def _action_space():
    import gymnasium as gym

    return gym.spaces.Discrete(2)


# ---- people on the page ---------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HttpLabeller:
    """A labeller that uses the page's HTTP API as the page does: asks for its next pair, judges it by the
    pair's true returns read from the folder's pairs file (ties: equal returns), skips every ``skip_every``-th."""

    def __init__(self, url: str, folder: Path, skip_every: int = 0):
        self.url, self.folder, self.skip_every = url, folder, skip_every
        self.choices: dict[int, str] = {}
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop:
            try:
                state = json.load(urllib.request.urlopen(f"{self.url}/api/state?labeller=bot", timeout=5))
            except OSError:  # the run has not served the page yet
                time.sleep(0.05)
                continue
            i = state["pair"]
            if i is None:
                time.sleep(0.05)
                continue
            choice = (
                "skip"
                if self.skip_every and i % self.skip_every == self.skip_every - 1
                else by_true_return(self.folder, i)
            )
            body = json.dumps({"labeller": "bot", "pair": i, "choice": choice}).encode()
            request = urllib.request.Request(
                f"{self.url}/api/judge", body, {"Content-Type": "application/json"}
            )
            urllib.request.urlopen(request, timeout=5)
            self.choices[i] = choice


def _page_cfg(port: int, *overrides: str):
    return _cfg("labeller.source=page", f"labeller.page.port={port}", "labeller.page.wait=all", *overrides)


def test_people_label_on_the_page_while_the_agent_trains(tmp_path):
    """The run serves the page, appends the pairs it wants labelled, waits (wait=all) and trains r̂ on the
    standing judgements: left/right as 1/0 of first ≻ second, ties 0.5, skips left out."""
    port, run = free_port(), tmp_path / "run"
    bot = HttpLabeller(f"http://127.0.0.1:{port}", run / "labelling", skip_every=5)
    bot.thread.start()
    try:
        summary = prefs.run(_page_cfg(port), run)
    finally:
        bot.stop = True
    pairs = (run / "labelling" / "pairs.jsonl").read_text().splitlines()
    assert len(pairs) == summary["pairs_asked"] == 24
    judged = [i for i, c in bot.choices.items() if c != "skip"]
    assert summary["labels_used"] == len(judged) == 24 - 24 // 5
    rows = [json.loads(line) for line in (run / "labelling" / "preferences.jsonl").read_text().splitlines()]
    for row in rows:  # the page's rows are the first-vs-second labels of the true returns
        first, second = sum(row["first"]["true_rewards"]), sum(row["second"]["true_rewards"])
        assert row["label"] == (0.5 if first == second else float(first > second))
    ties = np.mean([r["label"] == 0.5 for r in rows])
    last = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["label_ties"] == pytest.approx(ties) and 0 < ties < 1
    taken = [json.loads(line) for line in (run / "labels_taken.jsonl").read_text().splitlines()]
    assert [t["iteration"] for t in taken] == list(range(4))


def test_a_resumed_page_run_replays_the_judgements_and_repeats_the_run(tmp_path):
    """Resume: the events each iteration took in are replayed from the log (no labeller is there now) and
    the pairs the run asks again are the folder's, so the weights equal the uninterrupted run's bit for bit."""
    port, straight = free_port(), tmp_path / "straight"
    bot = HttpLabeller(f"http://127.0.0.1:{port}", straight / "labelling")
    bot.thread.start()
    try:
        prefs.run(_page_cfg(port, "run.save_every=1", "run.keep_last=20"), straight)
    finally:
        bot.stop = True
    interrupted = interrupted_copy(straight, tmp_path / "interrupted")  # killed after the 2nd of 4 iterations
    cfg = load_config(
        prefs.ControlPrefsConfig, interrupted / "config.yaml", [f"labeller.page.port={free_port()}"]
    )
    prefs.run(cfg, interrupted, resume=True)
    lines = (interrupted / "labelling" / "pairs.jsonl").read_text()
    assert lines == (straight / "labelling" / "pairs.jsonl").read_text()  # no pair asked twice
    assert_same_weights(straight, interrupted)


def test_short_labels_go_on_after_the_timeout(tmp_path):
    """Nobody labels: wait=all with a timeout trains on (no labels: r̂ = 0) instead of waiting for ever."""
    run = tmp_path / "run"
    t0 = time.monotonic()
    summary = prefs.run(_page_cfg(0, "labeller.page.timeout=0.3"), run)
    assert summary["labels_used"] is None or summary["labels_used"] == 0
    assert summary["pairs_asked"] == 24 and time.monotonic() - t0 < 60


def test_a_page_served_from_another_terminal_picks_up_the_pairs_the_run_appends(tmp_path):
    """serve=false: the run only writes the folder; `postrl label --out FOLDER` (here its `Labelling` and
    `running`, started once the first pairs are there) serves it and takes in the pairs appended later."""
    from postrl.label.app import Labelling, running

    run = tmp_path / "run"
    folder = run / "labelling"
    served, stop = [], threading.Event()

    def second_terminal():
        while not (folder / "pairs.jsonl").is_file():
            time.sleep(0.02)
        with running(Labelling(folder)) as url:
            bot = HttpLabeller(url, folder)
            bot.thread.start()
            stop.wait()
            bot.stop = True
            served.append(len(bot.choices))

    page = threading.Thread(target=second_terminal, daemon=True)
    page.start()
    try:
        summary = prefs.run(
            _cfg("labeller.source=page", "labeller.page.serve=false", "labeller.page.wait=all"), run
        )
    finally:
        stop.set()
        page.join(timeout=30)
    assert summary["labels_used"] == 24 and served == [24]


def test_labels_given_before_with_postrl_label_env_are_labels_of_the_run(tmp_path):
    """A folder of `postrl label --env CartPole-v1 --length 10` (random-action segments, labelled by true
    return) named as labeller.page.folder: its judgements are the run's first labels, in the format the
    reward model reads; a folder of other segment lengths is refused before the run folder is made."""
    from postrl.label.app import Labelling
    from postrl.label.segments import segment_pairs

    folder = tmp_path / "labels"
    labelling = Labelling(
        folder, segment_pairs("CartPole-v1", tmp_path / "made" / "pairs.jsonl", 6, 10, width=64)
    )
    for i in range(6):
        labelling.store.record("ada", i, "skip" if i == 5 else by_true_return(folder, i))
    page = [
        "labeller.source=page",
        f"labeller.page.folder={folder}",
        "labeller.page.wait=none",
        "labeller.page.port=0",
    ]
    summary = prefs.run(_cfg(*page), tmp_path / "run")
    assert summary["labels_used"] == 5  # the judgements made before; nobody labels the run's own pairs
    assert summary["pairs_asked"] == 24  # the run's own, after the 6 pairs of the folder
    assert len((folder / "pairs.jsonl").read_text().splitlines()) == 6 + 24
    with pytest.raises(ConfigError, match="pair 0 is a segment of 10 steps"):
        prefs.run(_cfg(*page, "prefs.segment_length=8"), tmp_path / "other")
    assert not (tmp_path / "other").exists()


def test_a_taken_port_is_refused_before_the_run_folder(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"labeller.page.port {port}: cannot serve"):
            prefs.run(_page_cfg(port), tmp_path / "run")
    assert not (tmp_path / "run").exists()
