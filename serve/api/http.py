"""What the HTTP routes share: the app's context (`Served`, on `app.state.ctx`), the API key, bodies read
within their bound and checked off the loop when large, and error answers (a 4xx logged once per reason
through the limiter)."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field

from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse

from kern.errors import KernError
from serve.api import bodies
from serve.api.guard import Limits
from serve.api.metrics import Metrics
from serve.api.validate import ApiError
from serve.client.seam import EngineClient, EngineView
from serve.common import logs

__all__ = ["CAPABILITIES", "POLL_S", "VERSION", "Disconnected", "Served", "auth", "body_of", "ctx", "cut",
           "plain_error", "reject"]

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


class Disconnected(KernError):
    """The client hung up."""


@dataclass
class Served:
    """One app's context: what every handler reads (`ctx(request)`)."""

    scheduler: EngineClient  # in this process or another (serve/client/seam.py)
    engine: EngineView
    meter: Metrics
    limits: Limits
    limit_log: logs.Limiter
    api_key: str | None = None
    protect_stats: bool = False
    sampling: str = "refuse"
    created: int = 0
    cancelled: int = 0  # handlers cancelled at shutdown (each answered a 503)
    outbox: object = None  # the `Outbox` of the loop serving this app, made by its first request
    warned: set = field(default_factory=set)  # --sampling greedy-warn: one WARN line per parameter name

    @property
    def model(self) -> str:
        return self.engine.model


def ctx(request: HttpRequest) -> Served:
    return request.app.state.ctx


def plain_error(exc: ApiError, headers: dict | None = None) -> JSONResponse:
    """The error answer, unlogged."""
    if exc.status == 413:  # the rest of a body too large is not worth reading
        headers = {**(headers or {}), "Connection": "close"}
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


def reject(c: Served, exc: ApiError, headers: dict | None = None, path: str | None = None) -> JSONResponse:
    """Every error answer of an app comes through here: a 4xx is a rejected request, one line per reason
    (its code) and then a count per interval through the limiter."""
    if 400 <= exc.status < 500:
        fields = {"reason": exc.code or f"status_{exc.status}", "status": exc.status}
        fields.update({k: v for k, v in (("param", exc.param), ("path", path)) if v})
        c.limit_log("rejected", "INFO", **fields, message=str(exc.message)[:200])
    return plain_error(exc, headers)


def cut(message: str = "the server stopped before this request finished") -> ApiError:
    return ApiError(503, message, code="server_shutting_down", type="server_error")


def auth(request: HttpRequest) -> None:
    key = ctx(request).api_key
    if key is None:
        return
    scheme, _, given = request.headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
        raise ApiError(401, "incorrect or missing API key", code="invalid_api_key")


def auth_stats(request: HttpRequest) -> None:
    """/stats and /metrics: behind the API key only with --protect-stats."""
    if ctx(request).protect_stats:
        auth(request)


def _too_large(limits: Limits, got: str) -> ApiError:
    return ApiError(413, f"the request body is {got}; this server takes at most {limits.max_body_bytes} bytes "
                    "(--max-body-bytes)", code="request_too_large")


JSON_TYPES = ("application/json",)
"""The body's content types a route takes (and any `+json` type); a body with no Content-Type is read
as JSON too (docs/api.md)."""


def check_content_type(request: HttpRequest) -> None:
    """A 415 naming a Content-Type that is not JSON."""
    given = request.headers.get("content-type")
    if given is None:
        return
    media = given.split(";", 1)[0].strip().lower()
    if media in JSON_TYPES or media.endswith("+json"):
        return
    raise ApiError(415, f"the body's content type {given[:80]!r} is not JSON; send Content-Type: application/json",
                   code="unsupported_media_type")


async def read_body(request: HttpRequest) -> bytes:
    limits = ctx(request).limits
    check_content_type(request)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise _too_large(limits, f"{int(declared)} bytes")
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limits.max_body_bytes:
            raise _too_large(limits, "larger")
        parts.append(part)
    return b"".join(parts)


async def body_of(request: HttpRequest, kind: str, *args):
    """The body parsed and checked (`serve.api.bodies.run`), off the loop when it is large."""
    auth(request)
    peer = request.client.host if request.client is not None else ""
    return await bodies.check(kind, await read_body(request), *args, client=peer)
