"""The configurations kern ships beyond one process, each in a session of its own (issue 39).

split (``--frontend-process``): the engine core in a process of its own, the HTTP front end in the
server's; frontends2 (``--frontends 2``): two front-end processes on the one port around one core.
Each sends prompts 1-`PROMPTS_AT_ONCE`, every one twice, whole and streamed, all at once, in `ROUNDS`
rounds, each on new connections (the kernel hands a new connection to one front end: with two, one
round's may all go to the same one): every answer
identical to the oracle's (`split_equals_run`, `frontends2_equals_run`), every stream ended by
``data: [DONE]``, no request id (``kern.request_id``) told to two answers, and (a server that logs
at info) its own lines show the layout asked for: an ``engine core`` line and its ``serving`` line's
``frontends``. A bug of the messages between front end and core (a request's tokens sent to the
wrong request or front end, ids that collide across front ends, a held token lost) changes an answer.

stage_loss (a pipeline target): the twelve prompts, whole and streamed, all at once (max_tokens
at least `LOAD_TOKENS`), on a server started with ``--fault stall-until-loss``: `KILL_AT` steps after its
first request the head stalls (a stage hung mid-load, answers unchanged) until a stage is lost. The
gate reads ``/stats/live`` until the server has run `KILL_AT` steps of the load with a request running,
then SIGKILLs one stage (drawn from ``--seed``) by the pid its ``pp stage ready`` line logs. The stall
holds the server at the trigger until the kill, so however starved the gate is (beside a second test
suite, on two cores shared with nine other targets) the kill lands mid-answer: nothing races the clock.
Earlier triggers raced it and lost: one counted in the tokens a client had read landed after the server
had finished every answer (the clients lag behind its writes), one counted in finished answers when only
requests that had not started were left, and one on /stats/live unheld saw a whole load (about 70 steps,
half a second) go out between two of its reads, twice (CI on 3727287). The head starts the stage again
and resumes every request from its prompt and the tokens it already produced: `stage_loss_resumed`
holds every answer identical to the oracle's, no request erred, and the server's ``/stats`` shows one
loss, no request answered with an error, and at least one request resumed mid-answer (``resumed``;
else nothing was running at the kill and the check is reported, not judged).

Only this checkout's kern serves these configurations: an engine under the contract, or another kern
(``--kern``), skips them (their rows' `runs` in `e2e/scenarios/__init__.py`).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import dataclass

from e2e.prompts import PROMPTS
from e2e.scenarios.stream import streamed
from verdicts import Same

__all__ = ["frontends", "frontends_flags", "split", "split_flags", "stage_loss", "stage_loss_flags"]

PROMPTS_AT_ONCE = 6  # split and frontends2: prompts 1-6, each whole and streamed (12 requests at once)
ROUNDS = 4  # split: the burst again on new connections
ROUNDS_FRONTENDS = 8  # frontends2: more, as the kernel shares new connections between the two front ends
# unevenly, and on a loaded machine all of four rounds' could go to one (no request ids could then collide)
KILL_AT = 12  # stage_loss: the server's steps into the load when a stage is killed (a request still running); the
# server's stall-until-loss fault stalls it there (its STALL_AT, the same 12: tests/test_e2e_configs.py)
STALL_FAULT = "stall-until-loss"
LOAD_TOKENS = 64  # stage_loss: max_tokens at least this (the longest answer has about LOAD_TOKENS - KILL_AT left at the kill)
POLL_S = 0.005  # stage_loss: how often /stats/live is read for the kill
LIVE_S = 30.0  # stage_loss: how long one read of /stats/live may take: under load the server answers it
# late, but of the moment it answers, so the kill follows a fresh answer (with the hang watch's 1 s, every
# read beside a second suite gave up and the load ended unseen)
STAGE_S = 60.0  # for the killed stage's replacement to be logged ready


def split_flags(r) -> list[str]:
    return ["--frontend-process"]


def frontends_flags(r) -> list[str]:
    return ["--frontends", "2"]


def stage_loss_flags(r) -> list[str]:
    return ["--fault", STALL_FAULT]


def _calls(r, prompts: list[str]) -> list[tuple[list[int], bool]]:
    """Each prompt twice: whole, then streamed."""
    return [(list(p.encode()), stream) for p in prompts for stream in (False, True)]


def _one(r, ids: list[int], stream: bool, m: int) -> tuple[list[int], str | None, str]:
    """One request's (ids, finish, name); a streamed one without its `[DONE]` raises."""
    client = r.need_any().client
    if not stream:
        a = client.complete(ids, m)
        return a.ids, a.finish, a.request
    body = {"model": client.model, "prompt": ids, "max_tokens": m, "temperature": 0, "return_token_ids": True,
            "stream": True}
    data, name = client.request(body)
    got, finish = streamed(data)
    if finish == "stop" and got:
        got.pop()  # a stopped answer ends with its stop token, as a whole one does (`Client.complete`)
    if not data.get("done"):
        raise RuntimeError(f"request {name}: the stream ended without `data: [DONE]`")
    return got, finish, str((data.get("kern") or {}).get("request_id") or name)


