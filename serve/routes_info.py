"""The routes that answer about the server rather than generate: readiness, version, capabilities, the
model list, tokenize and detokenize, /stats, /stats/live and /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request as HttpRequest
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from serve.http import CAPABILITIES, VERSION, Served, auth, auth_stats, body_of, ctx

__all__ = ["router"]

router = APIRouter()


@router.api_route("/health", methods=["GET", "HEAD"])
async def health(request: HttpRequest):
    h = await ask(ctx(request), "health")
    if h["trouble"] is not None:  # a pipeline head: a stage lost or silent
        return JSONResponse(h["trouble"], status_code=503)  # docs/pipeline.md
    if h["ready"] and h["alive"]:
        if h["warm"]:
            return {"status": "ok"}
        return JSONResponse({"status": "warming"}, status_code=503)  # kernels compiling: serve/warmup.py
    return JSONResponse({"status": "starting"}, status_code=503)


async def ask(c: Served, what: str):
    """A question of `serve.frontend_wire.QUESTIONS`: of the engine core's process when it has one
    (--frontend-process, `serve.frontend.RemoteScheduler.ask`), else of the scheduler thread here
    (`serve.scheduler.Scheduler.ask`)."""
    return await c.scheduler.ask(what)


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
