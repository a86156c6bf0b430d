"""`e2e`'s flags as one object: the click command builds it at once from what it parsed (as vLLM's
`EngineArgs`), and the gate reads it, so a new flag is a field here and an option in `e2e/cli.py`."""

from __future__ import annotations

from dataclasses import dataclass

from oracle.reference import PACKAGED_MODEL

__all__ = ["GateFlags"]


@dataclass(frozen=True)
class GateFlags:
    """Every `e2e` flag by its click name (`e2e --help` says what each does; the defaults are its)."""

    config: str | None = None
    targets: tuple[str, ...] = ()
    scenarios: tuple[str, ...] = ()
    reference: str = str(PACKAGED_MODEL)
    no_reference: bool = False
    out: str = "results"
    max_tokens: int = 64
    backend: str = "auto"
    port: int = 0
    capacity: int = 16384
    server_flags: str = ""
    kern: str | None = None
    engine_cmd: str | None = None
    engine_url: str | None = None
    capabilities: str | None = None
    load_timeout: float = 600.0
    jobs: int = 0
    zygote: bool = True
    hosts: int | None = None
    reference_worker: bool | None = None
    at_once: bool = True
    junit_path: str | None = None
    seed: int = 0
    shrink_: bool = False
    replay_path: str | None = None
    explore_n: int | None = None
