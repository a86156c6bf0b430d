"""Session cold_burst: simultaneous prompts sharing a cold 3-block prefix, sent to a fresh engine
(`cold_prefix_burst`, issue 39).

An engine that batches two of them in one step must not let one read a block the other has not
written yet (its hash registered at admission, its K and V written later in the step), nor count it
as cached. Each round sends `CALLS` prompts at once: one 3-block prefix no request has sent before,
`CALLS - 1` different tails of 1 to B + 1 tokens (some prompts end inside a block) and one prompt twice;
sixteen rounds, each with a fresh prefix, on the session's fresh server (after one unrelated prompt
alone, which the policy oracle predicts on kern). Every answer identical to the
reference, every hit within what the round's other calls could have cached (`e2e/scenarios/wild.py`).
"""

from __future__ import annotations

import random

from e2e.scenarios.wild import Judge, block, draw, segment

__all__ = ["run"]

CALLS = 12
ROUNDS = 16
M = 16


def run(r) -> None:
    b = block(r)
    m = min(r.m, M)
    rng = random.Random(f"cold_burst-{r.opts.seed}")
    j = Judge(r, "cold_prefix_burst")
    j.serial("an unrelated prompt first", draw(rng, 2 * segment(b) + 1), m)  # shares nothing with the prefixes
    r.serial_ends("cold_prefix_burst (bursts)")
    for k in range(ROUNDS):
        prefix = draw(rng, 3 * segment(b))
        calls = [prefix + draw(rng, rng.randint(1, b + 1)) for _ in range(CALLS - 1)]
        calls.append(list(calls[0]))  # one prompt twice: the same blocks written by two requests at once
        j.burst(f"round {k + 1}", [(ids, m) for ids in calls])
    j.add()
