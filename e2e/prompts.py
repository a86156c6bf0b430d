"""The gate's fixed inputs (SPEC §10): twelve prompts, the turn-2 suffix, the fill variants.

The same as the Rust kern gate's, so the two gates' hit counts compare number for number.
"""

from __future__ import annotations

__all__ = ["PROMPTS", "SUFFIX", "variant"]

PROMPTS = (
    "The lighthouse keeper had not seen a ship in eleven days, and the silence of the bay was starting to feel like",
    "To make a proper risotto, begin by warming the stock in a separate pan, because cold stock",
    "In 1911 the expedition reached the plateau with only three sledges left. The diary for that week records",
    "A hash map trades memory for speed: instead of scanning every entry, it computes",
    "The village market opened before dawn. By the time the sun cleared the hills, the fish stalls",
    "Photosynthesis converts light into chemical energy in two stages. In the first stage, chlorophyll",
    "She unfolded the map on the hood of the car and traced the river with one finger until",
    "The difference between a symphony and a concerto is mostly a question of who",
    "When the bridge was finally closed for repairs, the town council discovered that nobody",
    "A good chess opening does three things: it develops pieces, controls the center, and",
    "Rain had turned the trail to mud, so the surveyors camped early and spent the evening",
    "Compilers optimize loops by hoisting invariant computations out of them, which means",
)

SUFFIX = "\n\nNow explain that again for a ten-year-old, in two sentences."


def variant(n: int) -> str:
    """Fill request `n`: prompt ``n mod 12``, prefixed ``"{n}. "`` once ``n >= 12``."""
    p = PROMPTS[n % len(PROMPTS)]
    return p if n < len(PROMPTS) else f"{n}. {p}"
