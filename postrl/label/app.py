"""The labelling page: a Starlette app over one labelling folder, served by uvicorn (`serve`).

Routes (the client names pairs by index and pictures by slot; no request carries a path):

    GET  /                          the page (``page.html``: one comparison at a time, keyboard shortcuts)
    GET  /api/state?labeller=NAME   the labeller's next pair, progress and agreement with the others
    GET  /api/pair/{i}              pair i as shown: prompt and left/right responses, or left/right clip URLs
    POST /api/judge                 ``{"labeller", "pair", "choice"}`` (left, right, tie, skip, undo): written to
                                    the folder (`postrl.label.store.LabelStore`) before the reply
    GET  /media/{i}/{slot}          pair i's picture ``image<k>`` or clip ``left``/``right``, from DIR/media only
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from postrl.label.pairs import (
    MEDIA_TYPES,
    PAIRS_FILE,
    kind_of,
    media_path,
    pair_rows,
    parse_pairs,
    prepare,
    shown,
)
from postrl.label.store import LabelStore, StaleJudgement, check_name
from postrl.runtime.checkpoint import atomic_write_text
from postrl.runtime.errors import DataError, UserError

HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
QUESTION_FILE = "question.txt"
QUESTIONS = {"lm": "Which response is better?", "segments": "Which segment shows the better behaviour?"}
"""The question the page asks of each pair when the folder has none of its own (``postrl label --question``)."""


class Labelling:
    """A labelling folder opened for the page: its pairs and its store of judgements."""

    def __init__(self, folder: Path, pairs_file: Path | None = None, question: str | None = None):
        """``question``: what the labellers are asked of each pair, kept in the folder for later starts (None:
        the folder's, else `QUESTIONS`' for the pairs' kind)."""
        self.folder = Path(folder)
        self.pairs = prepare(self.folder, pairs_file)
        self.kind = kind_of(self.pairs)
        stored = self.folder / QUESTION_FILE
        if question is not None:
            atomic_write_text(stored, question + "\n")
        self.question = stored.read_text().strip() if stored.is_file() else QUESTIONS[self.kind]
        self.store = LabelStore(self.folder, len(self.pairs), lambda js: pair_rows(self.pairs, js))
        self._read = (self.folder / PAIRS_FILE).stat().st_size
        self._refreshing = threading.Lock()  # the run and the page's requests may refresh together

    def refresh(self) -> None:
        """Take in the pairs appended to the folder's pairs file since it was read (a running ``postrl control
        prefs`` appends the pairs it wants labelled, one whole line each); a line still being written waits."""
        with self._refreshing:
            stored = self.folder / PAIRS_FILE
            if stored.stat().st_size == self._read:
                return
            data = stored.read_bytes()
            end = data.rfind(b"\n") + 1
            if end == self._read:
                return
            pairs = [pair for _, pair in parse_pairs(data[:end].decode("utf-8"), stored)]
            if pairs[: len(self.pairs)] != self.pairs or kind_of(pairs) != self.kind:
                raise DataError(
                    f"{stored}: its pairs changed while the page served them (only appending is allowed)"
                )
            self.pairs = pairs
            self.store.grow(len(pairs))
            self._read = end

    def view(self, index: int) -> dict[str, Any]:
        """Pair ``index`` as the page shows it (media as URLs of this app)."""
        pair = self.pairs[index]
        left, right = shown(pair, index)
        images = [f"/media/{index}/image{k}" for k in range(len(pair.get("images", [])))]
        if self.kind == "lm":
            return {
                "kind": "lm", "question": self.question, "prompt": pair["prompt"], "left": left, "right": right,
                "images": images,
            }  # fmt: skip
        steps = len(pair["first"]["obs"])
        return {
            "kind": "segments",
            "question": self.question,
            "env": pair["env"],
            "steps": steps,
            "left": f"/media/{index}/left",
            "right": f"/media/{index}/right",
        }

    def media(self, index: int, slot: str) -> Path:
        pair = self.pairs[index]
        if slot in ("left", "right") and self.kind == "segments":
            left, right = shown(pair, index)
            name = (left if slot == "left" else right)["clip"]
        elif slot.startswith("image") and slot[5:].isdigit() and int(slot[5:]) < len(pair.get("images", [])):
            name = pair["images"][int(slot[5:])]
        else:
            raise UserError(f"pair {index} has no {slot!r}")
        return media_path(self.folder, name)


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=HEADERS)


