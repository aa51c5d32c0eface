"""The OpenAI-compatible HTTP face of :class:`~sim.serve.engine.LiveEngine` (Starlette).

Routes: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (``stream: true``: Server-Sent
Events, one chunk per emission of the engine, at its simulated time; ``stream_options:
{"include_usage": true}`` adds the usage chunk; then ``data: [DONE]``), ``GET /v1/models``,
``GET /health``, ``GET /metrics`` (:mod:`sim.serve.metrics`).

A request's sizes: prompt tokens are the whitespace-separated words of the prompt (of every
message's content for chat; a prompt given as a list of token ids counts its ids), at least 1;
output tokens are ``max_tokens`` (or ``max_completion_tokens``), default 16 - every request
runs to its length, as with ``ignore_eos``. The text is a placeholder, one word per token.
``usage`` reports those counts. A request the engine refuses at arrival (over
``max_model_len``, larger than the KV pool) is an HTTP 400 whose message is the engine's
reason; a malformed body is a 400 naming the field. A client that leaves mid-stream aborts
its request in the simulation (:meth:`~sim.serve.engine.LiveEngine.abort`: out of the queue or
the batch, its KV blocks freed, counted aborted; a non-streaming request runs to its end).
``max_concurrency``: with that many requests in flight, another is an HTTP 429 saying so (with
``Retry-After: 1``), never queued unseen.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid

import anyio
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from .metrics import Metrics

WORDS = ("the", "simulated", "engine", "emits", "this", "placeholder", "text", "one", "word",
         "per", "token")
DEFAULT_MAX_TOKENS = 16


class BadRequest(ValueError):
    """A request the server refuses: HTTP 400 with this message."""


def error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "BadRequestError",
                                   "param": None, "code": status}}, status_code=status)


def placeholder(start: int, n: int) -> str:
    """Tokens ``start .. start + n - 1`` of the placeholder text: one word each."""
    return "".join(" " + WORDS[i % len(WORDS)] for i in range(start, start + n))


def count_words(value, field) -> int:
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return len(value)  # token ids
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        return len(value[0].split())
    raise BadRequest(f"{field} must be a string or a list of token ids, got {value!r:.80}")


def sizes(body, chat: bool):
    """(prompt tokens, output tokens) of a request body (the module docstring)."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        prompt = 0
        for i, m in enumerate(messages):
            content = m.get("content", "") if isinstance(m, dict) else None
            if isinstance(content, list):  # content parts: their text
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            if not isinstance(content, str):
                raise BadRequest(f"messages[{i}].content must be a string, got {content!r:.80}")
            prompt += len(content.split())
    else:
        if "prompt" not in body:
            raise BadRequest("prompt is required")
        prompt = count_words(body["prompt"], "prompt")
    out = body.get("max_tokens", body.get("max_completion_tokens", DEFAULT_MAX_TOKENS))
    if out is None:
        out = DEFAULT_MAX_TOKENS
    if isinstance(out, bool) or not isinstance(out, int) or out < 1:
        raise BadRequest(f"max_tokens must be an integer >= 1, got {out!r}")
    return max(1, prompt), out


