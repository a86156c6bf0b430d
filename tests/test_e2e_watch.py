"""The watch (e2e/watch.py) calls a request hung only when the scheduler answers /stats and makes no
step while the request stays unanswered; a busy scheduler (a long step: /stats does not answer), a
scheduler making steps for others, and an answer that arrives late are never called hangs."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest

from e2e.watch import Hung, Watch


def watch(stats) -> Watch:
    w = Watch("http://127.0.0.1:1", "/tmp/server.log", still_s=0.3, after_s=0.05)
    w._stats = stats  # what the server's /stats says at each poll
    return w


def idle(steps: int = 7, waiting=("req-3",)):
    return lambda: {"counters": {"steps": steps}, "gauges": {"running": 0, "waiting": len(waiting), "leases": 1},
                    "queue": {"running": [], "waiting": list(waiting)}}


def never() -> concurrent.futures.Future:
    return concurrent.futures.Future()


def later(value, after_s: float) -> concurrent.futures.Future:
    fut: concurrent.futures.Future = concurrent.futures.Future()
    threading.Timer(after_s, lambda: fut.set_result(value)).start()
    return fut


def test_an_idle_scheduler_with_the_request_unanswered_is_a_hang_naming_it():
    t0 = time.monotonic()
    with pytest.raises(Hung) as exc:
        watch(idle()).wait(never(), "request req-3 (5 prompt tokens, max_tokens 8)", None)
    assert time.monotonic() - t0 < 3
    note = str(exc.value)
    assert "request req-3 (5 prompt tokens" in note and "waiting=1 ['req-3']" in note
    assert "steps stayed at 7" in note and "/tmp/server.log" in note


def test_steps_advancing_for_others_is_not_a_hang():
    n = iter(range(10**6))
    fut = later("answer", 1.5)
    assert watch(lambda: {"counters": {"steps": next(n)}, "gauges": {}}).wait(fut, "r", None) == "answer"


def test_a_scheduler_busy_in_a_long_step_is_not_a_hang():
    # a step in progress (numba compiling, a loaded box): /stats waits behind it and the poll gives up
    fut = later("answer", 1.5)
    assert watch(lambda: None).wait(fut, "r", None) == "answer"


def test_an_answer_that_arrives_is_returned_and_an_error_raised():
    assert watch(idle()).wait(later("fast", 0.01), "r", None) == "fast"
    fut: concurrent.futures.Future = concurrent.futures.Future()
    fut.set_exception(ValueError("the request's own error"))
    with pytest.raises(ValueError):
        watch(idle()).wait(fut, "r", None)


def test_a_server_that_died_says_so_before_the_hang():
    def dead():
        raise RuntimeError("server exited with code 101")

    with pytest.raises(RuntimeError, match="code 101"):
        watch(idle()).wait(never(), "r", None, alive=dead)


def test_an_answer_without_the_kern_fields_is_untold():
    """A response that does not say its tier, snapshot and wake in `kern` names what it lacks."""
    from e2e.client import Answer

    told = {"kern": {"request_id": "req-0", "cache_tier": None, "snapshot": "kept", "woken": False}}
    assert Answer([], None, [], 0, "length", "req-0", raw=told).untold() == []
    assert Answer([], None, [], 0, "length", "req-0", raw={"kern": {"request_id": "req-0", "snapshot": "kept"}}
                  ).untold() == ["cache_tier", "woken"]
    assert Answer([], None, [], 0, "length", "req-0", raw={}).untold() == ["request_id", "cache_tier", "snapshot",
                                                                           "woken"]
