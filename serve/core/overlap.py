"""Overlapped launches (`kern serve --overlap`): the next decode steps go out before the pending ones are committed.

`Core.run` leaves a forward launch of several decode steps *pending* (runtime/multistep.py's `launch`,
its tokens collected at its commit). The next `run` chains onto it: the plan's prefill calls run, then
one launch takes the pending requests that go on (each fed, on the device, the last token its row of the
pending launch emits) and the plan's newly stepping ones (fed from the host), and only then is the
pending launch committed. The host's commit and the next launch's staging thus overlap the device's
steps. A pending request that ends by length in the pending steps, or has an abort waiting, is not
carried on; one that stops (EOS, a stop string) is only known at the commit, so its rows of the launch
just sent are void and dropped at that launch's commit. Their writes lie past every token it fed, in
pages no cached prefix holds, and reach the device before any later use of its freed pages (one stream,
in order).
"""

from __future__ import annotations

from runtime.step import Cell
from serve.core.work import FORWARD, PREFILL, Flight, Work

__all__ = ["chain"]


def chain(core, plan) -> bool:
    """`core`'s pending launch chained (`Core.run`, with `overlap`): run `plan`'s prefill calls; launch
    the next steps of the pending requests that go on (fed on the device) and of the plan's stepping
    ones (fed from the host); then commit the pending launch. False after the prefill calls where that
    batch is empty or over the decode program's groups."""
    prev, k = core.pending, core.decode_steps
    for work in plan.works:
        if work.kind == PREFILL:
            core.commit(core.launch(work))
    gone = set(map(id, core._aborted))  # applied at the pending launch's commit: not carried on
    carry = [r for r in prev.work.reqs if r.stepping and id(r) not in gone and r.max_tokens - len(r.out) > k]
    fresh = [r for r in plan.step if r.stepping]
    batch = carry + fresh
    if not batch or len(batch) > core.step_forward.groups:
        return False
    rows = {id(r): i for i, r in enumerate(prev.work.reqs)}
    cells = [Cell(r.lease.pages, r.lease.slot, [r.anchor], r.pos + k) for r in carry]
    cells += [Cell(r.lease.pages, r.lease.slot, [r.anchor], r.pos) for r in fresh]
    limits = [r.max_tokens - len(r.out) - k for r in carry] + [r.max_tokens - len(r.out) for r in fresh]
    follow = [rows[id(r)] for r in carry] + [-1] * len(fresh)
    program = core.device.protocol.forward(len(cells), 1).program
    core.pending = Flight(Work(FORWARD, batch), [], core._launch(program, cells, limits, follow))
    core.counters.add("batched_steps", len(batch) > 1)
    core.in_flight.update(map(id, fresh))
    core.commit(prev)
    if not any(r.stepping for r in batch):
        core.settle()  # every one of them stopped: nothing waits on the launch but its collection
    return True

