"""vLLM in server mode (sampling.engine=vllm, sampling.vllm_mode=server, `postrl.lm.rollout.vllm_server`).

Without vLLM: the HTTP side against a stand-in server (what a completions answer becomes, what the weight sync
sends, a server without the dev endpoints), and a server that is down or hangs is one error within the
timeout, also from the CLI (a server's URL needs no vLLM in the trainer's process). Marked ``vllm`` (``make
test-vllm``): a server postrl launches samples what colocate mode samples, with the log-probs of π_τ, reloads
pushed weights, runs GRPO, is stopped with its run, and its death is one error naming its exit code.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from postrl.lm.grpo import run_grpo
from postrl.lm.grpo.config import GRPOSamplingConfig
from postrl.lm.rollout import SamplingConfig
from postrl.lm.rollout.vllm_server import VLLMServerError, VLLMServerSampler
from postrl.lm.trainer import OptimConfig
from postrl.runtime.logging import read_jsonl
from tests.lm.test_grpo import _config
from tests.lm.test_vllm_engine import G, T, _check_layout, _prompts, _teacher_forced, base, perturbed  # noqa: F401


class _Tokenizer:
    pad_token_id, eos_token_id = 0, 2


class _StandIn(BaseHTTPRequestHandler):
    """A vLLM server's answers, canned: even choices 7 then EOS 2, odd ones 7, 9, 4 (max_tokens 3, no EOS)."""

    calls: list = []
    dev_mode = True

    def log_message(self, *args):  # quiet
        pass

    def _answer(self, code: int, body: dict | None) -> None:
        raw = b"" if body is None else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        self._answer(200, {"data": [{"id": "m", "max_model_len": 64}]} if self.path == "/v1/models" else None)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append((self.path, body))
        if self.path == "/collective_rpc" and not type(self).dev_mode:
            return self._answer(404, {"detail": "Not Found"})
        if self.path != "/v1/completions":
            return self._answer(200, {"results": [None]})
        choices = []
        for i in range(body["n"]):
            tokens = [7, 2] if i % 2 == 0 else [7, 9, 4]
            lp = [-0.5 - 0.1 * j - i for j in range(len(tokens))]
            choices.append({"index": i, "token_ids": tokens, "logprobs": {"tokens": [f"token_id:{t}" for t in tokens],
                            "token_logprobs": lp}})  # fmt: skip
        self._answer(200, {"choices": choices[::-1]})  # out of order: the sampler sorts by index


@pytest.fixture
def stand_in():
    _StandIn.calls, _StandIn.dev_mode = [], True
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_completions_answer_becomes_postrls_layout(stand_in):
    sampler = VLLMServerSampler(_Tokenizer(), url=stand_in, model_dir="m", max_model_len=32, timeout=10)
    sampling = SamplingConfig(max_new_tokens=3, temperature=0.7, top_k=5)
    rollout = sampler.sample([[5, 6, 7], [8]], 2, sampling, seed=10)
    requests = [b for path, b in _StandIn.calls if path == "/v1/completions"]
    assert sorted(b["seed"] for b in requests) == [10, 11] and {len(b["prompt"]) for b in requests} == {1, 3}
    first = next(b for b in requests if b["seed"] == 10)
    assert first["prompt"] == [5, 6, 7] and first["n"] == 2 and first["temperature"] == 0.7
    assert first["top_k"] == 5 and first["max_tokens"] == 3 and first["logprobs"] == 0
    assert (
        first["stop_token_ids"] == [2] and first["return_token_ids"] and first["return_tokens_as_token_ids"]
    )
    assert rollout.input_ids[:, :3].tolist() == [[5, 6, 7], [5, 6, 7], [0, 0, 8], [0, 0, 8]]  # left-padded
    assert rollout.response_ids.tolist() == [[7, 2, 0], [7, 9, 4]] * 2  # choice 0 then 1, right-padded
    assert rollout.response_mask.tolist() == [[1, 1, 0], [1, 1, 1]] * 2  # up to and including EOS
    expected = torch.tensor([[-0.5, -0.6, 0.0], [-1.5, -1.6, -1.7]] * 2)
    torch.testing.assert_close(rollout.log_probs, expected)
    sampler.close()


