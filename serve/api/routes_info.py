"""The routes that answer about the server rather than generate: readiness, version, capabilities, the
model list, tokenize and detokenize, /stats, /stats/live and /metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request as HttpRequest
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from serve.api.http import CAPABILITIES, VERSION, Served, auth, auth_stats, body_of, ctx
from serve.api.validate import ApiError

__all__ = ["router"]

router = APIRouter()


ASK_WAIT_S = 0.4
"""How long a route waits for the engine core's answer before it looks at the core's health: /health
answers 503 then (the core does not answer); /stats, /stats/live and /metrics answer 503 when the core
does not answer /health's question either, or is stuck (`--stuck-after`), else wait on (docs/serve.md,
"When the engine core is stuck")."""


@router.api_route("/health", methods=["GET", "HEAD"])
async def health(request: HttpRequest):
    c = ctx(request)
    h = await _within(c.scheduler.ask("health"))
    if h is None:  # the core's process is stopped, or too loaded to answer at once
        return JSONResponse({"status": "engine core not answering", "waited_s": ASK_WAIT_S}, status_code=503)
    if h["trouble"] is not None:  # a pipeline head: a stage lost or silent
        return JSONResponse(h["trouble"], status_code=503)  # docs/pipeline.md
    busy = h.get("busy_s")
    if busy is not None and busy > c.limits.stuck_after:
        return JSONResponse({"status": "engine core stuck", "busy_s": busy, "stuck_after": c.limits.stuck_after},
                            status_code=503)
    if h["ready"] and h["alive"]:
        if h["warm"]:
            return {"status": "ok"}
        return JSONResponse({"status": "warming"}, status_code=503)  # kernels compiling: serve/core/warmup.py
    return JSONResponse({"status": "starting"}, status_code=503)


async def _within(aw, wait: float = ASK_WAIT_S):
    """`aw`'s result, or None (and `aw` cancelled) when it takes longer than `wait`."""
    try:
        return await asyncio.wait_for(aw, wait)
    except asyncio.TimeoutError:
        return None


async def ask(c: Served, what: str):
    """A question of `serve.client.frontend_wire.QUESTIONS`: of the engine core's process when it has one
    (--frontend-process, `serve.client.frontend.RemoteScheduler.ask`), else of the scheduler thread here
    (`serve.core.scheduler.Scheduler.ask`). While no answer comes, every `ASK_WAIT_S` the core's health is
    asked: a 503 when it does not answer that either, or has been stuck in one iteration past
    `--stuck-after`; a core merely slow is waited for."""
    pending = asyncio.ensure_future(c.scheduler.ask(what))
    while True:
        done, _ = await asyncio.wait({pending}, timeout=ASK_WAIT_S)
        if done:
            return pending.result()
        refusal = await _stuck(c)
        if refusal is not None:
            pending.cancel()
            raise refusal


async def _stuck(c: Served) -> ApiError | None:
    """A 503 when the core does not answer /health's question within `ASK_WAIT_S`, or its iteration in
    progress has run past `--stuck-after`; None while it is merely busy."""
    h = await _within(c.scheduler.ask("health"))
    if h is None:
        return ApiError(503, f"the engine core does not answer (not within {ASK_WAIT_S:g} s: stopped, or too "
                        "loaded); retry later", code="engine_core_not_answering", type="server_error")
    busy = h.get("busy_s")
    if busy is not None and busy > c.limits.stuck_after:
        return ApiError(503, f"the engine core has been in one iteration for {busy:g} s (over --stuck-after "
                        f"{c.limits.stuck_after:g}); retry later", code="engine_core_stuck", type="server_error")
    return None


@router.get("/version")
async def version():
    return {"version": VERSION}  # vLLM's /version: the package's version, no auth


@router.get("/kern/capabilities")
async def capabilities(request: HttpRequest):
    # docs/engine-contract.md: what `e2e --engine` may gate this server on (all but a kern's subcommands
    # and in-process runtime, which a server cannot offer), and its facts
    return {"contract": 1, "engine": {"name": "kern", "version": VERSION},
            "capabilities": list(CAPABILITIES), "facts": ctx(request).engine.facts()}


@router.api_route("/v1/models", methods=["GET", "HEAD"])
async def models(request: HttpRequest):
    auth(request)
    c = ctx(request)
    return {"object": "list", "data": [{"id": c.model, "object": "model", "created": c.created, "owned_by": "kern",
                                        "max_model_len": c.engine.max_request_tokens}]}


@router.post("/tokenize")
async def tokenize(request: HttpRequest):
    c = ctx(request)
    ids = await body_of(request, "tokenize", c.model, c.limits.max_tokenize_tokens)
    return {"tokens": ids, "count": len(ids), "max_model_len": c.engine.max_request_tokens}


@router.post("/detokenize")
async def detokenize(request: HttpRequest):
    return {"prompt": await body_of(request, "detokenize", ctx(request).model)}


@router.get("/stats")
async def stats(request: HttpRequest):
    auth_stats(request)
    return await ask(ctx(request), "stats")


@router.get("/stats/live")
async def stats_live(request: HttpRequest):
    auth_stats(request)
    return await ask(ctx(request), "live")


@router.get("/metrics")
async def metrics(request: HttpRequest):
    auth_stats(request)
    c = ctx(request)
    s = await ask(c, "snapshot")
    return Response(c.meter.render(s), media_type=CONTENT_TYPE_LATEST)
