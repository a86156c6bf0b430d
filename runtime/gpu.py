"""The GPU backend: cupy arrays, numba.cuda kernels, pinned host memory (SPEC §5).

    gpu_available()   True when cupy imports, sees a CUDA device, and numba.cuda works
    set_wait(mode)    how the process's threads wait on the GPU (spin, yield, blocking)
    GpuBackend        the Backend on one device

Ordering. Kernels, uploads, downloads, device-to-device copies and zeroing run on the runtime's
stream, in the order the runtime issues them. Host-tier copies (park and wake) run on one transfer
stream for both directions, so a host page reused before an earlier copy landed stays ordered.
Each host copy first waits for the runtime's stream (it reads what the kernels wrote, or overwrites
what they read), and the runtime's stream then waits for the copy, so nothing issued after a park
overwrites its pages before they landed and nothing reads a woken page before it landed, while
the host thread never blocks. `synchronize` drains both streams; `download` drains the runtime's.

Importing this module makes numba.cuda importable under numpy >= 2.5, where numba-cuda 0.30
still reaches for `np.row_stack`: the alias below is the one place that is done. Import this
module before `numba.cuda` (or `toy.kernels.cuda`).
"""

from __future__ import annotations

import os
import threading

import numpy as np

from runtime import host_arena
from runtime.backend import _NP, Backend, KernelError
from runtime.host_arena import ChunkedArena, spans

if not hasattr(np, "row_stack"):  # numpy 2.5 removed it; numba-cuda 0.30 still uses it
    np.row_stack = np.vstack

# Launch arguments are cupy arrays: numba would otherwise synchronize the stream each one names
# (cupy's current stream) at every launch. This backend orders its streams itself.
os.environ.setdefault("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", "0")
os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")  # a decode step's grid is small by design

_SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

try:
    import cupy as cp
except ImportError as exc:  # the CUDA simulator needs no cupy; the backend does
    if not _SIMULATED:
        raise ImportError(f"the GPU backend needs cupy: {exc}") from exc
    cp = None

_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: direction from the pointers (unified addressing)
# A step's uploads (tokens, positions, slots, lengths, changed page-table rows) are small: each goes
# through a pinned staging ring, so its copy is only queued (from pageable memory the driver first
# stages it itself, on the caller's time). When the ring is used up the stream is drained, after
# which every queued copy out of it has landed and it is reused from the start. A small download (the
# step's tokens) lands in pinned memory too and is copied out once the stream has drained.
STAGING_BYTES = 1 << 20
STAGED_MAX = 64 << 10  # an upload this size or under goes through the ring; a larger one (weights) directly

# numba-cuda loads a kernel's module into the context at its first launch, and that is not safe for
# two threads at once ("key already in dictionary"): several runtimes in one process (the servers of
# a host, oracle/host.py) each launch a kernel for the first time under this lock. Keyed by the
# entry and its arguments' types (a new type compiles and loads another specialisation).
_LOAD_LOCK = threading.Lock()
_LOADED: set = set()


def numba_cuda():
    """numba.cuda, with array-interface synchronisation off (see above)."""
    from numba import cuda

    for modname in ("numba.cuda.core.config", "numba.core.config"):
        try:
            mod = __import__(modname, fromlist=["_"])
        except ImportError:
            continue
        if hasattr(mod, "CUDA_ARRAY_INTERFACE_SYNC"):
            mod.CUDA_ARRAY_INTERFACE_SYNC = False
        if hasattr(mod, "CUDA_LOW_OCCUPANCY_WARNINGS"):
            mod.CUDA_LOW_OCCUPANCY_WARNINGS = False
    return cuda


WAITS = {"spin": 0x1, "yield": 0x2, "blocking": 0x4}  # CU_CTX_SCHED_*: how a thread waits on the GPU


def set_wait(mode: str, device: int = 0) -> None:
    """How this process's threads wait on the GPU (a stream's or an event's synchronize), set on the
    device's primary context before it is made: `spin` (CUDA's choice for a process with one
    context and more cores), `yield`, or `blocking` (the thread sleeps until the GPU is done). Raises
    RuntimeError naming the driver's error when the driver refuses."""
    import ctypes

    flags = WAITS[mode]
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise RuntimeError(f"no CUDA driver library: {exc}") from None
    dev = ctypes.c_int()
    set_flags = getattr(cu, "cuDevicePrimaryCtxSetFlags_v2", None) or cu.cuDevicePrimaryCtxSetFlags
    calls = (("cuInit", lambda: cu.cuInit(0)),
             ("cuDeviceGet", lambda: cu.cuDeviceGet(ctypes.byref(dev), device)),
             ("cuDevicePrimaryCtxSetFlags", lambda: set_flags(dev, ctypes.c_uint(flags))))
    for what, call in calls:
        code = call()
        if code != 0:
            raise RuntimeError(f"{what} failed with CUDA error {code}")


