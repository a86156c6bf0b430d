"""One TLS context for every HTTP client the gate's process makes (`tls()`): httpx otherwise builds one,
loading the CA bundle, for each client, and each module-level `httpx.get` is a client of its own
(about 25 ms of CPU each; the gate's watcher polled `/stats` so: 0.6 s of one toy-paged gate's 6)."""

from __future__ import annotations

__all__ = ["tls"]

_TLS: list = []


def tls():
    """The process's TLS context (made at the first call)."""
    if not _TLS:
        import ssl

        import certifi

        _TLS.append(ssl.create_default_context(cafile=certifi.where()))
    return _TLS[0]
