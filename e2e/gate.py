"""One target through the gate: `kern test`, then each session's steps in order (SPEC §10).

`Run` is one lane's view of a target: its options, oracles and checks, the session it has open, and
what its own sessions told and it reports. A lane's `Run` is its thread's alone: what a step gives
later steps (cold answers, turn-2 ids and hits, ...) is its typed result (`e2e/results.py`), handed
by the plan to the steps that depend on it, and the lanes' reports are folded into the target's run
once every lane ended. Any exception in a step ends the target with a gated ``error`` check; a
server that exited says so with its exit code.

A target with `stages = N` (N > 1) has every server started with ``--stages N``: a pipeline head and
N-1 stage processes, otherwise the same sessions and flags. `Run.served` records how every serial
step's request was answered (ids digest, cached tokens, tier, snapshot) and `Run.session_hits` each
all-serial session's hit counters, so a staged target's can be held to its single process's
(`e2e/stages.py`).
"""

from __future__ import annotations

import hashlib
import shlex
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from e2e import metrics, metrics_vllm
from e2e.attached import Attached
from e2e.checks import Checks
from e2e.client import Answer, Client, Rejected
from e2e.config import GateTarget
from e2e.engine import Engine
from e2e.oracle_seam import Oracle
from e2e.policy import PolicyGate
from e2e.results import Opened
from e2e.scenarios import SESSION_PORTS
from e2e.session import (PortTaken, Session, Unavailable, merge_flags, server_command, split_flags,
                         unused_port)
from e2e.spawn import Processes, Spawner
from e2e.stats import Stats
from kern.errors import KernError
from oracle.cache import CommandRun, KernRun
from verdicts.policy import POLICY_COUNTERS

if TYPE_CHECKING:  # what the options hold, named for the reader and the type checker; imported where they are made
    from e2e.hosts import Hosts
    from e2e.progress import Progress
    from e2e.zygote import Zygote

__all__ = ["MissingResult", "Options", "Run", "Untold"]

PORT_TRIES = 3  # a session whose gate-picked port was taken before its server bound it: picked again

T = TypeVar("T")
HIT_COUNTERS = POLICY_COUNTERS  # what a session's hits come to (resident/host hits and tokens, parks, ...)
HOST_CHUNK = 98_307  # the host tier's piece size in the gate: 1.5 toy-paged pages and 3 bytes (odd), so
# parks and wakes cross piece edges all the time, on the CPU as on the GPU (runtime/host_arena.py)
HUNG_TERM_S = 2.0  # a server with a stuck request: SIGTERM, then SIGKILL after this long
DEFAULT_WEIGHT = 3  # the default session is every other session's dependency: its host is left lighter


@dataclass
class Options:
    config: Path
    out: Path
    max_tokens: int = 64
    backend: str = "auto"
    port: int = 0
    server_flags: str = ""
    capacity: int = 16384
    load_timeout: float = 600.0
    kern: list[str] | None = None
    kern_test_timeout: float = 3600.0
    zygote: Zygote | None = None  # a warm process (only without `kern`): servers and `kern test` are forked from it
    started: float = field(default_factory=time.monotonic)  # when the gate began: targets' timelines count from it
    reference_worker: int = 0  # each target's reference arithmetic in this many processes of its own (0: in process)
    hosts: Hosts | None = None  # warm processes (only without `kern`): runs them as threads instead (not staged servers)
    at_once: bool = True  # a target's independent sessions at once (`run_target`); False: one after another
    seed: int = 0  # what the generated sessions (params, explore) draw from: `e2e --seed`
    engine: Engine | None = None  # the engine under test (None given: this checkout's kern, or `kern`; set after init)
    progress: Progress | None = None  # every line goes through it, and it names what runs

    def say(self, line: str) -> None:
        """Print one line of the gate's output (through `progress`, which keeps the heartbeat honest)."""
        if self.progress is not None:
            self.progress.echo(line)
        else:
            print(line, flush=True)

    def __post_init__(self) -> None:
        if self.engine is None:
            self.engine = Engine.own(self.kern)

    def spawner(self, staged: bool = False) -> Spawner:
        """What starts the commands under test (`e2e/spawn.py`): an engine's, a fresh process each in the
        gate's environment; our own kern's, the hosts (a staged server starts processes of its own, so
        it is forked from the zygote), else the zygote, else a fresh process each (this checkout's)."""
        if self.engine.external:
            return Processes.engine(self.engine.cwd)
        if self.hosts is not None and not staged:
            return self.hosts
        return self.zygote or Processes.gate()


