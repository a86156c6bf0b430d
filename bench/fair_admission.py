"""Short requests beside long ones that hold the pool (issue 41): their latency as a ratio of the same
probe with no long request running, in the same run, on the same server.

    python bench/fair_admission.py [--quick] [--admission fair|fifo] [--shorts 20] [--rounds N]
                                   [--max-tokens 8000] [--target toy-paged] [--backend cpu]

Two cases, each its own `kern serve` (CPU toy by default):

- **default**: the default capacity (16,384 tokens, 1,024 pages of 16) and 3 long requests;
- **large**: ``--capacity 262144`` and 48 long requests.

Every long request is a stream with ``ignore_eos`` and ``--max-tokens`` (8,000: about 500 pages each),
all from one client (127.0.0.2): in both cases most of them run, holding nearly every page, and the
rest wait at the head of the queue. The probe is `--shorts` completions of 4 tokens sent at once, each
from a client of its own (127.0.0.3, ...): first with no long request (the baseline), then with the
long ones running and waiting (seen on `/stats/live`), `--rounds` times each. A short request not
answered in `--probe-timeout` seconds counts as that many (`--admission fifo` shows the lock this
way). The long requests are hung up after the probe: the bench does not wait for them.

Prints one table: per case, how many long requests ran and waited, the probe's median and slowest
latency alone and beside them, and the ratios (beside / alone). `--quick`: one round each. Linux
(the clients bind addresses of 127.0.0.0/8). Never gates CI.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

import launch

LONG_CLIENT = "127.0.0.2"
CASES = (("default", None, 3), ("large", 262144, 48))  # (name, --capacity, long requests)


def _client(addr: str, timeout: float) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=addr), timeout=timeout)


class Longs:
    """`n` long streams from one client, each hung up once `stop` is set."""

    def __init__(self, url: str, n: int, max_tokens: int) -> None:
        self.stop = threading.Event()
        self.tokens = [0] * n
        self.threads = [threading.Thread(target=self._one, args=(url, i, max_tokens), daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def _one(self, url: str, i: int, max_tokens: int) -> None:
        body = {"prompt": list(f"long {i}".encode()), "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                "return_token_ids": True}
        try:
            with _client(LONG_CLIENT, 3600) as c, c.stream("POST", url + "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if self.stop.is_set():
                        return  # closing the stream hangs up: the server aborts it
                    if line.startswith("data: {"):
                        self.tokens[i] += len(json.loads(line[6:])["choices"][0].get("token_ids") or [])
        except httpx.HTTPError:
            pass

    def end(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)


class Probe:
    """`shorts` clients, each from its own address with a keep-alive connection (made once: making an
    httpx client costs more than the request it times), and one thread each."""

    def __init__(self, url: str, shorts: int, timeout: float) -> None:
        self.url, self.timeout = url, timeout
        self.clients = [_client(f"127.0.0.{3 + i}", timeout) for i in range(shorts)]
        self.pool = concurrent.futures.ThreadPoolExecutor(shorts)

    def __call__(self) -> list[float]:
        """Seconds to each client's 4-token completion, all sent at once."""
        return list(self.pool.map(self._one, range(len(self.clients))))

    def _one(self, i: int) -> float:
        t0 = time.monotonic()
        try:
            r = self.clients[i].post(self.url + "/v1/completions",
                                     json={"prompt": list(f"short {i}".encode()), "max_tokens": 4})
        except httpx.TimeoutException:
            return self.timeout
        if r.status_code != 200:
            raise SystemExit(f"a short request got {r.status_code}: {r.text[:200]}")
        return time.monotonic() - t0

    def close(self) -> None:
        self.pool.shutdown()
        for c in self.clients:
            c.close()


def wait_held(url: str, n: int, timeout: float = 120.0) -> dict:
    """/stats/live once all `n` long requests are in (running or waiting) and one waits."""
    deadline = time.monotonic() + timeout
    while True:
        live = httpx.get(url + "/stats/live", timeout=30).json()
        if (live["running"] + live["waiting"] >= n and live["waiting"] > 0) or time.monotonic() > deadline:
            return live
        time.sleep(0.05)


def run_case(args, name: str, capacity: int | None, n: int, out: Path) -> dict:
    flags = ["--backend", args.backend, "--admission", args.admission, "--log-level", "warn"]
    flags += ["--capacity", str(capacity)] if capacity else []
    server, url = launch.start(args.target, flags, out / f"server-{name}.log")
    probe = Probe(url, args.shorts, args.probe_timeout)
    try:
        probe()  # a first burst: connections and code paths warm
        alone = [t for _ in range(args.rounds) for t in probe()]
        longs = Longs(url, n, args.max_tokens)
        try:
            held = wait_held(url, n)
            beside = [t for _ in range(args.rounds) for t in probe()]
            still = httpx.get(url + "/stats/live", timeout=30).json()
        finally:
            longs.end()
    finally:
        probe.close()
        launch.stop(server)
    return {"case": name, "capacity": capacity or "default", "longs": n, "running": held["running"],
            "waiting": held["waiting"], "running_after": still["running"], "alone": alone, "beside": beside}


def table(rows: list[dict], args) -> str:
    head = ("| case | capacity | long requests (running / waiting) | short requests | alone p50 / max s "
            "| beside p50 / max s | ratio p50 | ratio max |\n|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        a, b = r["alone"], r["beside"]
        pa, pb, ma, mb = statistics.median(a), statistics.median(b), max(a), max(b)
        lines.append(f"| {r['case']} | {r['capacity']} | {r['longs']} ({r['running']} / {r['waiting']}) | "
                     f"{len(b)} ({args.rounds} x {args.shorts}) | {pa:.3f} / {ma:.3f} | {pb:.3f} / {mb:.3f} | "
                     f"{pb / pa:.2f} | {mb / ma:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--quick", action="store_true", help="one probe round per case (default: --rounds)")
    p.add_argument("--admission", default="fair", choices=["fair", "fifo"], help="kern serve's --admission")
    p.add_argument("--shorts", type=int, default=20, help="short requests per probe, each from its own client")
    p.add_argument("--rounds", type=int, default=5, help="probes alone and beside the long requests, each")
    p.add_argument("--max-tokens", type=int, default=8000, help="each long request's max_tokens")
    p.add_argument("--probe-timeout", type=float, default=60.0, help="a short request unanswered this long counts so")
    p.add_argument("--target", default="toy-paged")
    p.add_argument("--backend", default="cpu")
    p.add_argument("--cases", default="default,large", help="which cases, comma separated (default,large)")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds = 1
    if not 1 <= args.shorts <= 250:
        p.error("--shorts must be 1..250 (one loopback address each)")
    wanted = set(args.cases.split(","))
    rows = []
    with tempfile.TemporaryDirectory(prefix="fair-admission-") as tmp:
        for name, capacity, n in CASES:
            if name in wanted:
                rows.append(run_case(args, name, capacity, n, Path(tmp)))
                print(f"{name}: done", file=sys.stderr, flush=True)
    print(f"admission {args.admission}; {args.target} on {args.backend}; long requests of {args.max_tokens} tokens "
          f"(ignore_eos) from one client, short ones of 4 tokens from {args.shorts} others")
    print(table(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
