"""The front end's sends to its engine core (`serve.client.frontend.send_or_drop`).

A ZeroMQ PUSH socket with no peer blocks a send for good (its queue bound does not apply), and a core
that died is no peer: a request that reached the event loop between the core's death and its reaper
froze the loop, nothing was answered and the server never exited. The properties: with the core gone
(`ended` set) a send returns at once and drops the message; while the reaper has not seen the death yet
it waits for it, and returns when it comes; with a core connected, the message arrives."""

from __future__ import annotations

import threading
import time

import zmq

from serve.client.frontend import send_or_drop


def _push(ctx: zmq.Context, addr: str):
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, 0)
    s.bind(addr)
    return s


def _returns(fn, within: float) -> bool:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(within)
    return not t.is_alive()


def test_a_send_with_no_core_returns_once_the_core_is_known_gone():
    ctx = zmq.Context()
    push = _push(ctx, "inproc://no-core")
    ended = threading.Event()
    ended.set()
    assert _returns(lambda: send_or_drop(push, b"x", ended), 2.0)
    # the reaper sets `ended` a moment after the send began: the send returns then
    later = threading.Event()
    threading.Timer(0.2, later.set).start()
    t0 = time.monotonic()
    assert _returns(lambda: send_or_drop(push, b"y", later), 2.0)
    assert time.monotonic() - t0 >= 0.15
    push.close()
    ctx.term()


def test_a_send_reaches_a_connected_core():
    ctx = zmq.Context()
    push = _push(ctx, "inproc://a-core")
    pull = ctx.socket(zmq.PULL)
    pull.connect("inproc://a-core")
    send_or_drop(push, b"arrive", threading.Event())
    assert pull.poll(2000) and pull.recv() == b"arrive"
    for s in (push, pull):
        s.close(linger=0)
    ctx.term()
