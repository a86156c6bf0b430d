"""`kern serve --frontend-process`: the engine core in a process of its own (serve/client/frontend.py).

- the same requests get the same answers, whole and streamed, as from the in-process server (every
  field but `created`: chat and completions, stop strings and stop ids, echo, usage, the kern object,
  a prefix hit);
- a client that hangs up has its request aborted in the core (its ` finished ... reason=abort ` line,
  the core's counters, nothing leaked);
- a core that dies answers every open request with an explicit error (a 503 `engine_core_dead`, a
  stream's error event then [DONE]) and the server exits 101, without hanging;
- the core reads the front end's messages from two threads, one at a time: each exactly once, in order.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import assert_nothing_leaked, children

TARGET = "toy-paged"
FLAGS = ("--capacity", "4096", "--max-seqs", "8")

BODIES = [
    ("/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 12, "return_token_ids": True}),
    ("/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 12}),  # a prefix hit now
    ("/v1/completions", {"prompt": [5, 6, 7, 8, 9], "max_tokens": 9, "echo": False, "stop_token_ids": [101]}),
    ("/v1/completions", {"prompt": "abc", "max_tokens": 16, "echo": True, "stop": ["\u0001", "zz"]}),
    ("/v1/completions", {"prompt": "hello there", "max_tokens": 10, "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}),
    ("/v1/completions", {"prompt": "x" * 40, "max_tokens": 20, "ignore_eos": True, "return_token_ids": True}),
]


def _plain(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "created"}


def _fold(events: list) -> list:
    """A stream with its chunks folded into one (a server that lags sends several steps' tokens in one
    chunk): their texts and token ids joined, the rest the last chunk's; the usage chunk and [DONE] kept."""
    chunks = [e for e in events if isinstance(e, dict) and e.get("choices")]
    if not chunks:
        return events
    one = json.loads(json.dumps(chunks[-1]))
    c = one["choices"][0]
    if "text" in c:
        c["text"] = "".join(x["choices"][0]["text"] for x in chunks)
    c["token_ids"] = [t for x in chunks for t in x["choices"][0]["token_ids"]]
    if "delta" in c:
        c["delta"]["content"] = "".join(x["choices"][0]["delta"].get("content", "") for x in chunks)
        c["delta"]["role"] = chunks[0]["choices"][0]["delta"].get("role")
    if "prompt_token_ids" in chunks[0]["choices"][0]:
        c["prompt_token_ids"] = chunks[0]["choices"][0]["prompt_token_ids"]
    return [one] + [e for e in events if not (isinstance(e, dict) and e.get("choices"))]


def _run(server, path: str, body: dict, stream: bool):
    body = {**body, "temperature": 0, "stream": stream}
    if not stream:
        body.pop("stream_options", None)
        r = httpx.post(server.url + path, json=body, timeout=120)
        return r.status_code, _plain(r.json())
    events = []
    with httpx.stream("POST", server.url + path, json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:] if line == "data: [DONE]" else _plain(json.loads(line[6:])))
    return r.status_code, _fold(events)


