"""The token ids every package of the serving path agrees on (the toy vocabulary, docs/toy.md): ids
0..255 are the bytes of UTF-8 text, and EOS, the one id past them, ends an answer and has no text.

The one definition outside `toy/`: the runtime, the server, the oracle's CLI, the verdicts and the gate
import these. `toy/` keeps its own copies (the reference model's, and the kernels', whose source the
manifests pin by sha256); `tests/test_names.py` holds them equal to these. A leaf: imports nothing.
"""

from __future__ import annotations

__all__ = ["BYTES", "EOS"]

BYTES = 256  # token ids below this are bytes of text
EOS = BYTES  # the end of an answer: the first id past the bytes
