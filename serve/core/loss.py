"""What a lost pipeline stage does to the serving core (`Core.lose_state`): every step in flight void, every
lease and cached prefix dropped, the running requests requeued at the front or answered an error."""

from __future__ import annotations

import operator

from serve.core.request import Status

__all__ = ["lose_state"]

_order = operator.attrgetter("order")


def lose_state(core, error=None) -> int:
    """The runtime lost state (a pipeline stage): every step in flight is void, every lease and
    every cached prefix (resident or parked) is dropped. With `error`, every request running or
    waiting is answered with it; without, the running ones go back to the FRONT of the queue in
    their order, to be recomputed from their prompt and the tokens already emitted (nothing is
    sent twice). Returns how many requests were requeued or answered."""
    e = core.engine
    core.in_flight.clear()
    core.pending = None  # an overlapped launch (a single-process runtime's alone: none here)
    late, core._aborted = core._aborted, []
    running, core.running = sorted(core.running, key=_order), []
    for req in running:
        if req.lease is not None:
            req.lease.release()
            req.lease = None
        req.move(Status.WAITING)
        req.pos = req.fed_end = req.cached = req.page_mark = 0
        req.tier, req.woken = None, False
        core.turns.requeue(req.ticket)
    e.prefix.clear()
    core.waiting.extendleft(reversed(running))
    mid = sum(1 for req in running if req.emitted)  # resumed from the tokens they already emitted
    for req in late:
        core.abort(req)
    n = len(core.waiting)
    if error is not None:
        core.lost = error
        while core.waiting:
            core.abort(core.waiting[0], error)
    if error is None:
        core.restarts += 1
        core.requeued += n
        core.resumed += mid
    else:
        core.lost_answered += n
    return n