def _load(r, calls, m: int) -> list:
    """Every call at once, a thread each. Results in call order: (ids, finish, name) or the exception."""
    out: list = [None] * len(calls)

    def one(i: int) -> None:
        try:
            out[i] = _one(r, *calls[i], m)
        except BaseException as exc:  # reported with the check
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _longest(r, calls, m: int) -> int:
    """The index of the streamed call whose oracle answer is the longest (the first of equals)."""
    streamed_calls = [i for i, (_, stream) in enumerate(calls) if stream]
    return max(streamed_calls, key=lambda i: (len(r.oracle.run(calls[i][0], m, r.rows)), -i))


def _judge(r, calls, out, m: int, same: Same | None = None, problems: list[str] | None = None) -> tuple[Same, list[str]]:
    """Every answer of `out` held to the oracle's, into `same` (new if None); errors into `problems`."""
    same = Same(r.oracle, r.rows) if same is None else same
    problems = [] if problems is None else problems
    for (ids, stream), got in zip(calls, out):
        label = f"prompt {bytes(ids).decode(errors='replace')[:20]!r} {'streamed' if stream else 'whole'}"
        if isinstance(got, BaseException):
            problems.append(f"{label}: {type(got).__name__}: {got}")
            continue
        same.add(f"{label} (request {got[2]})", ids, got[0], r.oracle.run(ids, m, r.rows))
    return same, problems


def _layout(live, frontends: int) -> list[str]:
    """The server's own lines say it ran as asked: an `engine core` line and its `serving` line's
    front ends (not judged on a server that logs nothing at info: its `serving` line is missing)."""
    serving = live.session.log.lines("serving")
    if not serving:
        return []
    told = int(serving[-1].get("frontends", 1))
    core = live.session.log.count("engine core")
    if not core or told != frontends:
        return [f"the server's lines show {'an' if core else 'no'} engine core process and {told} front end(s); "
                f"its flags asked for an engine core process and {frontends}"]
    return []


def _concurrent(r, check: str, frontends: int, rounds: int = ROUNDS) -> None:
    r.serial_ends("whole and streamed requests at once")
    calls = _calls(r, PROMPTS[:PROMPTS_AT_ONCE])
    out = []
    for _ in range(rounds):  # each on new connections: the kernel hands them to the front ends afresh
        r.need_any().client.reconnect()
        out += _load(r, calls, r.m)
    calls = calls * rounds
    same, problems = _judge(r, calls, out, r.m)
    problems += _ids_unique(out) + _layout(r.need_any(), frontends)
    ok = not problems and (same.ok or not r.oracle.exact)
    note = (f"{rounds} rounds of {len(calls) // rounds} requests at once on new connections (prompts "
            f"1-{PROMPTS_AT_ONCE}, whole and streamed); {same}")
    r.checks.add(check, ok, note + "".join(f"; {p}" for p in problems), same.excused, same.first)


def _ids_unique(out) -> list[str]:
    """Every answer's request id (its `kern.request_id`) told once: one numbering across front ends."""
    ids = [o[2] for o in out if not isinstance(o, BaseException)]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    return [f"request id(s) {', '.join(twice)} told to more than one answer"] if twice else []


def split(r) -> None:
    _concurrent(r, "split_equals_run", 1)


def frontends(r) -> None:
    _concurrent(r, "frontends2_equals_run", 2, ROUNDS_FRONTENDS)


def victim(r) -> int:
    """The stage to kill (1 .. stages-1: the head is stage 0), drawn from --seed."""
    return random.Random(r.opts.seed).randrange(1, r.target.stages)


