"""The toy model: exact 64-bit integer arithmetic whose next token depends on every state byte.

`toy.model` is the reference (pure Python), `toy.kernels` the numba kernels the runtime launches,
`toy.gen` writes the shipped manifests.
"""