def test_answers_are_the_in_process_servers(kern_server):
    plain = kern_server(TARGET, *FLAGS, "--no-frontend-process")
    split = kern_server(TARGET, *FLAGS, "--frontend-process")
    assert _core_pid(plain) is None
    assert _core_pid(split) is not None, "the split server runs no engine core process"
    for stream in (False, True):
        for path, body in BODIES:
            want, got = _run(plain, path, body, stream), _run(split, path, body, stream)
            assert got == want, f"{path} {body} stream={stream}"
    assert split.stats()["counters"] == plain.stats()["counters"]
    assert _run(split, *BODIES[0], False)[1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    metrics = httpx.get(split.url + "/metrics", timeout=30).text
    assert re.search(r'kern:generation_tokens_total\{model_name="toy-paged"\} [1-9]', metrics)
    assert httpx.get(split.url + "/stats/live", timeout=30).json()["running"] == 0
    assert httpx.get(split.url + "/health", timeout=30).json() == {"status": "ok"}
    if sys.platform.startswith("linux"):  # the core's threads named where `top -H` and a pinning bench see them
        core = _core_pid(split)
        names = {Path(f"/proc/{core}/task/{t}/comm").read_text().strip() for t in os.listdir(f"/proc/{core}/task")}
        assert {"kern-core", "kern-scheduler", "kern-core-out"} <= names, names
    assert split.stop() == 0 and plain.stop() == 0


@pytest.mark.parametrize("frontend_process", [False, True], ids=["in-process", "frontend-process"])
def test_a_whole_answer_whose_client_hangs_up_is_aborted(kern_server, frontend_process):
    """A non-streamed request has nothing to write until its end, so only the hang-up watcher (its
    first check after POLL_S, its task made only then) sees the client go: the request is aborted in
    the core well before it would have finished, and nothing leaks."""
    import socket

    server = kern_server(TARGET, *FLAGS, "--fault", "slow-steps", *(["--frontend-process"] if frontend_process else []))
    body = json.dumps({"prompt": "hang up on me", "max_tokens": 1500, "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
              b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    deadline = time.monotonic() + 20
    while " admitted " not in server.log() and time.monotonic() < deadline:
        time.sleep(0.02)
    t0 = time.monotonic()
    s.close()
    while " reason=abort " not in server.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert re.search(r" finished request=req-\d+ reason=abort ", server.log()), server.log()[-2000:]
    assert time.monotonic() - t0 < 5, "seen by the watcher within a few of its checks"
    assert server.stats()["counters"]["aborted"] == 1
    assert_nothing_leaked(server)


def test_a_hang_up_aborts_the_request_in_the_core(kern_server):
    server = kern_server(TARGET, *FLAGS, "--frontend-process", "--fault", "slow-steps")  # a chunk a step
    prompt = "a long one, of more than a page of sixteen"
    body = {"prompt": prompt, "max_tokens": 1500, "ignore_eos": True, "stream": True, "temperature": 0}
    httpx.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}, timeout=60)  # cached
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        seen = []
        for line in r.iter_lines():
            if line.startswith("data: {"):
                seen.append(json.loads(line[6:]))
            if len(seen) >= 3:
                break  # hang up mid-stream
    # the hit as the core's admission found it reaches the front end with the first tokens
    assert seen[0]["kern"] == {"request_id": "req-1", "cache_tier": "device", "cached_tokens": 32, "woken": False}
    deadline = time.monotonic() + 20
    while " reason=abort " not in server.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert re.search(r" finished request=req-1 reason=abort ", server.log()), server.log()[-2000:]
    assert server.stats()["counters"]["aborted"] == 1
    assert_nothing_leaked(server)
    assert server.stop() == 0


def test_the_cores_death_answers_every_open_request_and_exits(kern_server):
    server = kern_server(TARGET, *FLAGS, "--frontend-process", "--fault", "slow-steps")  # 1500 steps: 30 s or more
    pid = _core_pid(server)
    body = {"prompt": "never ends", "max_tokens": 1500, "ignore_eos": True, "temperature": 0}
    got: dict = {}

    def whole():
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        got["whole"] = (r.status_code, r.json())

    streaming = threading.Event()

    def stream():
        got["stream"] = []
        with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    got["stream"].append(line)
                    streaming.set()

    threads = [threading.Thread(target=whole), threading.Thread(target=stream)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while server.stats()["gauges"]["running"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert streaming.wait(30), "the stream never started"
    os.kill(pid, signal.SIGKILL)
    for t in threads:
        t.join(30)
    assert got["whole"][0] == 503 and got["whole"][1]["error"]["code"] == "engine_core_dead", got["whole"]
    events = got["stream"]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["error"]["code"] == "engine_core_dead", events[-2:]
    assert server.wait_exit(30) == 101
    assert " engine core died " in server.log()


def _core_pid(server) -> int | None:
    """The server's engine core process (its one child), None when it has none."""
    return next(iter(children(server.proc.pid)), None)


def test_a_lagging_stream_sends_the_queued_tokens_as_one_chunk():
    import asyncio

    from serve.api.routes_complete import _merged
    from serve.core.request import Done, Update

    q: asyncio.Queue = asyncio.Queue()
    for u in (Update([2]), Update([3, 4]), Update([5], Done("length"))):
        q.put_nowait(u)
    one, after = _merged(q, Update([1]))
    assert (one.tokens, one.done.reason, after, q.empty()) == ([1, 2, 3, 4, 5], "length", None, True)
    cut = Update([], Done(None, error=(503, "gone", "engine_core_dead", None)))
    q.put_nowait(Update([7]))
    q.put_nowait(cut)
    one, after = _merged(q, Update([6]))
    assert (one.tokens, one.done, after) == ([6, 7], None, cut)  # a cut-off is never folded into tokens
    assert _merged(q, Update([8])) == (Update([8]), None)
    q.put_nowait(Update([10]))
    assert _merged(q, Update([9]), fold=False) == (Update([9]), Update([10]))  # continuous_usage_stats: a chunk each


def test_the_core_reads_every_message_once_in_order_from_two_threads():
    """The engine core reads the front end's socket from two threads, one at a time
    (serve/client/frontend_core.py): the scheduler thread after each iteration (`Bridge.flush`, never
    waiting), the main thread when the socket's descriptor wakes it (`_receive`). Property: every
    message sent is handled exactly once and in order, while both read and after the scheduler
    thread stops reading (the descriptor is edge-triggered: a read that leaves a message behind
    would leave it there for good)."""
    import zmq

    from serve.client.frontend_core import Bridge, _receive
    from serve.core.messages import HungUp, encode

    class Scheduler:
        def __init__(self) -> None:
            self.alive = threading.Event()
            self.alive.set()

        def is_alive(self) -> bool:
            return self.alive.is_set()

    ctx = zmq.Context()
    inp, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    inp.bind("inproc://core-in")
    push.connect("inproc://core-in")
    got: list[int] = []
    scheduler = Scheduler()
    bridge = Bridge(scheduler, None, None, inp)
    bridge.handle = lambda msg: got.append(int(msg.id))
    main = threading.Thread(target=_receive, args=(inp, bridge, os.getppid()), daemon=True)
    main.start()
    busy = threading.Event()
    busy.set()

    def scheduler_thread() -> None:
        while busy.is_set():
            bridge.pull(wait=False)

    sched = threading.Thread(target=scheduler_thread, daemon=True)
    sched.start()
    n = 3000
    try:
        for i in range(n):
            if i == n // 2:
                busy.clear()  # the scheduler waits for work from here on: the main thread alone reads
                sched.join(5)
            push.send(encode(HungUp(str(i))))
            if i % 97 == 0:
                time.sleep(0.002)
        deadline = time.monotonic() + 10
        while len(got) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == list(range(n)), (len(got), [i for i in range(n) if i not in set(got)][:5])
    finally:
        busy.clear()
        scheduler.alive.clear()
        main.join(5)
        push.close(linger=0)
        inp.close(linger=0)
        ctx.term()


def _bridge_run(plans: list[tuple[bool, list[int], bool]], every_s: float):
    """Drive a `Bridge` (the engine core's side) with requests `plans` (whole?, tokens per update,
    aborted?): one update per request an iteration, in turn, and `flush` after each iteration; the
    messages it sent handed to a `RemoteScheduler`'s `_deliver` (the front end's side) with `Gather`
    and `Track` as the routes make them. Returns (messages sent, per-iteration message counts, the
    front end's requests: (gathered tokens or streamed updates, track), its `Pending`)."""
    import asyncio

    from serve.api.metrics import Metrics
    from serve.api.routes_complete import Gather
    from serve.client.frontend import RemoteScheduler
    from serve.client.frontend_core import Bridge, Timed
    from serve.core.messages import decode
    from serve.core.request import Done, Request, Update

    sent: list[bytes] = []

    class Out:
        socks = [None]  # one front end

        def send_now(self, data: bytes, to: int = 0) -> None:
            sent.append(data)

    bridge = Bridge(None, None, Out())
    bridge.timeds = [Timed(every_s)]
    meter = Metrics("toy-paged", 4096, "kern")
    front = RemoteScheduler.__new__(RemoteScheduler)
    front.reqs, front.pending = {}, meter.pending
    sides, sinks = [], []
    for i, (whole, counts, aborted) in enumerate(plans):
        rid = f"req-{i}"
        q: asyncio.Queue = asyncio.Queue()
        streamed: list = []
        track = meter.track(0.0, 3)
        send = Gather(q, held=True) if whole else (lambda u, t=track, s=streamed: (t.update(u), s.append(u)))
        if whole:
            send.track = track
        front.reqs[rid] = Request(rid, [1, 2, 3], 64, 1, send)
        sides.append((q if whole else streamed, track))
        sinks.append(bridge.sink(rid, whole))
    per_iteration = []
    step, token = 0, 100
    while any(step < len(c) for _, c, _ in plans):
        before = len(sent)
        for sink, (whole, counts, aborted) in zip(sinks, plans):
            if step < len(counts):
                toks = list(range(token, token + counts[step]))
                token += counts[step]
                last = step == len(counts) - 1
                sink(Update(toks, (Done(None, error=(400, "gone", "x", None)) if aborted else Done("length"))
                            if last else None))
        bridge.flush()
        per_iteration.append(len(sent) - before)
        for raw in sent[before:]:
            front._deliver(decode(raw))
        step += 1
    bridge.send_timed()
    for raw in sent[sum(per_iteration):]:
        front._deliver(decode(raw))
    return sent, per_iteration, sides, meter.pending


def test_whole_answers_tokens_are_held_in_the_core_and_counted_once():
    """Under --frontend-process the engine core holds a whole (not streamed) answer's tokens after its
    first and sends them with its finish, timing them itself (serve/client/frontend_core.py `Timed`).
    Properties, over any mix of whole and streamed requests, tokens per update (speculative steps
    make several) and finishes (length or an abort): every request's tokens reach the front end once,
    in order; a whole answer gets two entries at most (its first tokens, at once, and its finish); a
    stream one per update, in the iteration that made it; an iteration that made only held tokens
    sends no message (timings due later); the front end's generation tokens are every token and its
    inter-token latency count every token after each request's first (what the gate holds /metrics
    to); no held timing is left unsent after /metrics' snapshot (`send_timed`)."""
    from hypothesis import given, settings, strategies as st

    from serve.core.messages import decode

    plan = st.tuples(st.booleans(), st.lists(st.integers(1, 3), min_size=1, max_size=6), st.booleans())

    @settings(max_examples=150, deadline=None)
    @given(st.lists(plan, min_size=1, max_size=5))
    def check(plans):
        sent, per_iteration, sides, pending = _bridge_run(plans, every_s=3600.0)
        entries: dict[int, list] = {}
        for raw in sent:
            msg = decode(raw)
            for rid, tokens, done, _ in msg.entries:
                entries.setdefault(int(rid.split("-")[1]), []).append((tokens, done))
        for i, (whole, counts, aborted) in enumerate(plans):
            made = sum(counts)
            got = [t for tokens, _ in entries[i] for t in tokens]
            assert len(got) == made and got == sorted(got), (i, got)
            side, track = sides[i]
            if whole:
                assert len(entries[i]) == (1 if len(counts) == 1 else 2)
                assert entries[i][0][0] == got[:counts[0]]  # the first tokens alone, at once
                answer = side.get_nowait()
                assert answer.tokens == got and side.empty()
            else:
                assert len(entries[i]) == len(counts) and [len(t) for t, _ in entries[i]] == counts
                assert [t for u in side for t in u.tokens] == got
            assert track.generated == made
        # iterations where every update was a whole answer's held middle sent nothing
        for step, n in enumerate(per_iteration):
            quiet = all(whole and 0 < step < len(c) - 1 or step >= len(c) for whole, c, _ in plans)
            assert n == (0 if quiet else 1), (step, n)
        total = sum(sum(c) for _, c, _ in plans)
        assert pending.generated == total
        assert sum(pending.counts) == total - len(plans)
        assert min(pending.counts) >= 0 and pending.sum >= 0

    check()


def test_held_timings_go_within_their_interval():
    """Held tokens' timings are sent at most `Timed.EVERY_S` after they were made even when no update
    goes (a /metrics scrape's rate of generation tokens stays current): with a zero interval, every
    iteration that made tokens sends a message."""
    sent, per_iteration, _, pending = _bridge_run([(True, [1] * 8, False), (True, [2] * 5, False)], every_s=0.0)
    assert per_iteration == [1] * 8
    assert pending.generated == 18 and sum(pending.counts) == 16
