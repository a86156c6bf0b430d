"""Reproducers of the hostile-load findings (issue 11), each shown gone.

2. The scheduler never blocks on its inbox while its queue holds work it could admit (it used to
   idle 1 s at every hand-off on a pool that fits one request at a time).
"""

from __future__ import annotations

import threading

from conftest import oracle
from serve.engine import Options, build
from serve.request import Request
from serve.scheduler import Scheduler


def test_scheduler_never_waits_with_admissible_work():
    """Property: every blocking read of the scheduler's inbox happens with an empty queue; on a pool
    that fits one request at a time, six queued requests are each answered exactly."""
    target = "toy-paged"
    engine = build(target, Options(capacity=160, backend="cpu"))
    sched = Scheduler(engine)
    blocked_with: list[int] = []
    get = sched.inbox.get

    def watched_get(block=True, timeout=None):
        if block:
            blocked_with.append(len(sched.waiting))
        return get(block, timeout)

    sched.inbox.get = watched_get
    n, prompt_len, max_tokens = 6, 100, 16  # room 116: two never fit in 160 less the pad
    done = [threading.Event() for _ in range(n)]
    got: list[list[int]] = [[] for _ in range(n)]
    prompts = [[(i * 7 + k) % 256 for k in range(prompt_len)] for i in range(n)]

    def sender(i):
        def send(update):
            got[i].extend(update.tokens)
            if update.done is not None:
                done[i].set()
        return send

    for i in range(n):
        sched.submit(Request(sched.name(), prompts[i], max_tokens, engine.rows, sender(i)))
    sched.start()
    try:
        for ev in done:
            assert ev.wait(120), "a request was never answered"
    finally:
        sched.stop()
        sched.join(30)
    assert max(sched.counters.values.get("requests", 0), 0) == n
    assert [w for w in blocked_with if w] == [], f"blocked on the inbox with {blocked_with} queued"
    for i in range(n):
        assert got[i] == oracle(target, prompts[i], max_tokens), f"request {i}"
