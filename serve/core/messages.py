"""Every message that crosses a seam of serve/, typed: one slotted dataclass per kind, dispatched by
its type through a table (SGLang's `TypeBasedDispatcher`), never by a string tag and a position.

Two vocabularies:

- **The scheduler's inbox** (one process): what a handler thread posts to the scheduler thread
  (`Submit`, `Abort`, `Query`, `Drain`, `Stop`). They carry live objects (a `Request`, a future).
- **The wire** between an HTTP front end and the engine core process (``--frontend-process``,
  ``--frontends N``): msgpack over ZeroMQ PUSH/PULL sockets. `encode` writes a message as
  ``[tag, field, ...]`` in its fields' order (compact: no field names), `decode` reads it back into
  its class; a message whose field count is not its class's is refused by name (a front end and a
  core from different builds), never unpacked by position somewhere else.

  Front end to core: `Arrive` (a request: its id, prompt ids, max_tokens and `asked`: every field of
  `Asked`, by name), `HungUp`, `Question`, `DrainFor`, `StopCore`, `FrontEndDied`.
  Core to front end: `Ready`, `Updates`, `Answer`, `Bye` (`serve/client/frontend_wire.py` tells what each
  carries and when it is sent).

**A request's fields cross the process split by construction.** `Asked` holds every field of a
request that the routes set and the core reads beyond its id, prompt and budget; `serve.core.request.
Request` inherits it (keyword-only, so its own positional fields keep their order). `asked(req)` reads
every `Asked` field of a request by name for the wire and `Arrive.kwargs` gives them back for the
core's `Request`, so a new field is added here, set where the routes make the request and read where the
core uses it, and nothing in between changes. A field whose value is not plain msgpack data (a list,
a str, a number, a bool, None) names its codec in `CODECS`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import msgpack

from kern.errors import KernError
from serve.core.answer import Done, Stops

__all__ = ["Abort", "Answer", "Arrive", "Asked", "Bye", "CODECS", "Drain", "DrainFor", "FrontEndDied",
           "HungUp", "MessageError", "Query", "Question", "Ready", "Stop", "StopCore", "Submit", "Updates",
           "asked", "decode", "dispatcher", "done_of", "encode", "pack_done"]


class MessageError(KernError, ValueError):
    """A wire message this build cannot read (an unknown tag, or another field count than its class's)."""


# ---- a request's fields that cross the split -------------------------------------------------------


@dataclass(eq=False, slots=True, kw_only=True)
class Asked:
    """What the routes ask of the core for one request, beyond its id, prompt ids and max_tokens."""

    t_arrive: float = 0.0
    ignore_eos: bool = False  # EOS does not end the answer (only max_tokens does)
    stops: Stops | None = None  # stop strings / stop token ids (None: EOS and max_tokens alone)
    whole: bool = False  # the client takes the answer whole (not streamed): an engine core in another
    # process may hold its tokens after the first until its finish (serve/client/frontend_core.py)
    client: str = ""  # who sent it, for admission's shares: "key:" + a digest of its bearer key, else the peer address


def _stops_out(s) -> list | None:
    return None if s is None else [s.strings, sorted(s.ids), s.include]


def _stops_in(v):
    if v is None:
        return None
    strings, ids, include = v
    return Stops(strings, ids, include) if strings or ids else None


CODECS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {"stops": (_stops_out, _stops_in)}
"""An `Asked` field's (to the wire, from the wire), when its value is not plain msgpack data."""

_ASKED = tuple(f.name for f in dataclasses.fields(Asked))


def asked(req: Asked) -> dict[str, Any]:
    """Every `Asked` field of `req`, by name, as the wire carries it."""
    out = {}
    for name in _ASKED:
        v = getattr(req, name)
        codec = CODECS.get(name)
        out[name] = codec[0](v) if codec is not None else v
    return out


def _asked_in(d: dict[str, Any]) -> dict[str, Any]:
    unknown = set(d) - set(_ASKED)
    if unknown:
        raise MessageError(f"a request carries field(s) {sorted(unknown)} this build's `Asked` lacks")
    return {k: (CODECS[k][1](v) if k in CODECS else v) for k, v in d.items()}


# ---- the scheduler's inbox (one process) ------------------------------------------------------------


@dataclass(slots=True)
class Submit:
    req: Any  # serve.core.request.Request


@dataclass(slots=True)
class Abort:
    req: Any


@dataclass(slots=True)
class Query:
    """A read on the scheduler thread (/stats, /metrics' snapshot): `fn()`'s result or its exception
    goes to `fut`."""

    fn: Callable[[], Any]
    fut: concurrent.futures.Future


@dataclass(slots=True)
class Drain:
    until: float  # time.monotonic() after which what is unfinished is cut off


@dataclass(slots=True)
class Stop:
    pass


def dispatcher(table: dict[type, Callable[[Any], None]]) -> Callable[[Any], None]:
    """`handle(msg)`: the table's function for the message's type; a type not in it is a bug, raised."""

    def handle(msg) -> None:
        fn = table.get(type(msg))
        if fn is None:
            raise TypeError(f"no handler for message {type(msg).__name__}")
        fn(msg)

    return handle


# ---- the wire between front ends and the engine core --------------------------------------------------

_WIRE: dict[str, type] = {}


def _wire(tag: str):
    def register(cls):
        if tag in _WIRE:
            raise RuntimeError(f"wire tag {tag!r} twice")
        cls.TAG = tag
        cls.FIELDS = tuple(f.name for f in dataclasses.fields(cls))  # read once: `encode` runs per message
        _WIRE[tag] = cls
        return cls

    return register


@_wire("s")
@dataclass(slots=True)
class Arrive:
    """A request, from front end `fe` to the core."""

    TAG: ClassVar[str]
    FIELDS: ClassVar[tuple[str, ...]]
    fe: int
    id: str
    ids: list[int]
    max_tokens: int
    asked: dict[str, Any] = field(default_factory=dict)  # every `Asked` field, by name (`asked`)

    @classmethod
    def of(cls, fe: int, req) -> "Arrive":
        return cls(fe, req.id, list(req.ids), req.max_tokens, asked(req))

    def kwargs(self) -> dict[str, Any]:
        """Its `Asked` fields as the keywords of the core's `Request` (the core makes it:
        ``Request(m.id, m.ids, m.max_tokens, rows, send, **m.kwargs())``)."""
        return _asked_in(self.asked)


@_wire("a")
@dataclass(slots=True)
class HungUp:
    """The client hung up: abort request `id`."""

    TAG: ClassVar[str]
    FIELDS: ClassVar[tuple[str, ...]]
    id: str


@_wire("q")
@dataclass(slots=True)
class Question:
    """A question (`serve.client.frontend_wire.QUESTIONS`) from front end `fe`, answered by an `Answer` with `qid`."""

    TAG: ClassVar[str]
    FIELDS: ClassVar[tuple[str, ...]]
    qid: int
    what: str
    fe: int = 0


@_wire("d")
@dataclass(slots=True)
class DrainFor:
    """From the leader: refuse new requests, cut the rest off `seconds` from now."""

    TAG: ClassVar[str]
    FIELDS: ClassVar[tuple[str, ...]]
    seconds: float


@_wire("x")
@dataclass(slots=True)
class StopCore:
    """From the leader, once every other front end ended: stop."""

    TAG: ClassVar[str]
    FIELDS: ClassVar[tuple[str, ...]]


@_wire("f")
@dataclass(slots=True)
class FrontEndDied:
    """From the leader: front end `fe` died; abort its requests."""

    TAG: ClassVar[str]
    FIELDS: ClassVar[tuple[str, ...]]
    fe: int


@_wire("r")
@dataclass(slots=True)
class Ready:
    """The scheduler is ready: the engine's facts and the sizes the routes use (to each front end)."""

    TAG: ClassVar[str]
    FIELDS: ClassVar[tuple[str, ...]]
    facts: dict[str, Any]


@_wire("u")
@dataclass(slots=True)
class Updates:
    """The new tokens since the last message (about one step) of the requests of the front end it goes
    to: each entry ``[id, tokens, done or None, admitted or None]``; `timed` counts held tokens for
    /metrics (``[generated, [[seconds, tokens], ...]]`` or None)."""

    TAG: ClassVar[str]
    FIELDS: ClassVar[tuple[str, ...]]
    entries: list
    timed: Any = None


@_wire("n")
@dataclass(slots=True)
class Answer:
    """The answer to question `qid` (ok false: `value` is the error's text)."""

    TAG: ClassVar[str]
    FIELDS: ClassVar[tuple[str, ...]]
    qid: int
    ok: bool
    value: Any


@_wire("b")
@dataclass(slots=True)
class Bye:
    """The scheduler stopped; `cut_off` requests were cut by the drain's deadline (to each front end)."""

    TAG: ClassVar[str]
    FIELDS: ClassVar[tuple[str, ...]]
    cut_off: int


def encode(msg) -> bytes:
    """A wire message as msgpack: ``[tag, field, ...]``."""
    return msgpack.packb([msg.TAG, *(getattr(msg, name) for name in msg.FIELDS)], use_bin_type=True)


def decode(raw: bytes):
    """The wire message `encode` wrote; `MessageError` for one this build cannot read."""
    got = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    if not isinstance(got, list) or not got or got[0] not in _WIRE:
        raise MessageError(f"not a wire message of this build: {str(got)[:80]}")
    cls = _WIRE[got[0]]
    if len(got) - 1 != len(cls.FIELDS):
        raise MessageError(f"message {cls.__name__} with {len(got) - 1} field(s); this build's has {len(cls.FIELDS)}")
    return cls(*got[1:])


# ---- a finish, inside `Updates` -------------------------------------------------------------------------


_DONE = tuple(f.name for f in dataclasses.fields(Done))  # a finish's fields in order, read once


def pack_done(d: Done | None) -> list | None:
    """A `serve.core.request.Done` as its fields in order (its error a list)."""
    if d is None:
        return None
    return [list(v) if name == "error" and v is not None else v for name in _DONE for v in (getattr(d, name),)]


def done_of(v) -> Done | None:
    """`pack_done`'s `Done` back."""
    if v is None:
        return None
    if len(v) != len(_DONE):
        raise MessageError(f"a finish with {len(v)} field(s); this build's Done has {len(_DONE)}")
    d = dict(zip(_DONE, v))
    if d["error"] is not None:
        d["error"] = tuple(d["error"])
    return Done(**d)
