"""A stand-in, not SGLang's sgl-kernel: PyPI's sgl-kernel is CUDA-only (its common_ops needs libnvrtc.so.12) and
its CPU build (sgl-kernel/pyproject_cpu.toml) needs the SGLang git tree, not reachable from the project's CPU machine. This module
only lets `import sgl_kernel` succeed; any op called raises, naming itself, so we learn which CPU ops a
tiny model's serving path really calls."""
__version__ = "0.0.0+kern-stand-in"


class _Missing:
    def __init__(self, name):
        self._name = name

    def __call__(self, *a, **k):
        raise NotImplementedError(f"sgl_kernel.{self._name}: no CPU sgl-kernel here (examples/sglang_toy/sgl_shim)")

    def __getattr__(self, attr):
        return _Missing(f"{self._name}.{attr}")


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Missing(name)
