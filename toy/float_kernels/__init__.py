"""The float toy's kernel module (`toy-float`): `toyf_predict` for the CPU (numba) and CUDA.

A float manifest names two modules: `toy` (toy.kernels) for the exact `write`, and `toyf` (this
one) for the predict that turns the state into bf16 logits (toy/model.py, "the float toy", gives
the arithmetic and the reference order). `build_hash({"block": B})` covers this module's sources
and the integer toy kernels' sources it imports, and the build parameters.
"""

from __future__ import annotations

from pathlib import Path

from toy.module import load_entry, source_hash

_HERE = Path(__file__).parent
SOURCES = (_HERE / "cpu.py", _HERE / "cuda.py", _HERE.parent / "kernels" / "cpu.py", _HERE.parent / "kernels" / "cuda.py")
ENTRIES = ("toyf_predict",)


def build_hash(params: dict) -> str:
    return source_hash([(path.relative_to(_HERE.parent).as_posix(), path) for path in SOURCES], params)


def entry(backend: str, name: str):
    """The launchable kernel `name` for `backend` ("cpu" or "gpu"): `fn(grid, block, *args)`."""
    return load_entry(__name__, ENTRIES, backend, name)


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
