"""The skip every GPU test module starts with: `skip_without_gpu()` at its top skips the whole module
cleanly where cupy is missing, sees no CUDA device, or numba.cuda cannot launch on it; where it
returns, cupy is imported and `runtime.gpu` (imported before numba.cuda, as its docstring asks) works."""

from __future__ import annotations

import pytest


def skip_without_gpu():
    """Skip the calling module unless a GPU can run the backend; returns the cupy module."""
    cp = pytest.importorskip("cupy")
    try:
        devices = cp.cuda.runtime.getDeviceCount()
    except Exception:  # no driver: cupy imports but cannot talk to a device
        devices = 0
    if devices < 1:
        pytest.skip("no CUDA device visible to cupy", allow_module_level=True)
    from runtime import gpu

    if not gpu.gpu_available():
        pytest.skip("numba.cuda cannot launch on the device", allow_module_level=True)
    return cp
