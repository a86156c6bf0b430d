"""The seam between the HTTP front end and the engine core, and the core's other-process side.

    seam.py           `EngineClient`, `EngineView` (protocols) and what crosses the seam, re-exported
                      from the core (`Request`, `Update`, `Done`, `Delivery`, the stats' names)
    frontend.py       `RemoteScheduler` / `RemoteEngine`: the front end of `--frontend-process`
    frontend_core.py  the engine core process: the scheduler thread and its bridge to the front end
    frontend_wire.py  what travels between them, and when

Imports `serve.core` and `serve.common`; never `serve.api`.
"""
