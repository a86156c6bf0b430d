"""The scheduler: one thread owns the runtime, the pool and the index. Each iteration it drains its
inbox (new requests, aborts, queries), admits from the head of the queue, then runs one batch:

    plan = self._schedule()      # prefill chunks within the chunk budget, then one batched step
    self._run(plan)              # runtime steps; each request commits what its cells emitted

Commit applies the checkpoint policy (SPEC §7): a paged manifest checkpoints the whole pages a step
completed unless the step ends the request; a lined one retires its lease into one snapshot at stop
or length, kept only when nothing the client never receives was folded (a lone stop token on a stop
is fine). An exception here ends the process with exit code 101: a server that accepts and never
answers is worse than one that is gone.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field

from pool import Tier
from runtime.step import Cell
from serve import logs
from serve.admission import WAIT, Admission
from serve.engine import Engine
from serve.faults import runner_up
from serve.pack import Bounds, Waiting, pack
from serve.request import EOS, Done, Request, Status, Update
from serve.stats import Counters, Window

__all__ = ["Scheduler"]

EXIT_CRASH = 101


@dataclass(slots=True)
class Plan:
    prefill: list[list[tuple[Request, int]]] = field(default_factory=list)  # calls of (request, tokens)
    step: list[Request] = field(default_factory=list)


class Scheduler(threading.Thread):
    def __init__(self, engine: Engine, stats_every: float = 5.0) -> None:
        super().__init__(name="scheduler", daemon=True)
        self.engine = engine
        self.inbox: queue.Queue = queue.Queue()
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self.counters = Counters()
        self.window = Window(self.counters, stats_every)
        self.admission = Admission(engine, self.counters)
        self.stopping = False
        self.cut_at: float | None = None  # draining: the monotonic time unfinished requests are cut off
        self.cut_off = 0  # requests cut off by a drain's deadline
        self.ready = threading.Event()
        self._names = 0
        self._names_lock = threading.Lock()
        self._leaked: list = []
        self._first_step_done = False
        rt = engine.runtime
        self.emits = rt.protocol.prefill_emits
        self.prefill_program = rt.protocol.chunk().program
        self.step_forward = rt.protocol.forward(1, engine.rows)
        # a packed prefill call: up to the chunk's rows, the chunk program's groups, its context bound
        self.bounds = Bounds(engine.chunk, rt.protocol.chunk().groups, engine.context or 1 << 62)

    # the handlers' side (any thread)

    def name(self) -> str:
        with self._names_lock:
            n, self._names = self._names, self._names + 1
        return f"req-{n}"

    def submit(self, req: Request) -> None:
        self.inbox.put(("submit", req))

    def abort(self, req: Request) -> None:
        self.inbox.put(("abort", req))

    def query(self, fn) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self.inbox.put(("query", fn, fut))
        return fut

    def stop(self) -> None:
        self.inbox.put(("stop",))

    def drain(self, seconds: float) -> None:
        """Refuse new requests (a 503 each) but finish the queued and running ones; whatever is still
        unfinished `seconds` from now is cut off with a 503 and counted in `cut_off`."""
        self.inbox.put(("drain", time.monotonic() + seconds))

    # the thread

    def run(self) -> None:
        try:
            self.ready.set()
            self._loop()
        except BaseException:
            logs.event("scheduler crashed", "ERROR", error=traceback.format_exc().strip().splitlines()[-1])
            traceback.print_exc()
            os._exit(EXIT_CRASH)

    def _loop(self) -> None:
        while True:
            self._drain(block=not self.running)
            if self.cut_at is not None and time.monotonic() >= self.cut_at:
                self._cut()
            if self.stopping and not self.running and not self.waiting:
                return
            self._admit()
            if self.running:
                t0 = time.perf_counter()
                self._run(self._schedule())
                self.counters.loop_s += time.perf_counter() - t0
                # what just finished freed room: admit now, so the next drain only blocks when nothing
                # runs and the queue's head cannot be admitted
                self._admit()
            if self.window.due():
                self.window.flush(self.gauges())

    def _drain(self, block: bool) -> None:
        left = None if self.cut_at is None else self.cut_at - time.monotonic()
        wait = min(1.0, left) if left is not None and left > 0 else 1.0  # wake for a drain's deadline
        try:
            msg = self.inbox.get(timeout=wait) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(msg)
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, msg) -> None:
        kind = msg[0]
        if kind == "submit":
            req = msg[1]
            self.counters.add("requests")
            if self.stopping or self.cut_at is not None:
                self._reject(req, (503, "the server is shutting down", "server_shutting_down", None))
            else:
                self.waiting.append(req)
        elif kind == "abort":
            self._abort(msg[1])
        elif kind == "query":
            fut = msg[2]
            try:
                fut.set_result(msg[1]())
            except Exception as exc:  # a query is a read; its failure is the asker's
                fut.set_exception(exc)
        elif kind == "drain":
            self.cut_at = msg[1]
        elif kind == "stop":
            self.stopping = True
            while self.waiting:
                self._abort(self.waiting[0])

    # admission

    def _admit(self) -> None:
        e = self.engine
        while self.waiting and len(self.running) < e.max_seqs and not self.stopping:
            req = self.waiting[0]
            got = self.admission.admit(req)
            if got == WAIT:
                return
            self.waiting.popleft()
            if got is not None:
                self._reject(req, got)
                continue
            req.move(Status.RUNNING)
            req.t_admit = time.monotonic()
            self.running.append(req)
            logs.event("admitted", "DEBUG", request=req.id, prompt=len(req.ids), max_tokens=req.max_tokens,
                       row=req.lease.slot if req.lease.slot is not None else req.lease.pages[0],
                       prefix_hit=req.cached, tier=req.tier or "none", woken=req.woken)

    def _reject(self, req: Request, error) -> None:
        req.move(Status.ABORTED)
        self._send(req, Update([], Done(None, error=error)))

    def _cut(self) -> None:
        error = (503, "the server stopped before this request finished (--drain-timeout ran out)",
                 "drain_timeout", None)
        for req in [*self.waiting, *self.running]:
            self.cut_off += 1
            self._abort(req, error)

    def _abort(self, req: Request, error=None) -> None:
        if req.status is Status.WAITING:
            self.waiting.remove(req)
        elif req.status is Status.RUNNING:
            self.running.remove(req)
            if "leak-lease" in self.engine.faults:
                self._leaked.append(req.lease)
            else:
                req.lease.release()
            req.lease = None
        else:
            return
        req.move(Status.ABORTED)
        logs.event("finished", "DEBUG", request=req.id, reason="abort", prompt=len(req.ids),
                   generated=len(req.out), elapsed_s=time.monotonic() - req.t_arrive)
        self._send(req, Update([], Done(None, req.cached, req.tier, error=error)))

    # one iteration

    def _schedule(self) -> Plan:
        plan = Plan()
        prefilling = [r for r in self.running if r.prefilling]
        if self.engine.pack:
            # one call packing the oldest prompts' next rows (pack() stops rather than skipping)
            got = pack([Waiting(r.pos, r.fed_end - r.pos) for r in prefilling], self.bounds)
            plan.prefill = [[(prefilling[i], n) for i, n in got]] if got else []
        else:
            budget = self.engine.chunk
            for req in prefilling:
                if budget <= 0:
                    break
                n = min(budget, req.fed_end - req.pos)
                plan.prefill.append([(req, n)])
                budget -= n
        plan.step = [r for r in self.running if r.stepping or (r.prefilling and self._ends_prefill(r, plan))]
        return plan

    def _ends_prefill(self, req: Request, plan: Plan) -> bool:
        # a non-emitting prefill that completes this iteration takes its first step in it too
        return not self.emits and any(r is req and req.pos + n == req.fed_end for call in plan.prefill for r, n in call)

    def _run(self, plan: Plan) -> None:
        rt = self.engine.runtime
        for call in plan.prefill:
            cells = [Cell(req.lease.pages, req.lease.slot, req.fed(req.pos, req.pos + n), req.pos) for req, n in call]
            self._step(self.prefill_program, cells)
            self.counters.add("prefill_calls")
            for (req, n), cell in zip(call, cells):
                req.pos += n
                self.counters.add("prefill_tokens", n)
                new = req.take(cell.tokens[:1]) if self.emits and req.pos == req.fed_end else []
                self._commit(req, new)
        batch = [r for r in plan.step if r.stepping]
        rows = self.engine.rows
        groups = self.step_forward.groups
        for at in range(0, len(batch), groups):
            part = batch[at : at + groups]
            cells = [Cell(r.lease.pages, r.lease.slot, [r.anchor] * rows, r.pos) for r in part]
            self._step(rt.protocol.forward(len(cells), rows).program, cells)
            if "flip-near-ties" in self.engine.faults and rows == 1:
                # the bug this fault stands for: a kernel whose order of addition moves logits by
                # more than a near-tie's width, on every step
                logits = rt.logits(len(cells))
                for g, cell in enumerate(cells):
                    alt = runner_up(logits[g]) if logits is not None else None
                    if alt is not None and cell.tokens and cell.tokens[0] != EOS:
                        cell.tokens[0] = alt
            if "wrong-token-batched" in self.engine.faults and len(cells) > 1:
                # the bug this fault stands for: a batch's rows bound wrongly, so every sequence but
                # the first gets its neighbour's row; here its first token off
                for cell in cells[1:]:
                    if cell.tokens and cell.tokens[0] != EOS:
                        cell.tokens[0] ^= 1
            for req, cell in zip(part, cells):
                toks = cell.tokens
                if rows > 1 and "reject-drafts" in self.engine.faults:
                    toks = toks[:1]  # count treated as 1: the drafted rows are thrown away
                req.pos += len(toks)
                if rows > 1:
                    self.counters.add("rounds")
                    self.counters.add("drafted_rows", rows - 1)
                    self.counters.add("accepted_rows", len(toks) - 1)
                self._commit(req, req.take(toks))

    def _step(self, program: str, cells: list[Cell]) -> None:
        t0 = time.perf_counter()
        self.engine.runtime.step(program, cells)
        self.counters.step_s += time.perf_counter() - t0
        self.counters.add("steps")
        if "raise-in-scheduler" in self.engine.faults and self._first_step_done:
            raise RuntimeError("fault injected: raise-in-scheduler")
        self._first_step_done = True

    # commit

    def _commit(self, req: Request, new: list[int]) -> None:
        e = self.engine
        self.counters.tokens += len(new)
        if req.reason is None:
            full = req.pos // e.unit
            if not e.lined and full > req.page_mark and "no-checkpoint" not in e.faults:
                self.admission.checkpoint(req, full)
            if new:
                self._send(req, Update(new))
            return
        self._send(req, Update(new, self._finish(req)))

    def _finish(self, req: Request) -> Done:
        e = self.engine
        self.running.remove(req)
        req.move(Status.FINISHED)
        lease, req.lease = req.lease, None
        snapshot = "none"
        if e.lined:
            answer = len(req.out) - (req.reason == "stop")
            known = len(req.ids) + answer
            kept = req.pos <= known or (req.pos == known + 1 and req.reason == "stop")
            snapshot = "kept" if kept else "not kept"
            if "no-checkpoint" in e.faults:
                lease.release()
            elif kept:
                e.prefix.insert(req.fed(0, req.pos), e.pool.retire(lease, req.pos))
            elif "keep-overshoot" in e.faults:
                # the bug this fault stands for: the answer's key over a state that folded more
                n = known + (req.reason == "stop")
                e.prefix.insert((req.ids + req.out)[:n], e.pool.retire(lease, n))
                snapshot = "kept"
            else:
                lease.release()
                self.counters.add("not_kept")
                logs.event("not kept", "DEBUG", request=req.id, tokens=req.pos, answer=known)
        else:
            lease.release()
        logs.event("finished", "DEBUG", request=req.id, reason=req.reason, prompt=len(req.ids),
                   generated=len(req.out), cached=req.cached, snapshot=snapshot,
                   elapsed_s=time.monotonic() - req.t_arrive)
        return Done(req.reason, req.cached, req.tier, snapshot)

    def _send(self, req: Request, update: Update) -> None:
        if "wrong-token" in self.engine.faults and not req.spoiled:
            for i, t in enumerate(update.tokens):
                if t != EOS:
                    update.tokens[i] = t ^ 1
                    req.spoiled = True
                    break
        try:
            req.send(update)
        except RuntimeError:
            # the handler's loop is gone (shutdown): nobody is listening
            pass

    # views (run on this thread through `query`)

    def gauges(self) -> dict[str, int]:
        e = self.engine
        pages, slots = snapshot_holdings(e.prefix)
        return {
            "running": len(self.running), "waiting": len(self.waiting), "leases": e.pool.leases - 1,
            "pages_used": e.pool.used, "snapshot_pages": len(pages), "slots": e.pool.slots,
            "slots_used": e.pool.slots_used, "snapshot_slots": len(slots),
            "resident_entries": e.prefix.count(Tier.DEVICE), "parked_entries": e.prefix.count(Tier.HOST),
            "host_used_bytes": e.host.used() if e.host is not None else 0,
        }

    def stats(self) -> dict:
        c = self.counters
        timing = getattr(self.engine.runtime, "timing", None)  # a pipeline head's runtime keeps none
        return {
            "facts": self.engine.facts(),
            "counters": dict(c.values),
            "gauges": self.gauges(),
            "parked_lengths": self.engine.prefix.parked_lengths(),
            "timing": {"steps": c["steps"], "step_s": c.step_s, "loop_s": c.loop_s, "tokens": c.tokens,
                       **(timing.as_dict() if timing is not None else {})},
        }


def snapshot_holdings(prefix) -> tuple[set[int], set[int]]:
    """Device pages and slots the index's resident snapshots hold, recounted from their stores, so a
    page the tallies lost track of shows up as a leak."""
    pages: set[int] = set()
    slots: set[int] = set()
    for store in prefix.resident_stores():
        pages.update(store.page_ids())
        if store.seq_slot() is not None:
            slots.add(store.seq_slot())
    return pages, slots
