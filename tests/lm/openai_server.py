"""A small OpenAI-compatible chat server for the judge tests: a real causal LM (a postrl model folder loaded
through transformers) answers ``/v1/chat/completions`` greedily, with the top log-probabilities of each
generated token, on the Starlette/uvicorn stack; ``/v1/models`` lists it. Not canned text: every answer and
log-probability is the model's, from its chat template."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from postrl.lm.models import load_causal_lm
from postrl.lm.tokenizer import load_tokenizer


@torch.no_grad()
def chat_answer(model, tokenizer, messages: list[dict], max_tokens: int, top: int) -> tuple[str, list[dict]]:
    """Greedy answer to ``messages`` (the chat template with the generation prompt) and, per generated token,
    its log-probability and the ``top`` most likely alternatives, as OpenAI's ``logprobs.content``."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    content, out_ids = [], []
    for _ in range(max_tokens):
        logp = torch.log_softmax(model(input_ids=ids).logits[0, -1].double(), -1)
        best = int(logp.argmax())
        if best == tokenizer.eos_token_id:
            break
        values, indices = logp.topk(top)
        piece = tokenizer.decode([best])
        alts = [
            {"token": tokenizer.decode([int(i)]), "logprob": float(v), "bytes": None}
            for v, i in zip(values, indices, strict=True)
        ]
        content.append({"token": piece, "logprob": float(logp[best]), "bytes": None, "top_logprobs": alts})
        out_ids.append(best)
        ids = torch.cat([ids, torch.tensor([[best]])], dim=1)
    return tokenizer.decode(out_ids), content


def make_app(model_dir: Path, name: str = "tiny") -> Starlette:
    model, tokenizer = load_causal_lm(model_dir), load_tokenizer(model_dir)

    async def models(request: Request) -> JSONResponse:
        return JSONResponse(
            {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "postrl"}]}
        )

    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        if body.get("model") != name:
            return JSONResponse({"error": {"message": f"no model {body.get('model')!r}"}}, status_code=404)
        top = int(body.get("top_logprobs") or 0)
        text, content = chat_answer(
            model, tokenizer, body["messages"], int(body.get("max_tokens") or 16), max(top, 1)
        )
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop",
            "logprobs": {"content": content} if body.get("logprobs") else None,
        }
        return JSONResponse(
            {"id": "chatcmpl-0", "object": "chat.completion", "created": int(time.time()), "model": name,
             "choices": [choice], "usage": {"prompt_tokens": 0, "completion_tokens": len(content), "total_tokens": 0}}
        )  # fmt: skip

    return Starlette(
        routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])]
    )


@contextmanager
def serve(model_dir: Path, name: str = "tiny") -> Iterator[str]:
    """Serve ``model_dir`` on a free localhost port in a thread; yields the base URL (``.../v1``)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(make_app(model_dir, name), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
