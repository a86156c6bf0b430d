"""The HTTP side (FastAPI): OpenAI-compatible routes over the scheduler thread.

A handler validates, names the request (req-N, in arrival order), submits it, and awaits its updates
on an asyncio queue the scheduler feeds through `call_soon_threadsafe`. A client that hangs up (seen
while waiting or when the stream's generator is closed) has its request aborted, and costs one line
through the log limiter. Every request that was accepted ends with its whole answer or an error: a
request cut off (by the drain's deadline, or a handler cancelled at shutdown) gets a 503, and a stream
an error event, never a success without an answer.
"""

from __future__ import annotations

import asyncio
import codecs
import hmac
import json
import threading
import time

from fastapi import FastAPI, Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from serve import logs, validate
from serve.engine import Engine
from serve.guard import Limits
from serve.request import EOS, Done, Request, Stops, Update
from serve.scheduler import Scheduler
from serve.metrics import Metrics, snapshot
from serve.validate import ApiError, Ask

__all__ = ["make_app"]

CAPABILITIES = ("text", "cached-tokens", "stream", "params", "stats", "metrics", "kern-serve", "kern-policy")
"""What GET /kern/capabilities declares (docs/engine-contract.md): every capability a server can have."""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kern")
    except PackageNotFoundError:
        return "unknown"


VERSION = _version()
POLL_S = 0.25


class Disconnected(Exception):
    """The client hung up."""


def _error(exc: ApiError, headers: dict | None = None) -> JSONResponse:
    """The error answer (make_app's own `_error` logs a rejected request first, then calls this)."""
    if exc.status == 413:  # the rest of a body too large is not worth reading
        headers = {**(headers or {}), "Connection": "close"}
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


_answer_error = _error


def _cut(message: str = "the server stopped before this request finished") -> ApiError:
    return ApiError(503, message, code="server_shutting_down", type="server_error")


