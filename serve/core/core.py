"""The scheduler's policy with no thread: submit, abort, admit, schedule, launch, commit, finish.

`Core` owns the waiting queue, the running set, the counters and admission over one `Engine`. It never
blocks and never sleeps; whoever drives it (the scheduler thread, or a test in process) calls

    core.admit()                     # room for the head of the queue, as much as fits
    plan = core.schedule()           # prefill calls within the chunk budget, then one batched step
    for work in plan.works:
        core.commit(core.launch(work))   # run the step on the runtime, then apply what it emitted

A launched step is *in flight* until its commit: its requests are left out of later schedules, and an
abort that arrives meanwhile is applied at the commit, so a pipeline may launch several steps (of
different requests) before the first commit lands. With `overlap` (`kern serve --overlap`), `run` leaves
a forward launch *pending*; the next `run` launches the next steps (the pending requests fed their last
tokens on the device, newly prefilled ones theirs from the host) before committing it, so the host's
commit and staging overlap the device's steps. A request that stopped in the committed steps has its
rows of the next launch dropped at that commit (their writes lie past all it fed, in pages no cached
prefix holds, and reach the device before any later use of its freed pages: one stream, in order).
`launch` builds its cells from the requests' state as it stands, so the works of one plan are launched
in order (a non-emitting prefill's first step follows its last chunk's commit).

Commit applies the checkpoint policy (SPEC §7): a paged manifest checkpoints the whole pages a step
completed unless the step ends the request; a lined one retires its lease into one snapshot at stop
or length, kept only when nothing the client never receives was folded (a lone stop token on a stop
is fine).

The core steps `self.device` (a `serve.core.device.Device`). `release_aborted`, `retire` and `tell` are hook
points doing the correct thing; `serve/core/faults.py` replaces one at start for a fault standing for a bug.
"""

from __future__ import annotations

import collections
import operator
import time

from pool.fair import Rule, Ticket, Turns
from runtime.step import Cell
from serve.common import logs
from serve.core.admission import WAIT, Admission
from serve.core.engine import Engine
from serve.core.loss import lose_state
from serve.core.overlap import chain
from serve.core.pack import Bounds, Waiting, pack
from serve.core.request import Done, Request, Status, Tickets, Update
from serve.core.stats import Counters, core_gauges, core_stats, snapshot_holdings
from serve.core.work import FORWARD, PREFILL, Flight, Plan, Work

QUEUE_SHOWN = 32  # request names /stats lists per queue (the gate names a stuck request from them)

__all__ = ["Core", "Flight", "Plan", "Work", "snapshot_holdings"]

_order = operator.attrgetter("order")  # a request's admission order


