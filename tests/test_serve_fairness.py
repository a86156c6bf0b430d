"""Issue 28's fairness and hygiene: one client holding thousands of connections does not shut the
others out (a cap per peer address, silent connections shed first under pressure); large legal
bodies are parsed off the event loop (/health stays fast under a burst of them); a 413 reaches a
client that sends its whole body first (no reset); HEAD /v1/models answers; no string, however
undecodable (a lone surrogate), ever gets a 500.

On loopback every client is 127.0.0.1, so the clients here bind their own source addresses in
127.0.0.0/8 (Linux routes the whole block to lo): the hog is 127.0.0.2, the others 127.0.0.3 on."""

from __future__ import annotations

import concurrent.futures
import errno
import json
import resource
import selectors
import socket
import threading
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import can_bind, oracle, start_server

HOG = "127.0.0.2"
CLIENTS = [f"127.0.0.{i}" for i in range(3, 23)]  # 20 clients


pytestmark = pytest.mark.skipif(not can_bind(HOG), reason="no 127.0.0.2 on lo (not Linux)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Default limits (--max-connections 1000, --max-connections-per-client 256, a 4 MiB body limit),
    but a --header-timeout longer than the tests, so a silent connection once admitted stays (the
    count the server holds is then what its caps allow, not what the timeout left)."""
    s = start_server("toy-paged", "--header-timeout", "120", log_path=tmp_path_factory.mktemp("fair") / "server.log")
    yield s
    s.stop()


@pytest.fixture(scope="module", params=["httptools", "h11"])
def small(request, tmp_path_factory):
    """A cap of 24 connections, all of which one client may hold: only shedding lets others in (under
    each HTTP parser: which connections are silent is read off the parser's state)."""
    s = start_server("toy-paged", "--max-connections", "24", "--max-connections-per-client", "24",
                     "--http", request.param, log_path=tmp_path_factory.mktemp("fair-small") / "server.log")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def quiet(tmp_path_factory):
    """Default limits and a server no other test has loaded: the bodies burst measures /health under
    the bodies alone, not while the server is still closing the 5,000-connection test's sockets (a
    different load, measured by that test)."""
    s = start_server("toy-paged", log_path=tmp_path_factory.mktemp("fair-quiet") / "server.log")
    yield s
    s.stop()


def _client(addr: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=addr), timeout=60)


class Hog(threading.Thread):
    """One peer address keeping `want` connections open: silent ones, each reopened when the server
    closes it (a 503, a 408 or a shed), until stopped."""

    def __init__(self, port: int, want: int, addr: str = HOG) -> None:
        super().__init__(daemon=True)
        self.port, self.want, self.addr = port, want, addr
        self.sel = selectors.DefaultSelector()
        self.open = 0
        self.closed_by_server = 0
        self.peak = 0  # the most it had open on its side at once
        self.stopping = threading.Event()
        self.paused = threading.Event()  # set: closed ones are not reopened

    def _connect(self) -> None:
        s = socket.socket()
        s.setblocking(False)
        s.bind((self.addr, 0))
        err = s.connect_ex(("127.0.0.1", self.port))
        if err not in (0, errno.EINPROGRESS):
            s.close()
            return
        self.sel.register(s, selectors.EVENT_READ)
        self.open += 1
        self.peak = max(self.peak, self.open)

    def run(self) -> None:
        while not self.stopping.is_set():
            while self.open < self.want and not self.paused.is_set():
                self._connect()
            for key, _ in self.sel.select(0.05):
                try:
                    got = key.fileobj.recv(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    got = b""
                if not got or got.startswith(b"HTTP/1.1 "):
                    self.sel.unregister(key.fileobj)
                    key.fileobj.close()
                    self.open -= 1
                    self.closed_by_server += 1

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()


def _served(server, addr: str, n: int, ids: list[int]) -> list[list[int]]:
    with _client(addr) as c:
        out = []
        for _ in range(n):
            r = c.post(server.url + "/v1/completions", json={"prompt": ids, "max_tokens": 4, "return_token_ids": True})
            assert r.status_code == 200, (addr, r.status_code, r.text[:200])
            out.append(r.json()["choices"][0]["token_ids"])
        return out


def _fd_room(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        if hard < n:
            pytest.skip(f"this process may open {hard} files; the test needs {n}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))


def _sockets(server) -> tuple[int, int, list[str]]:
    """What /proc/net/tcp says of the server's port: the hog's established connections, the listening
    socket's accept queue (connections the kernel completed that the server has not accepted yet),
    and every line from the hog (for a failure's message)."""
    port = f"{server.port:04X}"
    hog = "".join(f"{int(x):02X}" for x in reversed(HOG.split(".")))
    est, queued, lines = 0, 0, []
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, remote, state, queues = line.split()[1:5]
            if not local.endswith(":" + port):
                continue
            if state == "0A":
                queued += int(queues.split(":")[1], 16)  # a listener's rx_queue: its accept queue's length
            elif remote.startswith(hog + ":"):
                lines.append(f"{remote} state {state}")
                est += state == "01"
    return est, queued, lines


def _held(server) -> int:
    """Connections the server holds from the hog: established sockets on its port from HOG (/proc),
    less those still in the listener's accept queue (not the server's yet)."""
    est, queued, _ = _sockets(server)
    return est - queued


def test_twenty_clients_are_served_while_one_holds_5000_connections(server):
    """Done-when of issue 28: one peer keeps 5,000 connections open (each refused one reopened), and
    20 other peers, each asking 3 completions in turn, are all answered correctly; the server holds
    at most --max-connections-per-client of the hog's."""
    _fd_room(5000 + 512)
    hog = Hog(server.port, 5000)
    hog.start()
    try:
        deadline = time.monotonic() + 120  # 5,000 connects take seconds; minutes on a loaded 2-core machine
        while hog.peak < 5000 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # its first connections are in, and refused ones reopened
        ids = [1, 2, 3, 4, 5]
        want = oracle("toy-paged", ids, 4)
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(len(CLIENTS)) as ex:
            got = list(ex.map(lambda a: _served(server, a, 3, ids), CLIENTS))
        took = time.monotonic() - t0
        assert all(g == [want] * 3 for g in got)
        kept = hog.open  # open on its side now (the server's closes not yet seen, or not yet reopened)
        assert hog.peak == 5000 and kept + hog.closed_by_server >= 5000, (hog.peak, kept, hog.closed_by_server)
        hog.paused.set()
        # refused ones are let go after their 1 s linger, none reopened; on a loaded machine the
        # server's loop may take longer to close them, so the count is read until it settles (15 s at most)
        settle = time.monotonic() + 15.0
        held = _held(server)
        while held > 256 and time.monotonic() < settle:
            time.sleep(0.2)
            held = _held(server)
        assert held <= 256, held
        print(f"\n20 clients x 3 completions in {took:.2f} s while the hog had up to {hog.peak} "
              f"connections open at once ({kept} at the end, {hog.closed_by_server} closed by the server and "
              f"reopened); the server held {held} of them")
    finally:
        hog.stop()
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_silent_connections_are_shed_for_other_clients(small):
    """At --max-connections with one peer holding them all (silent), every newcomer from another
    peer is let in by shedding one of the hog's; one more from the hog itself is refused (503)."""
    hog = Hog(small.port, 24)
    hog.start()
    try:
        time.sleep(1.0)
        settle = time.monotonic() + 15.0  # a loaded machine: its connections in, a refused one let go
        while _held(small) != 24 and time.monotonic() < settle:
            time.sleep(0.2)
        assert _held(small) == 24, (_sockets(small), hog.open, hog.peak, hog.closed_by_server)  # the whole cap
        ids = [7, 8, 9]
        want = oracle("toy-paged", ids, 4)
        with concurrent.futures.ThreadPoolExecutor(len(CLIENTS)) as ex:
            got = list(ex.map(lambda a: _served(small, a, 2, ids), CLIENTS))
        assert all(g == [want] * 2 for g in got)
        assert hog.closed_by_server >= 1
    finally:
        hog.stop()
    assert " connection shed " in small.log()


def _burst_body(size: int = 4 << 20) -> bytes:
    """A legal body just under `size`: a prompt of token ids, the slowest JSON to parse and check."""
    n = (size - 64) // 2  # "1," each
    body = json.dumps({"prompt": [1] * n, "max_tokens": 1}, separators=(",", ":")).encode()
    assert len(body) <= size
    return body


def _post_raw(port: int, path: str, body: bytes, addr: str = "127.0.0.1") -> bytes:
    """Send headers and the whole body, then read the answer until the server closes or 60 s."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60, source_address=(addr, 0))
    try:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
                  "connection: close\r\n\r\n".encode() + body)
        out = b""
        while True:
            got = s.recv(65536)
            if not got:
                return out
            out += got
    finally:
        s.close()


def _probe(server, done: threading.Event, lat: list[float]) -> threading.Thread:
    """/health asked every 10 ms on a kept-alive connection until `done`, each latency into `lat`."""

    def probe() -> None:
        with httpx.Client(timeout=30) as c:
            c.get(server.url + "/health")  # connected before the burst
            while not done.is_set():
                t = time.perf_counter()
                r = c.get(server.url + "/health")
                lat.append(time.perf_counter() - t)
                assert r.status_code == 200
                time.sleep(0.01)

    p = threading.Thread(target=probe, daemon=True)
    p.start()
    return p


def _burst(server, control, body: bytes) -> tuple[list[float], list[float], list, float]:
    """48 copies of `body` sent at once to `server` while /health is asked every 10 ms on a kept-alive
    connection, of it and of `control` (a server no body reaches, on the same machine at the same
    moment): (the server's /health latencies, the control's, each body's error code, the burst's seconds)."""
    lat: list[float] = []
    base: list[float] = []
    done = threading.Event()
    probes = [_probe(server, done, lat), _probe(control, done, base)]
    time.sleep(0.3)
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(48) as ex:
        answers = list(ex.map(lambda _: _post_raw(server.port, "/v1/completions", body), range(48)))
    took = time.monotonic() - t0
    done.set()
    for p in probes:
        p.join(30)
    codes = [json.loads(a.split(b"\r\n\r\n", 1)[1])["error"]["code"] if b"\r\n\r\n" in a else None for a in answers]
    return lat, base, codes, took


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    """A second idle server: its /health, asked beside the burst, is what the machine itself stalls a
    server's loop by at that moment (the same-run baseline of the bound below)."""
    s = start_server("toy-paged", log_path=tmp_path_factory.mktemp("fair-control") / "server.log")
    yield s
    s.stop()


def test_health_stays_fast_while_48_bodies_of_4_mib_arrive(quiet, control):
    """Done-when of issue 28: 48 bodies of 4 MiB sent at once (each a prompt of 2 million token ids,
    refused for its length after it is parsed) do not push /health over 200 ms, and each gets its
    answer (400 context_length_exceeded), none a 408.

    200 ms is the bound on a machine that by itself stalls an idle server's probe by under 100 ms
    (alone on this 2-core box: worst 33-56 ms in a burst, docs/results-measured.md). In the parallel
    suite, or beside a second suite, other tests' servers share the cores and stall any server's loop
    by 300-750 ms now and then, which no server can answer for; so the same probe asks an idle control
    server at the same moments, and the bound is twice the control's worst when that is more (a
    baseline taken 3 s before the burst was not the same moment: beside a second suite it read under
    100 ms and the burst's window 380-710 ms). On a CI machine loaded by other jobs that was not enough
    either: bursts of 23-59 s, the server's worst 447-821 ms against the control's 119-259 ms (the
    server's loop reads the 192 MB itself). So the bound is also a twelfth of the burst's own length:
    a stall that is a small part of the burst is the machine's, not the loop's. Correct servers stay
    far under it (0.009-0.021 of the burst on that CI machine); what the test is for stays far over it
    on an idle machine: parsing on the loop stalled /health for 0.43-0.86 of a 10 s burst (4.4-8.7 s),
    parsing in a thread of the server's process (the interpreter lock) 0.21-0.72. The burst runs up to
    3 times and passes on the first that keeps its bound."""
    body = _burst_body()
    seen = []
    for attempt in range(3):
        lat, base, codes, took = _burst(quiet, control, body)
        assert codes == ["context_length_exceeded"] * 48, codes
        assert len(lat) >= 10 and len(base) >= 10
        worst, bound = max(lat), max(0.200, 2 * max(base), took / 12)
        seen.append(f"{worst * 1e3:.0f} (bound {bound * 1e3:.0f})")
        print(f"\n48 x {len(body)} bytes answered in {took:.2f} s; /health: {len(lat)} probes, "
              f"median {sorted(lat)[len(lat) // 2] * 1e3:.1f} ms, worst {worst * 1e3:.1f} ms; the idle control's "
              f"worst at the same moments {max(base) * 1e3:.1f} ms")
        if worst < bound:
            return
    pytest.fail(f"/health's worst latency in each of 3 bursts, ms: {', '.join(seen)}")


def test_413_reaches_a_client_that_sends_its_whole_body_first(server):
    """A body over --max-body-bytes sent whole before reading: the 413 arrives, never a reset
    (the server drains what it will not read instead of closing on it)."""
    big = b"x" * (12 << 20)
    for _ in range(10):
        raw = _post_raw(server.port, "/v1/completions", big)
        assert raw.startswith(b"HTTP/1.1 413 "), raw[:200]
        assert json.loads(raw.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_too_large"
    r = httpx.post(server.url + "/v1/completions", content=big, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_head_on_models_answers(server):
    r = httpx.head(server.url + "/v1/models", timeout=10)
    assert r.status_code == 200 and r.content == b""
    assert httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["id"] == "toy-paged"


# -- no string gets a 500 -------------------------------------------------------------------------

# every string-bearing field of the two schemas and the token endpoints, as (endpoint, path, body maker)
def _fields():
    from serve.api.validate import CHAT, CMPL, PARAMS

    base = {CMPL: {"prompt": [1, 2], "max_tokens": 1}, CHAT: {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}}
    out = []
    for p in PARAMS:
        for ep in p.on:
            if p.name in ("prompt", "messages"):
                continue
            out.append((ep, p.name, lambda s, ep=ep, n=p.name: {**base[ep], n: s}))
    out += [
        (CMPL, "prompt", lambda s: {"prompt": s, "max_tokens": 1}),
        (CMPL, "stop[1]", lambda s: {**base[CMPL], "stop": ["x", s]}),
        (CHAT, "messages[0].content", lambda s: {"messages": [{"role": "user", "content": s}], "max_tokens": 1}),
        (CHAT, "messages[0].role", lambda s: {"messages": [{"role": s, "content": "hi"}], "max_tokens": 1}),
        (CHAT, "messages[1].content[0].text",
         lambda s: {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "text", "text": s}]}],
                    "max_tokens": 1}),
        ("tokenize", "prompt", lambda s: {"prompt": s}),
        ("detokenize", "model", lambda s: {"tokens": [1], "model": s}),
    ]
    return out


FIELDS = _fields()
PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "tokenize": "/tokenize", "detokenize": "/detokenize"}
# any code point, surrogates half the time (a plain text strategy all but never draws one)
ANY_TEXT = st.lists(st.one_of(st.characters(blacklist_categories=()), st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)),
                    max_size=12).map("".join)


