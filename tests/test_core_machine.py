"""The serving core under a model: `serve.core.core.Core` over the real pool, index and host tier, driven in
process by a pure-Python runtime (tests/pyruntime.py) that carries out every plan on plain objects.

A hypothesis state machine submits (fresh prompts and next turns of finished conversations), aborts,
advances (admit, then one scheduled plan launched and committed work by work; prefill unpacked, or
packed several prompts to a call as a manifest with cu_seqlens does) and parks (evicts the coldest
resident snapshot). Mirrored step by step into the policy oracle (`verdicts.policy.Policy`),
it checks after every step:

- answers: every finished request's tokens equal `toy/model.py`'s `generate` (stop token included);
- hits and snapshots: each admitted request's cached tokens and tier, each finished one's snapshot
  verdict, equal the policy oracle's; a request waits exactly when the oracle says it must, every
  admission attempt mirrored in the order the core made it (under fair admission, the default,
  those behind a head that waits are tried too; `pool.fair`'s order is held by test_pool_fair);
- nothing leaked: pages used, snapshot pages, entries per tier, host bytes, the counters and the
  parked lengths equal the oracle's (which recounts them by scan), and an idle core holds no lease.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pool import Tier
from pyruntime import engine
from serve.core.admission import WAIT
from serve.core.core import Core
from serve.core.request import EOS, Request, Status
from toy import model as tm
from verdicts.policy import POLICY_COUNTERS, Policy

BASE = [b"The lighthouse keeper had not seen a ship", b"To make a proper risotto, begin", b"A hash map trades",
        b"The lighthouse keeper had not seen a ship in eleven days"]
SUFFIX = list(b" Again?")
GAUGES = ("pages_used", "snapshot_pages", "resident_entries", "parked_entries", "host_used_bytes")


class CoreMachine(RuleBasedStateMachine):
    @initialize(name=st.sampled_from(["toy-paged", "toy-spec", "toy-stateful", "toy-stateful-spec"]),
                pages=st.integers(12, 40), host_pages=st.sampled_from([0, 3, 8, 40]), max_seqs=st.integers(1, 4),
                chunk=st.sampled_from([7, 2048]), pack=st.sampled_from([0, 3]))
    def setup(self, name, pages, host_pages, max_seqs, chunk, pack):
        target = name
        page_bytes = 16 * 4096
        slot_bytes = (1 << 20) if "stateful" in target else 0
        host = host_pages * page_bytes + (2 * slot_bytes if host_pages else 0)
        self.e, geo = engine(target, pages * 16, host, max_seqs, chunk=chunk, first_slots=64, pack=pack)
        self.core = Core(self.e)
        self.manifest = json.load(open(f"manifests/toy/{target}.json"))
        f = self.e.facts()
        self.policy = Policy(page=f["page"], pages=f["pages"], lined=self.e.lined, emits=self.core.emits,
                             rows=self.e.rows, chunk=chunk, slots=f["seq_slots"], host_bytes=f["host_bytes"],
                             page_bytes=geo.page_bytes, slot_bytes=geo.slot_bytes)
        self.reqs: list[tuple[Request, list]] = []
        self.leases: dict[int, object] = {}
        self.finished: list[list[int]] = []
        self.n = 0

    # rules

    def _submit(self, ids: list[int], m: int) -> None:
        room = len(ids) + m + self.e.rows - 1
        if room > self.e.max_request_tokens:
            return
        sink: list = []
        req = Request(f"req-{self.n}", ids, m, self.e.rows, sink.append)
        self.n += 1
        self.core.submit(req)
        self.reqs.append((req, sink))

    @rule(i=st.integers(0, len(BASE) - 1), m=st.integers(1, 24))
    def submit(self, i, m):
        self._submit(list(BASE[i]), m)

    @precondition(lambda self: self.finished)
    @rule(data=st.data(), m=st.integers(1, 24))
    def next_turn(self, data, m):
        convo = data.draw(st.sampled_from(self.finished))
        self._submit(convo + SUFFIX, m)

    @precondition(lambda self: any(r.status in (Status.WAITING, Status.RUNNING) for r, _ in self.reqs))
    @rule(data=st.data())
    def abort(self, data):
        live = [r for r, _ in self.reqs if r.status in (Status.WAITING, Status.RUNNING)]
        req = data.draw(st.sampled_from(live))
        lease = self.leases.pop(id(req), None)
        self.core.abort(req)
        assert req.status is Status.ABORTED
        if lease is not None:
            self.policy.abort(lease)

    @rule()
    def park(self):
        assert self.core.admission.evict() == self.policy.evict()

    @rule()
    def advance(self):
        core, pol = self.core, self.policy
        for req, got in self._tried(core.admit):
            # every attempt mirrored in the order the core made it (kern's default, fair admission,
            # tries those behind a head that waits; a failed attempt evicts, as the policy's does)
            if got == WAIT:
                assert pol.admit(req.ids, req.max_tokens) is None, f"{req.id} waits; the policy admits it"
                continue
            assert got is None, (req.id, got)
            pred = pol.admit(req.ids, req.max_tokens)
            assert pred is not None, f"{req.id} admitted; the policy says it waits"
            lease, pred = pred
            assert (req.cached, req.tier) == (pred.cached, pred.tier), f"{req.id}: hit {req.cached} {req.tier}, policy {pred}"
            self.leases[id(req)] = lease
        for work in core.schedule().works:
            flight = core.launch(work)
            core.commit(flight)
            for req in work.reqs:
                lease = self.leases[id(req)]
                fed = req.ids + req.emitted
                done = req.status is Status.FINISHED
                pol.step(lease, fed, req.pos, done)
                if done:
                    del self.leases[id(req)]
                    self._finished(req, lease, fed)

    def _tried(self, admit) -> list:
        """Run `admit`; the (request, verdict) of every admission attempt it made, in order."""
        tried = []
        real = self.core.admission.admit

        def spy(req):
            got = real(req)
            tried.append((req, got))
            return got

        self.core.admission.admit = spy
        try:
            admit()
        finally:
            del self.core.admission.admit
        return tried

    def _finished(self, req: Request, lease, fed: list[int]) -> None:
        sink = next(s for r, s in self.reqs if r is req)
        tokens = [t for u in sink for t in u.tokens]
        want = tm.generate(req.ids, req.max_tokens, self.manifest)
        stop = req.reason == "stop"
        assert tokens == want + ([EOS] if stop else []), f"{req.id}: {tokens} != {want} (+stop {stop})"
        answer = len(tokens) - stop
        snap = self.policy.finish(lease, fed, req.pos, len(req.ids), answer, req.reason)
        assert sink[-1].done.snapshot == snap, f"{req.id}: snapshot {sink[-1].done.snapshot}, policy {snap}"
        self.finished.append(req.ids + tokens)

    # after every step

    @invariant()
    def matches_the_policy_and_leaks_nothing(self):
        if not hasattr(self, "core"):
            return
        g, pg = self.core.gauges(), self.policy.gauges()
        assert {k: g[k] for k in GAUGES} == {k: pg[k] for k in GAUGES}
        c = self.core.counters
        assert {k: c[k] for k in POLICY_COUNTERS} == self.policy.counters
        assert self.e.prefix.parked_lengths() == self.policy.parked_lengths()
        assert self.e.prefix.count(Tier.DEVICE) == pg["resident_entries"]
        if not self.core.running:
            assert self.e.pool.leases == 1, "an idle core holds a lease besides the pad's"
            assert g["pages_used"] == self.e.pad_pages + g["snapshot_pages"]


CoreMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
test_core_under_the_policy_oracle = CoreMachine.TestCase


@pytest.mark.parametrize("pack", [0, 2])
@pytest.mark.parametrize("target", ["toy-paged", "toy-stateful-spec"])
def test_a_pipeline_may_launch_before_committing(target, pack):
    """Two requests' steps launched before either commits give the same answers as one at a time."""
    e, _ = engine(target, 64 * 16, 0, 4, chunk=16, pack=pack)
    core = Core(e)
    man = json.load(open(f"manifests/toy/{target}.json"))
    sinks = []
    for ids in (list(BASE[0]), list(BASE[2])):
        sink: list = []
        core.submit(Request(f"r{len(sinks)}", ids, 12, e.rows, sink.append))
        sinks.append((ids, sink))
    core.admit()
    while core.running:
        plan = core.schedule()
        flights = [core.launch(w) for w in plan.works if w.kind == "prefill"]
        flying = {id(r) for f in flights for r in f.work.reqs}
        again = [r for call in core.schedule().prefill for r, _ in call]
        assert not [r for r in again if id(r) in flying], "a request in flight was scheduled again"
        for f in flights:
            core.commit(f)
        for w in plan.works:
            if w.kind != "prefill":
                core.commit(core.launch(w))
    for ids, sink in sinks:
        tokens = [t for u in sink for t in u.tokens]
        want = tm.generate(ids, 12, man)
        assert tokens[: len(want)] == want and len(tokens) - len(want) in (0, 1)


