"""The HTTP side (FastAPI): OpenAI-compatible routes over the scheduler thread.

`make_app` builds one app: its context (`serve.api.http.Served`, on `app.state.ctx`), its error answers and
two routers whose handlers are plain module-level functions: `serve/api/routes_complete.py` (completions
and chat: submit, await the scheduler's updates, answer whole or streamed) and `serve/api/routes_info.py`
(health, version, capabilities, models, tokenize, stats, metrics). A client that hangs up has its
request aborted, and costs one line through the log limiter. Every request that was accepted ends with
its whole answer or an error: a request cut off (by the drain's deadline, or a handler cancelled at
shutdown) gets a 503, and a stream an error event, never a success without an answer.
"""

from __future__ import annotations

import json
import time

from fastapi import FastAPI, Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.requests import ClientDisconnect

from serve.api import routes_complete, routes_info
from serve.api.guard import Limits
from serve.api.hosts import Hosts
from serve.api.http import CAPABILITIES, VERSION, Served, ctx, reject
from serve.api.metrics import Metrics
from serve.api.reply import Reply
from serve.api.validate import ApiError
from serve.client.seam import EngineClient, EngineView
from serve.common import logs

__all__ = ["CAPABILITIES", "VERSION", "Reply", "make_app"]


def make_app(scheduler: EngineClient, engine: EngineView, api_key: str | None = None, limits: Limits | None = None,
             limit_log: logs.Limiter | None = None, protect_stats: bool = False, sampling: str = "refuse",
             metrics_prefix: str = "kern", hosts: Hosts | None = None) -> FastAPI:
    """The routes. `limits` bounds bodies and /tokenize; `limit_log` takes repeated events (hang-ups);
    `protect_stats` puts /stats and /metrics behind `api_key` too; `sampling` ("refuse" or
    "greedy-warn") is what a non-greedy sampling value gets (docs/api.md); `metrics_prefix` "vllm":
    vLLM's metric names (docs/metrics.md); `hosts`: the Host header's rule (`serve.api.hosts`; None: any
    Host). `app.state.ctx.cancelled` counts handlers cancelled at
    shutdown (each answered a 503)."""
    app = Kern(title="kern", docs_url=None, redoc_url=None, openapi_url=None)
    app.hosts = hosts
    # this app's own registry (with --frontends, every front end's values summed at each scrape)
    meter = Metrics(engine.model, engine.max_request_tokens, metrics_prefix, shared=scheduler.shared)
    app.state.ctx = Served(scheduler, engine, meter, limits or Limits(), limit_log or logs.Limiter(), api_key,
                           protect_stats, sampling, created=int(time.time()))
    app.state.metrics = meter
    scheduler.measure(meter)  # a scheduler in another process counts the tokens it held into this app's metrics
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(ClientDisconnect, _hung_up)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _unexpected)
    # the generating routes first: a request is matched against the routes in order (half a request's
    # time in the router when they came last)
    app.include_router(routes_complete.router)
    app.include_router(routes_info.router)
    return app


class Kern(FastAPI):
    """FastAPI, with a POST to a generating route taken straight to its handler: past FastAPI's and
    Starlette's middleware stack and router (six layers and a scan of the routes, a fifth of a whole
    answer's time in the front end: `bench/frontend.py`), under the same error handling, whose two
    layers (an unexpected exception's 500, then our handlers for the rest) are set up here as the
    stack would set them. Every other request (another method, another path) takes the full stack."""

    _direct: dict | None = None
    hosts: Hosts | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and self.hosts is not None and not await self._host_ok(scope, send):
            return
        if scope["type"] == "http" and scope["method"] == "POST":
            route = (self._direct if self._direct is not None else self._routes()).get(scope["path"])
            if route is not None:
                scope["app"] = self
                await route(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    async def _host_ok(self, scope, send) -> bool:
        """The Host header against `hosts`; a refused one answered here (a 400 naming it)."""
        value = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)
        why = self.hosts.check(value)
        if why is None:
            return True
        self.state.ctx.limit_log("rejected", "INFO", reason="invalid_host", status=400, path=scope["path"])
        body = json.dumps(ApiError(400, why, "host", "invalid_host").body()).encode()
        await send({"type": "http.response.start", "status": 400,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
        return False

    def _routes(self) -> dict:
        """{path: the route's app under the stack's two error layers}, made at the first request (every
        handler is added by then), as `Starlette.build_middleware_stack` makes them."""
        unexpected = self.exception_handlers.get(500) or self.exception_handlers.get(Exception)
        handlers = {k: v for k, v in self.exception_handlers.items() if k not in (500, Exception)}
        self._direct = {r.path: ServerErrorMiddleware(ExceptionMiddleware(r.app, handlers), handler=unexpected)
                        for r in routes_complete.router.routes}
        return self._direct


async def _api_error(request: HttpRequest, exc: ApiError):
    return reject(ctx(request), exc, path=request.url.path)


async def _hung_up(request: HttpRequest, _):
    ctx(request).limit_log("client disconnected", "INFO", reason="mid_body", path=request.url.path)
    return Response(status_code=400)  # nobody reads it


async def _validation(request: HttpRequest, exc: RequestValidationError):
    return reject(ctx(request), ApiError(400, f"invalid request: {str(exc)[:300]}", code="invalid_request"))


async def _http(request: HttpRequest, exc: StarletteHTTPException):
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return reject(ctx(request), ApiError(exc.status_code, str(exc.detail), code=code), exc.headers, request.url.path)


async def _unexpected(request: HttpRequest, exc: Exception):
    return reject(ctx(request), ApiError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error",
                                         type="server_error"))
