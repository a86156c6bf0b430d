"""Logit evidence for one disputed token: the near-tie verdict text from a probe's logits (pure).

`evidence(probe, a, b, reference)` judges the server's token `a` against the oracle's `b` on the
logits a probe dumped at that very step: ``near-tie`` when both sit within `NEAR_TIE_ULPS` bf16
ULPs of the top logit, else ``confident flip``. When the reference's own logits are given (a
float toy's model.py computes them), the probe must first agree with them: every logit within
`PROBE_AGREE_ULPS` ULPs of the top, else there is no evidence at all (a probe of another step,
another build, or a broken dump), and nothing is excused. Only text starting with ``near-tie``
excuses (`verdicts.same`).
"""

from __future__ import annotations

from collections.abc import Sequence

from .ulp import NEAR_TIE_ULPS, near_tie, ulp_of, ulps_down

__all__ = ["PROBE_AGREE_ULPS", "evidence", "probe_disagreement"]

PROBE_AGREE_ULPS = 2
"""How far (in ULPs of the top logit) a probe's logit may sit from the reference's: the two add in
different orders, which moves a bf16 logit by a ULP at most in practice (docs/checks.md)."""


def probe_disagreement(probe: Sequence[float], reference: Sequence[float]) -> tuple[int, float] | None:
    """The token whose probe logit is furthest from the reference's and how far, in ULPs of the
    probe's top logit, when that is over `PROBE_AGREE_ULPS` (or the lengths differ: token -1); else None."""
    if len(probe) != len(reference):
        return -1, float("inf")
    unit = ulp_of(max(probe))
    worst = max(range(len(probe)), key=lambda v: abs(probe[v] - reference[v]))
    off = abs(probe[worst] - reference[worst]) / unit
    return (worst, off) if off > PROBE_AGREE_ULPS else None


def _top(logits: Sequence[float], k: int = 4) -> str:
    order = sorted(range(len(logits)), key=lambda v: (-logits[v], v))[:k]
    return " ".join(f"{v}:{logits[v]:g}" for v in order)


def _rank(logits: Sequence[float], t: int) -> int:
    return 1 + sum(1 for x in logits if x > logits[t])


def evidence(probe: Sequence[float], a: int, b: int, reference: Sequence[float] | None = None) -> str:
    """The verdict on server token `a` vs oracle token `b` from the probe's logits at that step."""
    if not (0 <= a < len(probe) and 0 <= b < len(probe)):
        return f"no evidence (token {a if not 0 <= a < len(probe) else b} is outside the probe's {len(probe)} logits)"
    if reference is not None:
        bad = probe_disagreement(probe, reference)
        if bad is not None:
            v, off = bad
            what = "has another vocabulary" if v < 0 else f"token {v} is {off:.1f} ULPs off"
            return f"no evidence (the probe disagrees with the reference: {what})"
    top = max(probe)
    verdict = "near-tie" if near_tie(top, probe[a], probe[b]) else "confident flip"
    return (f"{verdict}: top {_top(probe)}; server's {a} #{_rank(probe, a)} {ulps_down(top, probe[a]):.1f} ULPs down, "
            f"oracle's {b} #{_rank(probe, b)} {ulps_down(top, probe[b]):.1f} (limit {NEAR_TIE_ULPS})")
