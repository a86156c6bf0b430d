"""`kern replay`'s flags as one object: the click command builds a `ReplayFlags` from its keywords at
once, and what it runs reads that object (tests/test_replay.py holds each default to its flag's)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ReplayFlags"]


@dataclass(slots=True)
class ReplayFlags:
    """Every flag of `kern replay` (docs/replay.md), by its click name."""

    trace: str
    page: int | None = None
    capacity_text: str = "16M"
    host_tokens: int | None = None
    host_gib: float | None = None
    bytes_per_token: int | None = None
    order: str = "file"
    policy: str = "engine"
    limit: int | None = None
    as_json: bool = False
    out_dir: str | None = None
    plot: str | None = None
    server: str | None = None
    target: str | None = None
    scale_k: int = 1
    api_key: str | None = None
