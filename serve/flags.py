"""`kern serve`'s flags as one object: the click command builds a `ServeFlags` from its keywords at
once (as vLLM's `EngineArgs`), and everything it starts reads that object. The defaults are the
command's own (tests/test_serve_cli.py holds each field's default to its flag's)."""

from __future__ import annotations

from dataclasses import dataclass

from pool.fair import Rule
from serve.api.guard import Limits

__all__ = ["QUEUE_TIMEOUT_S", "ServeFlags"]

_D = Limits()
_R = Rule()
QUEUE_TIMEOUT_S = 1800.0  # --queue-timeout's default: past a long request's life on a small machine (issue 41: 11 minutes)


@dataclass(slots=True)
class ServeFlags:
    """Every flag of `kern serve` (docs/serve.md), by its click name."""

    target: str
    # where and how it listens
    port: int = 8000
    host: str = "127.0.0.1"
    allowed_hosts: str | None = None
    api_key: str | None = None
    served_model_name: str | None = None
    protect_stats: bool = False
    http: str = "auto"
    frontend_process: bool | None = None
    frontends: int = 1
    # the engine
    config: str | None = None
    capacity: int | None = None
    host_gib: float = 0.0
    host_chunk: int | None = None
    max_seqs: int | None = None
    chunk: int | None = None
    rows: int | None = None
    backend: str = "auto"
    device: str | None = None
    reserve_gib: float = 4.0
    weights: tuple[str, ...] = ()
    no_graphs: bool = False
    decode_steps: int | None = None
    overlap: bool | None = None
    gpu_wait: str = "auto"
    no_pack: bool = False
    faults: tuple[str, ...] = ()
    # connections and bodies (serve.api.guard.Limits)
    drain_timeout: float = _D.drain_timeout
    max_connections: int = _D.max_connections
    max_per_client: int = _D.max_per_client
    header_timeout: float = _D.header_timeout
    body_timeout: float = _D.body_timeout
    keep_alive: float = _D.keep_alive
    max_body_bytes: int = _D.max_body_bytes
    max_tokenize_tokens: int = _D.max_tokenize_tokens
    ceiling: int | None = None
    stuck_after: float = _D.stuck_after
    # admission (pool.fair.Rule) and the queue
    admission: str = _R.name
    page_share: float = _R.page_share
    row_share: float = _R.row_share
    bypass: int = _R.bypass
    queue_timeout: float = QUEUE_TIMEOUT_S
    # requests, logs, metrics
    sampling: str = "refuse"
    metrics_prefix: str = "kern"
    stats_every: float = 5.0
    log_level: str | None = None
    # a pipeline
    stages: int | None = None
    at: str | None = None
    pp_listen: str | None = None
    pp_head: str | None = None
    pp_timeout: float = 60.0
    pp_restart: bool = True
    stage_connect: float | None = None
    pp_bind: str = "127.0.0.1"
    pp_parent: int | None = None
    pp_share: int = 1

    def limits(self) -> Limits:
        """The connection and body limits the flags name (unchecked)."""
        return Limits(self.max_connections, self.header_timeout, self.body_timeout, self.keep_alive,
                      self.max_body_bytes, self.max_tokenize_tokens, self.drain_timeout, self.max_per_client,
                      self.ceiling, self.stuck_after)

    def rule(self) -> Rule:
        """The admission policy: --admission, its shares and its bound."""
        return Rule(self.admission, self.page_share, self.row_share, self.bypass)

    @property
    def pipelined(self) -> bool:
        """A pipeline's head or stage (--stages above 1, --pp-head or --pp-listen)."""
        return (self.stages or 1) > 1 or bool(self.pp_head) or bool(self.pp_listen)
