"""Deliberate misbehaviour, so each gate can be shown to catch it (`kern serve --fault NAME`)."""

from __future__ import annotations

__all__ = ["FAULTS", "Faults"]

FAULTS = {
    "wrong-token": "one answer token off (the first non-stop token of every answer, xor 1)",
    "no-checkpoint": "never insert snapshots",
    "no-park": "drop evicted snapshots instead of parking them",
    "drop-wake": "ignore parked hits",
    "leak-lease": "never return an aborted request's lease",
    "keep-overshoot": "keep snapshots a speculative round overshot (under the answer's key)",
    "raise-in-scheduler": "the scheduler thread raises after its first step",
    "wrong-token-batched": "in a decode step or round that batches more than one sequence, every sequence "
                           "but the first gets its first emitted token off (xor 1; fed back as its anchor): "
                           "sequences in a batch disturb each other, one at a time they answer right",
    "reject-drafts": "take only row 0 of every speculative round (count treated as 1): paged answers stay "
                     "right, accepted rows (and the acceptance rate) drop to 0",
    "no-remap": "never land the pool's remap plans: Remapping is handled as Busy (evict, else wait for a "
                "lease to end), so line slots never grow; the plan stays pending, unlanded, and requests "
                "are seated from slots that snapshots and finished leases give back",
    "skip-restore-copy": "a resident prefix hit restores into the lease without executing the copy plan "
                         "(the partial page and the line are never copied)",
    "flip-near-ties": "float targets: in every decode step, a sequence whose runner-up byte token sits within "
                      "4 bf16 ULPs of its top logit takes the runner-up (fed back as its anchor): each such "
                      "token is a near-tie the gate may excuse, but more than 3 in one answer is not",
    "slow-steps": "every step takes 20 ms more (a slow device; answers unchanged): lets a test catch a gate "
                  "or a server mid-run however fast the kernels are",
    "untold-tier": "the response's kern object leaves out cache_tier (a server that tells a request's tier only "
                   "in its log): the gate must fail it, whatever the server logs",
    "pad-in-limit": "the one-sequence limit counts the pad's page: a request whose room is the whole pool "
                    "passes validation and then waits for room forever, neither rejected nor seated",
    "wedge-step": "the scheduler's first step after its second request never returns (it sleeps in it for "
                  "WEDGE_S, 600 s): /stats stops answering while /stats/live says a step is in progress",
    "long-first-step": "the first step a request makes takes LONG_STEP_S (12 s) more, answers unchanged (numba "
                       "compiling on first use, a loaded box): legitimate slowness the gate must not call a hang",
}


def runner_up(bits, ulps: int = 4) -> int | None:
    """The runner-up byte token of one row of bf16 logit bits when it is within `ulps` bf16 ULPs
    of the top (EOS, the last logit, is left alone); else None."""
    import math

    import numpy as np

    vals = (np.asarray(bits[:-1], np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    order = np.argsort(-vals, kind="stable")
    top, second = float(vals[order[0]]), float(vals[order[1]])
    unit = 2.0 ** (math.frexp(abs(top))[1] - 8) if top else 2.0**-133
    return int(order[1]) if (top - second) / unit <= ulps else None


class Faults:
    def __init__(self, names=()) -> None:
        unknown = sorted(set(names) - set(FAULTS))
        if unknown:
            raise ValueError(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(FAULTS)}")
        self.names = frozenset(names)

    def __contains__(self, name: str) -> bool:
        assert name in FAULTS, f"{name=}"
        return name in self.names

    def __repr__(self) -> str:
        return f"Faults({sorted(self.names)})"
