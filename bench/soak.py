"""Soak: a real `kern serve` on a small pool under the hostile mix for a set time, every answer checked
against toy/model.py, then a SIGTERM with work queued.

    python bench/soak.py --target toy-paged --seconds 600 [--capacity 512] [--clients 12]

The mix, spread over `--clients` threads on 127.0.0.1 only: completions (plain and streamed, over a
few shared prefixes so snapshots are hit, parked and evicted), clients that hang up mid-answer or
mid-body, slow senders (headers and bodies dribbled, some past the deadlines), slow readers, idle
connections, bursts over --max-connections, bodies over --max-body-bytes, /tokenize over its limit,
malformed JSON. Prints answers checked, wrong answers, unintended 5xx (a 503 the server means, the
connection cap or the shutdown, is counted apart), leaks (the pool's accounting once idle), RSS after
warm-up, at the end and at peak, and the log's size; exits 1 when any of them is wrong. Never gates CI.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import launch

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
EOS = 256
MAX_TOKENS = 48
INTENDED_503 = {"too_many_connections", "server_shutting_down", "drain_timeout"}
SERVER_FLAGS = ["--max-connections", "48", "--header-timeout", "2", "--body-timeout", "2", "--keep-alive", "2",
                "--max-body-bytes", str(256 << 10), "--max-tokenize-tokens", "4096", "--drain-timeout", "5"]


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.n: collections.Counter = collections.Counter()
        self.notes: list[str] = []

    def add(self, key: str, note: str | None = None) -> None:
        with self.lock:
            self.n[key] += 1
            if note and len(self.notes) < 20:
                self.notes.append(f"{key}: {note}")


class Oracle:
    """toy/model.py's answers for a fixed set of prompts, computed once at the longest max_tokens."""

    def __init__(self, target: str, n: int, seed: int) -> None:
        from manifests.config import resolve
        from toy.model import generate

        manifest = json.loads(Path(resolve(target).manifest).read_text())
        rng = random.Random(seed)
        prefixes = [[rng.randrange(256) for _ in range(rng.choice((16, 40, 72)))] for _ in range(4)]
        self.prompts = [rng.choice(prefixes) + [rng.randrange(256) for _ in range(rng.randrange(1, 24))] for _ in range(n)]
        self.full = [generate(list(p), MAX_TOKENS, manifest) for p in self.prompts]

    def want(self, i: int, max_tokens: int) -> list[int]:
        out = self.full[i]
        return out[:max_tokens] if len(out) >= max_tokens else out + [EOS]


def start(target: str, flags: list[str], log: Path) -> tuple[launch.Server, str]:
    return launch.start(target, ["--backend", "cpu", "--host", "127.0.0.1", *flags], log, timeout=120)


