"""People label the segment pairs of a running `postrl control prefs` on the page of `postrl label`
(``labeller.source: page``), as Christiano et al. (2017, §2.3) had people label while the agent trained.

Each time the label schedule asks for pairs, the run renders the two segments as clips and appends the pairs
to the labelling folder (``RUN_DIR/labelling/pairs.jsonl`` and ``media/``, the folder `postrl label --out`
serves). The page is served from the run in a background thread (``labeller.page.serve``), or the run prints
the `postrl label --out FOLDER` command to serve it from another terminal (the page picks up the pairs the run
appends). Every iteration the run reads the page's crash-safe log (``judgements.jsonl``) and trains r̂ on the
standing judgements so far: left/right are labels 1/0, a tie is 0.5 (the paper's uniform distribution), a
skip is left out (the paper's "incomparable"), an undo takes a judgement back; several labellers' judgements of
one pair are separate labels. When the labels are short the run waits or goes on (``labeller.page.wait``).

Exact resume. How many log events each iteration took in is appended to ``RUN_DIR/labels_taken.jsonl``
(fsync'd) before the iteration's checkpoint; a resumed run takes in the same events at the same iterations
(replaying the judgements already in the log in order) and reuses the pairs the interrupted run had already
appended when they are the same pairs, so it repeats the uninterrupted run; after the last recorded
iteration it reads the log as it finds it.

Clips are drawn by `postrl.control.prefs_clips` (the training envs never render): from the raw observations
where they are the simulator's state (classic control), else by replaying the segment's rollout from a
snapshot of its env taken at the rollout's start (any env that renders rgb_array and whose state is plain
data: FrozenLake, CliffWalking, Taxi…, one-hot encoded for the MLP policies).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from postrl.control.prefs_clips import clip_renderer
from postrl.control.prefs_config import PageConfig
from postrl.control.prefs_reward import Pairs, Segments
from postrl.runtime.config import ConfigError

TAKEN_FILE = "labels_taken.jsonl"


def _segment_row(seg: Segments, i: int) -> dict[str, list]:
    return {
        "obs": seg.obs[i].tolist(),
        "actions": seg.actions[i].tolist(),
        "true_rewards": seg.true_rewards[i].tolist(),
        "alive": seg.alive[i].tolist(),
    }


def _append_lines(path: Path, lines: list[str]) -> None:
    """Append whole lines with one write, then fsync (a reader never sees a pair without its clips)."""
    data = "".join(lines).encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _cut_torn_tail(path: Path) -> None:
    """Drop a last line without its newline (a write cut by a crash) from a file this run appends to."""
    if path.is_file():
        data = path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            with open(path, "r+b") as f:
                f.truncate(end)


class PageLabeller:
    """The run's side of the labelling page: asks for pairs, serves (or names) the page, takes in labels."""

    def __init__(
        self,
        cfg: PageConfig,
        env_id: str,
        segment_length: int,
        val_fraction: float,
        env_kwargs: dict[str, Any] | None = None,
    ):
        try:
            from postrl.label import app  # noqa: F401  (starlette, uvicorn)
        except ImportError as err:
            raise ConfigError(
                f"labeller.source page needs the page's web stack ({err}): pip install 'postrl[label]'"
            ) from None
        if cfg.serve and cfg.port:
            _check_port(cfg.host, cfg.port)
        self.cfg, self.env_id, self.length, self.val_fraction = cfg, env_id, segment_length, val_fraction
        self.renderer = clip_renderer(env_id, cfg.clip_width, env_kwargs or {})
        self.folder = Path(cfg.folder).expanduser()
        if self.folder.is_absolute() and (self.folder / "pairs.jsonl").is_file():  # before the run folder
            from postrl.label.pairs import read_pairs

            self._check_fits(read_pairs(self.folder / "pairs.jsonl"))
        self.run_dir: Path | None = None
        self.labelling = None
        self.asked = 0  # pairs of the folder this run knows of (asked by it, its interrupted run, or before)
        self.n_asked = 0  # pairs this run asked for (the label schedule's count)
        self.events = 0  # log events taken in so far
        self.taken: dict[int, int] = {}  # iteration → events taken in (labels_taken.jsonl)
        self.url: str | None = None
        self._stack = ExitStack()

    # -- the folder and the page ----------------------------------------------------------------------------
    def attach(self, run_dir: Path) -> None:
        """Open the labelling folder inside (or named by) the run folder; on a resume, the record of what
        the interrupted run took in."""
        self.run_dir = Path(run_dir)
        folder = Path(self.cfg.folder).expanduser()
        self.folder = folder if folder.is_absolute() else self.run_dir / folder
        taken = self.run_dir / TAKEN_FILE
        _cut_torn_tail(taken)
        if taken.is_file():
            for line in taken.read_text().splitlines():
                row = json.loads(line)
                self.taken[int(row["iteration"])] = int(row["events"])
        _cut_torn_tail(self.folder / "pairs.jsonl")
        if (self.folder / "pairs.jsonl").is_file():
            self._open_page()

    def _open_page(self) -> None:
        from postrl.label.app import Labelling, running

        if self.labelling is not None:
            self.labelling.refresh()
            return
        self.labelling = Labelling(self.folder)
        self._check_fits(self.labelling.pairs)
        if not self.cfg.serve:
            print(
                f"postrl control prefs: people label the pairs this run asks for with\n"
                f"    postrl label --out {self.folder}\n(in another terminal; the page picks up new pairs)",
                file=sys.stderr,
                flush=True,
            )
            return
        self.url = self._stack.enter_context(running(self.labelling, self.cfg.host, self.cfg.port))
        print(
            f"postrl control prefs: label the pairs this run asks for at {self.url}/ "
            f"(bound to {self.cfg.host}; labels are read from {self.folder})",
            file=sys.stderr,
            flush=True,
        )

    def _check_fits(self, pairs: list[dict[str, Any]]) -> None:
        """Pairs already in the folder (labelled before, e.g. by `postrl label --env`) are labels of this run
        only if they are segments of its env and length."""
        if pairs and "first" not in pairs[0]:
            raise ConfigError(
                f"labeller.page.folder {self.folder}: it labels language-model pairs, not segments"
            )
        for i, p in enumerate(pairs):
            if (p["env"], len(p["first"]["obs"])) != (self.env_id, self.length):
                raise ConfigError(
                    f"labeller.page.folder {self.folder}: pair {i} is a segment of {len(p['first']['obs'])} "
                    f"steps of {p['env']}; this run cuts segments of {self.length} steps of {self.env_id} "
                    "(prefs.segment_length, env.id)"
                )

    def close(self) -> None:
        self._stack.close()
        self.renderer.close()

    # -- asking for pairs -----------------------------------------------------------------------------------
    def ask(self, first: Segments, second: Segments, i: torch.Tensor, j: torch.Tensor) -> None:
        """Append the pairs ``(first[k], second[k])``, pool segments ``i[k]`` and ``j[k]``, to the folder
        (clips rendered into ``media/``); pairs the interrupted run of a resume had already appended at this
        point are reused when the same."""
        existing, n = self._folder_pairs(), len(first)
        self.n_asked += n
        tail = existing[self.asked :]
        k = 0
        while k < min(len(tail), n) and _same(tail[k], first, second, k):
            k += 1
        if k == min(len(tail), n):  # none, or the interrupted run's pairs as far as it got: reuse them
            new, self.asked = range(k, n), self.asked + n
        else:  # other pairs (a resume that was not exact): the old ones stay, and their labels count
            new, self.asked = range(n), len(existing) + n
        if len(new):
            self.folder.mkdir(parents=True, exist_ok=True)
            lines = [json.dumps(self._pair(first, second, k, (int(i[k]), int(j[k])))) + "\n" for k in new]
            _append_lines(self.folder / "pairs.jsonl", lines)
        self._open_page()

    def _pair(self, first: Segments, second: Segments, i: int, pool: tuple[int, int]) -> dict[str, Any]:
        from postrl.label.clips import save_clip

        media = self.folder / "media"
        media.mkdir(parents=True, exist_ok=True)
        row: dict[str, Any] = {"env": self.env_id}
        for side, seg, k in (("first", first, pool[0]), ("second", second, pool[1])):
            frames = self.renderer.frames(k, seg.obs[i], seg.actions[i], seg.alive[i])
            data = _segment_row(seg, i)
            name = hashlib.sha256(json.dumps(data).encode()).hexdigest()[:16] + ".gif"
            if not (media / name).is_file():
                save_clip(frames, media / name, self.cfg.fps)
            row[side] = {**data, "clip": f"media/{name}"}
        return row

    def _folder_pairs(self) -> list[dict[str, Any]]:
        if self.labelling is not None:
            self.labelling.refresh()
            return self.labelling.pairs
        return []

    # -- taking in labels -----------------------------------------------------------------------------------
    def labels(self, iteration: int, waiting_for_first: bool) -> Pairs | None:
        """The labelled pairs of the standing judgements after this iteration's log events (recorded on a
        resume; else after waiting as ``labeller.page.wait`` says); None when there are none."""
        if self.labelling is None:
            return None
        if iteration in self.taken:
            events = self._read_log()[: self.taken[iteration]]
        else:
            if self.cfg.wait == "all" or (self.cfg.wait == "initial" and waiting_for_first):
                self._wait()
            events = self._read_log()
            self.taken[iteration] = len(events)
            _append_lines(
                self.run_dir / TAKEN_FILE,
                [json.dumps({"iteration": iteration, "events": len(events)}) + "\n"],
            )
        self.events = len(events)
        return self._pairs_of(events)

    def _read_log(self) -> list[dict[str, Any]]:
        from postrl.label.store import LOG_FILE, read_log

        self.labelling.refresh()
        return read_log(self.folder / LOG_FILE, len(self.labelling.pairs), repair=False)

    def _wait(self) -> None:
        """Until every pair asked for is judged or skipped by someone, or ``timeout`` seconds."""
        from postrl.label.store import replay

        start, said = time.monotonic(), False
        while True:
            made = replay(self._read_log())
            seen = {j.pair for js in made.values() for j in js}
            missing = self.asked - len(seen & set(range(self.asked)))
            if missing <= 0:
                return
            waited = time.monotonic() - start
            if self.cfg.timeout is not None and waited >= self.cfg.timeout:
                print(
                    f"postrl control prefs: {missing} pairs still unlabelled after {waited:.1f} s; training goes on",
                    file=sys.stderr,
                )
                return
            if not said and waited > 2:  # a page that keeps up needs no word
                where = self.url or f"the page of `postrl label --out {self.folder}`"
                print(
                    f"postrl control prefs: waiting for {missing} labels on {where}",
                    file=sys.stderr,
                    flush=True,
                )
                said = True
            time.sleep(self.cfg.poll_seconds)

    def _pairs_of(self, events: list[dict[str, Any]]) -> Pairs | None:
        from postrl.label.pairs import pair_rows
        from postrl.label.store import replay

        made = replay(events)
        standing = [j for name in sorted(made) for j in made[name] if j.choice != "skip"]
        if not standing:
            return None
        pairs = Pairs.from_rows(pair_rows(self.labelling.pairs, standing))
        index = torch.tensor([j.pair for j in standing], dtype=torch.float64)
        f = self.val_fraction
        # held out by pair (all of a pair's labels on one side), at the share the synthetic labeller holds out
        pairs.val = torch.floor((index + 1) * f) > torch.floor(index * f)
        return pairs

    def state_dict(self) -> dict[str, Any]:
        counts = {"asked": self.asked, "n_asked": self.n_asked, "events": self.events}
        return {**counts, "clips": self.renderer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.asked, self.n_asked, self.events = (int(state[k]) for k in ("asked", "n_asked", "events"))
        self.renderer.load_state_dict(state.get("clips", {}))


def _same(row: dict[str, Any], first: Segments, second: Segments, i: int) -> bool:
    """Whether a folder pair holds segments ``first[i]`` and ``second[i]`` (the numbers, not the clips)."""
    for side, seg in (("first", first), ("second", second)):
        if not torch.equal(torch.tensor(row[side]["obs"], dtype=seg.obs.dtype), seg.obs[i]):
            return False
        if row[side]["alive"] != seg.alive[i].tolist():
            return False
    return True


def _check_port(host: str, port: int) -> None:
    """Refuse a port that is taken before the run folder is touched."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        # as uvicorn binds: the port of a run that just ended (TIME_WAIT) is free
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as err:
            raise ConfigError(
                f"labeller.page.port {port}: cannot serve the page on {host}:{port} ({err.strerror}); "
                "choose another port (0: any free one)"
            ) from None
