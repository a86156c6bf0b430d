"""The serving policy and its thread (SPEC §7): imports `runtime`, `pool`, `manifests` and
`serve.common`, nothing else of serve/.

    engine.py     builds the runtime, pool, host tier and prefix index for one target
    core.py       the serving policy without a thread: admit, schedule, launch, commit, finish
    scheduler.py  the thread that owns the core: inbox, loop, stats window (`EngineClient` in process)
    admission.py  room for one request: lookup, one ask, evict on Busy, land remaps
    pack.py       the next packed prefill call, planned from the waiting prompts and the bounds
    device.py     `Device`, `Losable`: what the core drives on the runtime (steps, the pool's plans)
    request.py    one request's state as the scheduler sees it; `Delivery`
    answer.py     how an answer ends: `Done`, `Update`, `Stops`
    messages.py   every message of the scheduler's inbox and the front-end wire, typed
    stats.py      counters, gauges, /stats, the 5 s stats line
    warmup.py     every program the server will run, run once before /health says ok
    faults.py     deliberate misbehaviour for testing the gate, bound once at start (a Device wrapper, hooks)
"""
