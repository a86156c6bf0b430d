"""A server's warm-up: every program it will run, run once on the pad before /health says ok.

numba compiles a CPU kernel (or loads it from its cache) at its first call, and CUDA loads a module at
its first launch; on a fresh clone the first request held the scheduler 37-67 s while /health said
ok. `warm_up(engine)` runs one step of each program the server can call (the chunk program, and each
batched program of the served `--rows`) with a single cell on the pad page, which padding rows write
anyway: nothing of the pool, the prefix cache, the counters or the request names is touched. Each
program's step is one `warming` line (`kern serve` prints the progress); the scheduler thread runs it
before its loop, and /health answers 503 `{"status": "warming"}` until it is done. A pipeline head
steps its stages too (the cell's tokens come from the last one), so every stage is warm.
"""

from __future__ import annotations

import time

from serve.common import logs

__all__ = ["programs", "warm_up"]


def programs(engine) -> list:
    """The forwards a server of `engine` runs: the chunk program, and the batched ones of its rows."""
    return [f for f in engine.runtime.protocol.forwards if f.rows is None or f.rows == engine.rows]


def warm_up(engine, say=logs.event) -> float:
    """Run each of `programs(engine)` once on the pad; the seconds it took."""
    from runtime.step import Cell

    t0 = time.monotonic()
    todo = programs(engine)
    say("warming", programs=len(todo), backend=engine.backend)
    for i, f in enumerate(todo, 1):
        t = time.monotonic()
        cell = Cell(list(engine.pad.pages[:1]), engine.pad.slot, [0] * (f.rows or 1), 0)
        len(engine.runtime.step(f.program, [cell])[0])  # a pipeline's come from its last stage: wait for them
        say("warming", step=f"{i}/{len(todo)}", program=f.program, seconds=round(time.monotonic() - t, 3))
    took = time.monotonic() - t0
    say("warm", programs=len(todo), warm_s=round(took, 3))
    return took
