"""A client of one server session: completions with request ids mirrored, tokenize, stats, hang-up.

The server names requests ``req-0``, ``req-1``, ... in arrival order; the client mirrors that with a
counter under a lock that goes up for every completion the server accepted (a 400 is not counted),
and prefers the id the server reports in its ``kern`` object when there is one.

A request is sent again, once, on a fresh connection only when it was never handed to the server: the
live server dropped the (kept-alive, idle) connection before any byte of a response (httpx:
"Server disconnected without sending a response", or the write itself failed). A server reads a
request before it answers anything, and a completion is not idempotent, so nothing else is retried;
a dead server is reported with its exit code. Idle connections are also let go after `KEEPALIVE_S`,
well inside a server's keep-alive timeout (uvicorn: 5 s), so the race is rare to begin with.
"""

from __future__ import annotations

import concurrent.futures
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx

from e2e.metrics import Ledger, Sent
from e2e.session import Session
from e2e.tls import tls
from e2e.watch import Hung, Watch
from kern.errors import KernError

__all__ = ["Answer", "Client", "Rejected", "Unanswerable", "hung_up", "never_sent"]

KEEPALIVE_S = 2.0
KERN_FIELDS = ("request_id", "cache_tier", "snapshot", "woken")


def hung_up(rid: str, prompt: int, first: dict[str, Any] | None) -> Sent:
    """The ledger's entry for a stream the client hung up on: its hit as the first chunk's `kern`
    told it (docs/api.md), or untold (no chunk read, or a server that tells it only at the end)."""
    k = (first or {}).get("kern")
    if not isinstance(k, dict):
        return Sent("hung_up", prompt, request=rid, untold=("kern",) if first is not None else ())
    fields = ("cache_tier", "cached_tokens", "woken")
    return Sent("hung_up", prompt, 0, int(k.get("cached_tokens") or 0), None, k.get("cache_tier"), k.get("woken"),
                tuple(f for f in fields if f not in k), str(k.get("request_id") or rid))


def _chunk(line: bytes) -> dict[str, Any]:
    """A ``data:`` line's JSON object ({} for ``[DONE]`` or anything else that is not one)."""
    try:
        got = json.loads(line[5:])
    except ValueError:
        return {}
    return got if isinstance(got, dict) else {}


def never_sent(exc: BaseException) -> bool:
    """Did this transport error happen before the server could have read the request?"""
    if isinstance(exc, httpx.WriteError):
        return True
    return isinstance(exc, httpx.RemoteProtocolError) and "without sending a response" in str(exc)


class Unanswerable(KernError, RuntimeError):
    """A 200 whose body the gate cannot read as the contract's answer (no generated ids)."""


class Rejected(KernError, RuntimeError):
    """The server refused a request (an HTTP error status)."""

    def __init__(self, status: int, body: Any):
        err = body.get("error", {}) if isinstance(body, dict) else {}
        self.status = status
        self.code = err.get("code") if isinstance(err, dict) else None
        self.body = body
        super().__init__(f"HTTP {status}: {json.dumps(body)[:300]}")


@dataclass
class Answer:
    """One completion: the answer ids without the stop token, and what the response said."""

    ids: list[int]
    stop: int | None
    prompt_ids: list[int]
    cached: int
    finish: str | None
    request: str
    tier: str | None = None
    snapshot: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    woken: bool | None = None  # kern.woken: its hit was a parked snapshot woken into the lease

    def untold(self) -> list[str]:
        """The `kern` object's fields this response lacks: a server with /stats tells each request's
        tier, snapshot and wake through the API (docs/api.md), never only in a log line."""
        k = self.raw.get("kern")
        return [f for f in KERN_FIELDS if not isinstance(k, dict) or f not in k]

    @property
    def served(self) -> tuple[int | None, str | None]:
        """What it was served from, as the response told it: (``cached_tokens``, the tier); None where untold."""
        d = (self.raw.get("usage") or {}).get("prompt_tokens_details") or {}
        told = d.get("cached_tokens") if isinstance(d, dict) else None
        return (told if isinstance(told, int) else None), self.tier

    @property
    def fed(self) -> list[int]:
        """The answer as a next turn feeds it back: with the stop token when it ended on stop."""
        return self.ids + ([self.stop] if self.stop is not None else [])