@dataclass
class Live:
    session: Session
    client: Client
    stats: Stats
    policy: PolicyGate | None = None
    metrics_start: dict | None = None  # the first /metrics scrape (None: the server has no /metrics)


@dataclass
class Run:
    """One lane's view of a target, used by that lane's thread alone (`run_target`); the target's own
    run, once every lane ended, holds what they all reported (`fold`)."""
    target: GateTarget
    opts: Options
    oracle: Oracle  # what answers are judged against: the reference, else `kern run` (e2e/oracle_seam.py)
    runner: KernRun | CommandRun | None  # `kern run`, held to the reference (run_equals_reference); None without one
    checks: Checks
    echo: Callable[[str], None] = print
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    counters: dict[str, dict[str, Any]] = field(default_factory=dict)
    server_facts: dict[str, dict[str, Any]] = field(default_factory=dict)  # /stats facts per session
    live: Live | None = None
    results: dict[type, Any] = field(default_factory=dict)  # what the step's deps gave (`got`): e2e/results.py
    snapshots: dict[str, str | None] = field(default_factory=dict)  # this lane's answers' snapshot news
    # what serial steps were answered, for the staged targets' comparison (e2e/stages.py)
    step: str = ""
    serial: bool = True
    unserial: set[str] = field(default_factory=set)  # sessions where a concurrent step ran
    served: list[dict[str, Any]] = field(default_factory=list)
    session_hits: dict[str, dict[str, int]] = field(default_factory=dict)
    stage_page_bytes: dict[str, list[int]] = field(default_factory=dict)  # per session, a pipeline's stages
    scripts: dict[str, dict[str, Any]] = field(default_factory=dict)  # per session: its flags and requests as sent
    times: dict[str, float] = field(default_factory=dict)  # where the target's time went: seconds by part
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds (user + sys) of each session's server, forked ones

    def lane(self) -> "Run":
        """A fresh view of this run's target for one lane (`run_target`): the same target, options and
        oracles (read only), its own checks, and nothing else of this run's."""
        return Run(self.target, self.opts, self.oracle, self.runner, self.checks.fork(), self.echo)

    def got(self, kind: type[T]) -> T:
        """The result of type `kind` a step this one depends on gave (`e2e/results.py`)."""
        found = self.results.get(kind)
        if found is None:
            raise MissingResult(f"step {self.step or '?'} reads {kind.__name__}, which no step it depends on "
                                "gave (its Step's deps in e2e/scenarios/__init__.py)")
        return found

    def opened(self, name: str) -> Opened:
        """What session `name`'s server told as it started (for the lanes whose flags read it)."""
        return Opened(name, dict(self.facts.get(name) or {}), dict(self.server_facts.get(name) or {}),
                      tuple(self.stage_page_bytes.get(name, ())))

    def take(self, opened: Opened | None) -> None:
        """Another lane's first session's start, as this lane's own record of it."""
        if opened is None:
            return
        self.facts.setdefault(opened.session, dict(opened.facts))
        self.server_facts.setdefault(opened.session, dict(opened.server_facts))
        if opened.stage_page_bytes:
            self.stage_page_bytes.setdefault(opened.session, list(opened.stage_page_bytes))

    def fold(self, lane: "Run") -> None:
        """Take in what a lane reported once it ended: its checks, answers, facts, counters, scripts,
        hits, times and CPU (a session's are only in its lane; times and CPU add up)."""
        self.checks.extend(lane.checks)
        self.served.extend(lane.served)
        for mine, theirs in ((self.facts, lane.facts), (self.counters, lane.counters),
                             (self.server_facts, lane.server_facts), (self.stage_page_bytes, lane.stage_page_bytes),
                             (self.scripts, lane.scripts), (self.session_hits, lane.session_hits)):
            for k, v in theirs.items():
                mine.setdefault(k, v)
        for mine, theirs in ((self.times, lane.times), (self.cpu, lane.cpu)):
            for k, v in theirs.items():
                mine[k] = round(mine.get(k, 0.0) + v, 2)
        self.unserial |= lane.unserial

    @property
    def dir(self) -> Path:
        return self.opts.out / self.target.name

    @property
    def m(self) -> int:
        return self.opts.max_tokens

    @property
    def page(self) -> int:
        """The cache's block in tokens: our servers' ready line or /stats, an engine's facts.page."""
        return int(self._first_facts()["page"])

    def _first_facts(self) -> dict[str, Any]:
        """The default session's facts, else (a lane gated without it: `--scenarios` naming another
        session's check) the facts of the session this lane opened."""
        if "default" in self.facts:
            return self.facts["default"]
        return next(iter(self.facts.values()), {})

    @property
    def rows(self) -> int:
        f = self._first_facts()
        return int(f.get("rows", self.target.widest))

    @property
    def stateful(self) -> bool:
        f = self._first_facts()
        if "checkpoints" in f:
            return f["checkpoints"] == "at request end"
        return self.target.lined

    # sessions
    def command(self, name: str, flags: list[str], cache: int | None = None) -> tuple[list[str], int]:
        """Session `name`'s server command and port: its own flags over --server-flags over the base
        (backend, capacity and, for a target with `stages = N > 1`, ``--stages N``). An engine under
        the contract: its command, with those flags only if it takes kern serve's (``kern-serve``).
        `cache`: the session's cache size in tokens (kern: ``--capacity``; an engine: ``{cache_tokens}``)."""
        o = self.opts
        if o.engine.url is not None:  # a running engine (--engine-url): nothing to start
            return [], 0
        port = 0 if o.port == 0 else o.port + SESSION_PORTS[name]
        e = o.engine
        sized = [("--capacity", [str(cache)])] if cache is not None else []
        if e.external:
            if port == 0:
                port = unused_port()
            extra = (merge_flags(split_flags(o.server_flags), split_flags(flags), sized)
                     if e.has("kern-serve") else [])
            return [*e.argv(port, self.target.model, cache if cache is not None else e.default_cache(o.capacity),
                            manifest=self.target.manifest.resolve()), *extra], port
        base = [("--backend", [o.backend]), ("--capacity", [str(o.capacity)])]
        if self.target.stages > 1:
            base.append(("--stages", [str(self.target.stages)]))
        elif o.kern is None:  # our own single-process server: parks and wakes cross the host tier's pieces
            base.append(("--host-chunk-bytes", [str(HOST_CHUNK)]))
        argv = merge_flags(base, split_flags(o.server_flags), split_flags(flags), sized)
        return server_command(o.kern, self.target.config or o.config, self.target.name, port, argv), port

    def open(self, name: str, flags: list[str], cache: int | None = None) -> Live:
        """Start session `name` (a fresh server) with its own flags over the base and --server-flags
        (and its cache sized to `cache` tokens, when the session asks: `Step.cache`)."""
        self.close()
        o = self.opts
        for tries in range(PORT_TRIES, 0, -1):
            try:
                return self._open(name, flags, cache)
            except PortTaken:  # a port the gate picked was taken before the server bound it: another one
                if o.port != 0 or tries == 1:
                    raise

    def _open(self, name: str, flags: list[str], cache: int | None) -> Live:
        o = self.opts
        cmd, port = self.command(name, flags, cache)
        e = o.engine
        if e.command is not None and not e.has("kern-serve"):  # --server-flags: its own, after its command
            cmd = [*cmd, *shlex.split(o.server_flags)]
        s = Attached(name, e.url, self.dir / f"server-{name}.log", e.reset) if e.url is not None else \
            Session(name, cmd, port, self.dir / f"server-{name}.log", load_timeout=o.load_timeout,
                    spawner=o.spawner(staged=self.target.stages > 1 or _forks(flags)),
                    weight=DEFAULT_WEIGHT if name == "default" else 1, health=e.external)
        try:
            facts = s.start()
            if e.external:  # what it can do and its facts, from its first server (docs/engine-contract.md)
                with _LEARN:
                    e.learn(s.url)
                lacks = e.lacks_family(self.target.family)
                if lacks is not None:
                    raise Unavailable(lacks)
                facts = {"page": 1, **e.facts, **facts}  # page: the block a hit is counted in (1: any token)
        except BaseException:
            s.stop(kill=True)
            raise
        self.facts[name] = facts
        ready = s.log.lines("pp ready")  # a pipeline head: each stage's host page bytes
        if ready and ready[-1].get("stage_page_bytes") is not None:
            self.stage_page_bytes[name] = [int(b) for b in str(ready[-1]["stage_page_bytes"]).split(",")]
        if name == "default":
            self.echo("  facts: " + ", ".join(f"{k}={facts[k]}" for k in
                      ("ranks", "pages", "page", "rows", "checkpoints", "seq_slots", "max_request_tokens", "load_s")
                      if k in facts))
        c = Client(s, self.target.model, text=e.has("text"), stream_usage=e.has("metrics-vllm"))
        sized = ["--capacity", str(cache)] if cache is not None else []  # a replay (e2e/case.py) sizes it alike
        self.scripts[name] = {"flags": list(flags) + sized, "requests": c.script}  # as the session sends them
        raw = c.stats()
        self.server_facts[name] = dict((raw or {}).get("facts") or {})
        self.live = Live(s, c, Stats(c, s.log, reads_log=not e.external),
                         PolicyGate(self.oracle, (raw or {}).get("facts"), self.target.lined))
        self.live.stats.has_endpoint = raw is not None
        text = c.metrics() if raw is not None or e.has("metrics-vllm") else None
        self.live.metrics_start = metrics.parse(text) if text is not None else None
        return self.live

    def policy_check(self) -> None:
        """The open session's policy check: every serial request and counter read it predicted."""
        live = self.live
        if live is None or live.policy is None:
            return
        ok, note = live.policy.verdict()
        self.checks.add(f"policy_{live.session.name}", ok, note)

    def metrics_check(self) -> None:
        """The open session's metrics check: its /metrics, once idle, against what its client sent and
        got, its /stats and (still predicting) the policy oracle (e2e/metrics.py)."""
        live = self.live
        if live is None:
            return
        name = f"metrics_{live.session.name}"
        if live.metrics_start is None:
            self.checks.add(name, None, "not gated: the server has no /metrics")
            return
        if self.opts.engine.has("metrics-vllm") and not self.opts.engine.has("metrics"):
            end = metrics_vllm.idle(live.client.metrics)
            self.checks.add(name, *metrics_vllm.verdict(live.metrics_start, end, live.client.ledger.sent))
            return
        if not live.client.hung:  # a stuck request never lets it idle (and got no token to count)
            live.stats.idle()
        stats = live.client.stats()
        text = live.client.metrics()
        p = live.policy
        policy = {k: p.policy.counters[k] for k in POLICY_COUNTERS} if p is not None and p.active else None
        ok, note = metrics.verdict(live.metrics_start, metrics.parse(text or ""), live.client.ledger.sent, stats,
                                   policy, idle=not live.client.hung)
        self.checks.add(name, ok, note)

    def serial_ends(self, why: str) -> None:
        """A phase whose recency and counters depend on timing starts: exact predictions stop."""
        if self.live is not None and self.live.policy is not None:
            self.live.policy.stop(why)

    def close(self) -> None:
        if self.live is None:
            return
        self.policy_check()
        self.metrics_check()
        name = self.live.session.name
        if name not in self.unserial and self.live.session.alive():  # all serial: counters are not timing's
            raw = self.live.client.stats() or {}
            self.session_hits[name] = {k: int(v) for k, v in (raw.get("counters") or {}).items() if k in HIT_COUNTERS}
        live, self.live = self.live, None
        _let_go(live)
        try:
            live.session.check()
        finally:
            live.session.stop()
            self.note_cpu(live.session)

    def note_cpu(self, session: Session) -> None:
        """The CPU seconds a forked server spent (the zygote reports them with its exit)."""
        use = getattr(session.proc, "usage", None) or {}
        if "cpu_s" in use:
            self.cpu[session.name] = round(self.cpu.get(session.name, 0.0) + sum(use["cpu_s"]), 2)

    def host_page_bytes(self, session: str = "default") -> int:
        """Bytes of one host page on the stage that holds the most (a pipeline's `--host-gib` is per
        stage, and the head keeps the fewest host pages any stage has); a single process's page_bytes."""
        return max([int(self.live_facts("page_bytes", session))] + self.stage_page_bytes.get(session, []))

    def live_facts(self, key: str, session: str = "default") -> Any:
        """A fact of an earlier session's `/stats` (page_bytes, slot_bytes, ...)."""
        facts = self.server_facts.get(session) or {}
        if key not in facts:
            raise KeyError(f"the {session} session's /stats facts have no {key!r}")
        return facts[key]

    def need(self, name: str) -> Live:
        assert self.live is not None and self.live.session.name == name, f"{name=} not open"
        return self.live

    def answer(self, prompt: str | list[int], max_tokens: int | None = None, timeout: float | None = None) -> Answer:
        live = self.need_any()
        m = max_tokens or self.m
        ids = list(prompt.encode()) if isinstance(prompt, str) else list(prompt)
        if live.policy is not None and live.policy.active:  # the reference starts on it while the server serves
            live.policy.prefetch(ids, m)
        else:
            self.oracle.prefetch(ids, m, self.rows)
        try:
            a = live.client.complete(prompt, m, timeout=timeout)
        except Rejected as exc:
            if live.policy is not None and exc.status == 400:
                live.policy.rejected(list(prompt.encode()) if isinstance(prompt, str) else list(prompt))
            raise
        untold = a.untold() if live.stats.has_endpoint and self.opts.engine.has("kern-serve") else []
        if untold:
            raise Untold(f"request {a.request}: the response's kern object lacks {', '.join(untold)}; a server "
                         "with /stats reports each request's tier, snapshot and wake in it (docs/api.md), not "
                         "only in a log line")
        self.snapshots[a.request] = a.snapshot
        if self.serial:
            self.served.append({"session": live.session.name, "step": self.step, "request": a.request,
                                "tokens": len(a.ids), "ids": hashlib.sha256(str(a.ids).encode()).hexdigest()[:16],
                                "cached": a.cached, "tier": a.tier, "snapshot": a.snapshot})
        if live.policy is not None:
            live.policy.expect(a.request, self.prompt_ids(a, prompt), m, a)
        return a

    def need_any(self) -> Live:
        assert self.live is not None, "no session open"
        return self.live

    def prompt_ids(self, a: Answer, prompt: str | list[int]) -> list[int]:
        return a.prompt_ids or (list(prompt.encode()) if isinstance(prompt, str) else list(prompt))




_LEARN = threading.Lock()  # an engine's capabilities are asked once, by the first session to start


class MissingResult(KernError, LookupError):
    """A step read a result (`Run.got`) that none of the steps it depends on gives."""


class Untold(KernError, RuntimeError):
    """A server with /stats answered without the `kern` fields that say a request's tier, snapshot
    and wake: the gate cannot prove its tiers from the API, so the target fails."""
























def _forks(flags: list[str]) -> bool:
    """A session's flags that make its server start processes of its own (a host's thread serves in
    process whatever it is told: docs/serve.md)."""
    return any(f in ("--frontend-process", "--frontends") or f.startswith("--frontends=") for f in flags)


def _let_go(live: Live) -> None:
    """Close the session's client; a server holding a stuck request would drain it until its
    --drain-timeout (30 s), so it is given `HUNG_TERM_S` before it is killed."""
    if live.client.hung:
        live.session.term_timeout = min(live.session.term_timeout, HUNG_TERM_S)
    live.client.close()
