"""An engine a user already runs (`e2e --engine-url URL`): the gate starts and stops nothing.

`probe` asks the URL before anything is gated: ``GET /health`` must answer 200 (else `NotServing`: exit
125, nothing could run) and ``GET /v1/models`` names the model it serves, which picks the one target it
can be gated on (`pick_target`). `Attached` stands where a started server's `Session` would: its
"start" checks ``/health`` and, where the engine declares a cache reset (``facts.reset``,
docs/engine-contract.md), POSTs it so the session begins on an empty cache; its "stop" leaves the
engine running.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from e2e.session import ServerError, Session
from e2e.tls import tls
from kern.errors import KernError

__all__ = ["Attached", "NotServing", "models", "pick_target", "probe"]


class NotServing(KernError, RuntimeError):
    """Nothing usable answers at the URL (refused, not HTTP, /health not 200): nothing can be gated."""


def probe(url: str) -> None:
    """`NotServing` unless ``GET URL/health`` answers 200, naming what it got instead."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NotServing(f"--engine-url {url!r} is not an http:// URL")
    try:
        status = httpx.get(url + "/health", timeout=10.0, verify=tls()).status_code
    except httpx.HTTPError as exc:
        raise NotServing(f"nothing answers at {url} (GET /health: {type(exc).__name__}: {exc}); "
                         "start the engine first, or give its URL") from None
    if status != 200:
        raise NotServing(f"GET {url}/health answers {status}, not 200: the engine is not ready to serve "
                         "(docs/engine-contract.md, readiness)")


def models(url: str) -> list[str] | None:
    """The model ids ``GET /v1/models`` lists (None: it answers no such list)."""
    try:
        r = httpx.get(url + "/v1/models", timeout=10.0, verify=tls())
        data = r.json().get("data") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    if not isinstance(data, list):
        return None
    return [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m]


def pick_target(asked: list[str], served: list[str] | None, model_of: dict[str, str], url: str) -> str:
    """The one target to gate at `url`: the one named (`asked`), else the one whose model the engine
    serves. `model_of`: each config target's model name. `ValueError` with what to do otherwise."""
    if len(asked) > 1:
        raise ValueError(f"--engine-url gates one target (a running engine serves one model); "
                         f"--targets names {len(asked)}: {', '.join(asked)}")
    if asked:
        name = asked[0]
        if served is not None and name in model_of and model_of[name] not in served:
            raise ValueError(f"target {name}'s model is {model_of[name]!r}, but {url} serves "
                             f"{', '.join(map(repr, served)) or 'none'} (GET /v1/models)")
        return name
    if not served:
        raise ValueError(f"{url} lists no model (GET /v1/models): name the target with --targets")
    match = [t for t, m in model_of.items() if m in served]
    if len(match) != 1:
        found = ", ".join(match) if match else "none"
        raise ValueError(f"{url} serves {', '.join(map(repr, served))}; the config's targets of that model: "
                         f"{found}: name exactly one with --targets")
    return match[0]


class Attached(Session):
    """A session on the running engine at `url`: nothing started, nothing stopped; its log file says so."""

    def __init__(self, name: str, url: str, log_path: str | Path, reset: str | None = None):
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        super().__init__(name, [], port, log_path, host=parts.hostname or "127.0.0.1", health=True, header=False)
        self.url = url
        self.reset = reset
        self.was_reset = False

    def start(self) -> dict[str, Any]:
        self.log.path.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"# attached to {self.url}: the engine runs outside the gate (e2e --engine-url)"]
        try:
            if not self._healthy():
                raise ServerError(f"session {self.name}: GET {self.url}/health is not 200")
            if self.reset is not None:
                r = httpx.post(self.url + self.reset, timeout=60.0, verify=tls())
                if r.status_code != 200:
                    raise ServerError(f"session {self.name}: POST {self.url}{self.reset} (the engine's declared "
                                      f"cache reset) answered {r.status_code}: {r.text[:200]} (vLLM serves "
                                      "/reset_prefix_cache only when started with VLLM_SERVER_DEV_MODE=1)")
                self.was_reset = True
                lines.append(f"# POST {self.reset}: {r.status_code} (its cache reset before this session)")
        finally:
            self.log.path.write_text("\n".join(lines) + "\n")
        self.facts = {}
        return self.facts

    def alive(self) -> bool:
        return True

    def check(self, grace: float = 0.0) -> None:
        """Never `ServerExited`: the gate has no process of it to watch (a dead engine fails requests)."""

    def stop(self, kill: bool = False) -> int | None:
        return None
