"""The OpenAI-compatible HTTP server and its continuous-batching scheduler (SPEC §7).

    cli.py        `kern serve` / `kern-serve`: flags, wiring, uvicorn
    engine.py     builds the runtime, pool, host tier and prefix index for one target
    core.py       the serving policy without a thread: admit, schedule, launch, commit, finish
    device.py     `Device`: what the core drives on the runtime (steps, the pool's plans, park/wake)
    scheduler.py  the thread that owns the core: inbox, loop, stats window
    admission.py  room for one request: lookup, one ask, evict on Busy, land remaps
    request.py    one request's state as the scheduler sees it
    app.py        FastAPI routes
    validate.py   request bodies -> prompts, or OpenAI-style errors
    stats.py      counters, gauges, /stats, the 5 s stats line
    metrics.py    /metrics through prometheus_client (vLLM's names under kern:, docs/metrics.md)
    logs.py       key=value event lines
    faults.py     deliberate misbehaviour for testing the gate, bound once at start (a Device wrapper, hooks)
"""
