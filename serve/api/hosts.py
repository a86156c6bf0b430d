"""The `Host` header's rule (`--allowed-hosts`): a page in a browser whose name an attacker points at
127.0.0.1 (DNS rebinding) reaches a server bound to loopback with its own name as the Host; a server
that answers only to the names it is known by refuses it.

A request's Host (its port left off) is accepted when it is an IP address, `localhost` (or a name
under `.localhost`), the `--host` the server bound, or a name in `--allowed-hosts`; `--allowed-hosts '*'`
accepts any. A server bound to every interface (`--host 0.0.0.0` or `::`) without `--allowed-hosts`
accepts any (it cannot know the names it is reached by). A request with no Host (HTTP/1.0) is
accepted. A refused one is a 400 `invalid_host` naming the Host (docs/serve.md, "The Host header").
"""

from __future__ import annotations

import ipaddress

__all__ = ["ANY_INTERFACE", "Hosts"]

ANY_INTERFACE = ("", "0.0.0.0", "::", "*")


def _name(value: str) -> str:
    """The host part of a Host header, lowercased: `[::1]:8000` -> `::1`, `Box.:80` -> `box`."""
    v = value.strip().lower()
    if v.startswith("["):
        return v[1:v.find("]")] if "]" in v else v
    if v.count(":") == 1:
        v = v.split(":", 1)[0]
    return v.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class Hosts:
    """`check(value)`: None when a Host header's value is accepted, else the refusal's message."""

    def __init__(self, bound: str, allowed: tuple[str, ...] | None = None) -> None:
        names = tuple(_name(a) for a in allowed or () if a.strip())
        self.any = "*" in names or (allowed is None and bound.strip().lower() in ANY_INTERFACE)
        self.names = frozenset(names + (_name(bound), "localhost"))

    def check(self, value: str | None) -> str | None:
        if value is None or self.any:
            return None
        name = _name(value)
        if name in self.names or name.endswith(".localhost") or _is_ip(name):
            return None
        return (f"the Host header {value[:100]!r} is not a name this server answers to (an IP address, localhost, "
                "its --host, or a name in --allowed-hosts)")