def _two_prompts(e, core, m=4):
    sinks = []
    for ids in (list(BASE[0]), list(BASE[2])):
        sink: list = []
        core.submit(Request(f"r{len(sinks)}", ids, m, e.rows, sink.append))
        sinks.append(sink)
    core.admit()
    return sinks


def test_packed_prefill_plans_one_call_within_the_chunk():
    """Packed, one prefill call per iteration carries the oldest prompts' next rows (the older one
    first and whole before the younger gets any), at most the chunk's rows and the call's sequences;
    unpacked, one call per prompt within the same chunk budget. `prefill_calls` counts calls."""
    chunk = 50  # BASE[0] is 41 tokens: the call gives it all, then BASE[2] the rest of the chunk
    e, _ = engine("toy-paged", 64 * 16, 0, 4, chunk=chunk, pack=3)
    core = Core(e)
    _two_prompts(e, core)
    plan = core.schedule()
    fed0 = len(BASE[0]) - 1  # toy-paged's prefill does not emit: it stops one token short
    assert [[(r.id, n) for r, n in call] for call in plan.prefill] == [[("r0", fed0), ("r1", chunk - fed0)]]
    (work, *_) = plan.works
    assert (work.kind, [r.id for r in work.reqs], work.ns) == ("prefill", ["r0", "r1"], [fed0, chunk - fed0])
    core.run(plan)
    assert core.counters["prefill_calls"] == 1 and core.counters["prefill_tokens"] == chunk

    e, _ = engine("toy-paged", 64 * 16, 0, 4, chunk=chunk, pack=0)
    core = Core(e)
    _two_prompts(e, core)
    plan = core.schedule()
    assert [[(r.id, n) for r, n in call] for call in plan.prefill] == [[("r0", fed0)], [("r1", chunk - fed0)]]
    core.run(plan)
    assert core.counters["prefill_calls"] == 2 and core.counters["prefill_tokens"] == chunk


