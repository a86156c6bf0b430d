"""The bf16 ULP at a logit's scale, and the 4-ULP near-tie rule built on it.

bf16 keeps 8 significand bits, so one ULP at `x` is ``2**(exponent(x) - 8)`` with ``frexp``'s
exponent. Two tokens are a near tie when both sit within `NEAR_TIE_ULPS` of the top logit, counted
in ULPs of the top logit: a different reduction order can move a bf16 logit by that much.
"""

from __future__ import annotations

import math

__all__ = ["NEAR_TIE_ULPS", "near_tie", "ulp_of", "ulps_down"]

NEAR_TIE_ULPS = 4
"""The most ULPs below the top logit that either disputed token may sit (kern's ``--logit-ulp``)."""

_ZERO_ULP = 2.0**-133  # bf16's smallest subnormal step


def ulp_of(x: float) -> float:
    """One bf16 ULP at the scale of `x` (8 significand bits); ``2**-133`` at zero."""
    if x == 0:
        return _ZERO_ULP
    return 2.0 ** (math.frexp(abs(x))[1] - 8)


def ulps_down(top_logit: float, logit: float) -> float:
    """How many ULPs of the top logit `logit` sits below it."""
    return (top_logit - logit) / ulp_of(top_logit)


def near_tie(top_logit: float, logit_a: float, logit_b: float) -> bool:
    """Both tokens' logits within `NEAR_TIE_ULPS` of the top logit."""
    return max(ulps_down(top_logit, logit_a), ulps_down(top_logit, logit_b)) <= NEAR_TIE_ULPS