class Mix:
    def __init__(self, url: str, oracle: Oracle, tally: Tally, seed: int) -> None:
        self.url = url
        self.port = int(url.rsplit(":", 1)[1])
        self.oracle = oracle
        self.tally = tally
        self.rng = random.Random(seed)

    def judge(self, status: int, body: dict | None, what: str) -> bool:
        """Count a non-200; True when it was one the server means."""
        code = (body or {}).get("error", {}).get("code") if isinstance(body, dict) else None
        if status == 503 and code in INTENDED_503:
            self.tally.add("intended 503")
            return True
        if status >= 500:
            self.tally.add("unintended 5xx", f"{what} {status} {body}")
            return False
        if status in (400, 408, 413):
            self.tally.add(f"{status}")
            return True
        self.tally.add("unexpected status", f"{what} {status} {body}")
        return False

    def completion(self) -> None:
        i = self.rng.randrange(len(self.oracle.prompts))
        m = self.rng.randint(1, MAX_TOKENS)
        stream = self.rng.random() < 0.5
        body = {"prompt": self.oracle.prompts[i], "max_tokens": m, "stream": stream, "return_token_ids": True}
        want = self.oracle.want(i, m)
        try:
            if not stream:
                r = httpx.post(self.url + "/v1/completions", json=body, timeout=300)
                d = r.json()
                if r.status_code != 200:
                    self.judge(r.status_code, d, "completion")
                    return
                got = d["choices"][0]["token_ids"]
            else:
                got, last = [], None
                with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=300) as r:
                    if r.status_code != 200:
                        self.judge(r.status_code, json.loads(r.read()), "stream")
                        return
                    for line in r.iter_lines():
                        if line.startswith("data: ") and line != "data: [DONE]":
                            last = json.loads(line[6:])
                            if "error" in last:
                                break
                            got += last["choices"][0]["token_ids"]
                if last is None or "error" in last:
                    if not self.judge(503, last, "stream error event") or got != want[: len(got)]:
                        self.tally.add("wrong answers", f"cut-off stream prefix {got} vs {want}")
                    return
        except (httpx.HTTPError, ValueError) as exc:
            self.tally.add("client errors", f"completion: {exc!r}")
            return
        self.tally.add("answers checked")
        if got != want:
            self.tally.add("wrong answers", f"prompt {i} max_tokens {m}: {got} != {want}")

    def hang_up(self) -> None:
        body = {"prompt": self.oracle.prompts[self.rng.randrange(len(self.oracle.prompts))], "max_tokens": MAX_TOKENS,
                "stream": True}
        try:
            with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=300) as r:
                for _ in r.iter_lines():
                    break  # the first event, then gone
        except httpx.HTTPError:
            pass
        self.tally.add("hang-ups")

    def raw(self, data: list[bytes], gap: float, read: bool = True) -> bytes:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        try:
            for part in data:
                s.sendall(part)
                time.sleep(gap)
            if not read:
                return b""
            out = b""
            while True:
                got = s.recv(65536)
                if not got:
                    return out
                out += got
        except OSError:
            return b""
        finally:
            s.close()

    def judge_raw(self, raw: bytes, what: str) -> None:
        if not raw.startswith(b"HTTP/1.1 "):
            self.tally.add("closed without an answer")  # a reset after a refusal: allowed, counted
            return
        status = int(raw.split(b" ", 2)[1])
        head, _, rest = raw.partition(b"\r\n\r\n")
        try:
            body = json.loads(rest) if rest else None
        except ValueError:
            body = None
        if status != 200:
            self.judge(status, body, what)

    def slow_headers(self) -> None:
        req = b"GET /health HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n"
        parts = [req[k : k + 8] for k in range(0, len(req), 8)]
        self.judge_raw(self.raw(parts, self.rng.choice((0.02, 0.4))), "slow headers")  # 0.4 s x 7: past 2 s
        self.tally.add("slow senders")

    def slow_body(self) -> None:
        body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 2}).encode()
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: soak\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        self.judge_raw(self.raw([head, body[:10], body[10:]], self.rng.choice((0.05, 2.5))), "slow body")
        self.tally.add("slow senders")

    def hang_up_mid_body(self) -> None:
        head = b"POST /v1/completions HTTP/1.1\r\nHost: soak\r\ncontent-length: 500\r\n\r\n{\"prompt\":"
        self.raw([head], 0.1, read=False)
        self.tally.add("hang-ups")

    def slow_reader(self) -> None:
        i = self.rng.randrange(len(self.oracle.prompts))
        body = {"prompt": self.oracle.prompts[i], "max_tokens": 16, "stream": True, "return_token_ids": True}
        got = []
        try:
            with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=300) as r:
                if r.status_code != 200:  # a 503 at the connection cap is an answer, not a wrong one
                    self.judge(r.status_code, json.loads(r.read()), "slow reader")
                    return
                for line in r.iter_lines():
                    time.sleep(0.05)
                    if line.startswith("data: {"):
                        event = json.loads(line[6:])
                        if "error" in event:
                            self.judge(503, event, "slow reader error event")
                            return
                        got += event["choices"][0].get("token_ids", [])
        except httpx.HTTPError as exc:
            self.tally.add("client errors", f"slow reader: {exc!r}")
            return
        self.tally.add("answers checked")
        if got != self.oracle.want(i, 16):
            self.tally.add("wrong answers", f"slow reader prompt {i}: {got} != {self.oracle.want(i, 16)}")

    def idle(self) -> None:
        self.judge_raw(self.raw([], 0), "idle")  # held until the header deadline answers 408
        self.tally.add("idle connections")

    def burst(self) -> None:
        socks = []
        try:
            for _ in range(60):  # over --max-connections 48 with the others open
                socks.append(socket.create_connection(("127.0.0.1", self.port), timeout=30))
        except OSError:
            pass
        for s in socks:
            out = b""
            try:
                s.settimeout(10)
                while True:
                    got = s.recv(65536)
                    if not got:
                        break
                    out += got
            except OSError:
                pass
            s.close()
            self.judge_raw(out, "burst")
        self.tally.add("bursts")

    def large_body(self) -> None:
        big = b'{"prompt": "' + b"a" * (512 << 10) + b'"}'
        try:
            r = httpx.post(self.url + "/v1/completions", content=big, headers={"content-type": "application/json"},
                           timeout=60)
            self.judge(r.status_code, r.json(), "large body")
        except httpx.HTTPError:
            self.tally.add("closed without an answer")
        try:
            r = httpx.post(self.url + "/tokenize", json={"prompt": "b" * 5000}, timeout=60)
            self.judge(r.status_code, r.json(), "tokenize")
        except httpx.HTTPError as exc:
            self.tally.add("client errors", f"tokenize: {exc!r}")
        self.tally.add("large bodies")

    def malformed(self) -> None:
        r = httpx.post(self.url + "/v1/completions", content=b'{"prompt": [1,', timeout=60)
        self.judge(r.status_code, r.json(), "malformed")

    ACTIONS = (("completion", 50), ("hang_up", 8), ("slow_headers", 5), ("slow_body", 5), ("hang_up_mid_body", 4),
               ("slow_reader", 5), ("idle", 3), ("burst", 1), ("large_body", 3), ("malformed", 3))

    def one(self) -> None:
        names, weights = zip(*self.ACTIONS)
        getattr(self, self.rng.choices(names, weights)[0])()


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def leaked(url: str, timeout: float = 60.0) -> str | None:
    """None when the pool is idle and accounted for (no lease but the pad, pages = pad + snapshots)."""
    deadline = time.monotonic() + timeout
    while True:
        s = httpx.get(url + "/stats", timeout=30).json()
        g, f = s["gauges"], s["facts"]
        ok = (g["running"] == 0 and g["waiting"] == 0 and g["leases"] == 0
              and g["pages_used"] == f["pad_pages"] + g["snapshot_pages"]
              and (f["seq_slots"] == 0 or g["slots_used"] == g["snapshot_slots"] + 1))
        if ok:
            return None
        if time.monotonic() > deadline:
            return json.dumps(g)
        time.sleep(0.2)


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="toy-paged")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long the mix runs (then the SIGTERM)")
    ap.add_argument("--capacity", type=int, default=512, help="pool tokens: small, so requests wait and evict")
    ap.add_argument("--host-gib", type=float, default=0.0)
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--log", default=None, help="keep the server log here (default: a temporary file)")
    args = ap.parse_args()
    if not 1 <= args.seconds <= 3600:
        ap.error("--seconds must be within 1..3600")
    return args