def make_app(engine, model: str, max_concurrency: int | None = None) -> Starlette:
    """The ASGI app serving ``engine`` (started and stopped with the app) as ``model``, at most
    ``max_concurrency`` requests in flight (None: no limit)."""
    if max_concurrency is not None and (isinstance(max_concurrency, bool) or not isinstance(
            max_concurrency, int) or max_concurrency < 1):
        raise ValueError(f"max_concurrency must be an integer >= 1, got {max_concurrency!r}")
    metrics = Metrics(model, len(engine.replicas))
    created = int(time.time())
    flight = [0]  # requests in flight (the event loop's thread alone counts them)

    def listen(loop, q):
        return lambda kind, value, now: loop.call_soon_threadsafe(q.put_nowait,
                                                                  (kind, value, now))

    async def events(q):
        """(kind, value, simulated time) until the request's end."""
        while True:
            kind, value, now = await q.get()
            yield kind, value, now
            if kind != "tokens":
                return

    async def completion(request, chat: bool):
        try:
            body = json.loads(await request.body())
        except json.JSONDecodeError as e:
            return error(f"the request body is not JSON: {e}")
        try:
            num_prompt, num_output = sizes(body, chat)
        except BadRequest as e:
            return error(str(e))
        if max_concurrency is not None and flight[0] >= max_concurrency:
            metrics.refused += 1
            response = error(f"{flight[0]} requests in flight, the server's limit "
                             f"(--max-concurrency {max_concurrency}): retry later", 429)
            response.headers["Retry-After"] = "1"
            return response
        flight[0] += 1
        q = asyncio.Queue()
        listener = listen(asyncio.get_running_loop(), q)
        ended = [False]

        def end():
            if not ended[0]:
                ended[0] = True
                flight[0] -= 1
        engine.add(num_prompt, num_output, listener)
        try:
            first = await q.get()
        except asyncio.CancelledError:
            end()
            metrics.aborted += 1
            engine.abort(listener)
            raise
        if first[0] == "rejected":
            end()
            metrics.rejected += 1
            return error(str(first[1]))
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        usage = {"prompt_tokens": num_prompt, "completion_tokens": num_output,
                 "total_tokens": num_prompt + num_output}
        kind = "chat.completion" if chat else "text_completion"
        head = {"id": rid, "created": created, "model": body.get("model", model)}

        async def stream():
            try:
                async for chunk in _stream():
                    yield chunk
            finally:  # ended, or the client left (the task cancelled): abort it if running
                if not ended[0]:
                    end()
                    if not done[0]:
                        metrics.aborted += 1
                        engine.abort(listener)
        done = [False]

        async def _stream():
            times, sent = [], 0
            q.put_nowait(first)
            async for kind_, value, now in events(q):
                if kind_ == "tokens":
                    times.append((now, value))
                    text = placeholder(sent, value)
                    sent += value
                    last = sent == num_output
                    choice = {"index": 0, "finish_reason": "length" if last else None}
                    if chat:
                        choice["delta"] = ({"role": "assistant", "content": text}
                                           if len(times) == 1 else {"content": text})
                    else:
                        choice.update(text=text, logprobs=None)
                    yield {**head, "object": kind + ("" if not chat else ".chunk"),
                           "choices": [choice]}
                elif kind_ == "done":
                    done[0] = True
                    metrics.finished(value[0], times, value[1])
                    return
                else:  # aborted: the server is shutting down
                    done[0] = True
                    raise asyncio.CancelledError

        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

            async def sse():
                async for chunk in stream():
                    yield f"data: {json.dumps(chunk)}\n\n"
                if include_usage:
                    tail = {**head, "object": kind, "choices": [], "usage": usage}
                    yield f"data: {json.dumps(tail)}\n\n"
                yield "data: [DONE]\n\n"
            return StreamingResponse(sse(), media_type="text/event-stream")
        async for _ in stream():
            pass
        text = placeholder(0, num_output)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                   "finish_reason": "length"} if chat else
                  {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"})
        return JSONResponse({**head, "object": kind, "choices": [choice], "usage": usage})

    async def completions(request):
        return await completion(request, chat=False)

    async def chat_completions(request):
        return await completion(request, chat=True)

    async def models(_request):
        return JSONResponse({"object": "list", "data": [
            {"id": model, "object": "model", "created": created, "owned_by": "sim"}]})

    async def health(_request):
        return PlainTextResponse("")

    async def prometheus(_request):
        return PlainTextResponse(metrics.text(engine.snapshot, engine.snapshots),
                                 media_type="text/plain; version=0.0.4")

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        # a streamed response runs in an anyio task group, whose backend anyio imports on
        # first use (~50 ms, measured): import it now, or the first request's first token
        # comes that late to the client (aiperf measured it: TTFT +35 ms on an L4's 227 ms)
        async with anyio.create_task_group():
            pass
        engine.start()
        yield
        engine.stop()

    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
                            Route("/v1/models", models), Route("/health", health),
                            Route("/metrics", prometheus)], lifespan=lifespan)
    app.state.metrics = metrics
    return app
