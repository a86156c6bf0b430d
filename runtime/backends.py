"""Which backend: `make_backend("cpu" | "gpu" | "auto")`. Apart from `runtime/backend.py` (the interface
and the CPU backend), so the GPU backend, which builds on that interface, is imported only from here and
never imports back (no import circle)."""

from __future__ import annotations

from runtime.backend import Backend, CpuBackend, KernelError

__all__ = ["make_backend"]


def make_backend(name: str, wait: str = "auto") -> Backend:
    """`cpu`, `gpu`, or `auto` (the GPU when cupy sees one). On a GPU, `wait` is how this process's
    threads wait on it (`runtime.gpu.set_wait`: spin, yield, blocking), set before its context is made;
    "auto" leaves CUDA's own choice (spin where the CPUs outnumber the contexts)."""
    if name == "cpu":
        return CpuBackend()
    if name in ("gpu", "auto"):
        try:
            from runtime.gpu import GpuBackend, gpu_available, set_wait
        except ImportError as exc:
            if name == "auto":
                return CpuBackend()
            raise KernelError(f"--backend gpu: the GPU backend cannot load: {exc}") from exc
        if gpu_available():
            if wait != "auto":  # the driver is up, no context made yet (neither check makes one)
                try:
                    set_wait(wait)
                except RuntimeError as exc:
                    raise KernelError(f"--gpu-wait {wait}: {exc}") from None
            return GpuBackend()
        if name == "auto":
            return CpuBackend()
        raise KernelError("--backend gpu: no CUDA GPU is visible (cupy sees none)")
    raise ValueError(f"unknown backend {name!r} (cpu, gpu or auto)")
