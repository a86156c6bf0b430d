"""Event lines, one a line, `<time> INFO serve: <event> key=value ...` (SPEC §7, §7a).

The event name sits between spaces so a log reader can match ` admitted `; a value with a space (or
a quote) is double-quoted. Lines under the level `set_level` chose (`kern serve --log-level`; default
info, or what `RUST_LOG` asks of `kern_serve`, as the Rust kern gate driver sets it) are not written.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import threading
import time
import traceback

__all__ = ["LEVELS", "Limiter", "event", "fmt", "level", "level_from_env", "set_level"]

_lock = threading.Lock()
LEVELS = {"DEBUG": 10, "INFO": 20, "WARN": 30, "ERROR": 40}
_threshold = LEVELS["INFO"]
# a server run as a host's command (serve/common/hosted.py) has its own level; None: the process's
_command_threshold: contextvars.ContextVar[int | None] = contextvars.ContextVar("kern_log_threshold", default=None)


def set_level(name: str) -> None:
    """Write only lines at `name` (debug, info, warn or error) or above: this process's lines, or,
    in a host's command (`serve.common.hosted`), that command's."""
    global _threshold
    level = LEVELS[{"WARNING": "WARN"}.get(name.upper(), name.upper())]
    from serve.common.hosted import COMMAND

    if COMMAND.get() is not None:
        _command_threshold.set(level)
    else:
        _threshold = level


def level() -> str:
    """The level lines are written at now (debug, info, warn or error): what a process this one starts
    (a pipeline's stage) is given, so its lines follow this one's."""
    t = _current_threshold()
    return next(k for k, v in LEVELS.items() if v == t).lower()


def _current_threshold() -> int:
    t = _command_threshold.get()
    return _threshold if t is None else t


def level_from_env(rust_log: str | None) -> str | None:
    """The level `RUST_LOG` gives `kern_serve` (its `kern_serve=LEVEL` directive, else a bare LEVEL),
    or None: the Rust gate driver starts servers with `RUST_LOG=kern_serve=debug,kern_runtime=info`
    and reads their debug lines (` admitted `, ` parked `, ` not kept `)."""
    names = {"trace": "debug", "debug": "debug", "info": "info", "warn": "warn", "error": "error", "off": "error"}
    bare = None
    for part in (rust_log or "").split(","):
        target, _, level = part.strip().rpartition("=")
        level = level.strip().lower()
        if level not in names:
            continue
        if target.strip() == "kern_serve":
            return names[level]
        if not target:
            bare = names[level]
    return bare


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
    if LEVELS.get(level, LEVELS["ERROR"]) < _current_threshold():
        return
    line = fmt(name, level, **fields)
    with _lock:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


class Limiter:
    """Repeated events, held to at most two lines per reason per interval: the first occurrence of a
    reason is written as it comes, later ones within `interval` seconds are only counted, and the
    count is written (`repeated=N`) at the next occurrence after the interval or at `flush()`.

        limit = Limiter(interval=10.0)
        limit("client disconnected", "WARN", reason="mid-body", path="/v1/completions")

    The reason is the `reason` field (else the event name). `write` and `clock` are injectable for
    tests; the defaults write event lines to stderr.
    """

    def __init__(self, interval: float = 10.0, write=None, clock=time.monotonic) -> None:
        self.interval = interval
        self._write = write or event
        self._clock = clock
        self._lock = threading.Lock()
        self._since: dict[str, float] = {}  # reason -> when its current interval began
        self._held: dict[str, tuple[int, str, str, dict]] = {}  # reason -> (count, name, level, last fields)

    def __call__(self, name: str, level: str = "WARN", **fields) -> bool:
        """Log one occurrence; True when it was written, False when it was only counted."""
        reason = str(fields.get("reason", name))
        now = self._clock()
        with self._lock:
            since = self._since.get(reason)
            if since is not None and now - since < self.interval:
                n = self._held.get(reason, (0,))[0]
                self._held[reason] = (n + 1, name, level, fields)
                return False
            held = self._held.pop(reason, None)
            self._since[reason] = now
        if held is not None:
            self._summary(reason, held, now - since)
        self._write(name, level, **fields)
        return True

    def flush(self) -> None:
        """Write the counts held back so far (call it periodically, and at exit)."""
        now = self._clock()
        with self._lock:
            held, self._held = self._held, {}
            since = dict(self._since)
        for reason, h in held.items():
            self._summary(reason, h, now - since[reason])

    def _summary(self, reason: str, held: tuple, span: float) -> None:
        n, name, level, fields = held
        self._write(name, level, **{**fields, "repeated": n, "over_s": round(span, 3)})

    def logging_filter(self, name: str) -> logging.Filter:
        """A filter for a library's logger (uvicorn's, asyncio's): every record becomes the event
        `name` through this limiter, its reason the message's first line; the first of each reason
        keeps its traceback. The record itself is dropped. In a host's command (`serve.common.hosted`) only
        that command's records: the loggers are the process's, shared by every server in it."""
        from serve.common.hosted import COMMAND

        limiter, owner = self, COMMAND.get()

        class Limited(logging.Filter):
            def filter(self, record: logging.LogRecord) -> bool:
                if owner is not None and COMMAND.get() is not owner:
                    return True  # another server's record: its own filter takes it
                lines = record.getMessage().strip().splitlines() or ["?"]
                exc = record.exc_info[1] if record.exc_info else None
                fields = {"reason": lines[0][:120]}
                if exc is not None:
                    fields["error"] = f"{type(exc).__name__}: {exc}"[:200]
                level = {"WARNING": "WARN", "CRITICAL": "ERROR"}.get(record.levelname, record.levelname)
                if limiter(name, level, **fields) and record.exc_info:
                    with _lock:
                        sys.stderr.write("".join(traceback.format_exception(*record.exc_info)))
                        sys.stderr.flush()
                return False

        return Limited()
