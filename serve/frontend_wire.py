"""The messages between the HTTP front end and the engine core process (`--frontend-process`), as
msgpack over ZeroMQ PUSH/PULL sockets (`ipc://` in Linux's abstract namespace: no file): one to the
core from every front end, one back to each front end (`--frontends`: more than one).

Front end to core (`fe`: the sending front end's index, 0 for the leader):
    ["s", id, prompt ids, max_tokens, ignore_eos, t_arrive, stop strings, stop ids, include_stop, whole, fe, client]
                               whole: not streamed (its tokens after the first may be held, below)
    ["a", id]                  the client hung up: abort it
    ["q", qid, what, fe]       a question (`QUESTIONS`), answered to front end fe by an ["q", qid, ok, value]
    ["d", seconds]             drain (the leader): refuse new requests, cut the rest off `seconds` from now
    ["x"]                      stop (the leader, once every other front end ended)
    ["f", fe]                  front end fe died (the leader): abort its requests

Core to front end:
    ["r", facts]               the scheduler is ready (the engine's facts and the sizes the routes use; to each)
    ["u", [entry, ...], timed] every request's new tokens since the last message (about one step), of
                               the requests of the front end it goes to:
                               entry = [id, tokens, done or None, admitted or None]; `admitted`
                               ([cached, tier, woken, t_admit]) rides on a request's first entry.
                               A whole answer's first tokens go at once, the rest are held and
                               come with its finish; `timed` ([generated, [[seconds, tokens], ...]]
                               or None) counts the held tokens for /metrics (generation tokens, the
                               inter-token latency, timed at the end of the step that made them).
                               A step that only made held tokens sends no message (their `timed`
                               goes at most 50 ms later, or before /metrics' snapshot)
    ["q", qid, ok, value]      an answer (ok false: value is the error's text)
    ["b", cut_off]             the scheduler stopped; `cut_off` requests were cut by the drain's deadline (to each)

`t_arrive` and `t_admit` are `time.monotonic()`, one clock for every process of the machine.
"""

from __future__ import annotations

import time

import msgpack

from serve.request import Done

__all__ = ["QUESTIONS", "dead_error", "done_of", "health_of", "pack", "pack_done", "unpack"]

QUESTIONS = ("stats", "snapshot", "live", "health")
"""What the front end asks the core: /stats' dict, /metrics' snapshot (both on the scheduler thread),
/stats/live's and /health's (answered at once, whatever the scheduler is doing)."""


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(raw: bytes):
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


def pack_done(d: Done | None):
    if d is None:
        return None
    return [d.reason, d.cached, d.tier, d.snapshot, list(d.error) if d.error is not None else None, d.stop_reason,
            d.text_end, d.hide_last, d.woken]


def done_of(v) -> Done | None:
    if v is None:
        return None
    reason, cached, tier, snapshot, error, stop_reason, text_end, hide_last, woken = v
    return Done(reason, cached, tier, snapshot, tuple(error) if error is not None else None, stop_reason, text_end,
                hide_last, woken)


def dead_error(code: int | None) -> tuple[int, str, str, None]:
    """The error every request open when the engine core process ended gets (a 503)."""
    how = "ended" if code is None else "was killed" if code < 0 else f"exited (code {code})"  # None: not our child
    return (503, f"the engine core process {how}; this server is exiting", "engine_core_dead", None)


def health_of(scheduler, engine) -> dict:
    """/health's facts (any thread): a pipeline's trouble (a stage lost or silent, else None), whether
    the scheduler is ready, alive and warm, and how long its iteration in progress has run (`busy_s`,
    None while it waits for work: the front end calls it stuck past `--stuck-after`)."""
    busy = getattr(scheduler, "busy_since", None)
    return {"trouble": engine.runtime.trouble(), "ready": scheduler.ready.is_set(),
            "alive": scheduler.is_alive(), "warm": scheduler.warm.is_set(),
            "busy_s": None if busy is None else round(time.monotonic() - busy, 3)}
