"""No false failures: what fails a good commit is worse than no gate.

- a request the server never read (its idle connection closed under it) is sent again, once, on a
  fresh connection; a response cut short is not (a completion is not idempotent);
- Ctrl-C or SIGTERM on `e2e` stops every server it started (the port is free again) and exits 130;
- nothing could run for a reason outside the commit (port in use, no GPU for ``--backend gpu``) →
  125; a server that fails to load is the commit's failure → 1.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from e2e.client import Client, never_sent
from test_e2e_driver import EXIT_FAIL, EXIT_NOTHING_RAN, checks, gate

ROOT = Path(__file__).resolve().parent.parent

COMPLETION = {"choices": [{"token_ids": [104, 105], "finish_reason": "length", "prompt_token_ids": [1, 2]}],
              "usage": {"prompt_tokens_details": {"cached_tokens": 0}}, "kern": {"request_id": "req-0"}}


class Flaky:
    """A raw HTTP server on an ephemeral port; request number `drop` gets `how`: "close" (hang up
    before any response byte) or "partial" (a response head and a cut body); "status": every request
    gets the status line `status`."""

    def __init__(self, drop: int, how: str, status: bytes = b""):
        self.drop, self.how, self.status = drop, how, status
        self.seen = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                if b"\r\n\r\n" not in data:
                    continue
                head, body = data.split(b"\r\n\r\n", 1)
                length = next((int(ln.split(b":")[1]) for ln in head.split(b"\r\n")
                               if ln.lower().startswith(b"content-length")), 0)
                while len(body) < length:
                    body += conn.recv(65536)
                self.seen += 1
                if self.seen == self.drop and self.how == "close":
                    continue  # hang up: nothing sent
                if self.how == "status":  # every request refused with the status line `status`
                    body = b'{"error": {"message": "no"}}'
                    conn.sendall(b"HTTP/1.1 " + self.status + b"\r\nContent-Type: application/json\r\n"
                                 + f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
                    continue
                out = json.dumps(COMPLETION).encode()
                if self.seen == self.drop and self.how == "partial":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 + f"Content-Length: {len(out)}\r\n\r\n".encode() + out[:5])
                    continue
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                             + f"Content-Length: {len(out)}\r\n\r\n".encode() + out)

    def close(self) -> None:
        self.sock.close()


def _client(port: int) -> Client:
    session = SimpleNamespace(url=f"http://127.0.0.1:{port}", host="127.0.0.1", port=port,
                              check=lambda grace=0.0: None)
    return Client(session, "toy")


def test_a_request_the_server_never_answered_is_sent_again_once():
    srv = Flaky(drop=2, how="close")
    c = _client(srv.port)
    try:
        assert c.complete([1, 2], 2).ids == [104, 105]
        a = c.complete([1, 2], 2)  # the server hangs up on it before answering: sent again
        assert a.ids == [104, 105] and c.resent == 1 and srv.seen == 3
    finally:
        c.close()
        srv.close()


def test_a_response_cut_short_is_not_sent_again():
    srv = Flaky(drop=1, how="partial")
    c = _client(srv.port)
    try:
        with pytest.raises(httpx.TransportError) as exc:
            c.complete([1, 2], 2)
        assert not never_sent(exc.value) and c.resent == 0 and srv.seen == 1
    finally:
        c.close()
        srv.close()


def _serving_port(out: Path, timeout: float = 240.0) -> int:
    """The port of the gate's server once it has admitted a request (the gate is past start-up)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        for log in out.glob("*/server-*.log"):
            text = log.read_text(errors="replace")
            if " admitted " not in text:
                continue
            for line in text.splitlines():
                if " serving " in line and "port=" in line:
                    return int(line.split("port=")[1].split()[0])
        time.sleep(0.2)
    raise AssertionError(f"no server under {out} admitted a request after {timeout:.0f}s")


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return False
    except OSError:
        return True


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupting_e2e_stops_every_server_it_started(tmp_path, sig):
    out = tmp_path / "results"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # long_room's three long requests (954 tokens each, 20 ms a step more under slow-steps) keep the
    # gate busy for a minute whatever the machine's load; conc1's short answers (about 10 s in all)
    # were sometimes all done, the gate exited 0, before a loaded test sent the signal
    p = subprocess.Popen([sys.executable, "-m", "e2e.cli", "--targets", "toy-paged", "--scenarios", "long_beside_short",
                          "--backend", "cpu", "--max-tokens", "16", "--out", str(out),
                          "--server-flags", "--fault slow-steps"],  # still serving when the signal comes
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path,
                         # as a terminal's foreground job: a suite started in the background of a
                         # script has SIGINT ignored, and an ignored disposition is inherited
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        port = _serving_port(out)
        assert not _refused(port)
        p.send_signal(sig)
        _, err = p.communicate(timeout=120)
        assert p.returncode == 130, err.decode()[-2000:]
        assert b"stopped 1 server(s)" in err
        assert _refused(port), f"a server still listens on {port} after the gate was interrupted"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_port_in_use_skips_the_target_with_125(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code, reports = gate(tmp_path, "--targets", "toy-paged", "--scenarios", "conc1_equals_run", "--port", str(port))
    assert code == EXIT_NOTHING_RAN, reports
    assert "in use" in reports["toy-paged"]["skipped"]


def _gpu_here() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@pytest.mark.skipif(_gpu_here(), reason="this machine has a GPU: --backend gpu can run")
def test_backend_gpu_without_a_gpu_exits_125(tmp_path, capsys):
    """The GPU check runs while the hosts warm; they fail without a GPU, and that is not news: the
    gate says only that there is no GPU, and no zygote stands in for the hosts."""
    out = tmp_path / "results"
    from e2e.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["--targets", "toy-paged", "--backend", "gpu", "--out", str(out)])
    assert exc.value.code == EXIT_NOTHING_RAN
    report = json.loads((out / "toy-paged" / "report.json").read_text())
    assert report["skipped"].startswith("--backend gpu")
    said = capsys.readouterr()
    assert "no hosts" not in said.err + said.out and "zygote:" not in said.err + said.out, said


def test_a_server_that_fails_to_load_is_the_commits_failure(tmp_path):
    code, reports = gate(tmp_path, "--targets", "toy-paged", "--scenarios", "conc1_equals_run",
                         "--server-flags", "--capacity 1")
    got = checks(reports["toy-paged"])
    assert code == EXIT_FAIL and got["error"]["ok"] is False, got
    assert "exited with code 2" in got["error"]["note"]


@pytest.mark.parametrize("status, named", [(b"400 Bad Request", 0), (b"503 Service Unavailable", 1)])
def test_a_hang_up_refused_before_the_server_named_it_takes_no_name(status, named):
    """The client mirrors the server's names (req-0, req-1, ... in arrival order): a stream refused with
    a 4xx was never named by the server, so the next request's mirrored name stays where it was; a 5xx
    (the server named it, then refused it) moves it on, as `Client.request` counts them."""
    srv = Flaky(0, "status", status)
    c = _client(srv.port)
    try:
        rid, got = c.hang_up([1, 2, 3], chunks=3)
        assert got == 0 and c.ledger.sent[-1].kind == "refused"
        assert c._take_id() == f"req-{named}"
    finally:
        c.close()
        srv.close()
