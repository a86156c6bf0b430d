"""What travels between the HTTP front end and the engine core process (`--frontend-process`), and
when. The messages themselves are typed in `serve/core/messages.py` (one dataclass each, encoded as
msgpack ``[tag, field, ...]`` over ZeroMQ PUSH/PULL sockets, `ipc://` in Linux's abstract namespace:
no file): one socket to the core from every front end, one back to each front end (`--frontends`:
more than one).

Front end to core (`fe`: the sending front end's index, 0 for the leader):
    Arrive(fe, id, ids, max_tokens, asked)   a request; `asked`: every field of `messages.Asked` by name
                               (t_arrive, ignore_eos, stops, whole: not streamed, its tokens after
                               the first may be held, below; client)
    HungUp(id)                 the client hung up: abort it
    Question(qid, what, fe)    a question (`QUESTIONS`), answered to front end fe by an Answer(qid, ok, value)
    DrainFor(seconds)          drain (the leader): refuse new requests, cut the rest off `seconds` from now
    StopCore()                 stop (the leader, once every other front end ended)
    FrontEndDied(fe)           front end fe died (the leader): abort its requests

Core to front end:
    Ready(facts)               the scheduler is ready (the engine's facts and the sizes the routes use; to each)
    Updates(entries, timed)    every request's new tokens since the last message (about one step), of
                               the requests of the front end it goes to:
                               entry = [id, tokens, done or None, admitted or None]; `admitted`
                               ([cached, tier, woken, t_admit]) rides on a request's first entry;
                               `done` is a `Done`'s fields in order (`messages.pack_done`).
                               A whole answer's first tokens go at once, the rest are held and
                               come with its finish; `timed` ([generated, [[seconds, tokens], ...]]
                               or None) counts the held tokens for /metrics (generation tokens, the
                               inter-token latency, timed at the end of the step that made them).
                               A step that only made held tokens sends no message (their `timed`
                               goes at most 50 ms later, or before /metrics' snapshot)
    Answer(qid, ok, value)     an answer (ok false: value is the error's text)
    Bye(cut_off)               the scheduler stopped; `cut_off` requests were cut by the drain's deadline (to each)

`t_arrive` and `t_admit` are `time.monotonic()`, one clock for every process of the machine.
"""

from __future__ import annotations

__all__ = ["QUESTIONS", "dead_error"]

QUESTIONS = ("stats", "snapshot", "live", "health")
"""What the front end asks the core: /stats' dict, /metrics' snapshot (both on the scheduler thread),
/stats/live's and /health's (answered at once, whatever the scheduler is doing)."""


def dead_error(code: int | None) -> tuple[int, str, str, None]:
    """The error every request open when the engine core process ended gets (a 503)."""
    how = "ended" if code is None else "was killed" if code < 0 else f"exited (code {code})"  # None: not our child
    return (503, f"the engine core process {how}; this server is exiting", "engine_core_dead", None)