def _strings(v):
    """Every string in a decoded body, keys included."""
    if isinstance(v, str):
        yield v
    elif isinstance(v, dict):
        for k, x in v.items():
            yield k
            yield from _strings(x)
    elif isinstance(v, list):
        for x in v:
            yield from _strings(x)


def _lone(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), text=ANY_TEXT, in_key=st.booleans(), escaped=st.booleans())
def test_no_string_gets_a_500(server, field, text, in_key, escaped):
    """Any string (lone surrogates included, sent as a \\u escape or as their raw bytes) in any string
    field, or as an unknown key: never a 500; a string that is not valid Unicode is a 400 naming the
    field it is in."""
    ep, path, make = field
    body = {**make("x"), text: 1} if in_key else make(text)
    raw = json.dumps(body, ensure_ascii=escaped).encode("utf-8", "surrogatepass")
    r = httpx.post(server.url + PATHS[ep], content=raw, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code < 500, (r.status_code, r.text[:300])
    err = r.json().get("error") if r.status_code >= 400 else None
    # what the server decodes: a high and a low surrogate side by side as \\u escapes are one character
    if any(_lone(x) for x in _strings(json.loads(raw))):
        assert r.status_code == 400 and err["code"] == "invalid_string", r.text[:300]
        if not in_key:
            assert err["param"] == path, (err, path)
