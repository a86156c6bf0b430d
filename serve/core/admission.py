"""Room for one request (SPEC §6 "Room"): look the prefix up, ask the pool once for the whole
request; on Busy release the hit, evict once, look up again and ask again; on Remapping land the plan
and ask again. A resident hit restores into the lease, a parked hit is woken straight into it.

`lookup`, `checkpoint`, `on_remapping`, `too_long`, `restore_copy` and `parker` are hook points: each
does the correct thing, and `serve/core/faults.py` replaces one (at start) for a fault that stands for a bug.
"""

from __future__ import annotations

from pool import Denied, Lease, Tier
from serve.common import logs
from serve.core.engine import Engine
from serve.core.request import Request
from serve.core.stats import Counters

__all__ = ["WAIT", "Admission"]

WAIT = "wait"
"""Busy with no resident snapshot left to evict: the request waits at the head of the queue."""


class Admission:
    WAIT = WAIT  # the verdict that leaves a request waiting (what a hook may answer)

    def __init__(self, engine: Engine, counters: Counters, log=logs.event) -> None:
        self.engine = engine
        self.counters = counters
        self.emits = engine.runtime.protocol.prefill_emits
        self.log = log

    def admit(self, req: Request) -> str | tuple[int, str, str, str | None] | None:
        """None when `req` now holds its lease; WAIT; or an error (status, message, code, param)."""
        e = self.engine
        fed = len(req.ids) if self.emits else len(req.ids) - 1
        if req.emitted and e.context is not None and len(req.ids) + len(req.emitted) - 1 > e.context:
            # resumed after a lost pipeline stage, its recompute would not fit one prefill's context
            return (503, f"this request was cut off by a lost pipeline stage and its {len(req.ids) + len(req.emitted) - 1} "
                    f"tokens exceed the context bound {e.context} to recompute", "pipeline_stage_lost", None)
        if e.context is not None and fed > e.context:
            # no prefill call could ever seat its last chunk: waiting would be forever
            return (400, f"this prompt's prefill reaches {fed} tokens; the manifest's context bound is "
                    f"{e.context}", "context_length_exceeded", None)
        hit = self.lookup(req.ids)
        while True:
            got = self._ask(req, hit)
            if isinstance(got, Lease):
                break
            if got == Denied.Remapping:
                got = self.on_remapping()
                if got is None:
                    continue
            if hit is not None:
                hit.release()
                hit = None
            if got == Denied.Busy:
                if not self.evict():
                    return WAIT
                hit = self.lookup(req.ids)
                continue
            if got == Denied.ExceedsPool:
                return (400, f"this request needs room for {req.room} tokens, which no layout of the pool "
                        f"holds with a sequence slot", "kv_budget_exceeded", None)
            return self.too_long(req, got)
        req.lease = got
        self.counters.queried += len(req.ids)  # /metrics' prefix-cache queries: once per admitted request
        if hit is not None:
            n = hit.len
            self.counters.add("prefix_hit_tokens", n)
            if hit.tier is Tier.DEVICE:
                self.counters.add("resident_hits")
                self.counters.add("resident_hit_tokens", n)
            else:
                self.counters.add("host_hits")
                self.counters.add("host_hit_tokens", n)
                self.counters.add("wakes")
                self.counters.add("wake_tokens", n)
                req.woken = True
            req.cached, req.tier = n, hit.tier.value
            hit.release()
        req.pos = req.cached
        req.page_mark = req.cached // e.unit
        req.fed_end = len(req.ids) if self.emits else len(req.ids) - 1
        req.anchor = req.ids[-1]
        if req.emitted:
            # resumed (its state was lost with a pipeline stage): the prefill recomputes the prompt and
            # every token fed since; the last token emitted is the anchor of its next step, as before
            req.fed_end = len(req.ids) + len(req.emitted) - 1
            req.anchor = req.emitted[-1]
        return None

    # hook points (serve/core/faults.py replaces one for a fault)

    def lookup(self, ids: list[int]):
        """The index's longest hit for `ids` (resident or parked), or None."""
        return self.engine.prefix.lookup(ids)

    def on_remapping(self) -> Denied | None:
        """The pool wants its pending remap landed before it leases: land it (None: ask again)."""
        self.land()
        return None

    def too_long(self, req: Request, got: Denied) -> tuple[int, str, str, str | None] | str:
        """The answer to a request one sequence cannot hold: a 400 naming the limit."""
        limit = got.limit if got.limit is not None else self.engine.max_request_tokens
        return (400, f"this request needs room for {req.room} tokens (prompt + max_tokens + rows - 1); "
                f"one sequence holds at most {limit}", "context_length_exceeded", None)

    def restore(self, hit, room: int):
        """A lease of `room` tokens whose first `hit.len` are a resident hit's (whole pages shared and held)."""
        return self.engine.pool.restore(hit.store, hit.len, room)

    def restore_copy(self, copies) -> None:
        """Copy a resident hit's partial page and line into the lease."""
        self.engine.runtime.copy(copies)

    def parker(self):
        """How an evicted snapshot is parked (None: dropped): to the host tier when there is one."""
        return self._park if self.engine.host is not None else None

    # the rest

    def _ask(self, req: Request, hit) -> Lease | Denied:
        e, rt = self.engine, self.engine.runtime
        if hit is None:
            got = e.pool.lease(req.room)
            if isinstance(got, Lease) and got.slot is not None:
                rt.zero_slot(got.slot)
            return got
        if hit.tier is Tier.DEVICE:
            got = self.restore(hit, req.room)
            if isinstance(got, Denied):
                return got
            lease, copies = got
            self.restore_copy(copies)
            return lease
        got = e.host.restore(hit.store, e.pool, hit.len, req.room)
        if isinstance(got, Denied):
            return got
        lease, copies = got
        rt.wake(copies)
        return lease

    def checkpoint(self, req: Request, full: int) -> None:
        """A paged request's first `full` whole pages become a snapshot in the index (SPEC §7's
        checkpoint policy: after a step that does not end the request, the pages it completed)."""
        e = self.engine
        n = full * e.unit
        cp, copies = e.pool.checkpoint(req.lease, n)
        if copies:  # whole pages are shared, not copied: most checkpoints have nothing to copy
            e.runtime.copy(copies)
        e.prefix.insert(req.key_to(n), cp)
        req.page_mark = full

    def land(self) -> None:
        """Execute the pool's pending remap and tell it the plan landed."""
        plan = self.engine.pool.take_pending()
        if plan is not None:
            self.engine.runtime.land(plan)
            self.engine.pool.complete(plan)
            self.counters.add("remaps")

    def evict(self) -> bool:
        """Park (or drop) the coldest resident snapshot; False when nothing is resident."""
        ev = self.engine.prefix.evict(self.parker())
        if ev is None:
            return False
        if ev.parked:
            self.counters.add("parks")
            self.log("parked", "DEBUG", tokens=ev.tokens)
        else:
            self.counters.add("evictions")
        self.counters.add("host_evictions", ev.dropped)
        return True

    def _park(self, store):
        got = self.engine.host.park(store)
        if isinstance(got, Denied):
            return got
        parked, copies = got
        self.engine.runtime.park(copies)
        return parked