def make_app(scheduler: Scheduler, engine: Engine, api_key: str | None = None, limits: Limits | None = None,
             limit_log: logs.Limiter | None = None, protect_stats: bool = False, sampling: str = "refuse",
             metrics_prefix: str = "kern") -> FastAPI:
    """The routes. `limits` bounds bodies and /tokenize; `limit_log` takes repeated events (hang-ups);
    `protect_stats` puts /stats and /metrics behind `api_key` too; `sampling` ("refuse" or
    "greedy-warn") is what a non-greedy sampling value gets (docs/api.md). `app.state.cancelled` counts
    handlers cancelled at shutdown (each answered a 503)."""
    app = FastAPI(title="kern", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.cancelled = 0
    app.state.outbox = None  # an `Outbox` for the loop serving this app, made by its first request
    model = engine.model
    created = int(time.time())
    limits = limits or Limits()
    limit_log = limit_log or logs.Limiter()
    # this app's own registry; `metrics_prefix` "vllm": vLLM's names (docs/metrics.md)
    app.state.metrics = meter = Metrics(model, engine.max_request_tokens, metrics_prefix)

    def _error(exc: ApiError, headers: dict | None = None, path: str | None = None) -> JSONResponse:
        # every error answer in this app comes through here: a 4xx is a rejected request, one line per
        # reason (its code) and then a count per interval through the limiter
        if 400 <= exc.status < 500:
            fields = {"reason": exc.code or f"status_{exc.status}", "status": exc.status}
            fields.update({k: v for k, v in (("param", exc.param), ("path", path)) if v})
            limit_log("rejected", "INFO", **fields, message=str(exc.message)[:200])
        return _answer_error(exc, headers)

    @app.exception_handler(ApiError)
    async def _api_error(request: HttpRequest, exc: ApiError):
        return _error(exc, path=request.url.path)

    @app.exception_handler(ClientDisconnect)
    async def _hung_up(request: HttpRequest, _):
        limit_log("client disconnected", "INFO", reason="mid_body", path=request.url.path)
        return Response(status_code=400)  # nobody reads it

    @app.exception_handler(RequestValidationError)
    async def _validation(_, exc: RequestValidationError):
        return _error(ApiError(400, f"invalid request: {str(exc)[:300]}", code="invalid_request"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: HttpRequest, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return _error(ApiError(exc.status_code, str(exc.detail), code=code), exc.headers, request.url.path)

    @app.exception_handler(Exception)
    async def _unexpected(_, exc: Exception):
        return _error(ApiError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error",
                               type="server_error"))

    def auth(request: HttpRequest) -> None:
        if api_key is None:
            return
        scheme, _, key = request.headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), api_key.encode()):
            raise ApiError(401, "incorrect or missing API key", code="invalid_api_key")

    def too_large(got: str) -> ApiError:
        return ApiError(413, f"the request body is {got}; this server takes at most {limits.max_body_bytes} bytes "
                        "(--max-body-bytes)", code="request_too_large")

    async def read_body(request: HttpRequest) -> bytes:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limits.max_body_bytes:
            raise too_large(f"{int(declared)} bytes")
        parts, size = [], 0
        async for part in request.stream():
            size += len(part)
            if size > limits.max_body_bytes:
                raise too_large("larger")
            parts.append(part)
        return b"".join(parts)

    async def body_of(request: HttpRequest) -> dict:
        auth(request)
        return validate.parse(await read_body(request))

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health():
        trouble = getattr(engine.runtime, "trouble", None)  # a pipeline head: a stage lost or not answering
        found = trouble() if trouble is not None else None
        if found is not None:
            return JSONResponse(found, status_code=503)
        if scheduler.ready.is_set() and scheduler.is_alive():
            return {"status": "ok"}
        return JSONResponse({"status": "starting"}, status_code=503)

    @app.get("/version")
    async def version():
        return {"version": VERSION}  # vLLM's /version: the package's version, no auth

    @app.get("/kern/capabilities")
    async def capabilities():
        # docs/engine-contract.md: what `e2e --engine` may gate this server on (all but a kern's subcommands
        # and in-process runtime, which a server cannot offer), and its facts
        return {"contract": 1, "engine": {"name": "kern", "version": VERSION},
                "capabilities": list(CAPABILITIES), "facts": engine.facts()}

    @app.get("/v1/models")
    async def models(request: HttpRequest):
        auth(request)
        return {"object": "list", "data": [{"id": model, "object": "model", "created": created, "owned_by": "kern",
                                            "max_model_len": engine.max_request_tokens}]}

    @app.post("/tokenize")
    async def tokenize(request: HttpRequest):
        ids = validate.tokenize(await body_of(request), model)
        if len(ids) > limits.max_tokenize_tokens:
            raise ApiError(413, f"the input is {len(ids)} tokens; /tokenize takes at most {limits.max_tokenize_tokens} "
                           "(--max-tokenize-tokens)", "prompt", "input_too_large")
        return {"tokens": ids, "count": len(ids), "max_model_len": engine.max_request_tokens}

    @app.post("/detokenize")
    async def detokenize(request: HttpRequest):
        return {"prompt": validate.detokenize(await body_of(request), model)}

    @app.get("/stats")
    async def stats(request: HttpRequest):
        if protect_stats:
            auth(request)
        return await asyncio.wrap_future(scheduler.query(scheduler.stats))

    @app.get("/stats/live")
    async def stats_live(request: HttpRequest):
        # answered here, not on the scheduler's thread: says whether it is busy, and in a step, when
        # /stats (which waits for it) does not answer
        if protect_stats:
            auth(request)
        return scheduler.live()

    @app.get("/metrics")
    async def metrics(request: HttpRequest):
        if protect_stats:
            auth(request)
        s = await asyncio.wrap_future(scheduler.query(lambda: snapshot(scheduler)))
        return Response(meter.render(s), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def completions(request: HttpRequest):
        ask = validate.completion(await body_of(request), model, sampling)
        return await answer(request, ask)

    @app.post("/v1/chat/completions")
    async def chat(request: HttpRequest):
        ask = validate.chat(await body_of(request), model, sampling)
        return await answer(request, ask)

    warned: set[str] = set()  # --sampling greedy-warn: one WARN line per parameter name

    async def answer(request: HttpRequest, ask: Ask):
        for name in ask.sampling:
            if name not in warned:
                warned.add(name)
                logs.event("sampling ignored", "WARN", param=name, decoding="greedy")
        pool_tokens = engine.pages * engine.unit
        limit = pool_tokens if "pad-in-limit" in engine.faults else engine.max_request_tokens
        validate.room(ask, engine.rows, engine.reach, pool_tokens, limit)
        outbox = app.state.outbox
        if outbox is None or outbox.loop is not asyncio.get_running_loop():
            outbox = app.state.outbox = Outbox(asyncio.get_running_loop())
        q: asyncio.Queue[Update] = asyncio.Queue()
        req = Request(scheduler.name(), ask.ids, ask.max_tokens, engine.rows,
                      lambda u: outbox.put(q, u), t_arrive=time.monotonic(),
                      ignore_eos=ask.ignore_eos,
                      stops=Stops(list(ask.stop), list(ask.stop_ids), ask.include_stop) if ask.stop or ask.stop_ids else None)
        scheduler.submit(req)
        watcher = asyncio.ensure_future(_watch(request, q))  # a hang-up reaches the queue as DISCONNECTED
        try:
            first = await _next(q)
        except Disconnected:
            watcher.cancel()
            return hung_up(req, request)
        except asyncio.CancelledError:
            watcher.cancel()
            return cancelled(req)
        if first.done is not None and first.done.error is not None:
            watcher.cancel()
            return _error(failure(first.done))
        reply = Reply(req, ask, model)
        reply.untold_tier = "untold-tier" in engine.faults
        track = meter.track(req.t_arrive, len(ask.ids), req, ask.max_tokens)
        if ask.stream:
            return StreamingResponse(stream(request, q, req, reply, first, track, watcher),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Request-Id": req.id})
        update = first
        try:
            while True:
                reply.add(update)
                track.update(update)
                if update.done is not None:
                    break
                update = await _next(q)
        except Disconnected:
            return hung_up(req, request)
        except asyncio.CancelledError:
            return cancelled(req)
        finally:
            watcher.cancel()
        if update.done.reason is None:
            return _error(failure(update.done))
        track.finish(update.done)
        return reply.whole()

    def failure(done: Done) -> ApiError:
        if done.error is None:
            return _cut("the request was aborted (the server is stopping)")
        status, message, code, param = done.error
        return ApiError(status, message, param, code, type="server_error" if status >= 500 else "invalid_request_error")

    def hung_up(req: Request, request: HttpRequest) -> Response:
        scheduler.abort(req)
        limit_log("client disconnected", "INFO", reason="hung_up", path=request.url.path)
        return Response(status_code=400)  # nobody reads it

    def cancelled(req: Request) -> JSONResponse:
        # shutdown's last resort (uvicorn cancels handlers past its graceful window): an explicit 503
        scheduler.abort(req)
        app.state.cancelled += 1
        return _error(_cut())

    async def stream(request: HttpRequest, q: asyncio.Queue, req: Request, reply: Reply, first: Update, track,
                     watcher: asyncio.Future):
        done = False
        try:
            update = first
            while True:
                # every update already queued goes out in one write (a stream interval under load)
                text = []
                while True:
                    if update.done is not None and update.done.reason is None:
                        done = True  # cut off: the stream ends with an error event, not a finish
                        text.append(f"data: {json.dumps(failure(update.done).body(), separators=(',', ':'))}\n\n")
                        break
                    chunk = reply.chunk(update)
                    track.update(update)
                    text.append(f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n")
                    if update.done is not None:
                        done = True
                        track.finish(update.done)
                        if reply.ask.include_usage:  # vLLM's: a chunk of its own, no choices, then [DONE]
                            text.append(f"data: {json.dumps(reply.usage_chunk(), separators=(',', ':'))}\n\n")
                        break
                    update = _ready(q)
                    if update is None:
                        break
                if done:
                    text.append("data: [DONE]\n\n")
                yield "".join(text)
                if done:
                    break
                update = await _next(q)
        except Disconnected:
            limit_log("client disconnected", "INFO", reason="hung_up", path=request.url.path)
        finally:
            watcher.cancel()
            if not done:
                scheduler.abort(req)

    return app


DISCONNECTED = object()  # what `_watch` puts in a request's queue when its client hung up


class Outbox:
    """Updates handed from the scheduler thread to the event loop: one loop wake-up for everything
    that arrives between two of its turns (a step's tokens for every request), not one per token."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lock = threading.Lock()
        self.items: list = []

    def put(self, q: asyncio.Queue, update: Update) -> None:
        with self.lock:
            self.items.append((q, update))
            first = len(self.items) == 1
        if first:
            self.loop.call_soon_threadsafe(self.flush)

    def flush(self) -> None:
        with self.lock:
            items, self.items = self.items, []
        for q, update in items:
            q.put_nowait(update)


async def _watch(request: HttpRequest, q: asyncio.Queue) -> None:
    """Until cancelled: a client that hung up puts DISCONNECTED in its request's queue (checked every
    POLL_S, off the path each token takes)."""
    while not await request.is_disconnected():
        await asyncio.sleep(POLL_S)
    q.put_nowait(DISCONNECTED)


async def _next(q: asyncio.Queue) -> Update:
    update = await q.get()
    if update is DISCONNECTED:
        raise Disconnected()
    return update


def _ready(q: asyncio.Queue) -> Update | None:
    """The next update if one is already queued (None if not); a hang-up raises `Disconnected`."""
    if q.empty():
        return None
    update = q.get_nowait()
    if update is DISCONNECTED:
        raise Disconnected()
    return update


class Reply:
    """Builds one request's response: whole, or as stream chunks whose texts concatenate to it."""

    def __init__(self, req: Request, ask: Ask, model: str) -> None:
        self.req = req
        self.ask = ask
        self.model = model
        self.tokens: list[int] = []
        self.created = int(time.time())
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.done: Done | None = None
        self.sent_role = False
        self.sent_prompt = False
        self.sent_kern = False
        self.echo = validate.text_of(ask.ids) if ask.echo else ""  # leads the text (the first chunk's)
        self.hold = req.stops.hold if req.stops is not None else 0
        self._pieces: list[str] = []  # the answer's text as decoded
        self._pending = ""  # decoded, not yet released to a stream
        self._sent = 0  # characters released

    def add(self, update: Update) -> str:
        """Take an update; return the text it releases (a stream chunk's). With stop strings the last
        `hold` characters (the longest stop string's length - 1, as vLLM) wait until they can no longer
        start a match; at the end the text is cut at `Done.text_end` (the scheduler matched it)."""
        self.tokens.extend(update.tokens)
        toks = update.tokens
        last = update.done is not None
        if last:
            self.done = update.done
            if update.done.hide_last and toks:
                toks = toks[:-1]  # a stop token id's text is left out (vLLM)
        got = self.decoder.decode(bytes(t for t in toks if t != EOS), final=last)
        self._pieces.append(got)
        pending = self._pending + got
        if not last:
            n = max(len(pending) - self.hold, 0)
            self._pending, self._sent = pending[n:], self._sent + n
            return pending[:n]
        end = self.done.text_end
        self._pending = ""
        return pending if end is None else pending[:end - self._sent]

    def text(self) -> str:
        """The whole answer's text (after the last update), cut by a stop string, the echo first."""
        text = "".join(self._pieces)
        end = self.done.text_end if self.done is not None else None
        return self.echo + (text if end is None else text[:end])

    def _usage(self) -> dict:
        n = len(self.ask.ids)
        return {"prompt_tokens": n, "completion_tokens": len(self.tokens), "total_tokens": n + len(self.tokens),
                "prompt_tokens_details": {"cached_tokens": self.done.cached if self.done else 0}}

    untold_tier = False  # --fault untold-tier: cache_tier left out of the kern object

    def _kern(self) -> dict:
        out = self._told()
        if self.untold_tier:
            del out["cache_tier"]
        return out

    def _told(self) -> dict:
        """The kern object (docs/api.md): the server's request id, where its cached tokens came from,
        what became of its snapshot, whether its hit was woken from the host tier."""
        d = self.done
        return {"request_id": self.req.id, "cache_tier": d.tier if d else None, "snapshot": d.snapshot if d else "none",
                "woken": bool(d.woken) if d else False}

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion" if self.ask.chat else "text_completion") + (".chunk" if chunk and self.ask.chat else "")
        prefix = "chatcmpl" if self.ask.chat else "cmpl"
        name = self.ask.request_id or self.req.id
        return {"id": f"{prefix}-{name}", "object": kind, "created": self.created, "model": self.model}

    def whole(self) -> dict:
        text = self.text()
        choice: dict = {"index": 0, "finish_reason": self.done.reason, "logprobs": None}
        if self.ask.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice["stop_reason"] = self.done.stop_reason
        if self.ask.return_token_ids:
            choice["token_ids"] = list(self.tokens)
            choice["prompt_token_ids"] = list(self.ask.ids)
        return {**self._head(False), "choices": [choice], "usage": self._usage(), "kern": self._kern()}

    def chunk(self, update: Update) -> dict:
        text = self.add(update)
        if self.echo:
            text, self.echo = self.echo + text, ""
        last = update.done is not None
        choice: dict = {"index": 0, "finish_reason": self.done.reason if last else None, "logprobs": None}
        if self.ask.chat:
            delta: dict = {"content": text}
            if not self.sent_role:
                delta["role"] = "assistant"
                self.sent_role = True
            choice["delta"] = delta
        else:
            choice["text"] = text
        choice["stop_reason"] = self.done.stop_reason if last else None
        choice["token_ids"] = list(update.tokens)
        if self.ask.return_token_ids and not self.sent_prompt:
            choice["prompt_token_ids"] = list(self.ask.ids)
            self.sent_prompt = True
        out = {**self._head(True), "choices": [choice]}
        if self.ask.continuous_usage or (last and not self.ask.include_usage):
            out["usage"] = self._usage()  # with include_usage alone: only in `usage_chunk`, as vLLM
        if last:
            out["kern"] = self._kern()
        if not last and not self.sent_kern:  # the hit is known at admission: a client that hangs up still learns it
            out["kern"] = self._admitted()
        self.sent_kern = True
        return out

    def usage_chunk(self) -> dict:
        """`stream_options.include_usage`: the chunk after the last, with no choices and the whole
        request's usage (the non-streamed answer's), as vLLM sends it."""
        return {**self._head(True), "choices": [], "usage": self._usage()}

    def _admitted(self) -> dict:
        """A stream's first chunk's kern object: the request's hit as its admission found it (its snapshot
        is told at the end)."""
        r = self.req
        out = {"request_id": r.id, "cache_tier": r.tier, "cached_tokens": r.cached, "woken": bool(r.woken)}
        if self.untold_tier:
            del out["cache_tier"]
        return out