def main() -> None:
    args = _args()
    tally = Tally()
    print(f"oracle: {args.target} ...", flush=True)
    oracle = Oracle(args.target, 24, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(args.log) if args.log else Path(tmp) / "server.log"
        flags = [*SERVER_FLAGS, "--capacity", str(args.capacity), "--host-gib", str(args.host_gib)]
        server, url = start(args.target, flags, log)
        rss: list[tuple[float, int]] = []
        try:
            Mix(url, oracle, tally, args.seed).completion()  # warm: kernels loaded
            _mix(args, url, server, oracle, tally, log, rss)
            leak = leaked(url)
            rc = _drain(url, server, oracle, tally)
        finally:
            server.stop(kill=True)  # SIGKILL if it still runs, and its process group
        log_bytes = log.stat().st_size
        tracebacks = log.read_text(errors="replace").count("Traceback")
    _report(args, tally, rss, leak, (log_bytes, tracebacks, rc))


def _mix(args, url: str, server, oracle, tally, log: Path, rss: list) -> None:
    """`--clients` threads run the mix for `--seconds`; the server's rss sampled each second into `rss`,
    a progress line every 30 s."""
    t0 = time.monotonic()
    stop_at = t0 + args.seconds
    rss.append((0.0, rss_kib(server.pid)))
    def worker(k: int) -> None:
        mix = Mix(url, oracle, tally, args.seed * 1000 + k)
        while time.monotonic() < stop_at:
            try:
                mix.one()
            except Exception as exc:  # noqa: BLE001  (a soak counts, it does not stop)
                tally.add("client errors", repr(exc))

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(args.clients)]
    for t in threads:
        t.start()
    next_print = time.monotonic() + 30
    while any(t.is_alive() for t in threads):
        time.sleep(1.0)
        rss.append((time.monotonic() - t0, rss_kib(server.pid)))
        if time.monotonic() >= next_print:
            next_print += 30
            n = tally.n
            print(f"  {time.monotonic() - t0:5.0f} s: {n['answers checked']} answers, {n['wrong answers']} wrong, "
                  f"{n['unintended 5xx']} 5xx, rss {rss[-1][1] / 1024:.0f} MiB, log {log.stat().st_size} B", flush=True)


