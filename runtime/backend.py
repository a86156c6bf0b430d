"""Backends: where buffers live and kernels run. The runtime talks to one through this seam.

    Backend          the interface (one per device kind)
    CpuBackend       numpy arrays, numba njit kernels
    KernelError      a kernel that failed to compile or run, with the entry that failed
    graphed          run a step's work as a captured graph per key (plain first, captured second)
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import numpy as np

from kern.errors import KernError
from runtime.host_arena import ChunkedArena, spans


class KernelError(KernError, RuntimeError):
    """A kernel failed to compile or run; the message names the op and entry."""


class Backend:
    """Memory and launches for one device. Arrays are flat; `view` reinterprets bytes."""

    name = "abstract"

    def zeros(self, nbytes: int) -> Any:
        raise NotImplementedError

    def host_zeros(self, nbytes: int, chunk: int | None = None) -> Any:
        """Host-tier memory (pinned on a GPU): one array, or with `chunk` a `ChunkedArena` of pieces of
        that many bytes (`kern serve --host-chunk-bytes`), taken as they are first written."""
        if chunk is None:
            return np.zeros(nbytes, np.uint8)
        return ChunkedArena(nbytes, lambda n: np.zeros(n, np.uint8), chunk)

    def view(self, arr: Any, dtype: str) -> Any:
        return arr.view(np.dtype(_NP[dtype]))

    def upload(self, dst: Any, src: np.ndarray) -> None:
        raise NotImplementedError

    def download(self, src: Any, n: int) -> np.ndarray:
        raise NotImplementedError

    def copy(self, dst: Any, dst_off: int, src: Any, src_off: int, nbytes: int) -> None:
        """Byte copy between any two u8 arrays of this backend or the host tier."""
        raise NotImplementedError

    def pinned(self, nbytes: int) -> np.ndarray:
        """Host memory a device copy may land in without waiting (pinned on a GPU), zeroed."""
        return np.zeros(nbytes, np.uint8)

    def download_start(self, src: Any, nbytes: int, landing: np.ndarray) -> Any:
        """Start copying `nbytes` of u8 device array `src` into `landing` (from `pinned`) after the work
        issued so far; returns what `download_wait` waits on. The CPU copies at once."""
        landing[:nbytes] = src[:nbytes]
        return None

    def download_wait(self, done: Any) -> None:
        """Block until the copy `download_start` returned `done` for has landed."""

    def zero(self, arr: Any, off: int, nbytes: int) -> None:
        raise NotImplementedError

    def kernel(self, module: Any, entry: str) -> Callable:
        return module.entry(self.name, entry)

    def launch(self, fn: Callable, grid: int, block: int, args: list) -> None:
        raise NotImplementedError

    def synchronize(self) -> None:
        pass

    def forget(self, arr: Any) -> None:
        """Drop whatever this backend keeps of `arr` (so freeing it frees its memory)."""

    # -- timing and graphs (a backend that cannot capture returns None and runs every step plainly) --

    def mark(self) -> Any:
        """A point on the device's timeline (the CPU runs kernels as they are issued: a clock)."""
        import time

        return time.perf_counter()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Device time between two marks; call after the work between them has finished."""
        return 1000.0 * (end - start)

    def capture(self, fn: Callable[[], None]) -> Any:
        """Record `fn`'s launches as a replayable graph without running them, or None if this
        backend has no graphs."""
        return None

    def replay(self, graph: Any) -> None:
        raise NotImplementedError


_NP = {"i32": "int32", "i64": "int64", "u8": "uint8", "f32": "float32", "u64": "uint64", "bf16": "uint16"}


class CpuBackend(Backend):
    name = "cpu"

    def zeros(self, nbytes: int) -> np.ndarray:
        return np.zeros(nbytes, np.uint8)

    def upload(self, dst: np.ndarray, src: np.ndarray) -> None:
        if _chunked(dst):
            dst.write(0, src)
        else:
            dst[: src.size] = src

    def download(self, src: np.ndarray, n: int) -> np.ndarray:
        return src.read(0, n) if _chunked(src) else np.array(src[:n])

    def copy(self, dst, dst_off, src, src_off, nbytes) -> None:
        if _chunked(dst) or _chunked(src):  # the host tier in pieces: a run per piece, as on a GPU
            for d, d_off, s, s_off, n in spans(dst, dst_off, src, src_off, nbytes):
                d[d_off : d_off + n] = s[s_off : s_off + n]
            return
        dst[dst_off : dst_off + nbytes] = src[src_off : src_off + nbytes]

    def zero(self, arr, off, nbytes) -> None:
        if _chunked(arr):
            arr.fill_zero(off, nbytes)
        else:
            arr[off : off + nbytes] = 0

    def launch(self, fn, grid, block, args) -> None:
        fn(grid, block, *args)


def _chunked(arr: Any) -> bool:
    return type(arr) is ChunkedArena  # on the step's uploads: one type test, no import


def graphed(backend: "Backend", graphs: dict, warm: set, key, run: Callable[[], Any], enabled: bool) -> None:
    """Run `run` as the graph of `key`: a key's first use runs plainly (it loads the kernels and sizes
    their scratch); its second is captured and then replayed, as is every later one. With graphs off,
    a backend without them, or a capture that failed (`graphs[key]` None), it runs plainly for good."""
    if not enabled or graphs.get(key, 0) is None:
        run()
        return
    g = graphs.get(key)
    if g is None:
        if key not in warm:
            warm.add(key)
            run()
            return
        try:
            g = backend.capture(run)
        except Exception:  # a launch that cannot be captured: this key runs plainly
            g = None
        graphs[key] = g
        if g is None:
            run()
            return
    backend.replay(g)


@contextlib.contextmanager
def map_kernel_exceptions(op: str, entry: str):
    """Translate whatever a kernel raises into a KernelError naming where it happened."""
    try:
        yield
    except KernelError:
        raise
    except Exception as exc:  # numba typing errors, cupy/CUDA errors, bad arguments
        raise KernelError(f"op {op!r} (entry {entry}): {type(exc).__name__}: {exc}") from exc
