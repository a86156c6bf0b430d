"""The routes that answer about the server rather than generate: readiness, version, capabilities, the
model list, tokenize and detokenize, /stats, /stats/live and /metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request as HttpRequest
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from serve.http import CAPABILITIES, VERSION, auth, auth_stats, body_of, ctx
from serve.metrics import snapshot

__all__ = ["router"]

router = APIRouter()


@router.api_route("/health", methods=["GET", "HEAD"])
async def health(request: HttpRequest):
    scheduler = ctx(request).scheduler
    found = ctx(request).engine.runtime.trouble()  # a pipeline head: a stage lost or silent
    if found is not None:
        return JSONResponse(found, status_code=503)  # docs/pipeline.md
    if scheduler.ready.is_set() and scheduler.is_alive():
        if scheduler.warm.is_set():
            return {"status": "ok"}
        return JSONResponse({"status": "warming"}, status_code=503)  # kernels compiling: serve/warmup.py
    return JSONResponse({"status": "starting"}, status_code=503)


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
    scheduler = ctx(request).scheduler
    return await asyncio.wrap_future(scheduler.query(scheduler.stats))


@router.get("/stats/live")
async def stats_live(request: HttpRequest):
    # answered here, not on the scheduler's thread: says whether it is busy, and in a step, when
    # /stats (which waits for it) does not answer
    auth_stats(request)
    return ctx(request).scheduler.live()


@router.get("/metrics")
async def metrics(request: HttpRequest):
    auth_stats(request)
    c = ctx(request)
    s = await asyncio.wrap_future(c.scheduler.query(lambda: snapshot(c.scheduler)))
    return Response(c.meter.render(s), media_type=CONTENT_TYPE_LATEST)
