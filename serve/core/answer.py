"""How an answer ends and reaches its handler: `Done` (the finish), `Update` (new tokens, and the
finish on the last one) and `Stops` (a request's stop strings and stop token ids, matched as its tokens
are committed). Imports nothing of serve/: the request (`serve.core.request`) and the messages that carry
these across the process split (`serve.core.messages`) both read them from here.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

from kern.tokens import BYTES

__all__ = ["Done", "Stops", "Update"]


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
