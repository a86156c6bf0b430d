"""The float toy's manifests (`toy-float` and its `-ref` twin), for `kern gen`.

A paged toy (toy-paged's geometry) whose predict is `toyf_predict` of the `toyf` module
(toy.float_kernels): it writes bf16 logits over the 257 tokens (a `logits` output, the buffer a
probe dumps) besides the next token. The write stays the integer toy's. The twin differs only in
its block, which is also its order of addition (tiles of block // 32 positions).
"""

from __future__ import annotations

from toy import model
from toy.float_kernels import build_hash

NAME = "toy-float"
MODULE = "toyf"


def manifest(base: dict, block: int) -> dict:
    """`base` is the toy-paged-shaped manifest of this block; return it made the float toy."""
    m = dict(base, model=NAME)
    buffers = dict(m["buffers"])
    salt = buffers.pop("salt")
    buffers["logits"] = {"dtype": "bf16", "shape": ["seqs", model.FLOAT_VOCAB], "kind": "output"}
    buffers["salt"] = salt
    m["buffers"] = buffers
    m["modules"] = dict(m["modules"], **{MODULE: {"impl": "toy.float_kernels", "block": block,
                                                   "sha256": build_hash({"block": block})}})
    params = ["in buffer<i32>", "in buffer<i32>", "in state", "in buffer<i64>", "out buffer<bf16>", "out buffer<i64>"]
    literals = [lit for lit in m["ops"]["predict"]["impl"]["launches"][0]["args"] if "param" not in lit]
    types = [next(iter(lit)) for lit in literals]
    launch = {"module": MODULE, "entry": "toyf_predict", "block": [block, 1, 1], "grid": ["seqs", 1, 1],
              "params": params + types,
              "args": [{"param": i} for i in range(len(params))] + literals}
    m["ops"] = dict(m["ops"], predict={"params": params, "impl": {"launches": [launch]}})
    programs = {}
    for name, prog in m["programs"].items():
        calls = []
        for call in prog["calls"]:
            if call["op"] == "predict":
                args = call["args"]
                call = {"op": "predict", "args": args[:-1] + [{"buf": "logits"}, args[-1]]}
            calls.append(call)
        programs[name] = dict(prog, calls=calls)
    m["programs"] = programs
    return m
