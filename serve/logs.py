"""Event lines, one a line, `<time> INFO serve: <event> key=value ...` (SPEC §7, §7a).

The event name sits between spaces so a log reader can match ` admitted `; a value with a space (or
a quote) is double-quoted.
"""

from __future__ import annotations

import sys
import threading
import time

__all__ = ["event", "fmt"]

_lock = threading.Lock()


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        v = f"{v:.3f}".rstrip("0").rstrip(".") if v == v else "nan"
    s = str(v)
    if not s or any(c in s for c in ' "='):
        return '"' + s.replace('"', '\\"') + '"'
    return s


def fmt(name: str, level: str = "INFO", **fields) -> str:
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"
    pairs = " ".join(f"{k}={_value(v)}" for k, v in fields.items())
    return f"{stamp} {level} serve: {name} {pairs}".rstrip()


def event(name: str, level: str = "INFO", **fields) -> None:
    line = fmt(name, level, **fields)
    with _lock:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
