"""`turn2_hit`: did turn 2 reuse what its first turns left behind?

A zero is excused only when the entry's *own* first turns were all logged ``not kept`` (a
speculative round ran past ``max_tokens`` or stop and the end-of-request snapshot was dropped);
counting ``not kept`` lines overall would let an unrelated drop excuse a real miss.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence

__all__ = ["turn2_hit"]


def turn2_hit(
    cached: Iterable[tuple[int, int, Sequence[str]]],
    floor: Callable[[int], int],
    unkept: Collection[str],
) -> bool:
    """Every hit reaches its floor or is an excused zero, and at least one hit is nonzero.

    `cached` holds ``(cached_tokens, first_prompt_len, first_turn_request_ids)`` per turn 2;
    `floor(first_prompt_len)` is the least hit wanted (whole pages for paged targets, the whole
    first prompt for stateful ones); `unkept` the request ids logged ``not kept``.
    """
    entries = list(cached)
    for c, n, reqs in entries:
        excused_zero = c == 0 and all(r in unkept for r in reqs)
        if c < floor(n) and not excused_zero:
            return False
    return any(c > 0 for c, _, _ in entries)
