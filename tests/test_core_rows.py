"""A running request keeps its row of the batch from step to step (serve/core/core.py's `_leave`).

The runtime keeps its page-table rows between steps by position (runtime/tables.py), so every request
that moves to another row of the forward step costs a rebuild and an upload of its row. The property,
over random lengths, admissions and aborts: between two forward steps, no more requests change rows
than requests left the batch (a finish or an abort moves the last request into the place it left),
and every answer is still the toy model's.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from pyruntime import engine
from serve.core.core import FORWARD, Core
from serve.core.request import EOS, Request
from toy import model as tm

PROMPTS = [list(b"The lighthouse keeper"), list(b"To make a proper risotto"), list(b"A hash map trades")]


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 14), min_size=2, max_size=12), max_seqs=st.integers(2, 6),
       aborts=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 11)), max_size=3),
       target=st.sampled_from(["toy-paged", "toy-stateful"]))
def test_a_running_request_keeps_its_row(lengths, max_seqs, aborts, target):
    e, _ = engine(target, 4096, 0, max_seqs)
    core = Core(e)
    steps: list[list[str]] = []
    launch = core.launch

    def recording(work):
        flight = launch(work)
        if work.kind == FORWARD:
            steps.append([r.id for r in work.reqs])
        return flight

    core.launch = recording
    sinks: dict[str, list] = {}
    reqs = []
    for i, n in enumerate(lengths):
        sinks[f"r{i}"] = sink = []
        req = Request(f"r{i}", PROMPTS[i % len(PROMPTS)] + [i], n, e.rows, sink.append)
        reqs.append(req)
        core.submit(req)
    aborted = set()
    for it in range(400):
        for when, k in aborts:
            if when == it and k < len(reqs) and reqs[k].id not in aborted:
                aborted.add(reqs[k].id)
                core.abort(reqs[k])
        if not (core.waiting or core.running):
            break
        core.admit()
        core.run(core.schedule())
    assert not core.waiting and not core.running
    for before, after in zip(steps, steps[1:]):
        left = set(before) - set(after)
        moved = [r for r in after if r in before and before.index(r) != after.index(r)]
        assert len(moved) <= len(left), (before, after)
    manifest = json.load(open(f"manifests/toy/{target}.json"))
    for req in reqs:
        if req.id not in aborted:
            want = tm.generate(req.ids, req.max_tokens, manifest)
            got = [t for u in sinks[req.id] for t in u.tokens]
            assert got == want + ([EOS] if req.reason == "stop" else []), req.id
