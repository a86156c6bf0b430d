"""`kern serve --frontends N`: N HTTP front-end processes on one port, one engine core (serve/client/frontend.py).

- every front end serves (each one's own count of answered requests, from its metrics file), request
  ids are one numbering across them, and every answer, whole or streamed, is toy/model.py's;
- /metrics, whichever front end answers the scrape, counts every front end's requests and tokens
  exactly (prometheus_client's multiprocess mode);
- SIGTERM drains every front end's open requests (each answered in full), exits 0 and leaves no process;
  a drain that runs out cuts every front end's off (each answered so) and exits 75;
- the core's death answers every front end's open requests with a 503 `engine_core_dead` and ends them all;
- a front end killed on its own: its requests are aborted in the core (nothing leaked) and the others
  serve on; the leader killed: the others answer their open requests with an HTTP error and remove its
  metrics directory;
- `--frontends` above 1 with `--no-frontend-process` is refused in one line.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import glob
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from conftest import EOS, assert_nothing_leaked, children, gone, manifest_dict
from oracle.reference import Reference
from verdicts.params import continuation

REPO = Path(__file__).resolve().parent.parent

TARGET = "toy-paged"
FLAGS = ("--capacity", "8192", "--max-seqs", "16", "--frontends", "2")


def _one(server, i: int, stream: bool, max_tokens: int = 12, client: httpx.Client | None = None) -> dict:
    """Request i on `client`'s connection, else on a connection of its own (the listening socket's
    accept picks the front end)."""
    ids = [(7 * i + k) % 256 for k in range(5 + i % 7)]
    body = {"prompt": ids, "max_tokens": max_tokens, "return_token_ids": True, "ignore_eos": True,
            "temperature": 0, "stream": stream}
    with (httpx.Client(timeout=120) if client is None else contextlib.nullcontext(client)) as c:
        if not stream:
            r = c.post(server.url + "/v1/completions", json=body)
            d = r.json()
            return {"i": i, "status": r.status_code, "ids": d["choices"][0]["token_ids"] if r.status_code == 200 else None,
                    "request": (d.get("kern") or {}).get("request_id"), "body": d, "prompt": ids}
        out, rid, last = [], None, None
        with c.stream("POST", server.url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return {"i": i, "status": r.status_code, "ids": None, "request": None, "body": json.loads(r.read()),
                        "prompt": ids}
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    last = json.loads(line[6:])
                    if "error" in last:
                        continue
                    out += last["choices"][0]["token_ids"]
                    rid = rid or (last.get("kern") or {}).get("request_id")
        return {"i": i, "status": r.status_code, "ids": out, "request": rid, "body": last, "prompt": ids}


def _want(prompt: list[int], max_tokens: int) -> list[int]:
    """toy/model.py's answer under ignore_eos (run on past each EOS: the gate's own `continuation`)."""
    return continuation(Reference(REPO / "toy" / "model.py", manifest_dict(TARGET)), 1, prompt, max_tokens, EOS,
                        ignore_eos=True)


def _answered(server) -> dict[int, float]:
    """Each front end's own count of answered requests (pid -> count): its values' file in the
    directory the `serving` line names."""
    from prometheus_client.mmap_dict import MmapedDict

    where = re.search(r" serving .* metrics_dir=(\S+)", server.log()).group(1)
    out = {}
    for path in glob.glob(f"{where}/counter_*.db"):
        pid = int(path.rsplit("_", 1)[1].split(".")[0])
        out[pid] = sum(v for key, v, _, _ in MmapedDict.read_all_values_from_file(path)
                       if json.loads(key)[1] == "kern:request_success_total")
    return out


def _placed(server, want: int) -> dict[int, list[httpx.Client]]:
    """Keep-alive clients placed on each front end (pid -> clients), `want` on each at least: clients
    open their connections at once (the front ends race to accept them), then each asks once more,
    alone, and the front end whose count grew holds its connection."""
    placed: dict[int, list] = {}
    for _ in range(5):
        clients = [httpx.Client(timeout=120) for _ in range(4 * want)]
        with concurrent.futures.ThreadPoolExecutor(len(clients)) as ex:
            list(ex.map(lambda c: _one(server, 0, False, 1, c), clients))
        for c in clients:
            before = _answered(server)
            _one(server, 0, False, 1, c)
            after = _answered(server)
            grew = [pid for pid in after if after[pid] > before.get(pid, 0)]
            assert len(grew) == 1, (before, after)
            placed.setdefault(grew[0], []).append(c)
        if len(placed) == 2 and all(len(v) >= want for v in placed.values()):
            return placed
    raise AssertionError(f"connections did not reach both front ends: {({p: len(v) for p, v in placed.items()})}")


def _under_way(server, clients: list[httpx.Client], run) -> tuple[list[threading.Thread], list]:
    """`run(i, client)` for each client on a thread of its own, returned once every one is running in
    the core (at most 30 s): (the threads, the list their results go to)."""
    results: list = []
    threads = [threading.Thread(target=lambda i=i, c=c: results.append(run(i, c))) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while server.stats()["gauges"]["running"] < len(clients) and time.monotonic() < deadline:
        time.sleep(0.05)
    return threads, results


def _terminated(server, each: int, max_tokens: int) -> list:
    """`each` requests under way on each front end (streams and whole answers in turn), then SIGTERM to
    the server: their results, once every client is done."""
    clients = [c for cs in _placed(server, each).values() for c in cs[:each]]
    threads, results = _under_way(server, clients, lambda i, c: _one(server, i, i % 2 == 0, max_tokens, c))
    server.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    assert len(results) == 2 * each
    return results


def _metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}\{{[^}}]*{labels}[^}}]*\}} (\S+)$", text, re.M)
    assert m, f"{name} {labels} not in /metrics"
    return float(m.group(1))


def test_every_front_end_serves_exact_answers_and_metrics_count_them_all(kern_server):
    server = kern_server(TARGET, *FLAGS)
    assert len(children(server.proc.pid)) == 2  # the engine core and the second front end
    assert re.search(r" serving .* frontends=2", server.log())
    n = 48
    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        got = list(ex.map(lambda i: _one(server, i, i % 2 == 1), range(n)))
    for g in got:
        assert g["status"] == 200 and g["ids"] == _want(g["prompt"], 12), g
    ids = {g["request"] for g in got}
    assert ids == {f"req-{k}" for k in range(n)}, "one numbering across the front ends"
    served = _answered(server)
    assert len(served) == 2 and all(served.values()) and sum(served.values()) == n, served
    prompt = sum(len(g["prompt"]) for g in got)
    for _ in range(6):  # each scrape on a connection of its own: either front end may answer it
        text = httpx.get(server.url + "/metrics", timeout=30).text
        assert _metric(text, "kern:request_success_total", 'finished_reason="length"') == n
        assert _metric(text, "kern:generation_tokens_total") == 12 * n
        assert _metric(text, "kern:prompt_tokens_total") == prompt
        assert _metric(text, "kern:e2e_request_latency_seconds_count") == n
        assert _metric(text, "kern:inter_token_latency_seconds_count") == 11 * n
        assert _metric(text, "kern:num_requests_running") == 0
    assert_nothing_leaked(server)
    where = re.search(r" metrics_dir=(\S+)", server.log()).group(1)
    assert server.stop() == 0 and not os.path.exists(where), "the leader removes the metrics directory"


def test_sigterm_drains_every_front_end_and_leaves_no_process(kern_server):
    server = kern_server(TARGET, *FLAGS, "--fault", "slow-steps")
    kids = children(server.proc.pid)
    for g in _terminated(server, 3, 40):
        assert g["status"] == 200 and g["ids"] == _want(g["prompt"], 40), g
    assert server.wait_exit(60) == 0
    assert gone(kids), "a front end or the core outlived the server"
    assert server.log().count(" serve: stopped ") == 1 and " front end stopped index=1 " in server.log()


def test_a_drain_that_runs_out_cuts_off_every_front_ends_requests(kern_server):
    """--drain-timeout past: every open request, on either front end, answered as cut off (a 503
    `drain_timeout`, a stream's error event), and the exit code says so (75)."""
    server = kern_server(TARGET, *FLAGS, "--fault", "slow-steps", "--drain-timeout", "1")
    for g in _terminated(server, 2, 1000):
        assert (g["body"].get("error") or {}).get("code") == "drain_timeout", g
        assert g["status"] == (200 if g["i"] % 2 == 0 else 503), g  # a stream's status was sent at its start
    assert server.wait_exit(60) == 75


def test_the_cores_death_ends_every_front_end(kern_server):
    server = kern_server(TARGET, *FLAGS, "--fault", "slow-steps")
    core, peer = children(server.proc.pid)
    clients = [c for cs in _placed(server, 3).values() for c in cs[:3]]  # three open on each front end
    threads, results = _under_way(server, clients, lambda i, c: _one(server, i, i % 2 == 0, 400, c))
    os.kill(core, signal.SIGKILL)
    for t in threads:
        t.join(60)
    assert len(results) == 6
    for g in results:
        body = g["body"]
        if g["status"] == 200:  # a stream: its error event
            assert body["error"]["code"] == "engine_core_dead", g
        else:
            assert g["status"] == 503 and body["error"]["code"] == "engine_core_dead", g
    assert server.wait_exit(30) == 101
    assert not os.path.exists(re.search(r" metrics_dir=(\S+)", server.log()).group(1))
    assert gone([peer]), "the second front end outlived the core"


def test_a_front_end_killed_alone_has_its_requests_aborted_and_the_rest_serve_on(kern_server):
    server = kern_server(TARGET, *FLAGS, "--fault", "slow-steps")
    _, peer = children(server.proc.pid)
    placed = _placed(server, 3)
    clients = placed[server.proc.pid][:3] + placed[peer][:3]
    threads, results = _under_way(server, clients, lambda i, c: _catch(server, i, c))
    os.kill(peer, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while " front end died " not in server.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert re.search(rf" front end died pid={peer} code=-9 ", server.log()), server.log()[-2000:]
    for t in threads:
        t.join(60)
    lost = [g for g in results if g is None]  # the dead front end's clients: their connection reset
    kept = [g for g in results if g is not None]
    assert len(lost) == len(kept) == 3, results
    for g in kept:
        assert g["status"] == 200 and g["ids"] == _want(g["prompt"], 300), g
    assert server.log().count(" reason=abort ") == len(lost)
    assert_nothing_leaked(server, timeout=30)
    again = _one(server, 99, False)
    assert again["status"] == 200 and again["ids"] == _want(again["prompt"], 12)
    assert server.stop() == 0


def test_a_front_end_that_ends_cleanly_is_logged_at_info(kern_server):
    """Another front end told to stop by someone else (SIGTERM to it alone) drains and exits 0: the
    leader logs `front end ended` at info, not `front end died` at error, and serves on."""
    server = kern_server(TARGET, *FLAGS)
    _, peer = children(server.proc.pid)
    os.kill(peer, signal.SIGTERM)
    assert gone([peer], 30)
    deadline = time.monotonic() + 20
    while " front end ended " not in server.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert re.search(rf" INFO serve: front end ended pid={peer} code=0 ", server.log()), server.log()[-2000:]
    assert " front end died " not in server.log() and " ERROR " not in server.log()
    again = _one(server, 5, False)
    assert again["status"] == 200 and again["ids"] == _want(again["prompt"], 12)
    assert server.stop() == 0


def test_the_leaders_death_answers_the_other_front_ends_clients_and_removes_its_directory(kern_server):
    """SIGKILL of the leader (issue 41): the core dies with it, and the other front end, told by the
    leader's death (SIGTERM), answers each of its open requests with an HTTP error (a 503
    `engine_core_dead`, a stream's error event) rather than dropping the connection, removes the
    leader's metrics directory, and ends."""
    server = kern_server(TARGET, *FLAGS, "--fault", "slow-steps")
    core, peer = children(server.proc.pid)
    where = re.search(r" metrics_dir=(\S+)", server.log()).group(1)
    assert os.path.isdir(where)
    clients = _placed(server, 3)[peer][:3]
    threads, results = _under_way(server, clients, lambda i, c: _catch(server, i, c, 400))
    os.kill(server.proc.pid, signal.SIGKILL)
    for t in threads:
        t.join(60)
    assert len(results) == 3 and None not in results, results  # None: the connection dropped, no answer
    for g in results:
        code = (g["body"].get("error") or {}).get("code")
        assert g["status"] in (200, 503) and code == "engine_core_dead", g
    assert gone([core, peer], 30), "the engine core or the other front end outlived the leader"
    assert not os.path.exists(where), "the leader's metrics directory was left behind"


def test_the_metrics_directory_goes_when_every_process_is_killed_at_once(kern_server):
    """SIGKILL to the server's whole process group (the leader, the core and the other front end at
    once: nobody of them survives to clean up): the janitor, in a session of its own, removes the
    leader's metrics directory."""
    server = kern_server(TARGET, *FLAGS)
    kids = children(server.proc.pid)
    where = re.search(r" metrics_dir=(\S+)", server.log()).group(1)
    assert os.path.isdir(where) and os.getpgid(server.proc.pid) != os.getpgrp()
    os.killpg(os.getpgid(server.proc.pid), signal.SIGKILL)
    assert gone([server.proc.pid, *kids], 30)
    deadline = time.monotonic() + 30
    while os.path.exists(where) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(where), "the leader's metrics directory was left behind"


def _catch(server, i: int, client: httpx.Client, max_tokens: int = 300) -> dict | None:
    try:
        return _one(server, i, i % 2 == 0, max_tokens, client)
    except (httpx.TransportError, httpx.RemoteProtocolError):
        return None


def test_frontends_with_no_frontend_process_is_refused():
    r = subprocess.run([sys.executable, "-m", "serve", TARGET, "--backend", "cpu", "--port", "0", "--frontends", "2",
                        "--no-frontend-process"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        "kern serve: error: --frontends 2 needs the engine core in a process of its own: not with --no-frontend-process")