class _Routes:
    """The app's handlers over one labelling folder."""

    def __init__(self, labelling: Labelling):
        self.labelling = labelling
        self.page = resources.files("postrl.label").joinpath("page.html").read_text(encoding="utf-8")

    def _pair_index(self, request: Request) -> int | None:
        self.labelling.refresh()
        index = request.path_params["index"]
        return index if 0 <= index < len(self.labelling.pairs) else None

    async def index(self, request: Request) -> Response:
        return HTMLResponse(self.page, headers=HEADERS)

    async def state(self, request: Request) -> Response:
        try:
            name = check_name(request.query_params.get("labeller", ""))
        except UserError as err:
            return _error(str(err))
        self.labelling.refresh()
        return JSONResponse(self.labelling.store.state(name), headers=HEADERS)

    async def pair(self, request: Request) -> Response:
        i = self._pair_index(request)
        if i is None:
            return _error(f"no pair {request.path_params['index']}", 404)
        return JSONResponse(self.labelling.view(i), headers=HEADERS)

    async def judge(self, request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return _error("expected a JSON body")
        if not isinstance(body, dict):
            return _error("expected a JSON object {labeller, pair, choice}")
        try:
            # in a worker thread: the fsyncs would otherwise stall every other labeller's requests
            self.labelling.refresh()
            record = self.labelling.store.record
            state = await run_in_threadpool(
                record, body.get("labeller"), body.get("pair"), body.get("choice")
            )
        except UserError as err:
            return _error(str(err), 409 if isinstance(err, StaleJudgement) else 400)
        return JSONResponse(state, headers=HEADERS)

    async def media(self, request: Request) -> Response:
        i = self._pair_index(request)
        if i is None:
            return _error(f"no pair {request.path_params['index']}", 404)
        try:
            path = self.labelling.media(i, request.path_params["slot"])
        except UserError as err:
            return _error(str(err), 404)
        return FileResponse(path, media_type=MEDIA_TYPES[path.suffix], headers=HEADERS)


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def allowed_hosts(host: str) -> list[str] | None:
    """The Host headers a page bound to ``host`` answers: on a loopback address only the loopback names, so
    that a web page the labeller visits cannot reach the page through DNS rebinding; None (any) otherwise."""
    return ["127.0.0.1", "localhost", "[::1]"] if host in LOOPBACK else None


def make_app(labelling: Labelling, hosts: list[str] | None = None) -> Starlette:
    """The page's Starlette app over ``labelling``; ``hosts``: the Host headers it answers (None: any)."""
    r = _Routes(labelling)
    routes = [
        Route("/", r.index),
        Route("/api/state", r.state),
        Route("/api/pair/{index:int}", r.pair),
        Route("/api/judge", r.judge, methods=["POST"]),
        Route("/media/{index:int}/{slot:str}", r.media),
    ]
    middleware = [] if hosts is None else [Middleware(TrustedHostMiddleware, allowed_hosts=hosts)]
    return Starlette(routes=routes, middleware=middleware)


def serve(labelling: Labelling, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve the page with uvicorn until interrupted; say where, and whether others can reach it."""
    import uvicorn

    reach = (
        "only this computer can open it"
        if host in LOOPBACK
        else "WARNING: other computers on the network can open it (and label)"
    )
    done = labelling.store.counts()
    print(
        f"postrl label: {len(labelling.pairs)} {labelling.kind} pairs from {labelling.folder}; "
        f"judgements so far: {sum(done.values())} by {len(done)} labeller(s)\n"
        f"postrl label: serving on http://{host}:{port}/ (bound to {host}: {reach}); Ctrl-C stops, and "
        "rerunning with the same --out continues",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(make_app(labelling, allowed_hosts(host)), host=host, port=port, log_level="warning")


@contextmanager
def running(labelling: Labelling, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """The page served by uvicorn in a background thread (port 0: a free one) while the block runs; yields
    its URL. For a program that asks people for labels and goes on when they are done (and for tests)."""
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(make_app(labelling, allowed_hosts(host)), host=host, port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, name="postrl-label", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise UserError(f"postrl label: the page could not be served on {host}:{port}")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
