"""The float toy's kernel module (`toy-float`): `toyf_predict` for the CPU (numba) and CUDA.

A float manifest names two modules: `toy` (toy.kernels) for the exact `write`, and `toyf` (this
one) for the predict that turns the state into bf16 logits (toy/model.py, "the float toy", gives
the arithmetic and the reference order). `build_hash({"block": B})` covers this module's sources
and the integer toy kernels' sources it imports, and the build parameters.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from pathlib import Path

_HERE = Path(__file__).parent
SOURCES = (_HERE / "cpu.py", _HERE / "cuda.py", _HERE.parent / "kernels" / "cpu.py", _HERE.parent / "kernels" / "cuda.py")
ENTRIES = ("toyf_predict",)


def build_hash(params: dict) -> str:
    h = hashlib.sha256()
    for path in SOURCES:
        if path.exists():
            name = path.relative_to(_HERE.parent).as_posix()
            h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(json.dumps(params, sort_keys=True).encode())
    return h.hexdigest()


def entry(backend: str, name: str):
    """The launchable kernel `name` for `backend` ("cpu" or "gpu"): `fn(grid, block, *args)`."""
    if name not in ENTRIES:
        raise KeyError(f"toy.float_kernels has no entry {name!r} (it has {', '.join(ENTRIES)})")
    mod = importlib.import_module(f"{__name__}.{'cpu' if backend == 'cpu' else 'cuda'}")
    return getattr(mod, name)


def cuda_constants():
    """The CUDA source's constants without importing numba.cuda (tests compare them to the model's)."""
    import ast
    import types

    values = {}
    for node in ast.parse((_HERE / "cuda.py").read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("VOCAB", "BANKS", "BIAS_EXP", "EOS_TOP", "EOS_LOW"):
                values[name] = ast.literal_eval(node.value)
            elif name == "BIAS_SALT":  # U(0x...)
                values[name] = ast.literal_eval(node.value.args[0])
    return types.SimpleNamespace(**values)
