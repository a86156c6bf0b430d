"""The pipeline's transport seam: messages keep kind, header and arrays exactly; arrays arrive as
views of the received frames; a receive with nothing to read returns None at its deadline."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from serve.pipeline.transport import Message, ZmqWire, decode, encode


def _arrays():
    rng = np.random.default_rng(7)
    return {
        "act": rng.integers(-(2**62), 2**62, size=(5, 8), dtype=np.int64),
        "u8": rng.integers(0, 255, size=33, dtype=np.uint8),
        "empty": np.zeros((0, 8), np.int64),
        "f32": rng.standard_normal((2, 3, 4)).astype(np.float32),
    }


def test_encode_decode_keeps_everything():
    """kind, header (nested lists and None) and every array's dtype, shape and bytes survive."""
    head = {"item": 3, "cells": [[[1, 2], None, [5, 6, 7], 16]], "plans": [["copy", [[1, 2]], None]]}
    arrays = _arrays()
    got = decode(encode(Message("item", head, arrays)))
    assert got.kind == "item" and got.head == head
    assert set(got.arrays) == set(arrays)
    for name, a in arrays.items():
        b = got.arrays[name]
        assert b.dtype == a.dtype and b.shape == a.shape and np.array_equal(a, b), name


def test_arrays_travel_as_their_own_frames_without_copy():
    """encode hands out views of the arrays (no copy); decode views the frames it was given."""
    a = np.arange(64, dtype=np.int64)
    frames = encode(Message("item", {}, {"a": a}))
    assert len(frames) == 2
    assert np.shares_memory(np.frombuffer(frames[1], np.int64), a)
    raw = bytearray(frames[1])
    got = decode([frames[0], raw])
    assert np.shares_memory(got.arrays["a"], np.frombuffer(raw, np.int64))


def test_a_frame_count_that_disagrees_is_an_error():
    frames = encode(Message("item", {}, {"a": np.arange(3)}))
    with pytest.raises(ValueError, match="names 1 arrays but carries 0 frames"):
        decode(frames[:1])


def test_zmq_wire_round_trip_and_deadline():
    """A PUSH/PULL pair carries a message whole; an empty receive returns None, not forever."""
    ctx = zmq.Context()
    try:
        pull = ZmqWire.make(ctx, zmq.PULL, bind="tcp://127.0.0.1:*")
        push = ZmqWire.make(ctx, zmq.PUSH, connect=pull.address)
        big = np.arange(1 << 18, dtype=np.int64)
        push.send(Message("item", {"item": 1}, {"act": big}))
        got = pull.recv(10.0)
        assert got is not None and got.head == {"item": 1} and np.array_equal(got.arrays["act"], big)
        t0 = time.monotonic()
        assert pull.recv(0.2) is None
        assert time.monotonic() - t0 < 5.0
        push.close()
        pull.close()
    finally:
        ctx.term()


def test_router_addresses_peers_and_refuses_unknown_ones():
    """A ROUTER tags what it receives with the sender and sends only to a peer it knows."""
    ctx = zmq.Context()
    try:
        router = ZmqWire.make(ctx, zmq.ROUTER, bind="tcp://127.0.0.1:*")
        dealer = ZmqWire.make(ctx, zmq.DEALER, connect=router.address, identity=b"s1")
        dealer.send(Message("hello", {"stage": 1}))
        got = router.recv(10.0)
        assert got.sender == b"s1" and got.kind == "hello"
        router.send(Message("table", {"pages": 4}), to=b"s1")
        assert dealer.recv(10.0).head == {"pages": 4}
        with pytest.raises(ValueError, match="needs `to`"):
            router.send(Message("hb"))
        with pytest.raises(zmq.ZMQError):
            router.send(Message("hb"), to=b"nobody")
        for w in (dealer, router):
            w.close()
    finally:
        ctx.term()