def test_a_push_writes_the_weights_and_asks_the_server_to_reload_them(stand_in):
    sampler = VLLMServerSampler(_Tokenizer(), url=stand_in, model_dir="m", max_model_len=32, timeout=10)
    model = torch.nn.Linear(3, 2)
    sampler.push(model)
    (path, rpc), (reset, _) = _StandIn.calls[-2:]
    assert path == "/collective_rpc" and rpc["method"] == "reload_weights" and reset == "/reset_prefix_cache"
    from safetensors.torch import load_file

    saved = load_file(os.path.join(rpc["kwargs"]["weights_path"], "model.safetensors"))
    assert set(saved) == {"weight", "bias"} and torch.equal(saved["weight"], model.weight.detach())
    folder = rpc["kwargs"]["weights_path"]
    sampler.close()
    assert not os.path.exists(folder)  # the weights folder goes with the sampler


def test_a_server_without_the_dev_endpoints_is_told_how_to_start(stand_in):
    _StandIn.dev_mode = False
    sampler = VLLMServerSampler(_Tokenizer(), url=stand_in, model_dir="m", max_model_len=32, timeout=10)
    with pytest.raises(VLLMServerError, match="start it with VLLM_SERVER_DEV_MODE=1"):
        sampler.push(torch.nn.Linear(3, 2))
    sampler.close()


def test_a_server_with_a_short_context_is_refused(stand_in):
    with pytest.raises(VLLMServerError, match="serves max_model_len=64, below .* = 80"):
        VLLMServerSampler(_Tokenizer(), url=stand_in, model_dir="m", max_model_len=80, timeout=10)


def test_a_hung_server_is_one_error_within_the_timeout():
    with socket.socket() as s:  # accepts connections (the kernel's backlog), never answers
        s.bind(("127.0.0.1", 0))
        s.listen()
        start = time.monotonic()
        with pytest.raises(VLLMServerError, match=r"was not up within 2 s \(sampling.vllm_timeout\)"):
            VLLMServerSampler(_Tokenizer(), url=f"http://127.0.0.1:{s.getsockname()[1]}", model_dir="m",
                              max_model_len=32, timeout=2)  # fmt: skip
        assert time.monotonic() - start < 10


