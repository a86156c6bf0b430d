"""Activations device to device over NCCL, behind the pipeline's transport seam.

`NcclWire` wraps a `Wire` (ZeroMQ): a message's kind and header still travel on the wrapped wire,
but its arrays that live on a GPU (cupy arrays) go GPU to GPU through an NCCL communicator, posted
on a stream in the order the header names them; host arrays keep travelling as frames. The header
carries `nccl: [[name, dtype, shape], ...]` so the receiver allocates the buffers, posts the
matching receives in the same order, and hands back cupy arrays.

A pipeline of N stages on N GPUs opens one communicator of N ranks (stage k is rank k, on GPU k
modulo the GPUs given); its unique id is made by the head and handed to every stage in the Table.
NCCL refuses two ranks on one GPU, so stages sharing a GPU keep the plain frames of `ZmqWire`.
NVLink multicast stays off: `nccl_env()` sets NCCL_NVLS_ENABLE=0 for this process and whatever it
starts (a program that uses multicast can take a host's shared GPUs out of service).

    nccl_env()                 the environment NCCL runs under here
    unique_id() -> bytes       a new communicator id (the head makes it)
    communicator(uid, n, rank) this process's rank
    NcclWire(wire, comm, peer) the seam: send(msg) / recv(timeout) as any Wire
"""

from __future__ import annotations

import os

import numpy as np

from serve.pipeline.transport import Message, Wire

__all__ = ["NcclWire", "communicator", "nccl_available", "nccl_env", "unique_id"]

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

_NCCL_TYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
               "float16": 6, "float32": 7, "float64": 8}


def nccl_env() -> dict[str, str]:
    """Set (in this process) and return the variables that keep NVLink multicast off."""
    for k, v in SAFE_ENV.items():
        os.environ[k] = v
    return dict(SAFE_ENV)


def _nccl():
    nccl_env()
    from cupy.cuda import nccl  # imported only here: the CPU-only install has no cupy

    return nccl


def nccl_available(gpus: int = 2) -> bool:
    """True when cupy has NCCL and sees at least `gpus` devices (NCCL needs one GPU per rank)."""
    try:
        import cupy as cp

        _nccl()
        return cp.cuda.runtime.getDeviceCount() >= gpus
    except Exception:  # no cupy, no NCCL build, no driver
        return False


def unique_id() -> bytes:
    """A fresh communicator id, as bytes that travel in a msgpack header."""
    uid = _nccl().get_unique_id()
    return bytes(int(b) & 0xFF for b in uid)


def communicator(uid: bytes, ranks: int, rank: int):
    """This process's rank of the communicator `uid` (blocks until every rank has joined)."""
    nccl = _nccl()
    signed = tuple(b - 256 if b > 127 else b for b in uid)
    return nccl.NcclCommunicator(ranks, signed, rank)


class NcclWire(Wire):
    """A Wire whose GPU arrays go over NCCL to one peer rank; everything else over `wire`."""

    def __init__(self, wire: Wire, comm, peer: int, stream=None, empty=None) -> None:
        self.wire = wire
        self.comm = comm
        self.peer = peer
        self.stream = stream
        self._empty = empty  # (shape, dtype) -> a device array; cupy.empty unless given

    def _stream_ptr(self) -> int:
        if self.stream is not None:
            return self.stream.ptr
        import cupy as cp

        return cp.cuda.get_current_stream().ptr

    def _alloc(self, shape, dtype):
        if self._empty is not None:
            return self._empty(shape, dtype)
        import cupy as cp

        return cp.empty(shape, dtype=dtype)

    def send(self, msg: Message, to: bytes | None = None) -> None:
        host, dev, specs = {}, [], []
        for name, arr in msg.arrays.items():
            if hasattr(arr, "__cuda_array_interface__"):
                specs.append([name, arr.dtype.name, list(arr.shape)])
                dev.append(arr)
            else:
                host[name] = arr
        head = dict(msg.head, nccl=specs) if specs else msg.head
        self.wire.send(Message(msg.kind, head, host), to)
        ptr = self._stream_ptr()
        for arr in dev:  # the peer posts its receives in this same order
            arr = arr if arr.flags.c_contiguous else arr.copy()
            self.comm.send(arr.data.ptr, arr.size, _NCCL_TYPES[arr.dtype.name], self.peer, ptr)

    def recv(self, timeout: float) -> Message | None:
        msg = self.wire.recv(timeout)
        if msg is None or "nccl" not in msg.head:
            return msg
        specs = msg.head.pop("nccl")
        ptr = self._stream_ptr()
        arrays = dict(msg.arrays)
        for name, dtype, shape in specs:
            arr = self._alloc(tuple(shape), np.dtype(dtype))
            self.comm.recv(arr.data.ptr, arr.size, _NCCL_TYPES[arr.dtype.name], self.peer, ptr)
            arrays[name] = arr
        return Message(msg.kind, msg.head, arrays, msg.sender)

    def close(self) -> None:
        self.wire.close()