class Client:
    def __init__(self, session: Session, model: str, timeout: float = 300.0, api_key: str | None = None,
                 text: bool = True, stream_usage: bool = False):
        self.session = session
        self.model = model
        self.text = text  # the server takes string prompts and /tokenize; else the client sends the bytes' ids
        # streams ask for usage (stream_options.include_usage: OpenAI's rule, vLLM's) where the body does not
        # say: a server that sends a stream's usage only when asked still fills the ledger
        self.stream_usage = stream_usage
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # One httpx client (one connection pool) per thread (`http`). A pool shared by threads closes
        # connections under each other: httpcore hands an idle connection to a request, and before that
        # request's thread writes on it another thread's call finds it idle past its keep-alive expiry
        # (or "surplus", encode/httpcore#1110) and closes it, so the request ends in EBADF. Under load
        # (a thread not run for KEEPALIVE_S) that was 2 of 92 toy-paged gates at load 15-45
        # (cold_burst, refcount_stress). A pool only its own thread touches cannot race.
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64, keepalive_expiry=KEEPALIVE_S)
        self._connect = lambda: httpx.Client(base_url=session.url, timeout=timeout, headers=headers, verify=tls(),
                                             limits=limits)
        self._mine = threading.local()  # this thread's client, and the generation it was made in
        self._clients: list[httpx.Client] = []  # every thread's, to close
        self._generation = 0  # `reconnect` moves it on: each thread then makes a new client
        self.resent = 0  # requests sent again after an idle connection was closed under them
        self._lock = threading.Lock()
        self._next = 0
        self._flying = 0  # completions sent and not yet answered
        log = getattr(session, "log", None)
        self.watch = Watch(session.url, str(log.path) if log is not None else "(none)", headers)  # a stuck request names itself
        self.hung = 0  # requests the watch found stuck: the server is stopped without waiting on them
        self.ledger = Ledger()  # every completion as sent and answered: what /metrics must say (e2e/metrics.py)
        self.script: list[dict[str, Any]] = []  # every request as sent, in order: a replayable case (e2e/case.py)
        self._in_burst = threading.local()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="request")

    @property
    def http(self) -> httpx.Client:
        """This thread's client (made at its first use, and again after `reconnect`)."""
        mine = self._mine
        if getattr(mine, "generation", None) != self._generation:
            with self._lock:
                mine.client, mine.generation = self._connect(), self._generation
                self._clients.append(mine.client)
        return mine.client

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.reconnect()

    def reconnect(self) -> None:
        """Drop every kept-alive connection (call with nothing in flight): every thread's client is
        closed and the next requests open new ones, which a server with several front ends hands out
        among them afresh."""
        with self._lock:
            old, self._clients = self._clients, []
            self._generation += 1
        for c in old:
            c.close()

    def _take_id(self) -> str:
        with self._lock:
            rid = f"req-{self._next}"
            self._next += 1
            return rid

    def _post(self, path: str, body: dict[str, Any], timeout: float | None = None) -> httpx.Response:
        kw = {"timeout": timeout} if timeout is not None else {}
        return self._resending(lambda: self.http.post(path, json=body, **kw))

    def _resending(self, send: Callable[[], Any]) -> Any:
        """`send()`, and once more (a fresh connection: the closed one left the pool) when the kept-alive
        connection was closed under it before the server read the request; a transport error asks the
        session first, so a dead server says so, with its exit code."""
        try:
            return send()
        except httpx.TransportError as exc:
            # one that let the time run out is alive
            grace = 0.0 if isinstance(exc, httpx.TimeoutException) else 0.5 if never_sent(exc) else 5.0
            self.session.check(grace=grace)
            if not never_sent(exc):
                raise
        with self._lock:
            self.resent += 1
        try:
            return send()
        except httpx.TransportError:
            self.session.check(grace=5.0)
            raise

    def complete(self, prompt: str | list[int], max_tokens: int, timeout: float | None = None) -> Answer:
        if isinstance(prompt, str) and not self.text:
            prompt = list(prompt.encode())  # the toys' tokenizer: a text's ids are its UTF-8 bytes
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "return_token_ids": True}
        data, mirrored = self.request(body, timeout=timeout)
        choices = data.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        if not isinstance(choice.get("token_ids"), list):
            raise Unanswerable(f"request {mirrored}: the response has no choices[0].token_ids list (the generated "
                               "ids, asked for by return_token_ids: docs/engine-contract.md); it began "
                               + json.dumps(data)[:200])
        ids = list(choice["token_ids"])
        stop = None
        if choice.get("finish_reason") == "stop" and ids:
            stop = ids.pop()  # the server ends a stopped answer with its stop token
        details = (data.get("usage") or {}).get("prompt_tokens_details") or {}
        k = data.get("kern") or {}
        return Answer(ids, stop, list(choice.get("prompt_token_ids") or []), int(details.get("cached_tokens") or 0),
                      choice.get("finish_reason"), k.get("request_id") or mirrored, k.get("cache_tier"),
                      k.get("snapshot"), data, k.get("woken"))

    def request(self, body: dict[str, Any], path: str = "/v1/completions",
                timeout: float | None = None, first: threading.Event | None = None) -> tuple[dict[str, Any], str]:
        """POST a completion or chat body, watched (`Hung` when the server idles with it); (the
        response, the client's name for it). A streamed one (``stream: true``) comes back as the
        response its chunks make: ``{"chunks": [...], "done": [DONE] seen}`` plus the last chunk's
        ``usage`` and ``kern`` (`first`, if given, is set when its first chunk arrives). A refusal
        raises `Rejected`; every completion goes in the ledger."""
        with self._lock:
            # the server names requests in arrival order: alone in flight, this one is req-<_next>;
            # with others in flight it is that or later (the Hung note lists the server's queues)
            self._flying += 1
            others = self._flying - 1
            name = f"req-{self._next}" if not others else f"req-{self._next} or later, {others + 1} in flight"
            if not getattr(self._in_burst, "on", False):
                self.script.append({"kind": "request", "path": path, "body": body})
        prompt = body.get("prompt")
        if prompt is None:
            prompt = "".join(str(m.get("content", "")) for m in body.get("messages", []))
        n = len(prompt.encode()) if isinstance(prompt, str) else len(prompt)
        what = f"request {name} ({n} prompt tokens, max_tokens {body.get('max_tokens')})"
        try:
            if body.get("stream"):
                fut = self._pool.submit(self._stream, path, body, timeout, first)
            else:
                fut = self._pool.submit(self._post, path, body, timeout)
            r = self.watch.wait(fut, what, None, alive=lambda: self.session.check(grace=0.5))
        except Hung:
            with self._lock:
                self.hung += 1
            raise
        finally:
            with self._lock:
                self._flying -= 1
        if isinstance(r, tuple):
            status, data = r
        else:
            status = r.status_code
            try:
                data = r.json()
            except ValueError:
                data = {"text": r.text[:300]}
        if status != 200:
            if status >= 500:
                self._take_id()
            self.ledger.add(Sent("refused", n))
            raise Rejected(status, data)
        mirrored = self._take_id()
        usage = data.get("usage") or {}
        choice = (data.get("choices") or [{}])[0]
        finish = choice.get("finish_reason") if "choices" in data else (
            (data["chunks"][-1]["choices"][0].get("finish_reason") if data.get("chunks") else None))
        k = data.get("kern") if isinstance(data.get("kern"), dict) else {}
        self.ledger.add(Sent("answered", int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                             int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0), finish,
                             k.get("cache_tier"), k.get("woken"), tuple(f for f in KERN_FIELDS if f not in k),
                             str(k.get("request_id") or mirrored)))
        return data, mirrored

    def _stream(self, path: str, body: dict[str, Any], timeout: float | None = None,
                first: threading.Event | None = None) -> tuple[int, dict[str, Any]]:
        return self._resending(lambda: self._streamed(path, body, timeout, first))

    def _streamed(self, path: str, body: dict[str, Any], timeout: float | None = None,
                  first: threading.Event | None = None) -> tuple[int, dict[str, Any]]:
        kw = {"timeout": timeout} if timeout is not None else {}
        chunks: list[dict[str, Any]] = []
        done = False
        if self.stream_usage and "stream_options" not in body:
            body = {**body, "stream_options": {"include_usage": True}}
        with self.http.stream("POST", path, json=body, **kw) as r:
            if r.status_code != 200:
                r.read()
                try:
                    return r.status_code, r.json()
                except ValueError:
                    return r.status_code, {"text": r.text[:300]}
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    chunks.append(json.loads(line[6:]))
                    if first is not None:
                        first.set()
        usage = chunks[-1].get("usage") if chunks else None
        if self.stream_usage and chunks and not chunks[-1].get("choices"):  # include_usage's chunk: usage alone
            chunks = chunks[:-1]
        last = chunks[-1] if chunks else {}
        return 200, {"chunks": chunks, "done": done, "usage": usage or last.get("usage"), "kern": last.get("kern")}

    def tokenize(self, text: str) -> list[int]:
        if not self.text:
            return list(text.encode())
        r = self._post("/tokenize", {"model": self.model, "prompt": text})
        if r.status_code != 200:
            raise Rejected(r.status_code, r.json())
        return list(r.json()["tokens"])

    def get(self, path: str, timeout: float = 30.0) -> httpx.Response:
        """``GET path`` on this thread's kept-alive connection, sent again on a fresh one when the server
        closed the old one before reading it (idle past the server's keep-alive while this thread
        waited: seen at load 48-81 as "Server disconnected without sending a response")."""
        return self._resending(lambda: self.http.get(path, timeout=timeout))

    def _get_info(self, path: str) -> httpx.Response:
        """``GET path`` (/stats, /metrics); a 503 (kern serve's front end answering for a busy engine
        core: ``engine_core_not_answering``) asked again, for up to 30 s in all."""
        deadline = time.monotonic() + 30
        while True:
            r = self.get(path)
            if r.status_code != 503 or time.monotonic() > deadline:
                return r
            time.sleep(0.2)

    def metrics(self) -> str | None:
        """``GET /metrics`` (Prometheus text), or None when the server has none."""
        r = self._get_info("/metrics")
        return r.text if r.status_code == 200 else None

    def stats(self) -> dict[str, Any] | None:
        """``GET /stats``, or None when the server has none (the Rust kern-serve)."""
        r = self._get_info("/stats")
        if r.status_code != 200:
            return None
        try:
            return r.json()
        except ValueError:
            return None

    def live(self, timeout: float | None = None) -> dict[str, Any] | None:
        """``GET /stats/live`` (answered off the scheduler's thread, even mid-step), or None when the
        server has none or gave no answer within `timeout` (default: the hang watch's 1 s). A busy
        server answers late but what it says is of the moment it answered: wait for it (a longer
        `timeout`) where the answer is acted on at once."""
        return self.watch._live() if timeout is None else self.watch._live(timeout)

    def hang_up(self, prompt: str | list[int], chunks: int = 3, max_tokens: int = 4096, timeout: float = 120.0,
                ignore_eos: bool = False, until: threading.Event | None = None,
                ids: list[int] | None = None) -> tuple[str, int]:
        """Stream a completion, read `chunks` ``data:`` lines (or, given `until`, read on until it is
        set or the stream ends), close the socket; its id (the server's, where its first chunk tells it)
        and the lines read. `ignore_eos` asks the
        answer to run all `max_tokens` (so it is still running when the socket closes); `ids` collects
        the token ids of the chunks read."""
        rid = None  # the mirror's name, taken once the status says the server named it (as `request` does)
        with self._lock:
            self.script.append({"kind": "hang_up", "prompt": prompt, "chunks": chunks, "max_tokens": max_tokens,
                                "ignore_eos": ignore_eos})
        if isinstance(prompt, str) and not self.text:
            prompt = list(prompt.encode())  # the toys' tokenizer: a text's ids are its UTF-8 bytes
        fields = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
        if ignore_eos:
            fields["ignore_eos"] = True
        if ids is not None:
            fields["return_token_ids"] = True
        body = json.dumps(fields).encode()
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: {self.session.host}:{self.session.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
        got, first, refused = 0, None, False
        try:
            with socket.create_connection((self.session.host, self.session.port), timeout=timeout) as s:
                s.sendall(head.encode() + body)
                f = s.makefile("rb")
                status = f.readline().split(b" ", 2)
                code = int(status[1]) if len(status) > 1 and status[1].isdigit() else 0
                if code == 200 or code >= 500:  # a 4xx is refused before the server names it
                    rid = self._take_id()
                if code != 200 and code:  # refused (a 400, a 503): nothing hung up on
                    refused = True
                    return rid or "(refused)", 0
                while (got < chunks) if until is None else not until.is_set():
                    line = f.readline()
                    if not line:
                        break
                    if line.startswith(b"data:"):
                        got += 1
                        chunk = _chunk(line)
                        if first is None:
                            first = chunk
                        if ids is not None:
                            ids += ((chunk.get("choices") or [{}])[0]).get("token_ids") or []
                f.close()
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        finally:
            n = len(prompt.encode()) if isinstance(prompt, str) else len(prompt)
            self.ledger.add(Sent("refused", n) if refused else hung_up(rid or "(no status)", n, first))
        told = ((first or {}).get("kern") or {}).get("request_id") if isinstance((first or {}).get("kern"), dict) else None
        return str(told or rid or "(no status)"), got

    def run_all(self, calls: list[tuple[str | list[int], int]]) -> list[Answer | BaseException]:
        """Send every call at once, one thread each; answers (or errors) in call order."""
        out: list[Any] = [None] * len(calls)
        with self._lock:
            self.script.append({"kind": "burst", "calls": [[p, n] for p, n in calls]})

        ready = threading.Barrier(len(calls))  # sent together, not as each thread gets going

        def one(i: int, prompt: str | list[int], n: int) -> None:
            self._in_burst.on = True
            self.http  # noqa: B018  this thread's client made before the barrier: 12 made after it (4 ms of
            # CPU each, under the interpreter lock) spread the burst over 50 ms or more, and a fast engine
            # answered each before the next arrived (toy-big's `concurrent` shared no step on an H100)
            try:
                ready.wait(10)
            except threading.BrokenBarrierError:  # a thread slow to start: send all the same
                pass
            try:
                out[i] = self.complete(prompt, n)
            except BaseException as exc:  # reported per request by the caller
                out[i] = exc

        threads = [threading.Thread(target=one, args=(i, p, n), daemon=True) for i, (p, n) in enumerate(calls)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