def test_a_server_that_is_down_is_one_cli_error_before_the_run_folder(tiny_lm_dir, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    out = tmp_path / "run"
    args = [sys.executable, "-m", "postrl.cli", "grpo", "--model", str(tiny_lm_dir), "--out", str(out),
            "sampling.engine=vllm", "sampling.vllm_mode=server", f"sampling.vllm_url=http://127.0.0.1:{port}",
            "sampling.vllm_timeout=2", "sampling.max_new_tokens=8"]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("postrl: error:"), proc.stderr
    assert f"the vLLM server at http://127.0.0.1:{port} was not up within 2 s" in lines[0]
    assert not out.exists() and time.monotonic() - start < 120


def test_a_url_without_server_mode_is_refused(tiny_lm_dir, tmp_path):
    from postrl.lm.grpo.build import vllm_problems

    sampling = GRPOSamplingConfig(engine="vllm", vllm_url="http://127.0.0.1:1")
    problems = vllm_problems(_config(tiny_lm_dir, sampling=sampling), 1)
    assert problems["sampling.vllm_url is a server's: set sampling.vllm_mode=server"]
    server = GRPOSamplingConfig(engine="vllm", vllm_mode="server", vllm_url="http://127.0.0.1:1")
    assert not any(vllm_problems(_config(tiny_lm_dir, sampling=server), 1).values())  # no vLLM needed here


# ---- with vLLM: a server postrl launches on the built-in tiny Llama ----------------------------------------
@pytest.fixture(scope="module")
def server(base):  # noqa: F811 - the module fixture of test_vllm_engine
    pytest.importorskip("vllm")
    sampler = VLLMServerSampler(base[2], model_dir=str(base[0]), max_model_len=64, seed=0, timeout=300)
    yield sampler
    sampler.close()


@pytest.mark.vllm
def test_the_server_samples_what_colocate_mode_samples_with_the_log_probs_of_pi_tau(server, base):  # noqa: F811
    from postrl.lm.rollout.vllm_engine import VLLMSampler

    _, tiny_lm, tokenizer = base
    server.push(tiny_lm)
    prompts, sampling = _prompts(tokenizer), SamplingConfig(max_new_tokens=T, temperature=0.7)
    rollout = server.sample(prompts, G, sampling, seed=5)
    _check_layout(rollout, prompts, tokenizer)
    assert len({tuple(r) for r in rollout.response_ids[:G].tolist()}) > 1  # a group is G draws, not copies
    torch.testing.assert_close(rollout.log_probs, _teacher_forced(tiny_lm, rollout, 0.7), atol=2e-3, rtol=0)
    colocated = VLLMSampler(str(base[0]), tokenizer, max_model_len=64, seed=0)
    same = colocated.sample(prompts, G, sampling, seed=5)
    colocated.close()
    assert torch.equal(same.response_ids, rollout.response_ids)  # the same engine, seeds and parameters
    torch.testing.assert_close(same.log_probs, rollout.log_probs, atol=1e-5, rtol=0)


@pytest.mark.vllm
def test_weights_pushed_to_the_server_are_the_ones_it_samples_from(server, base):  # noqa: F811
    _, tiny_lm, tokenizer = base
    changed = perturbed(tiny_lm)
    prompts, sampling = _prompts(tokenizer), SamplingConfig(max_new_tokens=T, temperature=1.0)
    server.push(tiny_lm)
    before = server.sample(prompts, G, sampling, seed=1)
    seconds = server.push(changed)
    after = server.sample(prompts, G, sampling, seed=1)
    torch.testing.assert_close(after.log_probs, _teacher_forced(changed, after, 1.0), atol=2e-3, rtol=0)
    assert float((after.log_probs - _teacher_forced(tiny_lm, after, 1.0)).abs().max()) > 0.05
    assert not torch.equal(before.response_ids, after.response_ids)  # same seeds, new weights: new samples
    assert seconds < 30


def _children() -> list[str]:
    """Command lines of this process's child processes."""
    out = subprocess.run(["pgrep", "-a", "-P", str(os.getpid())], capture_output=True, text=True).stdout
    return out.strip().splitlines()


@pytest.mark.vllm
def test_grpo_with_a_launched_server_runs_and_stops_it(base, tmp_path, monkeypatch):  # noqa: F811
    pytest.importorskip("vllm")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the sampler's weights folder lands here
    servers = {c for c in _children() if "api_server" in c}  # the module's own server
    sampling = GRPOSamplingConfig(max_new_tokens=4, engine="vllm", vllm_mode="server")
    optim = OptimConfig(lr=1e-2, warmup_steps=0, min_lr_ratio=1.0)  # large steps: unpushed weights would show
    run_grpo(_config(base[0], run={"steps": 3}, sampling=sampling, optim=optim), tmp_path / "run")
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert len(rows) == 3
    for row in rows:  # every step sampled from the weights of the step before: the engines agree closely
        assert 0 <= row["behaviour_kl"] < 1e-3 and row["is_capped_fraction"] == 0.0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("postrl-vllm-")]  # closed with its run
    assert {c for c in _children() if "api_server" in c} == servers  # the run's server was stopped


@pytest.mark.vllm
def test_a_server_that_dies_is_one_error_naming_its_exit(server, base):  # noqa: F811 - last: it kills the server
    os.killpg(server.server.process.pid, signal.SIGKILL)
    server.server.process.wait(timeout=30)
    sampling = SamplingConfig(max_new_tokens=T)
    with pytest.raises(VLLMServerError, match="the vLLM server postrl launched exited with code -9"):
        server.sample(_prompts(base[2]), G, sampling, seed=0)
