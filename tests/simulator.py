"""Run a test module's `_simulate()` in a subprocess under numba's CUDA simulator.

The simulator is chosen when numba.cuda is first imported, hence the subprocess. Its block manager
polls its threads in a busy loop, so under CPython's default 5 ms switch interval each simulated
`syncthreads` waits out whole intervals; at 0.1 ms the same run takes a fifth of the time (17 s ->
3.6 s for tests/test_gpu_sim.py on a 2-core box). The interval changes only how often threads
switch, never what they compute.

One race of the simulator's own is closed here (`atomic_shared_arrays`): it allocates a block's
shared array when the first of its threads reaches the line, with a look-up and then a store into a
dict, so two threads that both look before either stores each get an array of their own, and the
block's threads no longer share it (CI saw tests/test_gpu_sim_layers' block reduction lose terms; a
kernel summing its threads' ids through a shared array got a wrong sum in 1 block of 200 at a 1 us
switch interval, and none of 2,000 with the allocation under a lock).

And a second (`copied_globals_swap`): before each simulated call of a kernel or device function it
swaps the fake `cuda` module into the function's module globals, finding the names to swap by
iterating that dict while other simulated threads run; CI once saw "dictionary changed size during
iteration" there (tests/test_gpu_sim.py, a device function's first calls from 96 threads). The names
are now found in a copy of the dict, taken at once under the interpreter lock; the swap is numba's.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SWITCH_INTERVAL_S = 1e-4


def simulate(module: str, timeout: float = 300) -> None:
    """Run `module._simulate()` simulated; assert it exited 0 and printed "simulated: all equal"."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONWARNINGS="ignore")
    code = (f"import sys; sys.setswitchinterval({SWITCH_INTERVAL_S}); from tests.simulator import "
            f"atomic_shared_arrays, copied_globals_swap; atomic_shared_arrays(); copied_globals_swap(); "
            f"from {module} import _simulate; _simulate()")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "simulated: all equal" in r.stdout, r.stdout[-3000:]


def atomic_shared_arrays() -> None:
    """The simulator's `cuda.shared.array`, its allocation under a lock: one array per block and
    source line, whichever thread of the block gets there first (as numba's own, which keys the
    array by its caller's file and line, but looks up and stores without a lock)."""
    import threading

    import numpy as np
    from numba.core import types
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support

    lock = threading.Lock()
    dynamic = kernelapi.FakeCUDAShared.array

    def array(self, shape, dtype):
        if shape == 0:
            return dynamic(self, shape, dtype)  # dynamic shared memory: one buffer, nothing allocated
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        with lock:
            got = self._allocations.get(key)
            if got is None:
                got = self._allocations[key] = np.empty(shape, dtype)
        return got

    kernelapi.FakeCUDAShared.array = array


def copied_globals_swap() -> None:
    """The simulator's `swapped_cuda_module` (the fake `cuda` module in a function's globals for the
    length of a call, as numba's), its names found in a copy of the globals: iterating the live dict
    raised when another simulated thread changed its size meanwhile."""
    from contextlib import contextmanager

    from numba.cuda.simulator import kernel, kernelapi

    @contextmanager
    def swapped_cuda_module(fn, fake_cuda_module):
        from numba import cuda

        fn_globs = fn.__globals__
        orig = {k: v for k, v in fn_globs.copy().items() if v is cuda}  # the copy: one C call, under the GIL
        fn_globs.update(dict.fromkeys(orig, fake_cuda_module))
        try:
            yield
        finally:
            fn_globs.update(orig)

    kernelapi.swapped_cuda_module = kernel.swapped_cuda_module = swapped_cuda_module
