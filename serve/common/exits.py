"""`kern serve`'s exit codes (`EXIT_CODES`: also in `kern serve --help` and docs/serve.md)."""

from __future__ import annotations

__all__ = ["EXIT_BIND", "EXIT_CODES", "EXIT_CRASHED", "EXIT_CUT_OFF", "EXIT_PIPELINE", "EXIT_START_FAILED",
           "EXIT_USAGE"]

EXIT_START_FAILED = 1  # uvicorn did not start after the load
EXIT_USAGE = 2  # a bad flag value, or a target that cannot be served
EXIT_BIND = 3  # the listening socket cannot be bound (a taken port)
EXIT_PIPELINE = 3  # a pipeline lost a stage and could not go on (the same 3: a bind fails before any stage starts)
EXIT_CUT_OFF = 75  # EX_TEMPFAIL
EXIT_CRASHED = 101  # the scheduler thread crashed (serve/core/scheduler.py), or the engine core process died
EXIT_CODES = {
    0: "SIGTERM (or SIGINT) drained every request",
    EXIT_START_FAILED: "the HTTP server failed to start after the load",
    EXIT_USAGE: "a bad flag value, or a target that cannot be served (config, manifest, weights and their sha256, kernels, sizes)",
    EXIT_BIND: "--host/--port cannot be bound (the port is taken: \"address already in use\"); checked before the load; "
               "or, with --stages and --no-pp-restart (or a restart that failed), the pipeline lost a stage",
    EXIT_CUT_OFF: "--drain-timeout ran out and requests were cut off (each answered a 503)",
    EXIT_CRASHED: "the scheduler thread crashed (or, with --frontend-process, the engine core process was killed)",
}
