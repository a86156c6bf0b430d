"""Shared fixtures: a real `kern serve` process on an ephemeral 127.0.0.1 port.

`kern_server(target, *flags)` starts one (`--port 0`; the `serving` log line names the port; the
CPU backend, or the one `KERN_TEST_BACKEND` names, so `KERN_TEST_BACKEND=gpu` runs the server tests
on a GPU), waits for /health, and the fixture always ends it at teardown. The process runs from this
checkout, whatever the installed console scripts point at: on the CPU it is forked from this worker's
zygote (`e2e/zygote.py`: the same `kern serve` process without paying imports and kernel loading
again); `KERN_TEST_FRESH_SERVERS=1`, or another backend, starts `python -m serve` fresh (PYTHONPATH set).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

# One numba thread per test process (and per server it forks) unless the caller says otherwise. The
# tests already run 1.5 workers per core, each with servers of its own; at the tests' sizes a
# parallel kernel gains nothing from a second thread, and under the omp layer that thread spins
# between launches (a 300-step run: 0.56 s wall either way, 1.11 CPU-s with 2 threads, 0.56 with 1),
# taking the core from the other workers. The gate's servers get the same (`e2e.spawn.gate_env`).
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
BACKEND = os.environ.get("KERN_TEST_BACKEND", "cpu")


def _one_default_tls_context() -> None:
    """Every httpx client a test makes with the default TLS settings shares one context (as the gate's
    own clients share `e2e.tls`'s): each module-level `httpx.post` is a client of its own, and loading
    the CA bundle for each took 30 ms on the 2-core box (300 requests of one property test: 9 s). One
    context per value of what the default reads (`trust_env`, SSL_CERT_FILE, SSL_CERT_DIR); a client
    given its own `verify` or `cert` (the TLS tests) still builds its own. httpx's private helper: if
    it moves, nothing is shared and nothing breaks."""
    try:
        import httpx._config as config
        import httpx._transports.default as default
    except ImportError:
        return
    make = getattr(default, "create_ssl_context", None)
    if make is None:
        return

    made: dict = {}

    def shared(verify=True, cert=None, trust_env=True):
        if verify is not True or cert is not None:
            return make(verify=verify, cert=cert, trust_env=trust_env)
        key = (trust_env, os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))  # what the default reads
        if key not in made:
            made[key] = make(verify=verify, cert=cert, trust_env=trust_env)
        return made[key]

    default.create_ssl_context = config.create_ssl_context = shared


_one_default_tls_context()


@dataclass
class ServerProcess:
    """A running server: its session (`e2e.session.Session`: the one launcher, `e2e/spawn.py`), base URL
    and log file."""

    session: object  # an `e2e.session.Session`

    def __getattr__(self, name: str):
        """`proc` (or an `e2e.zygote.Child`: the same poll, wait, send_signal, kill), `port`, `url`,
        `pid`: the session's."""
        if name == "session":
            raise AttributeError(name)
        return getattr(self.session, name)

    @property
    def log_path(self) -> Path:
        return self.session.log.path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, timeout: float = 120.0, **kw):
        import httpx

        return httpx.Client(base_url=self.url, timeout=timeout, **kw)

    def stats(self) -> dict:
        import httpx

        r = httpx.get(self.url + "/stats", timeout=30)
        r.raise_for_status()
        return r.json()

    def wait_exit(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, SIGKILL after `timeout`, then its process group (`Session.stop`); the exit code."""
        self.session.term_timeout = timeout
        return self.session.stop()

    def kill(self) -> int | None:
        """SIGKILL, and its process group with it (a test's teardown)."""
        return self.session.stop(kill=True)


class _Zygotes:
    """This worker's warm parent for CPU servers (`e2e/zygote.py`), started on first use and closed at
    exit; none with `KERN_TEST_FRESH_SERVERS=1` or another backend (each server a fresh process)."""

    def __init__(self) -> None:
        self.zygote = None

    def get(self, backend: str):
        if backend != "cpu" or os.environ.get("KERN_TEST_FRESH_SERVERS") == "1":
            return None
        if self.zygote is None:
            import atexit

            from e2e.session import project_env
            from e2e.zygote import Zygote
            from manifests.config import PACKAGED

            self.zygote = Zygote(project_env(), PACKAGED, ["toy-paged", "toy-stateful"])
            atexit.register(self.zygote.close)
        return self.zygote


ZYGOTES = _Zygotes()


class _Lent:
    """The worker's zygote lent to an in-process gate (`e2e.cli.main`): the gate's close leaves it."""

    hosted = False

    def __init__(self, zygote) -> None:
        self.zygote = zygote
        self.warm_s = zygote.warm_s
        self.how = zygote.how

    def spawn(self, *args, **kw):
        return self.zygote.spawn(*args, **kw)

    def start(self, *args, **kw):
        return self.zygote.start(*args, **kw)

    def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def _gates_borrow_the_workers_zygote(monkeypatch):
    """A gate run in this process forks its servers from the worker's zygote instead of warming its
    own (about 1.5 s a gate); `KERN_TEST_FRESH_SERVERS=1` leaves every gate its own."""
    import e2e.spawners

    own = e2e.spawners.start_zygote

    def lend(cfg, chosen, backend, *args, **kw):
        z = ZYGOTES.get("cpu") if backend in ("cpu", "auto") else None
        return _Lent(z) if z is not None else own(cfg, chosen, backend, *args, **kw)

    monkeypatch.setattr(e2e.spawners, "start_zygote", lend)


def start_server(target: str, *flags: str, log_path: Path, backend: str = BACKEND, timeout: float = 120.0) -> ServerProcess:
    """`kern serve TARGET --port 0` of this checkout, ready once its `serving` line names the port and
    /health answers 200; started the gate's way (`e2e.session.launch`), by this worker's zygote or fresh."""
    from e2e.session import ServerError, Session, launch
    from e2e.spawn import Processes, own_kern

    # debug: tests read the debug lines (` admitted `, ` finished `); a test's own --log-level comes later and wins
    cmd = [*own_kern(), "serve", target, "--backend", backend, "--port", "0", "--log-level", "debug", *flags]
    spawner = ZYGOTES.get(backend) or Processes.project(cwd=REPO)
    try:
        s = launch(Session(log_path.stem, cmd, 0, log_path, spawner=spawner, health=True, env={}, header=False,
                           load_timeout=timeout))
    except ServerError as exc:
        raise RuntimeError(f"{exc}\n{log_path.read_text(errors='replace')[-3000:]}") from None
    return ServerProcess(s)


@pytest.fixture
def kern_server(tmp_path):
    """A factory: `kern_server("toy-paged", "--max-seqs", "2")` -> ServerProcess, ended at teardown."""
    started: list[ServerProcess] = []

    def start(target: str, *flags: str, **kw) -> ServerProcess:
        s = start_server(target, *flags, log_path=tmp_path / f"server-{len(started)}.log", **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()


# -- helpers for the server tests (import them: `from conftest import PROMPTS, ask, oracle`) -------

from e2e.prompts import PROMPTS, SUFFIX  # noqa: E402  (the gate's fixed inputs, SPEC §10)
EOS = 256


def bench_module(name: str):
    """`bench/<name>.py` loaded by its path, once per process, as module `bench_<name>` (bench/ on
    sys.path would let bench/serve.py shadow the serve package for every later test; its dataclasses
    look their module up in sys.modules, so it is registered there)."""
    import importlib.util
    import sys

    key = f"bench_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).resolve().parent.parent / "bench" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    return sys.modules[key]


def manifest_dict(target: str) -> dict:
    import json

    from manifests.config import resolve

    return json.loads(Path(resolve(target).manifest).read_text())


def oracle(target: str, ids: list[int], max_tokens: int) -> list[int]:
    """toy/model.py's answer as the server reports it: with the stop token when it stopped."""
    from toy.model import generate

    out = generate(list(ids), max_tokens, manifest_dict(target))
    return out + [EOS] if len(out) < max_tokens else out


def ask(server: ServerProcess, ids: list[int], max_tokens: int, stream: bool = False, model: str | None = None) -> dict:
    """One completion over plain HTTP: {"ids", "cached", "finish", "kern", "text"}."""
    import json

    import httpx

    body = {"prompt": list(ids), "max_tokens": max_tokens, "return_token_ids": True, "stream": stream}
    if model:
        body["model"] = model
    if not stream:
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        d = r.json()
        c = d["choices"][0]
        return {"ids": c["token_ids"], "cached": d["usage"]["prompt_tokens_details"]["cached_tokens"],
                "finish": c["finish_reason"], "kern": d["kern"], "text": c["text"]}
    out: list[int] = []
    text = ""
    last = None
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            last = json.loads(line[6:])
            out += last["choices"][0]["token_ids"]
            text += last["choices"][0]["text"]
    return {"ids": out, "cached": last["usage"]["prompt_tokens_details"]["cached_tokens"],
            "finish": last["choices"][0]["finish_reason"], "kern": last["kern"], "text": text}


def can_bind(addr: str) -> bool:
    """Whether this machine can bind `addr` (127.0.0.2 and the rest of 127/8 on Linux's lo): the tests
    that tell clients apart by their peer address need it, and skip without it."""
    try:
        with socket.socket() as s:
            s.bind((addr, 0))
        return True
    except OSError:
        return False


def alive(pid: int) -> bool:
    """Process `pid` runs (Linux's /proc; a zombie, exited and not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def gone(pids, timeout: float = 10.0) -> bool:
    """Whether every process of `pids` has ended, waiting up to `timeout` seconds for them to."""
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def children(pid: int) -> list[int]:
    """Process `pid`'s children, in the order it started them (none when it has ended)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(k) for k in f.read().split()]
    except OSError:
        return []


def assert_nothing_leaked(server: ServerProcess, timeout: float = 10.0) -> dict:
    """Idle: no lease but the pad, pages = pad + snapshots, slots = snapshots + the pad's."""
    deadline = time.monotonic() + timeout
    while True:
        s = server.stats()
        g, f = s["gauges"], s["facts"]
        ok = (g["running"] == 0 and g["waiting"] == 0 and g["leases"] == 0
              and g["pages_used"] == f["pad_pages"] + g["snapshot_pages"]
              and (f["seq_slots"] == 0 or g["slots_used"] == g["snapshot_slots"] + 1))
        if ok:
            return s
        if time.monotonic() > deadline:
            raise AssertionError(f"leaked: {g}")
        time.sleep(0.1)


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: half again as many workers as cores (many tests wait on servers; measured on the
    2-core box: 3 workers 115-131 s, 2 workers 145 s, when the suite was smaller; at 1,490 tests, 3
    workers 450 and 452 s, 4 workers 399, 444 and 473 s, 2026-12-07: no gain above the noise)."""
    return max(2, (3 * (os.cpu_count() or 1)) // 2)


def _runs_a_few(config) -> bool:
    """Whether this run names a few tests: `-k EXPR`, or only files and node ids (no directory).
    `python -m pytest -q` (the testpaths) and `python -m pytest tests/` run everything."""
    if config.option.keyword:
        return True
    if config.args_source != pytest.Config.ArgsSource.ARGS or not config.args:
        return False
    return all(Path(a.split("::", 1)[0]).is_file() for a in config.args)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Parallel by default, in process for a few tests: `-n auto --dist worksteal` (pytest-xdist)
    unless `-n` was given, or the run names only files,
    node ids or `-k` (one file's workers would each pay the imports and a server's start for a few
    tests: 16.7 s against 5.2 s in process for tests/test_replay.py). Runs before xdist's own hook."""
    if not config.pluginmanager.hasplugin("xdist") or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if config.option.numprocesses is None and not _runs_a_few(config):
        config.option.numprocesses = "auto"
    if config.option.numprocesses and config.option.dist == "no":
        config.option.dist = "worksteal"  # workers steal work from each other (xdist's own default: load)

