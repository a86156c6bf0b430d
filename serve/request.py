"""One request as the scheduler sees it, and the events it sends back to its HTTP handler.

The scheduler thread alone writes a request's state; the handler only reads the events it is sent.
"""

from __future__ import annotations

import codecs
import enum
from dataclasses import dataclass, field
from typing import Any, Callable

from kern.tokens import BYTES, EOS  # the one definition of where an answer ends

__all__ = ["EOS", "Done", "Request", "Status", "Stops", "Update"]


class Status(enum.Enum):
    WAITING = "waiting"
    """Queued: no lease yet (it waits at the head of the queue for room)."""
    RUNNING = "running"
    """Holds its lease: prefilling, then stepping."""
    FINISHED = "finished"
    """Ended by stop or length; its lease is released or retired into a snapshot."""
    ABORTED = "aborted"
    """The client hung up or the server stopped; its lease is released and nothing is kept."""


_MOVES = {
    Status.WAITING: {Status.RUNNING, Status.ABORTED, Status.FINISHED},
    Status.RUNNING: {Status.FINISHED, Status.ABORTED, Status.WAITING},  # WAITING: requeued (a lost pipeline stage)
    Status.FINISHED: set(),
    Status.ABORTED: set(),
}


@dataclass(slots=True)
class Done:
    """How a request ended: what the last response chunk carries."""

    reason: str | None  # "stop" | "length" | None (aborted or rejected)
    cached: int = 0
    tier: str | None = None  # "device" | "host" | None
    snapshot: str = "none"  # "kept" | "not kept" | "none"
    error: tuple[int, str, str, str | None] | None = None  # (status, message, code, param)
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it (vLLM's)
    text_end: int | None = None  # characters of the answer's text kept (a stop string cut it), None: all
    hide_last: bool = False  # the last token is a stop token id whose text is left out
    woken: bool = False  # its prefix hit was a parked snapshot, woken from the host tier into its lease


@dataclass(slots=True)
class Update:
    """New answer tokens for the client, and `done` on the last one."""

    tokens: list[int]
    done: Done | None = None


class Stops:
    """A request's stop strings and stop token ids, matched as its tokens are committed (vLLM's rules).

    The answer's text is its byte tokens decoded as UTF-8 with "replace" (`validate.text_of`); it is
    decoded here incrementally, token by token, and each token's new characters are searched together
    with the last `len(longest stop) - 1` characters before them (vLLM's `check_stop_strings`: the
    strings in the order given, the first found wins), so the work per token is bounded. The answer
    ends at the token that completes a match: `text_end` is where the text stops (before the string,
    or after it with `include`), `reason` the string. A stop token id ends the answer at that token
    (it is in token_ids); its text is left out unless `include` (vLLM: the token that stop-terminated
    is not detokenized). An answer that ends otherwise (length, EOS, a stop id) flushes the decoder's
    pending bytes (their U+FFFD) and matches those too, so the text never holds a stop string.
    """

    __slots__ = ("strings", "ids", "include", "hold", "reason", "text_end", "hide_last", "_dec", "_keep", "_tail",
                 "_chars", "_flushed")

    def __init__(self, strings: list[str], ids: list[int], include: bool) -> None:
        self.strings = list(strings)
        self.ids = frozenset(ids)
        self.include = include
        longest = max((len(s) for s in self.strings), default=0)
        self.hold = longest - 1 if self.strings and not include else 0  # what a stream holds back (vLLM's)
        self.reason: str | int | None = None
        self.text_end: int | None = None
        self.hide_last = False
        self._dec = codecs.getincrementaldecoder("utf-8")("replace") if self.strings else None
        self._keep = max(longest - 1, 0)
        self._tail = ""  # the last `_keep` characters decoded
        self._chars = 0  # characters decoded so far
        self._flushed = False

    def sees(self, t: int) -> bool:
        """Commit answer token `t`; True when it ends the answer (a stop token id or a completed string)."""
        if t in self.ids:
            self.reason = t
            if not self.include:
                self.hide_last = True
                return True
            self._text(t)  # included: its text is matched too (a string found there names the stop)
            return True
        return self._text(t)

    def end(self) -> bool:
        """The answer ended (length, EOS or a stop id): match the decoder's flushed tail; True on a match."""
        if self._dec is None or self._flushed or isinstance(self.reason, str):
            return False
        self._flushed = True
        return self._match(self._dec.decode(b"", final=True))

    def _text(self, t: int) -> bool:
        if self._dec is None or t >= BYTES:
            return False
        return self._match(self._dec.decode(bytes((t,))))

    def _match(self, new: str) -> bool:
        if not new:
            return False
        window = self._tail + new
        base = self._chars - len(self._tail)
        for s in self.strings:
            i = window.find(s, max(0, len(window) - len(new) - len(s) + 1))
            if i >= 0:
                self.reason = s
                self.text_end = base + min(i + len(s), len(window)) if self.include else base + i
                self.hide_last = False
                return True
        self._chars += len(new)
        self._tail = window[-self._keep:] if self._keep else ""  # a short window is kept whole
        return False


@dataclass(eq=False, slots=True)
class Request:
    id: str
    ids: list[int]
    max_tokens: int
    rows: int
    send: Callable[[Update], Any]  # thread-safe: hands an update to the handler's loop
    status: Status = Status.WAITING
    lease: Any = None
    cached: int = 0
    tier: str | None = None
    woken: bool = False
    pos: int = 0  # tokens the state holds (written and, when lined, folded)
    fed_end: int = 0  # prefill runs the prompt up to here
    emitted: list[int] = field(default_factory=list)  # every token the steps emitted
    out: list[int] = field(default_factory=list)  # what the client receives (stop token included)
    anchor: int = 0
    reason: str | None = None
    page_mark: int = 0  # whole pages already checkpointed (paged manifests)
    t_arrive: float = 0.0
    t_admit: float = 0.0
    order: int = 0  # the core's admission count when it was admitted (its running list is not in that order)
    ignore_eos: bool = False  # EOS does not end the answer (only max_tokens does)
    stops: Stops | None = None  # stop strings / stop token ids (None: EOS and max_tokens alone end it)
    whole: bool = False  # the client takes the answer whole (not streamed): an engine core in another
    # process may hold its tokens after the first until its finish (serve/frontend_core.py)
    client: str = ""  # who sent it, for admission's shares: "key:" + a digest of its bearer key, else the peer address
    ticket: Any = None  # its `pool.fair.Ticket` while the core holds it

    def move(self, to: Status) -> None:
        if to not in _MOVES[self.status]:
            raise RuntimeError(f"request {self.id}: cannot move from {self.status.value} to {to.value}")
        self.status = to

    @property
    def room(self) -> int:
        return len(self.ids) + self.max_tokens + self.rows - 1

    @property
    def prefilling(self) -> bool:
        return self.status is Status.RUNNING and self.pos < self.fed_end

    @property
    def stepping(self) -> bool:
        return self.status is Status.RUNNING and self.pos >= self.fed_end and self.reason is None

    def fed(self, start: int, stop: int) -> list[int]:
        """Tokens at positions start..stop: the prompt, then what the steps emitted."""
        seq = self.ids + self.emitted if stop > len(self.ids) else self.ids
        return seq[start:stop]

    def take(self, tokens: list[int]) -> list[int]:
        """Commit what a step emitted; return what the client gets now (ends by stop or length)."""
        self.emitted.extend(tokens)
        new: list[int] = []
        for t in tokens:
            if len(self.out) >= self.max_tokens:
                self.reason = "length"
                break
            self.out.append(t)
            new.append(t)
            if t == EOS and not self.ignore_eos:
                self.reason = "stop"
                break
            if self.stops is not None and self.stops.sees(t):
                self.reason = "stop"  # a stop token id, or the token that completed a stop string
                break
        if self.reason is None:
            if len(self.out) >= self.max_tokens:
                self.reason = "length"
            else:
                self.anchor = tokens[-1]
        if self.reason is not None and self.stops is not None and self.stops.end():
            self.reason = "stop"  # the decoder's flushed tail completed a stop string
        return new
