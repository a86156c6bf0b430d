"""The two Mooncake (FAST'25) traces `kern replay` knows, and the paper's hit ratios for them.

A trace is known by what it holds, not its file name: its request count and total input tokens as
released (`conversation_trace.jsonl`, `synthetic_trace.jsonl` in the paper's repository,
FAST25-release/traces/). The points are the paper's Fig. 9 (hit ratio against cache capacity in
tokens, its own per-block LRU simulation), read off the figure: synthetic reproduces closely; the
conversation ids as released bound the hit ratio near 0.37, a little under the paper's curve.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KNOWN", "Known", "known"]


@dataclass(frozen=True, slots=True)
class Known:
    name: str
    requests: int
    input_tokens: int
    paper: tuple[tuple[int, float], ...]  # (capacity in tokens, hit ratio), the paper's Fig. 9


KNOWN = (
    Known("Mooncake conversation trace", 12_031, 144_793_823,
          ((1_000_000, 0.087), (4_000_000, 0.215), (10_000_000, 0.326), (50_000_000, 0.398))),
    Known("Mooncake synthetic trace", 3_993, 61_194_628,
          ((1_000_000, 0.146), (4_000_000, 0.380), (10_000_000, 0.589), (50_000_000, 0.658))),
)


def known(requests: int, input_tokens: int) -> Known | None:
    """The known trace with exactly these totals (a whole trace, unscaled), or None."""
    for k in KNOWN:
        if (k.requests, k.input_tokens) == (requests, input_tokens):
            return k
    return None
