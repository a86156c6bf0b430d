"""The OpenAI-compatible HTTP server and its continuous-batching scheduler (SPEC §7), in rooms whose
imports point one way only (tests/test_imports.py's `ROOMS`, docs/architecture.md):

    api/       HTTP only: the app, its routes, bodies, replies, /metrics, the connection guard
    client/    the seam the routes use (`EngineClient`, `EngineView`) and the engine core in another
               process (the remote front end, its core process, the wire)
    core/      the serving policy and its thread: engine, core, scheduler, admission, the device, faults,
               the request and the typed messages
    pipeline/  a cut manifest served as a pipeline of processes (the head drives the core's `Device`)
    common/    leaves every room may import: logs, the hosted process, exit codes, start phases, ApiError

    api -> client -> core -> (runtime, pool, manifests); pipeline -> core; every room -> common

The process's entry points wire the rooms together and no room imports them:

    cli.py        `kern serve` / `kern-serve`: flags, wiring (in process or the core in a process of its own)
    server.py     binding, uvicorn, the scheduler's start, drain and stop
    flags.py      the command's flags as one dataclass
    __main__.py   `python -m serve`
"""
