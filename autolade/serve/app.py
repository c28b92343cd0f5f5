"""The HTTP side: an OpenAI-compatible FastAPI app over one ``ModelServer``.

Routes: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions`` (non-streaming and
server-sent events), ``GET /health``. Each request waits in a thread of its own while its row decodes in
the model's one batch (``batching.BatchLoop``: all requests in flight share every forward), so
concurrent requests progress together and a client that disconnects frees its row at the next step.
The threads are the app's own (``RequestSlots``): asyncio's default pool has cpu_count + 4 threads, 6 on
a 2-core machine, and a 7th client waited there behind a whole request before its row could even queue.
Past ``max_batch + max_waiting`` requests the server answers 503 at once. Errors are OpenAI-style JSON
(4xx for the request's faults); the server keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from autolade.serve.requests import MAX_WAITING, ApiError, DecodeRequest, decode_request, parse_body
from autolade.serve.worker import Completion, ModelServer

DONE = object()  # end of a stream's queue


class RequestSlots:
    """A thread for every request the server takes (decoding or waiting for a row), and a 503 past them."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the request limit must be >= 1, got {limit}")
        self.limit = limit
        self.pool = ThreadPoolExecutor(max_workers=limit, thread_name_prefix="autolade-request")
        self._free = threading.BoundedSemaphore(limit)

    def take(self) -> None:
        """Hold a slot for one request, or raise a 503 when every slot is held."""
        if not self._free.acquire(blocking=False):
            raise ApiError(503, f"the server is busy: {self.limit} requests are decoding or waiting for a row; retry "
                           "later (or start it with a larger --max-waiting)", kind="server_error", code="server_busy")

    def run(self, fn: Callable[[], Any]) -> asyncio.Future:
        """``fn()`` in a thread of the slot taken by ``take``; the slot is free again when ``fn`` returns
        (not when an awaiting handler is cancelled: the thread is still busy then)."""

        def held() -> Any:
            try:
                return fn()
            finally:
                self._free.release()

        return asyncio.get_running_loop().run_in_executor(self.pool, held)


def create_app(server: ModelServer, *, max_waiting: int = MAX_WAITING) -> FastAPI:
    app = FastAPI(title="autolade", summary="exact lookahead decoding behind an OpenAI-compatible API")
    created = int(time.time())
    slots = RequestSlots(server.loop.max_rows + max_waiting)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(ApiError(exc.status_code, str(exc.detail)).body(), status_code=exc.status_code)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": server.name, "in_flight": server.loop.in_flight,
                "waiting": len(server.loop.waiting), "steps": server.loop.steps}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": server.name, "object": "model", "created": created, "owned_by": "autolade"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _complete(server, slots, request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _complete(server, slots, request, chat=False)

    return app


async def _complete(server: ModelServer, slots: RequestSlots, request: Request, *, chat: bool):
    req = decode_request(parse_body(await request.body()), chat=chat, served=server.name)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    slots.take()
    if req.stream:
        return StreamingResponse(_stream(server, req, rid, _start_stream(server, slots, req)), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    done = await slots.run(lambda: server.run(req))
    return _response(server, req, rid, done)


def _response(server: ModelServer, req: DecodeRequest, rid: str, done: Completion) -> dict[str, Any]:
    if req.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": done.text}, "logprobs": None,
                  "finish_reason": done.finish_reason}
    else:
        choice = {"index": 0, "text": done.text, "logprobs": None, "finish_reason": done.finish_reason}
    return {"id": rid, "object": "chat.completion" if req.chat else "text_completion", "created": int(time.time()),
            "model": server.name, "choices": [choice], "usage": _usage(done), "autolade": done.settings}


def _usage(done: Completion) -> dict[str, int]:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens}


def _chunk(server: ModelServer, req: DecodeRequest, rid: str, text: str | None, finish: str | None,
           *, first: bool = False) -> dict[str, Any]:
    if req.chat:
        delta: dict[str, Any] = {"role": "assistant", "content": text or ""} if first else (
            {"content": text} if text is not None else {})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
    return {"id": rid, "object": "chat.completion.chunk" if req.chat else "text_completion", "created": int(time.time()),
            "model": server.name, "choices": [choice]}


def _start_stream(server: ModelServer, slots: RequestSlots, req: DecodeRequest) -> tuple[asyncio.Queue, threading.Event, Any]:
    """Start decoding ``req`` in its slot now, its text going to a queue: the slot is freed when the decode
    ends, even if the response never starts streaming (a client gone before the first byte)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    gone = threading.Event()

    def work() -> None:
        try:
            done = server.run(req, on_text=lambda t: loop.call_soon_threadsafe(queue.put_nowait, t),
                              cancelled=gone.is_set)
            loop.call_soon_threadsafe(queue.put_nowait, done)
        except Exception as exc:  # an ApiError, Cancelled, or a fault: the stream says so and ends
            loop.call_soon_threadsafe(queue.put_nowait, exc)
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, DONE)

    return queue, gone, asyncio.ensure_future(slots.run(work))


async def _stream(server: ModelServer, req: DecodeRequest, rid: str, started: tuple[asyncio.Queue, threading.Event, Any]
                  ) -> AsyncIterator[str]:
    """Server-sent events: a chunk per step's new text, a last chunk with the finish reason, [DONE].
    When the client goes away the generator is closed: the decode stops at its next step."""
    queue, gone, worker = started
    try:
        yield _sse(_chunk(server, req, rid, "", None, first=True))
        while (item := await queue.get()) is not DONE:
            if isinstance(item, str):
                yield _sse(_chunk(server, req, rid, item, None))
            elif isinstance(item, Completion):
                last = _chunk(server, req, rid, None, item.finish_reason)
                last["autolade"] = item.settings
                yield _sse(last)
                if req.include_usage:
                    yield _sse({**_chunk(server, req, rid, None, None), "choices": [], "usage": _usage(item)})
            elif isinstance(item, Exception):
                err = item if isinstance(item, ApiError) else ApiError(500, f"decoding failed: {item}", kind="server_error")
                yield _sse(err.body())
        yield "data: [DONE]\n\n"
    finally:
        gone.set()  # a closed stream (client gone) cancels the decode; after a finished one this is a no-op
        await worker


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
