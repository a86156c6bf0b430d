"""HTTP only: FastAPI app and routes, request bodies and their validation, replies (JSON and SSE),
/metrics, the connection guard and allowed hosts. Reaches the engine core only through
`serve.client` (never `serve.core`).

    app.py              make_app: the routes, the error handlers, the middleware
    http.py             what the routes share: `Served`, auth, body reading, rejections
    routes_complete.py  /v1/completions and /v1/chat/completions
    routes_info.py      readiness, version, capabilities, models, tokenize, /stats, /stats/live, /metrics
    bodies.py           JSON parsing off the event loop (a thread, or a worker process)
    validate.py         request bodies -> prompts, or OpenAI-style errors (over params.py's `PARAMS`)
    params.py           one row per request parameter
    reply.py            the OpenAI-shaped answers, whole and streamed
    metrics.py          /metrics through prometheus_client (vLLM's names under kern:, docs/metrics.md)
    guard.py            bounds on what clients hold (connections, deadlines, sizes) and the HTTP protocol
    hosts.py            the Host header's rule (--allowed-hosts)
"""
