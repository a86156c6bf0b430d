"""The NCCL path behind the pipeline's transport seam.

On any machine: a device array's bytes leave the message's frames and go through the communicator
in header order, arriving with their dtype and shape; host arrays and the header travel as before;
NVLink multicast is off in the environment it sets. With two GPUs (and cupy's NCCL): two processes,
one rank each, move an activation GPU to GPU (skipped otherwise: NCCL refuses two ranks on one GPU)."""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest
import zmq

from serve.pipeline.nccl import NcclWire, nccl_available, nccl_env
from serve.pipeline.transport import Message, ZmqWire


class FakeDevice:
    """A 'device' array: host memory that says it lives on a GPU (has __cuda_array_interface__)."""

    def __init__(self, arr: np.ndarray):
        self.host = np.ascontiguousarray(arr)
        self.dtype, self.shape, self.size = self.host.dtype, self.host.shape, self.host.size
        self.flags = SimpleNamespace(c_contiguous=True)
        self.data = SimpleNamespace(ptr=self.host.ctypes.data)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.data.ptr, False), "version": 3}


class FakeComm:
    """Two ends of one link: what a send posts, the peer's next receive takes, byte for byte."""

    def __init__(self, link: deque):
        self.link = link
        self.calls = []

    def send(self, ptr, count, dtype, peer, stream):
        size = count * np.dtype(_DT[dtype]).itemsize
        self.link.append((ctypes.string_at(ptr, size), dtype))
        self.calls.append(("send", count, dtype, peer))

    def recv(self, ptr, count, dtype, peer, stream):
        data, sent_as = self.link.popleft()
        assert sent_as == dtype and len(data) == count * np.dtype(_DT[dtype]).itemsize
        ctypes.memmove(ptr, data, len(data))
        self.calls.append(("recv", count, dtype, peer))


_DT = {0: "int8", 1: "uint8", 2: "int32", 3: "uint32", 4: "int64", 5: "uint64", 6: "float16", 7: "float32", 8: "float64"}


def test_device_arrays_go_through_the_communicator_and_host_arrays_as_frames():
    ctx = zmq.Context()
    link: deque = deque()
    try:
        pull = ZmqWire.make(ctx, zmq.PULL, bind="tcp://127.0.0.1:*")
        push = ZmqWire.make(ctx, zmq.PUSH, connect=pull.address)
        stream = SimpleNamespace(ptr=0)
        a, b = FakeComm(link), FakeComm(link)
        tx = NcclWire(push, a, peer=1, stream=stream)
        rx = NcclWire(pull, b, peer=0, stream=stream, empty=lambda shape, dt: FakeDevice(np.zeros(shape, dt)))
        act = np.arange(40, dtype=np.int64).reshape(5, 8) * 0x1E3779B97F4A7C1 - (1 << 61)
        logits = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
        table = np.arange(7, dtype=np.int32)
        tx.send(Message("item", {"item": 4}, {"act": FakeDevice(act), "table": table, "logits": FakeDevice(logits)}))
        got = rx.recv(5.0)
        assert got.kind == "item" and got.head == {"item": 4}
        assert np.array_equal(got.arrays["table"], table)  # a host array: a frame, as before
        assert isinstance(got.arrays["act"], FakeDevice) and np.array_equal(got.arrays["act"].host, act)
        assert got.arrays["logits"].host.dtype == np.float32 and np.array_equal(got.arrays["logits"].host, logits)
        assert [c[0] for c in a.calls] == ["send", "send"] and [c[0] for c in b.calls] == ["recv", "recv"]
        assert not link
        # a message with no device arrays carries no NCCL header and posts nothing
        tx.send(Message("stop", {}, {"x": table}))
        got = rx.recv(5.0)
        assert "nccl" not in got.head and len(a.calls) == 2
    finally:
        ctx.destroy(linger=0)


def test_nccl_env_keeps_nvlink_multicast_off():
    env = nccl_env()
    assert env["NCCL_NVLS_ENABLE"] == "0" and os.environ["NCCL_NVLS_ENABLE"] == "0"


def _rank(rank: int, uid: bytes, addr: str, out) -> None:
    import cupy as cp

    from serve.pipeline.nccl import communicator

    cp.cuda.Device(rank).use()
    comm = communicator(uid, 2, rank)
    ctx = zmq.Context()
    if rank == 0:
        wire = NcclWire(ZmqWire.make(ctx, zmq.PUSH, connect=addr), comm, peer=1)
        wire.send(Message("item", {"item": 1}, {"act": cp.arange(64, dtype=cp.int64) * 3}))
        cp.cuda.get_current_stream().synchronize()
    else:
        wire = NcclWire(ZmqWire.make(ctx, zmq.PULL, bind=addr), comm, peer=0)
        got = wire.recv(60.0)
        cp.cuda.get_current_stream().synchronize()
        out.put(cp.asnumpy(got.arrays["act"]).tolist())
    ctx.destroy(linger=0)


@pytest.mark.gpu
@pytest.mark.skipif(not nccl_available(2), reason="needs cupy's NCCL and two GPUs (NCCL refuses two ranks on one GPU)")
def test_an_activation_moves_gpu_to_gpu_over_nccl():
    from serve.pipeline.nccl import unique_id

    uid = unique_id()
    spawn = mp.get_context("spawn")
    out = spawn.Queue()
    addr = "tcp://127.0.0.1:27999"
    procs = [spawn.Process(target=_rank, args=(r, uid, addr, out)) for r in (1, 0)]
    for p in procs:
        p.start()
    try:
        assert out.get(timeout=120) == [3 * i for i in range(64)]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