class Core:
    """The serving policy over one engine; every method runs on the caller's thread, none blocks."""

    def __init__(self, engine: Engine, counters: Counters | None = None) -> None:
        self.engine = engine
        self.counters = counters if counters is not None else Counters()
        self.admission = Admission(engine, self.counters)
        # the order waiting requests are tried in (pool/fair.py); an engine of a test or a replay names none
        self.turns = Turns(getattr(engine, "admission", None) or Rule(), engine.pages, getattr(engine, "max_seqs", 1))
        self.queue_timeout: float | None = getattr(engine, "queue_timeout", None)
        self.timed_out = 0  # requests answered 503 queue_timeout
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self.stopping = False
        self.cut_at: float | None = None  # draining: the monotonic time unfinished requests are cut off
        self.cut_off = 0  # requests cut off by a drain's deadline
        self.in_flight: set[int] = set()  # id() of requests in a launched, uncommitted step
        self._aborted: list[Request] = []  # aborts that arrived while their request was in flight
        self.step_since: float | None = None  # monotonic start of the runtime step in progress (read off-thread)
        self.lost: tuple | None = None  # a pipeline stage was lost for good: the error every request gets
        # state dropped to resume; requeued (waiting ones too); of those, resumed mid-answer; answered an error
        self.restarts = self.requeued = self.resumed = self.lost_answered = 0
        self.admitted = 0  # requests admitted so far (each one's `order`)
        self.device = rt = engine.runtime  # what the steps run on (serve/core/faults.py may wrap it)
        self.emits = rt.protocol.prefill_emits
        self.prefill_program = rt.protocol.chunk().program
        self.step_forward = rt.protocol.forward(1, engine.rows)
        self.decode_steps = getattr(engine, "decode_steps", 1)  # steps a launch (runtime/multistep.py)
        # the next launch goes out before the last one's commit (serve/core/faults.py turns it off)
        self.overlap = bool(getattr(engine, "overlap", False)) and self.decode_steps > 1
        self.pending: Flight | None = None  # an overlapped forward launch not committed yet
        # a packed prefill call: up to the chunk's rows, the chunk program's groups, its context bound
        self.bounds = Bounds(engine.chunk, rt.protocol.chunk().groups, engine.context or 1 << 62)

    # requests in and out

    def submit(self, req: Request) -> None:
        self.counters.add("requests")
        if self.lost is not None:
            self._reject(req, self.lost)
        elif self.stopping or self.cut_at is not None:
            self._reject(req, (503, "the server is shutting down", "server_shutting_down", None))
        else:
            req.ticket = Ticket(req.client, -(-req.room // self.engine.unit))
            self.turns.arrive(req.ticket)
            self.waiting.append(req)
            logs.event("queued", "DEBUG", request=req.id, prompt=len(req.ids), max_tokens=req.max_tokens)

    def drain(self, cut_at: float) -> None:
        """Refuse new requests but finish the queued and running ones until `cut_at` (monotonic)."""
        self.cut_at = cut_at

    def cut(self) -> None:
        """A drain's deadline passed: what is unfinished is cut off with a 503."""
        error = (503, "the server stopped before this request finished (--drain-timeout ran out)",
                 "drain_timeout", None)
        for req in [*self.waiting, *self.running]:
            self.cut_off += 1
            self.abort(req, error)

    def abort(self, req: Request, error=None) -> None:
        if id(req) in self.in_flight:
            self._aborted.append(req)
            return
        if req.status is Status.WAITING:
            self.waiting.remove(req)
            if req.ticket is not None:
                self.turns.withdraw(req.ticket)
        elif req.status is Status.RUNNING:
            self._leave(req)
            self.release_aborted(req.lease)
            req.lease = None
        else:
            return
        req.move(Status.ABORTED)
        self.counters.add("aborted")
        logs.event("finished", "DEBUG", request=req.id, reason="abort", prompt=len(req.ids),
                   generated=len(req.out), elapsed_s=time.monotonic() - req.t_arrive, step=self.counters["steps"])
        self._send(req, Update([], Done(None, req.cached, req.tier, error=error)))

    def lose_state(self, error=None) -> int:
        """The runtime lost state (a pipeline stage): serve/core/loss.py. Returns the requests requeued or answered."""
        return lose_state(self, error)

    def stop(self) -> None:
        """Stop admitting: abort what waits; what runs runs to its end."""
        self.stopping = True
        while self.waiting:
            self.abort(self.waiting[0])

    @property
    def done(self) -> bool:
        """Stopping and nothing left to run."""
        return self.stopping and not self.running and not self.waiting

    # admission

    def admit(self) -> None:
        """Start waiting requests while rows are free, in the order the policy tries them
        (`pool.fair.Turns.order`: under fifo the head alone, under fair the head, then those behind it)."""
        e = self.engine
        while self.waiting and len(self.running) < e.max_seqs and not self.stopping:
            if not self._admit_one():
                return

    def _admit_one(self) -> bool:
        """Start (or refuse) one waiting request; False when none the policy tries fits."""
        waiting = self.waiting
        head = None
        for i in self.turns.order(Tickets(waiting)):
            req = waiting[i]
            head = req if head is None else head
            got = self.admission.admit(req)
            if got == WAIT:
                continue
            del waiting[i]
            if got is not None:
                self.turns.withdraw(req.ticket)
                self._reject(req, got)
                return True
            self.turns.seat(req.ticket, head.ticket)
            req.move(Status.RUNNING)
            req.t_admit = time.monotonic()
            self.admitted += 1
            req.order = self.admitted
            self.running.append(req)
            logs.event("admitted", "DEBUG", request=req.id, prompt=len(req.ids), max_tokens=req.max_tokens,
                       row=req.lease.slot if req.lease.slot is not None else req.lease.pages[0],
                       prefix_hit=req.cached, tier=req.tier or "none", woken=req.woken,
                       **({"bypassed": head.id} if head is not req else {}))
            return True
        return False

    def expire(self, now: float) -> int:
        """Answer 503 queue_timeout to every waiting request that arrived more than --queue-timeout
        before `now` (a resumed one, whose stream has begun, waits on). Returns how many."""
        bound = self.queue_timeout
        if bound is None or not self.waiting:
            return 0
        late = [r for r in self.waiting if now - r.t_arrive > bound and not r.emitted]
        error = (503, f"no room for this request within --queue-timeout {bound:g} s; retry later",
                 "queue_timeout", None)
        for req in late:
            self.abort(req, error)
            logs.event("queue timeout", "INFO", request=req.id, client=req.client, waited_s=round(now - req.t_arrive, 3))
        self.timed_out += len(late)
        return len(late)

    def _reject(self, req: Request, error) -> None:
        req.move(Status.ABORTED)
        self._send(req, Update([], Done(None, error=error)))

    # one iteration

    def schedule(self) -> Plan:
        plan = Plan()
        e = self.engine
        ready = [r for r in self.running if id(r) not in self.in_flight] if self.in_flight else list(self.running)
        prefilling = sorted((r for r in ready if r.prefilling), key=_order)  # the oldest first
        if e.pack:
            # one call packing the oldest prompts' next rows (pack() stops rather than skipping)
            got = pack([Waiting(r.pos, r.fed_end - r.pos) for r in prefilling], self.bounds)
            if got and sum(n for _, n in got) < e.chunk and self.device.hold_partial():
                got = []  # a pipeline full of items: a partial call waits for more rows or an answer
            plan.prefill = [[(prefilling[i], n) for i, n in got]] if got else []
        else:
            budget = e.chunk
            for req in prefilling:
                if budget <= 0:
                    break
                n = min(budget, req.fed_end - req.pos)
                plan.prefill.append([(req, n)])
                budget -= n
        if prefilling:
            plan.step = [r for r in ready if r.stepping or (r.prefilling and self._ends_prefill(r, plan))]
        else:
            plan.step = [r for r in ready if r.stepping]
        return plan

    def _ends_prefill(self, req: Request, plan: Plan) -> bool:
        # a non-emitting prefill that completes this iteration takes its first step in it too
        return not self.emits and any(r is req and req.pos + n == req.fed_end for call in plan.prefill for r, n in call)

    def run(self, plan: Plan) -> None:
        """Launch and commit every work of `plan`, in order (what the scheduler thread does). With `overlap`
        a forward launch stays pending, and the next `run` chains onto it (serve/core/overlap.py)."""
        if self.pending is not None:
            if chain(self, plan):
                return
            self.settle()
            plan = self.schedule()
        for work in plan.works:
            flight = self.launch(work)
            if flight.launched is not None:
                self.pending = flight
            else:
                self.commit(flight)

    def settle(self) -> None:
        """Commit the pending launch, if any."""
        prev, self.pending = self.pending, None
        if prev is not None:
            self.commit(prev)

    def launch(self, work: Work) -> Flight:
        """Run `work`'s step on the runtime from its requests' state; they are in flight until `commit`."""
        if not self.in_flight.isdisjoint(map(id, work.reqs)):
            for r in work.reqs:
                assert id(r) not in self.in_flight, f"request {r.id} launched twice before its commit"
        if work.kind == PREFILL:
            cells = [Cell(r.lease.pages, r.lease.slot, r.fed(r.pos, r.pos + n), r.pos) for r, n in zip(work.reqs, work.ns)]
            tokens = self._step(self.prefill_program, cells)
            self.counters.add("prefill_calls")
            self.in_flight.update(map(id, work.reqs))
            return Flight(work, [tokens])
        rt = self.device
        batch = [r for r in work.reqs if r.stepping]
        work.reqs = batch
        rows = self.engine.rows
        groups = self.step_forward.groups
        parts, launched = [], None
        several = self.decode_steps > 1
        pending = several and self.overlap and len(batch) <= groups  # one launch, left pending (`run`)
        for at in range(0, len(batch), groups):
            part = batch[at : at + groups]
            cells = [Cell(r.lease.pages, r.lease.slot, [r.anchor] * rows, r.pos) for r in part]
            program = rt.protocol.forward(len(cells), rows).program
            limits = [r.max_tokens - len(r.out) for r in part] if several else None
            if pending:
                launched = self._launch(program, cells, limits, None)
            else:
                parts.append(self._step(program, cells, limits))
        self.counters.add("batched_steps", len(batch) > 1)  # e2e's proof that its burst shared a step
        self.in_flight.update(map(id, batch))
        return Flight(work, parts, launched)

    def _step(self, program: str, cells: list[Cell], limits: list[int] | None = None) -> list[list[int]]:
        """One step of `program` over `cells`, or with each cell's `limits` `decode_steps` of them."""
        k = 1 if limits is None else self.decode_steps
        if k == 1:
            return self._timed(k, self.device.step, program, cells)
        return self._timed(k, self.device.steps, program, cells, k, limits)

    def _launch(self, program: str, cells: list[Cell], limits: list[int], follow: list[int] | None):
        """`decode_steps` steps of `program` issued, not waited for (`overlap`)."""
        k = self.decode_steps
        return self._timed(k, self.device.launch_steps, program, cells, k, limits, follow)

    def _timed(self, steps: int, call, *args):
        """A call into the device, timed into the counters, shown to /stats/live while it runs, and
        counted as `steps` steps once it returned (a StageLost counts none and leaves step_since for
        the scheduler to clear)."""
        t0 = time.perf_counter()
        self.step_since = time.monotonic()
        got = call(*args)
        self.step_since = None
        self.counters.step_s += time.perf_counter() - t0
        self.counters.add("steps", steps)
        return got

    # commit

    def commit(self, flight: Flight) -> None:
        """Apply what a launched step emitted: positions, answer tokens, checkpoints, finishes."""
        work = flight.work
        if flight.launched is not None:  # an overlapped launch: wait for its tokens
            flight.tokens = [self._timed(0, self.device.collect, flight.launched)]
        self.in_flight.difference_update(map(id, work.reqs))
        if self.pending is not None and self.pending is not flight:  # its requests are in flight again
            self.in_flight.update(map(id, self.pending.work.reqs))
        if work.kind == PREFILL:
            for req, n, emitted in zip(work.reqs, work.ns, flight.tokens[0]):
                req.pos += n
                self.counters.add("prefill_tokens", n)
                # a resumed request's prefill ends where its anchor was already emitted: nothing new
                new = req.take(emitted[:1]) if self.emits and req.pos == req.fed_end and not req.emitted else []
                self._commit(req, new)
        else:
            rows = self.engine.rows
            tokens = flight.tokens[0] if len(flight.tokens) == 1 else [t for part in flight.tokens for t in part]
            for req, toks in zip(work.reqs, tokens):
                if not req.stepping:  # stopped in the launch before this overlapped one: its steps are void
                    continue
                if rows == 1 and len(toks) > 1:  # several steps a launch (runtime/multistep.py)
                    self._commit_run(req, toks)
                    continue
                req.pos += len(toks)
                if rows > 1:
                    self.counters.add("rounds")
                    self.counters.add("drafted_rows", rows - 1)
                    self.counters.add("accepted_rows", len(toks) - 1)
                self._commit(req, req.take(toks))
        if self._aborted:
            late = [r for r in self._aborted if id(r) not in self.in_flight]
            self._aborted = [r for r in self._aborted if id(r) in self.in_flight]
            for req in late:
                self.abort(req)

    def _commit(self, req: Request, new: list[int]) -> None:
        e = self.engine
        self.counters.tokens += len(new)
        if req.reason is None:
            full = req.pos // e.unit
            if not e.lined and full > req.page_mark:
                self.admission.checkpoint(req, full)
            if new:
                self._send(req, Update(new))
            return
        self._send(req, Update(new, self._finish(req)))

    def _commit_run(self, req: Request, toks: list[int]) -> None:
        """One launch's several steps committed as single steps would be: the pages completed before a
        finishing step checkpointed, the tokens past a stop dropped, pos where the counted steps left it."""
        p0 = req.pos
        new, used = req.take_run(toks)
        full = (p0 + used - 1) // self.engine.unit
        if req.reason is not None and not self.engine.lined and full > req.page_mark:
            self.admission.checkpoint(req, full)
        req.pos = p0 + used
        self._commit(req, new)

    def _finish(self, req: Request) -> Done:
        e = self.engine
        self._leave(req)
        req.move(Status.FINISHED)
        lease, req.lease = req.lease, None
        snapshot = "none"
        if e.lined:
            # The keep rule. Every "stop" is retired alike: by EOS, by a stop token id or by the token
            # that completed a stop string (docs/api.md). Its last token is in token_ids but, with one
            # row a step, never fed; `answer` leaves it out, and a state that folded it too (a round's
            # last row) is still kept. Together with "length" that is one rule: kept iff the state
            # folded nothing past prompt + token_ids, the key being exactly what it folded.
            answer = len(req.out) - (req.reason == "stop")
            known = len(req.ids) + answer
            kept = req.pos <= known or (req.pos == known + 1 and req.reason == "stop")
            snapshot = self.retire(req, lease, known, kept)
        else:
            lease.release()
        logs.event("finished", "DEBUG", request=req.id, reason=req.reason, prompt=len(req.ids),
                   generated=len(req.out), cached=req.cached, snapshot=snapshot,
                   elapsed_s=time.monotonic() - req.t_arrive, step=self.counters["steps"])
        s = req.stops
        if s is None:
            return Done(req.reason, req.cached, req.tier, snapshot, woken=req.woken)
        return Done(req.reason, req.cached, req.tier, snapshot, stop_reason=s.reason, text_end=s.text_end,
                    hide_last=s.hide_last, woken=req.woken)

    def _leave(self, req: Request) -> None:
        """Take `req` out of the running list, the last one taking its place. A step's cells are the
        running requests in this list's order, and the runtime keeps its page-table rows between
        steps by position: a removal from the middle moved every later request up a row, so each
        finish rewrote and uploaded them all (most of a step's staging at 64 streams over HTTP)."""
        running = self.running
        if req.ticket is not None:
            self.turns.leave(req.ticket)
        i = running.index(req)
        last = running.pop()
        if last is not req:
            running[i] = last

    def _send(self, req: Request, update: Update) -> None:
        try:
            self.tell(req, update)
        except RuntimeError:
            # the handler's loop is gone (shutdown): nobody is listening
            pass

    # hook points (serve/core/faults.py replaces one for a fault)

    def release_aborted(self, lease) -> None:
        """An aborted request's lease goes back to the pool."""
        lease.release()

    def retire(self, req: Request, lease, known: int, kept: bool) -> str:
        """A lined request's lease at its finish: retired into a snapshot under the tokens it folded
        when `kept` (the keep rule), else released. Returns the snapshot verdict."""
        e = self.engine
        if kept:
            e.prefix.insert(req.fed(0, req.pos), e.pool.retire(lease, req.pos))
            return "kept"
        lease.release()
        self.counters.add("not_kept")
        logs.event("not kept", "DEBUG", request=req.id, tokens=req.pos, answer=known)
        return "not kept"

    def tell(self, req: Request, update: Update) -> None:
        """Send `update` to the request's client as it is."""
        req.send(update)

    # views (serve/core/stats.py)

    def gauges(self) -> dict[str, int]:
        return core_gauges(self)

    def stats(self) -> dict:
        return core_stats(self, QUEUE_SHOWN)
