"""vLLM as a rollout engine in server mode (``sampling.engine: vllm``, ``sampling.vllm_mode: server``): vLLM's
OpenAI-compatible server in another process, sampled over HTTP.

`VLLMServerSampler` either launches the server itself (``python -m vllm.entrypoints.openai.api_server`` on the
starting model's folder, a free local port, ``VLLM_SERVER_DEV_MODE=1``, the same engine settings as colocate
mode: token ids only, ``--logprobs-mode processed_logprobs``, no prefix cache) or talks to one a user started
(``sampling.vllm_url``). It returns what `postrl.lm.rollout.vllm_engine.VLLMSampler` returns: the same
`Rollout` layout, the same per-prompt seeds, the same vLLM sampling parameters.

Sampling. One ``POST /v1/completions`` per prompt (sent together, so the server batches them): the prompt as
token ids, ``n`` = G, ``seed``, ``logprobs: 0`` with ``return_token_ids`` and ``return_tokens_as_token_ids``:
the sampled token ids come back exactly (``choices[i].token_ids``, checked against the ``token_id:N`` names of
the log-probs), with the log-probs of π_τ that colocate mode records.

Weights (the documented path; it needs nothing but a shared file system, so it works on CPU). After each
optimiser step `push` writes the policy's tensors with their Hugging Face names to ``model.safetensors`` in a
folder of postrl's (a temporary file, then ``os.replace``), and calls the server's ``POST /collective_rpc``
with ``{"method": "reload_weights", "kwargs": {"weights_path": folder}}``: every worker reloads its weights in
place from that folder (vLLM's ``reload_weights``, the same worker method colocate mode calls with the tensors
themselves), then ``POST /reset_prefix_cache`` drops KV entries computed with the old weights. ``/collective_rpc``
exists only on a server started with ``VLLM_SERVER_DEV_MODE=1``. TRL's ``trl vllm-serve`` instead sends each
tensor through an NCCL communicator, which needs GPUs on both sides.

Failures. A server that does not come up, dies, or leaves a request unanswered for ``timeout`` seconds
(``sampling.vllm_timeout``) is one `VLLMServerError` naming the URL (and, for a launched server, its exit code
and log file). A launched server is stopped by `close`, at the interpreter's exit, and (Linux) when the
process that launched it dies.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from postrl.lm.rollout.engine import Rollout, SamplingConfig
from postrl.lm.rollout.vllm_engine import request_fields, rollout_from_tokens
from postrl.runtime.errors import UserError

log = logging.getLogger(__name__)


class VLLMServerError(UserError):
    """The vLLM server did not start, died, refused a request, or did not answer within the timeout."""


def hf_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state dict with Hugging Face names, as contiguous CPU tensors; a tensor shared by two names
    (tied embeddings) is written under each. vLLM 0.32's in-place reload rebuilds layer by layer and needs
    each layer's own tensors: without ``lm_head.weight`` its tied output layer kept the old weights (measured:
    log-probs 1.6 off after a push)."""
    seen: set[int] = set()
    out = {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().contiguous().cpu()
        out[name] = (
            tensor.clone() if tensor.data_ptr() in seen else tensor
        )  # safetensors refuses shared storage
        seen.add(tensor.data_ptr())
    return out


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: SIGTERM to this process when its parent dies (PR_SET_PDEATHSIG), so a killed trainer does not
    leave its server behind."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


class LaunchedServer:
    """vLLM's OpenAI-compatible server started by postrl on ``model_dir`` (its own process group), with its
    output in ``folder``/server.log."""

    def __init__(self, model_dir: str, folder: Path, *, dtype: torch.dtype, max_model_len: int,
                 kv_cache_gib: float, gpu_memory_utilization: float, seed: int) -> None:  # fmt: skip
        with socket.socket() as s:  # a free port, handed to the server
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = folder / "server.log"
        self.exited = False  # it exited by itself: its log is kept for the user
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
            "--host", "127.0.0.1", "--port", str(port), "--dtype", str(dtype).removeprefix("torch."),
            "--max-model-len", str(max_model_len), "--seed", str(seed),
            "--logprobs-mode", "processed_logprobs",  # log softmax(logits / τ): postrl's log π_τ
            "--skip-tokenizer-init",  # postrl tokenises and decodes; the server sees token ids only
            "--enforce-eager", "--no-enable-prefix-caching",  # weights change every step
            "--gpu-memory-utilization", str(gpu_memory_utilization),
        ]  # fmt: skip
        env = dict(os.environ, VLLM_SERVER_DEV_MODE="1")  # /collective_rpc: the weights' path
        env.pop(
            "VLLM_ENABLE_V1_MULTIPROCESSING", None
        )  # colocate mode's in-process switch is not the server's
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(kv_cache_gib))))
        with self.log_path.open("wb") as out:
            self.process = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )  # fmt: skip
        log.info("vLLM server starting at %s (pid %d, log %s)", self.url, self.process.pid, self.log_path)

    def check_alive(self) -> None:
        """A `VLLMServerError` if the server has exited (its code and the last line of its log)."""
        code = self.process.poll()
        if code is None:
            return
        self.exited = True
        lines = (
            self.log_path.read_text(errors="replace").strip().splitlines() if self.log_path.exists() else []
        )
        last = next((line for line in reversed(lines) if "Error" in line), lines[-1] if lines else "")
        raise VLLMServerError(
            f"the vLLM server postrl launched exited with code {code} (log {self.log_path}): {last}"
        )

    def stop(self, wait: float = 15.0) -> None:
        """SIGTERM to the server's process group, SIGKILL after ``wait`` seconds."""
        if self.process.poll() is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


