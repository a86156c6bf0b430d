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
}


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