def _stage_pid(log, stage: int) -> int | None:
    pids = [int(d["pid"]) for d in log.lines("pp stage ready") if int(d.get("stage", -1)) == stage and "pid" in d]
    return pids[-1] if pids else None


def stage_loss(r) -> None:
    live = r.need("stage_loss")
    r.serial_ends("a stage killed under load")
    calls = _calls(r, PROMPTS)
    k = victim(r)
    m = max(r.m, LOAD_TOKENS)
    longest = len(r.oracle.run(calls[_longest(r, calls, m)][0], m, r.rows))
    same, problems, pipe = Same(r.oracle, r.rows), [], {}
    load = _killed_under_load(r, live, calls, k, m, same, problems)
    if load.why:
        problems.append(load.why)
    else:
        problems += _restarted(live, k, load.killed)
    pipe = (live.client.stats() or {}).get("pipeline") or {}
    kills = int(load.killed > 0)
    if pipe.get("losses") != kills or pipe.get("answered_error"):
        problems.append(f"/stats pipeline {pipe}: want losses {kills} and answered_error 0")
    ok = not problems and (same.ok or not r.oracle.exact)
    note = (f"{len(calls)} requests at once (the 12 prompts, whole and streamed, {m} tokens, the longest answer "
            f"{longest}), stage {k} of {r.target.stages} SIGKILLed {KILL_AT} steps into the load with requests "
            f"running (the server stalled there by --fault {STALL_FAULT}), "
            f"{pipe.get('requeued', '?')} requests requeued, {pipe.get('resumed', '?')} of them resumed mid-answer; {same}")
    if ok and not pipe.get("resumed"):  # right answers, but the kill came when nothing ran
        ok = None
        problems.append("not judged: no request was running when the stage was killed")
    r.checks.add("stage_loss_resumed", ok, note + "".join(f"; {p}" for p in problems), same.excused, same.first)


def _killed_under_load(r, live, calls, k: int, m: int, same: Same, problems: list[str]) -> "Load":
    """One load of `calls`, stage `k` SIGKILLed `KILL_AT` server steps into it with a request running
    (the server stalls there until a stage is lost; the pid read before the load); every answer judged
    into `same`, errors into `problems`. What was killed, or why nothing was (`Load`)."""
    pid = _stage_pid(live.session.log, k)
    base = (live.client.live(LIVE_S) or {}).get("steps")
    done = threading.Event()
    killed: list[int] = []
    seen: list[dict] = []

    def kill_when_running() -> None:
        """The server's own progress (``/stats/live``), not what a client has read, which lags on a
        loaded machine until every answer may be out before the kill."""
        while not done.is_set():
            now = live.client.live(LIVE_S)
            if now is not None and base is not None:
                seen[:] = [now]
                if now.get("running") and now.get("steps", 0) >= base + KILL_AT:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
            done.wait(POLL_S)

    watcher = threading.Thread(target=kill_when_running, name="stage-loss-kill", daemon=True)
    if pid is not None:
        watcher.start()
    out = _load(r, calls, m)
    done.set()
    if pid is not None:
        watcher.join()
    _judge(r, calls, out, m, same, problems)
    if pid is None:
        return Load(why=f"no `pp stage ready stage={k}` line with a pid: nothing was killed")
    if base is None:
        return Load(why="/stats/live did not answer before the load: nothing to time the kill by, nothing was killed")
    if not killed:
        return Load(why=f"the load ended before the server had run {KILL_AT} steps of it with a request running "
                        f"(/stats/live last said {seen[-1] if seen else None}, {base} steps before; the server's stall "
                        f"at that step was missing or ended): nothing was killed")
    return Load(killed=killed[0])


@dataclass(frozen=True)
class Load:
    """One stage_loss load: the stage's pid it killed (0: none), else why not."""

    killed: int = 0
    why: str = ""


def _restarted(live, stage: int, pid: int) -> list[str]:
    """Within STAGE_S, the killed stage's replacement logged ready under another pid (the head's restart)."""
    deadline = time.monotonic() + STAGE_S
    while time.monotonic() < deadline:
        now = _stage_pid(live.session.log, stage)
        if now is not None and now != pid and live.session.log.count("pp stage restarted") >= 1:
            return []
        time.sleep(0.05)
    return [f"stage {stage} (pid {pid}) was not replaced within {STAGE_S:.0f} s"]