def gpu_available() -> bool:
    """True when cupy sees a CUDA device and numba.cuda can launch on it."""
    if cp is None:
        return False
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            return False
        return bool(numba_cuda().is_available())
    except Exception:  # no driver, no device, a broken toolkit: no GPU
        return False


def _pinned_zeros(nbytes: int) -> np.ndarray:
    """`nbytes` of pinned host memory, zeroed (cupy's pinned pool may hand back used memory)."""
    mem = cp.cuda.alloc_pinned_memory(max(nbytes, 1))
    arr = np.frombuffer(mem, np.uint8, nbytes)
    arr[:] = 0
    return arr


def _is_host(arr) -> bool:
    """Host memory (numpy, pinned or not) as opposed to a device array (which exports CAI)."""
    return not hasattr(arr, "__cuda_array_interface__")


def _ptr(arr, off: int) -> int:
    return (arr.ctypes.data if _is_host(arr) else arr.data.ptr) + off


class GpuBackend(Backend):
    name = "gpu"

    def __init__(self, device: int = 0):
        if cp is None:
            raise KernelError("the GPU backend needs cupy")
        self.device = cp.cuda.Device(device)
        self.device.use()
        self.cuda = numba_cuda()
        self.stream = cp.cuda.Stream(non_blocking=True)  # kernels and device work
        self.xfer = cp.cuda.Stream(non_blocking=True)  # host-tier copies, both directions
        self.nb_stream = self.cuda.external_stream(self.stream.ptr)
        self._views: dict[tuple[int, int, str], object] = {}  # numba views of cupy arrays (see _nb)
        self._staging: np.ndarray | None = None  # the pinned staging ring (made at the first small upload)
        self._staged_at = 0  # where the ring's next upload goes
        self._landing: np.ndarray | None = None  # pinned memory small downloads land in (made at the first)
        self._staging_lock = threading.Lock()

    # -- memory ---------------------------------------------------------------------------------

    def zeros(self, nbytes: int):
        with self.stream:
            return cp.zeros(nbytes, cp.uint8)

    def host_zeros(self, nbytes: int, chunk: int | None = None) -> ChunkedArena:
        """Pinned (page-locked) host memory, zeroed, taken a piece at a time as it is first written
        (`runtime/host_arena.py`: pinning the whole tier up front cost a server seconds of its start);
        pieces of `chunk` bytes when given (`kern serve --host-chunk-bytes`), else 32 MiB."""
        return ChunkedArena(nbytes, _pinned_zeros, chunk or host_arena.CHUNK)

    def view(self, arr, dtype: str):
        return arr.view(np.dtype(_NP[dtype]))

    def upload(self, dst, src: np.ndarray) -> None:
        src = np.ascontiguousarray(src)
        if src.dtype != dst.dtype:
            src = src.astype(dst.dtype)
        if _is_host(dst):
            self.xfer.synchronize()
            if isinstance(dst, ChunkedArena):
                dst.write(0, src)
            else:
                dst[: src.size] = src
            return
        n = src.nbytes
        if 0 < n <= STAGED_MAX:
            with self._staging_lock:
                if self._staging is None:
                    self._staging = _pinned_zeros(STAGING_BYTES)
                at = self._staged_at
                if at + n > STAGING_BYTES:
                    self.stream.synchronize()  # every copy out of the ring has landed: start it over
                    at = 0
                self._staging[at : at + n] = src.reshape(-1).view(np.uint8)
                cp.cuda.runtime.memcpyAsync(dst.data.ptr, self._staging.ctypes.data + at, n, _MEMCPY_DEFAULT,
                                            self.stream.ptr)
                self._staged_at = (at + n + 255) & ~255
        elif n:
            # from pageable memory the call returns once `src` is staged, so it may be freed after
            cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.ctypes.data, n, _MEMCPY_DEFAULT, self.stream.ptr)

    def download(self, src, n: int) -> np.ndarray:
        if _is_host(src):
            self.xfer.synchronize()
            return src.read(0, n) if isinstance(src, ChunkedArena) else np.array(src[:n])
        out = np.empty(n, src.dtype)
        if 0 < out.nbytes <= STAGED_MAX:  # a step's tokens: into pinned memory, then copied out once landed
            with self._staging_lock:
                if self._landing is None:
                    self._landing = _pinned_zeros(STAGED_MAX)
                cp.cuda.runtime.memcpyAsync(self._landing.ctypes.data, src.data.ptr, out.nbytes, _MEMCPY_DEFAULT,
                                            self.stream.ptr)
                self.stream.synchronize()
                out.view(np.uint8)[:] = self._landing[: out.nbytes]
            return out
        if n:
            cp.cuda.runtime.memcpyAsync(out.ctypes.data, src.data.ptr, out.nbytes, _MEMCPY_DEFAULT, self.stream.ptr)
        self.stream.synchronize()
        return out

    def pinned(self, nbytes: int) -> np.ndarray:
        return _pinned_zeros(nbytes)

    def download_start(self, src, nbytes: int, landing: np.ndarray):
        """The copy goes on the runtime's stream after the work issued so far; an event marks its landing."""
        if nbytes:
            cp.cuda.runtime.memcpyAsync(landing.ctypes.data, src.data.ptr, nbytes, _MEMCPY_DEFAULT, self.stream.ptr)
        return self.stream.record()

    def download_wait(self, done) -> None:
        done.synchronize()

    def copy(self, dst, dst_off: int, src, src_off: int, nbytes: int) -> None:
        """Byte copy: device to device on the runtime's stream; to or from the host tier on the
        transfer stream, ordered both ways against the runtime's stream (module docstring)."""
        if nbytes <= 0:
            return
        if isinstance(dst, ChunkedArena) or isinstance(src, ChunkedArena):  # a run per piece
            for d, d_off, s, s_off, n in spans(dst, dst_off, src, src_off, nbytes):
                self.copy(d, d_off, s, s_off, n)
            return
        hd, hs = _is_host(dst), _is_host(src)
        if hd and hs:
            self.xfer.synchronize()
            dst[dst_off : dst_off + nbytes] = src[src_off : src_off + nbytes]
            return
        if not hd and not hs:
            d, s = _ptr(dst, dst_off), _ptr(src, src_off)
            if d != s and d < s + nbytes and s < d + nbytes:  # overlapping ranges: through a temporary
                with self.stream:
                    tmp = cp.empty(nbytes, cp.uint8)
                cp.cuda.runtime.memcpyAsync(tmp.data.ptr, s, nbytes, _MEMCPY_DEFAULT, self.stream.ptr)
                s = tmp.data.ptr
            if d != s:
                cp.cuda.runtime.memcpyAsync(d, s, nbytes, _MEMCPY_DEFAULT, self.stream.ptr)
            return
        self.xfer.wait_event(self.stream.record())
        cp.cuda.runtime.memcpyAsync(_ptr(dst, dst_off), _ptr(src, src_off), nbytes, _MEMCPY_DEFAULT, self.xfer.ptr)
        self.stream.wait_event(self.xfer.record())

    def zero(self, arr, off: int, nbytes: int) -> None:
        if nbytes <= 0:
            return
        if _is_host(arr):
            self.xfer.synchronize()
            if isinstance(arr, ChunkedArena):
                arr.fill_zero(off, nbytes)
            else:
                arr[off : off + nbytes] = 0
            return
        cp.cuda.runtime.memsetAsync(arr.data.ptr + off, 0, nbytes, self.stream.ptr)

    # -- kernels --------------------------------------------------------------------------------

    def kernel(self, module, entry: str):
        return module.entry(self.name, entry)

    def launch(self, fn, grid: int, block: int, args: list) -> None:
        nb = [self._nb(a) for a in args]
        key = (fn, *[(a.dtype.str, a.ndim, a.is_c_contiguous()) if hasattr(a, "is_c_contiguous") else type(a)
                     for a in nb])
        if key in _LOADED:
            fn(grid, block, *nb, stream=self.nb_stream)
            return
        with _LOAD_LOCK:  # a first launch loads its module into the context: one thread at a time
            fn(grid, block, *nb, stream=self.nb_stream)
            _LOADED.add(key)

    def _nb(self, a):
        """A numba view of a cupy array, made once per (address, length, dtype) and kept. numba
        would otherwise take each cupy argument through DLPack at every launch, which makes its
        stream wait on cupy's current one: host time on every launch, and a dependency on
        uncaptured work that breaks a graph capture."""
        if cp is None or not isinstance(a, cp.ndarray):
            return a
        key = (a.data.ptr, a.size, a.dtype.str)
        v = self._views.get(key)
        if v is None:
            v = self._views[key] = self.cuda.from_cuda_array_interface(a.__cuda_array_interface__, owner=a, sync=False)
        return v

    def forget(self, a) -> None:
        """Drop the numba views made of cupy array `a`'s bytes, so freeing `a` frees its memory
        (a load-time source, staged only while derive programs read it)."""
        lo, hi = a.data.ptr, a.data.ptr + a.nbytes
        for key in [k for k in self._views if lo <= k[0] < hi]:
            del self._views[key]

    def synchronize(self) -> None:
        self.stream.synchronize()
        self.xfer.synchronize()

    # -- timing and graphs ----------------------------------------------------------------------

    def mark(self):
        return self.stream.record()

    def elapsed_ms(self, start, end) -> float:
        end.synchronize()
        return float(cp.cuda.get_elapsed_time(start, end))

    def capture(self, fn):
        """Capture `fn`'s launches on the runtime's stream as a CUDA graph (relaxed mode, so a lazy
        module load inside it is not an error). The work is recorded, not run: replay it to run."""
        self.stream.begin_capture()  # cupy's default mode is relaxed
        try:
            fn()
        except BaseException:
            try:
                self.stream.end_capture()
            except Exception:  # the capture was already invalidated by what failed
                pass
            raise
        return self.stream.end_capture()

    def replay(self, graph) -> None:
        graph.launch(self.stream)