def _drain(url: str, server, oracle, tally) -> int:
    """The end: work queued, then SIGTERM; each request must end with its answer or a 503. The exit code."""
    tail = [threading.Thread(target=Mix(url, oracle, tally, 7 + k).completion) for k in range(8)]
    for t in tail:
        t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until most of them are in
        g = httpx.get(url + "/stats", timeout=30).json()["gauges"]
        if g["running"] + g["waiting"] >= 6:
            break
        time.sleep(0.05)
    server.proc.send_signal(signal.SIGTERM)
    for t in tail:
        t.join(120)
    return server.proc.wait(120)


def _report(args, tally, rss: list, leak, ending: tuple) -> None:
    """The soak's table; exit 1 on any wrong answer, unintended 5xx, leak, traceback or a bad exit."""
    log_bytes, tracebacks, rc = ending
    warm = [r for t, r in rss if t >= args.seconds * 0.2] or [r for _, r in rss]
    n = tally.n
    rows = [
        ("target", args.target), ("seconds", f"{args.seconds:.0f}"), ("capacity", args.capacity),
        ("answers checked", n["answers checked"]), ("wrong answers", n["wrong answers"]),
        ("unintended 5xx", n["unintended 5xx"]), ("intended 503", n["intended 503"]),
        ("400 / 408 / 413", f"{n['400']} / {n['408']} / {n['413']}"), ("unexpected status", n["unexpected status"]),
        ("client errors", n["client errors"]), ("closed without an answer", n["closed without an answer"]),
        ("hang-ups / slow senders / idle / bursts / large bodies",
         f"{n['hang-ups']} / {n['slow senders']} / {n['idle connections']} / {n['bursts']} / {n['large bodies']}"),
        ("leaked (idle pool)", leak or "nothing"),
        ("rss after warm-up / end / peak MiB", f"{warm[0] / 1024:.0f} / {warm[-1] / 1024:.0f} / {max(r for _, r in rss) / 1024:.0f}"
         f"  (end / warm-up {warm[-1] / warm[0]:.2f})"),
        ("log bytes", log_bytes), ("tracebacks in log", tracebacks), ("exit code after SIGTERM", rc),
    ]
    for k, v in rows:
        print(f"{k:>55}: {v}")
    for note in tally.notes:
        print("  note:", note)
    bad = (n["wrong answers"] or n["unintended 5xx"] or n["unexpected status"] or leak or tracebacks
           or rc not in (0, 75) or log_bytes >= 1 << 20)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
