"""The generating routes, /v1/completions and /v1/chat/completions: validate, name the request (req-N,
in arrival order), submit it, and answer from the updates the scheduler thread hands the event loop
(through an `Outbox`, one wake-up per batch). A client that hangs up has its request aborted; every
request that was accepted ends with its whole answer or an error (a 503 when it was cut off, a stream's
error event), never a success without an answer."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time

from fastapi import APIRouter, Request as HttpRequest
from fastapi.responses import JSONResponse, Response
from starlette.routing import Route

from serve.api import validate
from serve.api.http import POLL_S, Disconnected, Served, body_of, ctx, cut, reject
from serve.api.metrics import Track
from serve.api.reply import Reply
from serve.api.validate import ApiError, Ask
from serve.client.seam import Done, Request, Stops, Update
from serve.common import logs

__all__ = ["router"]

router = APIRouter()
RETRY_AFTER_S = 5  # the Retry-After of a 503 queue_timeout, seconds


async def completions(request: HttpRequest):
    c = ctx(request)
    ask = await body_of(request, "completion", c.model, c.sampling, c.engine.rows, c.engine.reach)
    return await answer(request, ask)


async def chat(request: HttpRequest):
    c = ctx(request)
    ask = await body_of(request, "chat", c.model, c.sampling, c.engine.rows, c.engine.reach)
    return await answer(request, ask)


# plain Starlette routes: the handlers take the request alone, and FastAPI's dependency solving for it
# was an eighth of a whole answer's time in the front end (bench/frontend.py); errors are answered the same
router.routes += [Route("/v1/completions", completions, methods=["POST"]),
                  Route("/v1/chat/completions", chat, methods=["POST"])]


def client_of(request: HttpRequest) -> str:
    """Who sent `request`, for admission's per-client shares: its bearer key (as a digest: the key
    itself is never kept), else its peer address."""
    scheme, _, given = request.headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer" and given.strip():
        return "key:" + hashlib.sha256(given.strip().encode()).hexdigest()[:16]
    peer = request.client
    return peer.host if peer is not None else "unknown"


def _ceiling(c: Served, ask: Ask) -> None:
    top = c.limits.max_tokens_ceiling
    if top is not None and ask.max_tokens > top:
        raise ApiError(400, f"max_tokens {ask.max_tokens} is above this server's --max-tokens-ceiling {top}",
                       "max_tokens", "max_tokens_ceiling")


def _submit(c: Served, ask: Ask, client: str = "") -> tuple[Request, asyncio.Queue, Track]:
    """Validate the room, make the request, its queue and its metrics, hand it to the scheduler."""
    _ceiling(c, ask)
    for name in ask.sampling:
        if name not in c.warned:
            c.warned.add(name)
            logs.event("sampling ignored", "WARN", param=name, decoding="greedy")
    engine = c.engine
    pool_tokens = engine.pages * engine.unit
    limit = engine.faults.request_limit(engine)  # the pool's one-sequence limit (serve/core/faults.py may say otherwise)
    validate.room(ask, engine.rows, engine.reach, pool_tokens, limit)
    outbox = c.outbox
    if outbox is None or outbox.loop is not asyncio.get_running_loop():
        outbox = c.outbox = Outbox(asyncio.get_running_loop())
    q: asyncio.Queue[Update] = asyncio.Queue()
    stops = Stops(list(ask.stop), list(ask.stop_ids), ask.include_stop) if ask.stop or ask.stop_ids else None
    gather = None if ask.stream else Gather(q, c.scheduler.delivery.holds_whole)
    deliver = q.put_nowait if gather is None else gather
    # a scheduler in another process hands updates over on this loop (serve/client/frontend.py): straight in
    send = deliver if c.scheduler.delivery.on_loop else lambda u: outbox.put(deliver, u)
    req = Request(c.scheduler.name(), ask.ids, ask.max_tokens, engine.rows, send,
                  t_arrive=time.monotonic(), ignore_eos=ask.ignore_eos, stops=stops, whole=not ask.stream, client=client)
    track = c.meter.track(req.t_arrive, len(ask.ids), req, ask.max_tokens)
    if gather is not None:
        gather.track = track
    c.scheduler.submit(req)
    return req, q, track


class Gather:
    """A non-streamed request's updates, taken on the event loop as they arrive (their tokens kept,
    their times told to its metrics) and handed to its handler as one, at the end: a finish, an error
    or a cut-off. The handler wakes once per request, not once per step (under load those wake-ups were
    most of the front end's time). With `held` (an engine core in another process, `holds_whole`) the
    tokens after the first come with the finish, their timings already counted by the core: the track
    only learns how many arrived."""

    __slots__ = ("q", "track", "tokens", "held")

    def __init__(self, q: asyncio.Queue, held: bool = False) -> None:
        self.q = q
        self.track: Track | None = None
        self.tokens: list[int] = []
        self.held = held

    def __call__(self, update: Update) -> None:
        if update.tokens:
            if self.held and self.tokens:
                self.track.arrived(len(update.tokens))
            else:
                self.track.update(update)
            self.tokens += update.tokens
        if update.done is not None:
            self.q.put_nowait(Update(self.tokens, update.done))


async def answer(request: HttpRequest, ask: Ask):
    c = ctx(request)
    req, q, track = _submit(c, ask, client_of(request))
    streaming = False
    try:
        response = await _answer(request, c, ask, req, q, track)
        streaming = isinstance(response, EventStream)
        return response
    finally:
        if not streaming:  # a stream's own end closes its track
            track.close()


async def _answer(request: HttpRequest, c: Served, ask: Ask, req: Request, q: asyncio.Queue, track):
    watcher = Watcher(request, q)  # a hang-up reaches the queue as DISCONNECTED
    try:
        first = await _next(q)  # a stream's first update; a whole answer's only one (`Gather`)
    except Disconnected:
        watcher.cancel()
        return hung_up(c, req, request)
    except asyncio.CancelledError:
        watcher.cancel()
        return cancelled(c, req)
    if first.done is not None and first.done.error is not None:
        watcher.cancel()
        return reject(c, failure(first.done), retry_after(first.done))
    reply = Reply(req, ask, c.model)
    reply.untold_tier = not c.engine.faults.tells_tier
    if ask.stream:
        return EventStream(stream(request, q, req, reply, first, track, watcher),
                           {"Cache-Control": "no-cache", "X-Request-Id": req.id})
    watcher.cancel()
    if first.done.reason is None:
        return reject(c, failure(first.done))
    reply.add(first)
    track.finish(first.done)
    # serialized here: a dict returned to FastAPI is walked by its jsonable_encoder first, which took half
    # the event loop's time under load (py-spy, 64 streams on an H200)
    return Response(json.dumps(reply.whole(), separators=(",", ":")), media_type="application/json")


def failure(done: Done) -> ApiError:
    if done.error is None:
        return cut("the request was aborted (the server is stopping)")
    status, message, code, param = done.error
    return ApiError(status, message, param, code, type="server_error" if status >= 500 else "invalid_request_error")


def retry_after(done: Done) -> dict | None:
    """A request that waited past --queue-timeout is told when to try again."""
    if done.error is not None and done.error[2] == "queue_timeout":
        return {"Retry-After": str(RETRY_AFTER_S)}
    return None


def hung_up(c: Served, req: Request, request: HttpRequest) -> Response:
    c.scheduler.abort(req)
    c.limit_log("client disconnected", "INFO", reason="hung_up", path=request.url.path)
    return Response(status_code=400)  # nobody reads it


def cancelled(c: Served, req: Request) -> JSONResponse:
    # shutdown's last resort (uvicorn cancels handlers past its graceful window): an explicit 503
    c.scheduler.abort(req)
    c.cancelled += 1
    return reject(c, cut())


class EventStream(Response):
    """A stream's answer (text/event-stream), written from its events as they come. Starlette's
    StreamingResponse, under uvicorn's h11 (ASGI spec 2.3), ran every stream as a task group with a
    second task awaiting the client's disconnect: a task more per stream, and its first chunk a loop
    turn later. Here the handler's `_watch` alone sees a hang-up (uvicorn drops what is sent after it)."""

    media_type = "text/event-stream"

    def __init__(self, events, headers: dict[str, str]) -> None:
        self.events = events
        self.status_code = 200
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope, receive, send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for text in self.events:
                await send({"type": "http.response.body", "body": text.encode(), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await self.events.aclose()  # its `finally` (the abort of an unfinished request) runs now


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


async def stream(request: HttpRequest, q: asyncio.Queue, req: Request, reply: Reply, first: Update, track,
                 watcher: "Watcher"):
    c = ctx(request)
    done = False
    try:
        update, alone = first, True  # the first token's chunk is its own: the time to first token
        while True:
            text, done = _queued(q, update, reply, track, alone)  # every update already queued: one write
            alone = False
            yield "".join(text)
            if done:
                break
            update = await _next(q)
    except Disconnected:
        c.limit_log("client disconnected", "INFO", reason="hung_up", path=request.url.path)
    finally:
        watcher.cancel()
        track.close()
        if not done:
            c.scheduler.abort(req)


def _queued(q: asyncio.Queue, update: Update, reply: Reply, track, alone: bool = False) -> tuple[list[str], bool]:
    """The events for `update` and every update queued behind it, and whether the stream ended: a
    finish (then the usage chunk if asked, and [DONE]) or a cut-off (an error event, then [DONE]).
    Under load (a stream interval, as vLLM's output collector): the queued updates' tokens go out as
    one chunk, unless the client asked for usage on every chunk (`continuous_usage_stats`: a chunk a
    step, as without load). `alone`: `update` (the stream's first) gets a chunk of its own, whatever
    is queued behind it, and so does its first token when it brings more (a speculative round): a
    client times its first token by that chunk."""
    text = []
    fold = not reply.ask.continuous_usage
    if alone and len(update.tokens) > 1:
        head = Update(update.tokens[:1])
        text.append(f"data: {reply.chunk_text(head)}\n\n")
        track.update(head)
        update = Update(update.tokens[1:], update.done)
    while True:
        if update.done is not None and update.done.reason is None:
            text += [_sse(failure(update.done).body()), "data: [DONE]\n\n"]
            return text, True
        update, after = _merged(q, update, fold=fold and not alone)
        alone = False
        text.append(f"data: {reply.chunk_text(update)}\n\n")
        track.update(update)
        if update.done is not None:
            track.finish(update.done)
            if reply.ask.include_usage:  # vLLM's: a chunk of its own, no choices, then [DONE]
                text.append(_sse(reply.usage_chunk()))
            text.append("data: [DONE]\n\n")
            return text, True
        if after is None:
            return text, False
        update = after


def _merged(q: asyncio.Queue, update: Update, fold: bool = True) -> tuple[Update, Update | None]:
    """`update` with the tokens (and the finish) of the updates queued behind it, up to a cut-off,
    which is returned apart; (update, None) when nothing else was queued. Without `fold`: `update`
    and the next one queued, if any."""
    while update.done is None:
        after = _ready(q)
        if after is None:
            return update, None
        if not fold or after.done is not None and after.done.reason is None:
            return update, after  # a cut-off: its own error event
        update = Update(update.tokens + after.tokens, after.done)
    return update, None


DISCONNECTED = object()  # what `_watch` puts in a request's queue when its client hung up


class Outbox:
    """Updates handed from the scheduler thread to the event loop: one loop wake-up for everything
    that arrives between two of its turns (a step's tokens for every request), not one per token."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lock = threading.Lock()
        self.items: list = []

    def put(self, deliver, update: Update) -> None:
        """Hand `update` to `deliver` (a queue's put, or a `Gather`) on the loop."""
        with self.lock:
            self.items.append((deliver, update))
            first = len(self.items) == 1
        if first:
            self.loop.call_soon_threadsafe(self.flush)

    def flush(self) -> None:
        with self.lock:
            items, self.items = self.items, []
        for deliver, update in items:
            deliver(update)


class Watcher:
    """Until cancelled: a client that hung up puts DISCONNECTED in its request's queue, checked every
    POLL_S off the path each token takes. The first check is after POLL_S, and the task that checks is
    made only then: a request answered sooner (a whole answer, mostly) costs a timer, not a task and
    its steps, nor a receive under a cancel scope."""

    __slots__ = ("timer", "task")

    def __init__(self, request: HttpRequest, q: asyncio.Queue) -> None:
        self.task: asyncio.Task | None = None
        self.timer = asyncio.get_running_loop().call_later(POLL_S, self._start, request, q)

    def _start(self, request: HttpRequest, q: asyncio.Queue) -> None:
        self.task = asyncio.ensure_future(_watch(request, q))

    def cancel(self) -> None:
        self.timer.cancel()
        if self.task is not None:
            self.task.cancel()


async def _watch(request: HttpRequest, q: asyncio.Queue) -> None:
    """The watcher's task: a check now, then one every POLL_S, until a hang-up or its cancel."""
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