def test_a_held_partial_call_waits_and_a_full_one_goes():
    """A runtime whose `hold_partial` says hold (a pipeline full of items) gets no packed prefill
    call fewer rows than the chunk; a full call goes regardless, and without the hold the partial one
    goes. The answers are the reference's either way."""
    e, _ = engine("toy-paged", 64 * 16, 0, 4, chunk=2048, pack=3)
    holds = []
    e.runtime.hold_partial = lambda: holds.append(1) or len(holds) <= 2
    core = Core(e)
    sinks = _two_prompts(e, core)
    assert core.schedule().prefill == [] and core.schedule().prefill == [], "a partial call was not held"
    assert core.schedule().prefill, "the hold lifted and nothing was planned"
    while core.running:
        core.run(core.schedule())
    man = json.load(open("manifests/toy/toy-paged.json"))
    for ids, sink in zip((BASE[0], BASE[2]), sinks):
        tokens = [t for u in sink for t in u.tokens]
        want = tm.generate(list(ids), 4, man)
        assert tokens[: len(want)] == want

    e, _ = engine("toy-paged", 64 * 16, 0, 4, chunk=8, pack=3)
    e.runtime.hold_partial = lambda: True
    core = Core(e)
    _two_prompts(e, core)
    assert [n for _, n in core.schedule().prefill[0]] == [8], "a full call was held"