class VLLMServerSampler:
    """Samples into postrl's `Rollout` layout from a vLLM server: the one at ``url``, or (``url`` None) one
    launched on ``model_dir`` with the given engine settings (`LaunchedServer`). ``timeout``: seconds the
    server may take to start and to answer one request. Same interface as `VLLMSampler`: `push`, `sample`."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        model_dir: str,
        max_model_len: int,
        url: str | None = None,
        dtype: torch.dtype = torch.float32,
        kv_cache_gib: float = 1.0,
        gpu_memory_utilization: float = 0.3,
        seed: int = 0,
        timeout: float = 300.0,
    ) -> None:
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("VLLMServerSampler needs a tokenizer with both pad_token_id and eos_token_id")
        self.tokenizer, self.timeout = tokenizer, timeout
        self.folder = Path(tempfile.mkdtemp(prefix="postrl-vllm-"))  # the weights the server reloads
        self.server: LaunchedServer | None = None
        atexit.register(self.close)
        start = time.perf_counter()
        if url is None:
            self.server = LaunchedServer(
                model_dir, self.folder, dtype=dtype, max_model_len=max_model_len, kv_cache_gib=kv_cache_gib,
                gpu_memory_utilization=gpu_memory_utilization, seed=seed,
            )  # fmt: skip
            url = self.server.url
        self.url = url.rstrip("/")
        try:
            self._wait_until_up()
            self._check_model(max_model_len)
        except BaseException:
            self.close()
            raise
        self.start_seconds = time.perf_counter() - start
        log.info("vLLM server at %s up after %.1f s", self.url, self.start_seconds)

    # -- HTTP
    def _call(self, path: str, body: dict | None = None, timeout: float | None = None) -> Any:
        """GET (``body`` None) or POST JSON to the server; the decoded JSON answer (None when empty)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data=data, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:300]
            if e.code == 404 and path == "/collective_rpc":
                raise VLLMServerError(
                    f"the vLLM server at {self.url} has no /collective_rpc, which postrl's weight sync needs: "
                    "start it with VLLM_SERVER_DEV_MODE=1"
                ) from None
            raise VLLMServerError(
                f"the vLLM server at {self.url} refused {path} ({e.code}): {detail}"
            ) from None
        except (urllib.error.URLError, OSError) as e:  # refused, reset, or timed out
            if self.server is not None:
                self.server.check_alive()
            reason = getattr(e, "reason", e)
            raise VLLMServerError(
                f"the vLLM server at {self.url} did not answer {path} within {timeout or self.timeout:g} s "
                f"(sampling.vllm_timeout): {reason}"
            ) from None
        return json.loads(raw) if raw.strip() else None

    def _wait_until_up(self) -> None:
        """Poll ``/health`` until it answers, the launched server exits, or ``timeout`` passes."""
        deadline = time.monotonic() + self.timeout
        while True:
            if self.server is not None:
                self.server.check_alive()
            try:
                self._call("/health", timeout=5.0)
                return
            except VLLMServerError:
                if time.monotonic() > deadline:
                    raise VLLMServerError(
                        f"the vLLM server at {self.url} was not up within {self.timeout:g} s (sampling.vllm_timeout)"
                    ) from None
                time.sleep(0.5)

    def _check_model(self, max_model_len: int) -> None:
        """The served model's context must hold the longest prompt plus response."""
        models = (self._call("/v1/models") or {}).get("data") or [{}]
        served = models[0].get("max_model_len")
        if served is not None and served < max_model_len:
            raise VLLMServerError(
                f"the vLLM server at {self.url} serves max_model_len={served}, below max_prompt_length + "
                f"sampling.max_new_tokens = {max_model_len}"
            )

    # -- weights and samples
    def push(self, model: nn.Module) -> float:
        """Write ``model``'s weights to the folder the server reloads, and have it reload them; the seconds."""
        start = time.perf_counter()
        partial = self.folder / "model.partial"  # not *.safetensors: a reload never reads half a file
        save_file(hf_tensors(model), str(partial), metadata={"format": "pt"})
        os.replace(partial, self.folder / "model.safetensors")
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(self.folder)}}
        self._call("/collective_rpc", body)
        self._call("/reset_prefix_cache", {})
        return time.perf_counter() - start

    def sample(
        self,
        prompt_ids: Sequence[Sequence[int]],
        repeat: int,
        sampling: SamplingConfig,
        seed: int,
        device: torch.device | str = "cpu",
    ) -> Rollout:
        """``repeat`` responses to each prompt (rows ``i·repeat … i·repeat + repeat − 1``), prompt ``i``'s
        request seeded by ``seed + i``, as `VLLMSampler.sample`."""
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        fields = request_fields(sampling, repeat, eos)
        bodies = [
            {**fields, "prompt": list(ids), "seed": (seed + i) % 2**63, "return_token_ids": True,
             "return_tokens_as_token_ids": True}
            for i, ids in enumerate(prompt_ids)
        ]  # fmt: skip
        with ThreadPoolExecutor(max_workers=min(32, max(1, len(bodies)))) as pool:
            answers = list(pool.map(lambda body: self._call("/v1/completions", body), bodies))
        responses, log_probs = [], []
        for answer in answers:
            choices = sorted(answer["choices"], key=lambda c: c["index"])
            if len(choices) != repeat:
                raise VLLMServerError(
                    f"the vLLM server at {self.url} returned {len(choices)} samples for n={repeat}"
                )
            for choice in choices:
                tokens, lp = choice["token_ids"], choice["logprobs"]
                if lp["tokens"] != [f"token_id:{t}" for t in tokens]:
                    raise VLLMServerError(
                        f"the vLLM server at {self.url}: log-probs of other tokens than sampled"
                    )
                responses.append(list(tokens))
                log_probs.append([float(x) for x in lp["token_logprobs"]])
        return rollout_from_tokens(prompt_ids, repeat, responses, log_probs, pad, eos, device)

    def close(self) -> None:
        """Stop a launched server and remove the weights folder, but for the log of a server that exited by
        itself (safe to call twice)."""
        server, self.server = self.server, None
        if server is not None:
            server.stop()
            if server.exited:
                (self.folder / "model.safetensors").unlink(missing_ok=True)
                return
        shutil.rmtree(self.folder, ignore_errors=True)
