"""The head of a pipeline (stage 0): HTTP, the scheduler and the only pool, driving its stages.

`build_head` binds the control socket, starts the other stages on this machine (or waits for ones
started with `--pp-head`), takes each one's Hello {stage, cut, pages, page bytes, host pages, where
it listens}, sizes the pool to the fewest pages any stage holds and the host tier to the fewest host
pages, answers each with a Table {pages, pad, max_seqs, host pages, where to send}, loads stage 0
here and waits until every stage is ready. Then the scheduler runs as for one process, with a
`Pipeline` in place of the runtime.

Serving, a lost stage is the pipeline's to report (`Pipeline.lose`); with restart on (the default,
`--no-pp-restart` turns it off) `Head.restart` replaces it: a stage this head started is killed if
still there and started again, one started by hand is awaited (a new one started by hand with
`--pp-head`), each within `startup` seconds; the same Table goes to it, and its item address joins
the route the items carry. More than RESTARTS_MAX losses within RESTARTS_WINDOW_S seconds give up.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import zmq

from serve.common import logs
from serve.pipeline.forked import Warm
from serve.pipeline.liveness import EXIT_PIPELINE, HeadWatch, die, hb_identity
from serve.pipeline.stage import cut_of
from serve.pipeline.transport import Message, ZmqWire
from serve.pipeline.work import StageWork, arriving

__all__ = ["PipelineOptions", "Head", "build_head"]

GIB = 1 << 30
RESTARTS_MAX = 3
RESTARTS_WINDOW_S = 60.0
STARTUP_S = 180.0  # --stage-connect-timeout's default (or --pp-timeout, when longer)
SAY_EVERY_S = 10.0  # while waiting for stages, a line this often


@dataclass(slots=True)
class PipelineOptions:
    listen: str | None = None  # bind here and wait for stages started elsewhere
    timeout: float = 60.0
    startup: float | None = None  # --stage-connect-timeout: seconds for the stages to connect (say hello), and
    # again to load; None: STARTUP_S, or `timeout` when longer
    share: int = 1  # processes sharing this device's free memory (the default --capacity on a GPU)
    restart: bool = True  # replace a lost stage and resume (False: answer errors and exit 3)
    entry: Callable[[list[str]], None] | None = None  # what a forked stage runs on its command line (the
    # serve command, standalone: it exits); None: every stage a fresh `python -m serve` (serve/pipeline/forked.py)


@dataclass
class Head:
    """What the head holds beside the engine: the watcher, the stage processes it started, and what
    it takes to replace one."""

    watch: HeadWatch
    procs: dict = field(default_factory=dict)  # stage -> Popen (stages this head started)
    ctx: zmq.Context | None = None
    spawn: object = None  # stage -> a new Popen of it (None: stages are started by hand)
    table: dict = field(default_factory=dict)
    sends: list = field(default_factory=list)
    cut: tuple = ()  # (id, stages)
    startup: float = 180.0
    pipe: object = None
    losses: list = field(default_factory=list)  # monotonic times of restarts
    stopping: bool = False

    def stop(self) -> None:
        """Drain is the scheduler's; here: tell the stages to end and reap the ones we started."""
        self.stopping = True  # a restart in progress gives up
        self.watch.stop_stages()
        deadline = time.monotonic() + 10
        for p in list(self.procs.values()):
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def restart(self, todo: list[int]) -> str | None:
        """Replace the stages `todo` (run on the pipeline's restart thread); None when they are all
        ready again, else why not. A replacement that exits before it is ready is one more loss:
        it is replaced again while the budget (RESTARTS_MAX within RESTARTS_WINDOW_S) lasts."""
        while True:
            if self.stopping:
                return "the head is stopping"
            now = time.monotonic()
            self.losses = [t for t in self.losses if now - t < RESTARTS_WINDOW_S] + [now]
            if len(self.losses) > RESTARTS_MAX:
                return (f"stages were lost {len(self.losses)} times within {RESTARTS_WINDOW_S:.0f} s; "
                        "not restarting again")
            why = self._replace(todo)
            if not isinstance(why, _Exited):
                return why
            logs.event("pp stage lost", "ERROR", stage=why.stage, reason=str(why))

    def _replace(self, todo: list[int]) -> str | None:
        t0 = time.monotonic()
        pipe, watch = self.pipe, self.watch
        for k in todo:
            watch.lost.add(k)  # being replaced: not reported lost again (revived when ready)
            watch.known.discard(hb_identity(k))  # beat to the replacement once it is heard from
            old = self.procs.pop(k, None)
            watch.procs.pop(k, None)
            if old is not None and old.poll() is None:
                old.kill()  # frozen or stuck: it is replaced, not waited for
            if old is not None:
                old.wait()
        while not watch.control.empty():
            watch.control.get_nowait()  # a lost stage's last words
        if self.spawn is not None:
            for k in todo:
                if self.stopping:
                    return "the head is stopping"
                self.procs[k] = self.spawn(k)
        logs.event("pp stage restarting", stages=",".join(map(str, todo)), how="spawned" if self.spawn else "awaited",
                   epoch=pipe.epoch)
        procs = [(k, self.procs[k]) for k in todo if k in self.procs]
        hellos = _gather(watch, "hello", set(todo), self.startup, procs, lambda: self.stopping)
        if isinstance(hellos, str):
            return hellos
        cid, n = self.cut
        for k, h in hellos.items():
            if h.head["cut"] != cid or int(h.head["stages"]) != n:
                return f"the replacement for stage {k} serves cut {h.head['cut']} of {h.head['stages']} stages"
            if int(h.head["pages"]) < self.table["pages"] or int(h.head["host_pages"]) < self.table["host_pages"]:
                return (f"the replacement for stage {k} holds {h.head['pages']} pages and {h.head['host_pages']} host "
                        f"pages; the pool needs {self.table['pages']} and {self.table['host_pages']}")
        route = list(pipe.route)
        for k, h in hellos.items():
            route[k] = h.head["up"]
        for k in todo:
            down = route[k + 1] if k + 1 < n else None
            watch.post(f"s{k}".encode(), Message("table", {**self.table, "down": down, "send": self.sends[k],
                                                           "epoch": pipe.epoch}))
        ready = _gather(watch, "ready", set(todo), self.startup, procs, lambda: self.stopping)
        if isinstance(ready, str):
            return ready
        for k in todo:
            if k in self.procs:
                watch.procs[k] = self.procs[k]
            watch.revive(k)
        pipe.route = route
        logs.event("pp stage restarted", stages=",".join(map(str, todo)), epoch=pipe.epoch,
                   took_s=round(time.monotonic() - t0, 2))
        return None


class _Exited(str):
    """Why a restart failed: a replacement process exited before it was ready (it may be tried again)."""

    def __new__(cls, why: str, stage: int):
        self = super().__new__(cls, why)
        self.stage = stage
        return self


def _gather(watch: HeadWatch, kind: str, want: set[int], timeout: float, procs, stopping=lambda: False) -> dict | str:
    """Like `_await` while serving: every stage in `want`'s `kind` message, or why not (a string)."""
    got: dict[int, Message] = {}
    deadline = time.monotonic() + timeout
    while set(got) != want:
        if stopping():
            return "the head is stopping"
        for k, p in procs:
            if p.poll() is not None:
                return _Exited(f"the replacement for stage {k} exited with {p.returncode} before it was {kind}", k)
        if time.monotonic() >= deadline:
            return f"no {kind} from stage(s) {','.join(map(str, sorted(want - set(got))))} within {timeout:.0f} s"
        try:
            msg = watch.control.get(timeout=0.1)
        except queue.Empty:
            continue
        k = int(msg.head.get("stage", -1))
        if msg.kind == kind and k in want:
            got[k] = msg
    return got


def _stage_args(path: Path, head_addr: str, opts, pp: PipelineOptions, weights) -> list[str]:
    """A stage's command line after `python -m serve`: on this machine, on the head's backend and
    device (stages started separately with --pp-head choose their own)."""
    args = [str(path), "--pp-head", head_addr, "--pp-timeout", str(pp.timeout),
            "--backend", opts.backend, "--host-gib", str(opts.host_gib), "--pp-parent", str(os.getpid()),
            "--stage-connect-timeout", str(startup_s(pp)),
            "--log-level", logs.level()]  # its `pp item` lines are debug, as the head's
    if opts.device is not None:
        args += ["--device", str(opts.device)]
    if opts.capacity is None and opts.backend != "cpu":
        args += ["--pp-share", str(pp.share)]  # the stages and the head split one device's free memory
    if opts.capacity is not None:
        args += ["--capacity", str(opts.capacity)]
    for w in weights:
        args += ["--weights", str(w)]
    return args


def _spawn(args: list[str], k: int, warm: Warm | None):
    """Stage k: its warm copy told `args` (`serve/pipeline/forked.py`), else a fresh process."""
    if warm is not None:
        forked = warm.start(k, args)
        if forked is not None:
            return forked
    return subprocess.Popen([sys.executable, "-m", "serve", *args], stdin=subprocess.DEVNULL)


def startup_s(pp: PipelineOptions) -> float:
    """How long the head waits for its stages to connect, and then to load (--stage-connect-timeout)."""
    return pp.startup if pp.startup is not None else max(STARTUP_S, pp.timeout)


_DOING = {"hello": "connect", "ready": "load"}
_DONE = {"hello": "connected", "ready": "loaded"}


def _await(watch: HeadWatch, kind: str, want: set[int], timeout: float, procs, n: int = 0) -> dict[int, Message]:
    """Every stage in `want`'s `kind` message; a stage process that exits first, or silence past
    the limit, ends the head with one line naming the stages missing. While it waits, one `pp
    waiting` line per missing stage at once and every SAY_EVERY_S seconds (of `n` stages)."""
    got: dict[int, Message] = {}
    start = time.monotonic()
    deadline, say = start + timeout, start
    doing = _DOING.get(kind, kind)
    while set(got) != want:
        for k, p in procs:
            if p.poll() is not None:
                die("pp stage lost", {"stage": k, "reason": f"exited with {p.returncode} before it was {kind}"})
        now = time.monotonic()
        left = deadline - now
        missing = sorted(want - set(got))
        if left <= 0:
            names = ", ".join(f"{k}/{n}" for k in missing)
            die("pp stage lost", {"stages": ",".join(map(str, missing)),
                                  "reason": f"stage{'s' if len(missing) > 1 else ''} {names} did not {doing} within "
                                            f"{timeout:g} s (--stage-connect-timeout)",
                                  "stage_connect_timeout": timeout})
        if now >= say:
            for k in missing:
                logs.event("pp waiting", stage=k, stages=n, left_s=round(left),
                           message=f"waiting for stage {k}/{n} to {doing} (up to {timeout:g} s)...")
            say = now + SAY_EVERY_S
        try:
            msg = watch.control.get(timeout=min(left, 0.25))
        except queue.Empty:
            continue
        if msg.kind != kind:
            die("pp protocol error", {"reason": f"expected {kind}, got {msg.kind!r}"})
        k = int(msg.head["stage"])
        got[k] = msg
        logs.event(f"pp stage {_DONE.get(kind, kind)}", stage=k, stages=n)
    return got


def _host_tier(pages: int, page_bytes: int):
    """The head's host tier: counted in pages (one unit each; every stage maps host page h to h x its
    own host page), its `used()` in bytes of stage 0's host pages (`page_bytes` each), the unit of the
    `host_bytes` fact, so /stats `host_used_bytes` means bytes as in a single process."""
    from pool import Host

    class PageHost(Host):
        def used(self) -> int:
            return super().used() * page_bytes

    return PageHost(pages, 1, 1, 0)


def build_head(paths: list[Path], opts, pp: PipelineOptions):
    """The engine for stage 0 with a Pipeline as its runtime, and the Head that stops the stages."""
    from manifests import derive
    from manifests.config import resolve
    from runtime.protocol import Protocol
    from serve.core.engine import EngineError
    import runtime.runtime  # noqa: F401 - imported before the fork: the stages' copies hold it too

    if opts.device is not None and opts.backend != "cpu":
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", str(opts.device).split(",")[0])
    manifests = _stage_manifests(paths)
    m0, last = manifests[0], manifests[-1]
    cid, _, n = cut_of(m0)
    target = resolve(str(paths[0]), opts.config, list(opts.weights) or None)
    if derive.is_lined(m0) or any(derive.is_lined(m) for m in manifests):
        raise EngineError("a pipeline serves paged targets only (lined states through stages come later)")
    proto0, proto = Protocol(m0), Protocol(last)
    # the stages as warm copies of this process, before it makes a device context, a socket or a thread
    warm = Warm.fork(list(range(1, n)), pp.entry) if pp.listen is None else None
    try:
        return _build(paths, opts, pp, manifests, target, cid, n, proto0, proto, warm)
    finally:
        if warm is not None:
            warm.close()  # the copies not started (a load that failed first) exit


def _build(paths: list[Path], opts, pp: PipelineOptions, manifests, target, cid: str, n: int, proto0, proto,
           warm: Warm | None):
    """`build_head` once its stages' copies are made: the device, the stages' hellos, the pool, stage 0."""
    from manifests import derive
    from pool import Geometry, Prefix
    from runtime.backends import make_backend
    from runtime.runtime import Runtime
    from serve.core.engine import Engine, sizing
    from serve.pipeline.pipeline import Pipeline

    m0 = manifests[0]
    backend = make_backend(opts.backend)
    unit, reach = derive.page_unit(m0), derive.reach(m0)
    geometry = Geometry(**derive.geometry(m0))
    if pp.listen is None and opts.capacity is None and backend.name != "cpu":
        pp.share = n  # this machine's stages share the head's device
    sized = sizing(m0, proto0, proto, opts, backend, geometry, pp.share)  # one rule with a server's and the stages'
    rows, chunk, max_seqs, capacity = sized.rows, sized.chunk, sized.max_seqs, sized.capacity
    hpb0 = unit * sum(b for _, b in geometry.paged)  # one page of every paged state: a host page here

    head, procs, hellos = _start_stages(paths, opts, pp, target.weights, cid, n, warm)
    ctx, watch, startup = head.ctx, head.watch, startup_s(pp)
    fewest, host_pages, pool, host, pad = _shared_pool(hellos, capacity, unit, geometry, opts.host_gib * GIB, hpb0)
    table, sends = _send_tables(watch, manifests, hellos, pool, pad, max_seqs, host_pages, n)
    local = Runtime(m0, list(target.weights), pages=pool.pages_max, slots=0, backend=backend, max_seqs=max_seqs,
                    host_bytes=host_pages * hpb0, graphs=opts.graphs)
    local.set_pad(pad.pages[0], None)
    _await(watch, "ready", set(range(1, n)), startup, procs, n)
    down = ZmqWire.make(ctx, zmq.PUSH, connect=hellos[1].head["up"], send_timeout=pp.timeout)
    runtime = Pipeline(StageWork(local, sends[0]), proto, down, watch, n, pp.timeout, hpb0)
    runtime.route = [None] + [hellos[k].head["up"] for k in range(1, n)]
    runtime.down_at = runtime.route[1]
    runtime.reconnect = lambda at: ZmqWire.make(ctx, zmq.PUSH, connect=at, send_timeout=pp.timeout)
    head.table, head.sends, head.cut, head.startup, head.pipe = table, sends, (cid, n), startup, runtime
    if pp.restart:
        runtime.restarter = head.restart
    watch.procs.update(head.procs)
    watch.on_lost = runtime.lose  # serving: a lost stage breaks the pipeline instead of ending the head
    logs.event("pp ready", stages=n, cut=cid, pages=pool.pages_max, stage_pages=",".join(
        [str(fewest)] + [str(hellos[k].head["pages"]) for k in range(1, n)]), host_pages=host_pages,
        stage_page_bytes=",".join([str(hpb0)] + [str(hellos[k].head["page_bytes"]) for k in range(1, n)]))
    engine = Engine(
        model=m0.model, manifest_path=str(paths[0]), runtime=runtime, pool=pool, pad=pad, host=host,
        prefix=Prefix(unit), rows=rows, chunk=chunk, max_seqs=max_seqs, lined=False, unit=unit, reach=reach,
        backend=backend.name, host_bytes=host_pages * hpb0, seq_slots=pool.slots, faults=opts.faults,
        pack=_packs(opts, manifests), context=_context(manifests),
        admission=opts.admission, queue_timeout=opts.queue_timeout,
    )
    return engine, head


def _send_tables(watch, manifests: list, hellos: dict, pool, pad, max_seqs: int, host_pages: int, n: int):
    """(table, sends): the shared table (pages, pad, sizes) posted to every stage past the head, each
    with the address of the stage after it and what it sends on; `sends[k]`: stage k's outputs."""
    table = {"pages": pool.pages_max, "slots": 0, "pad_page": pad.pages[0], "pad_slot": None, "max_seqs": max_seqs,
             "host_pages": host_pages}
    sends = [arriving(manifests[k + 1]) if k + 1 < n else [] for k in range(n)]
    for k in range(1, n):
        down = hellos[k + 1].head["up"] if k + 1 < n else None
        watch.post(f"s{k}".encode(), Message("table", {**table, "down": down, "send": sends[k]}))
    return table, sends


def _packs(opts, manifests) -> bool:
    """Packed prefill as one process packs it, when every stage's chunk program takes cu_seqlens."""
    from runtime.protocol import Protocol

    return opts.pack and all(Protocol(m).packs for m in manifests)


def _shared_pool(hellos: dict, capacity: int, unit: int, geometry, host_bytes: float, hpb0: int):
    """(fewest pages, host pages, pool, host tier, pad): the pages every stage holds (the fewest any
    stage said), the host pages every stage maps, and the head's pool over them with its pad leased."""
    from pool import Lease, Pool, chunk_size, chunks_for
    from serve.core.engine import EngineError

    fewest = min([capacity // unit] + [int(h.head["pages"]) for h in hellos.values()])
    capacity = fewest * unit
    if fewest < 2:
        raise EngineError(f"the fewest pages any stage holds is {fewest}: under two pages (the pad takes one)")
    host_pages = min([int(host_bytes) // hpb0] + [int(h.head["host_pages"]) for h in hellos.values()])
    chunk_bytes = chunk_size(geometry)
    pool = Pool(geometry, chunk_bytes, chunks_for(geometry, capacity, 0, chunk_bytes), 0, tokens=capacity)
    host = _host_tier(host_pages, hpb0) if host_pages > 0 else None  # counted in pages: each stage maps its bytes
    pad = pool.lease_pad()
    if not isinstance(pad, Lease):
        raise EngineError(f"the pool cannot lease the pad ({pad!r}); raise --capacity")
    return fewest, host_pages, pool, host, pad


def _stage_manifests(paths: list[Path]) -> list:
    """Every stage's manifest, loaded; a PlanError naming the stages that hold no state."""
    from manifests import load

    manifests = [load(p) for p in paths]
    empty = [k for k, m in enumerate(manifests) if not m.raw.get("states")]
    if empty:
        from serve.pipeline.plan import PlanError

        raise PlanError(f"stage(s) {','.join(map(str, empty))} of {paths[0].parent} hold no state (a stage needs "
                        "pages to share the head's); cut so that every stage holds a layer")
    return manifests


def _start_stages(paths: list[Path], opts, pp: PipelineOptions, weights, cid: str, n: int, warm: Warm | None = None):
    """Bind the control socket, start the other stages here (or wait for ones started by hand), and take
    each one's hello: (the Head, the processes started, the hellos by stage). A stage of another cut ends
    the head."""
    ctx = zmq.Context()
    ctl = ZmqWire.make(ctx, zmq.ROUTER, bind=pp.listen or "tcp://127.0.0.1:*", send_timeout=pp.timeout)
    watch = HeadWatch(ctl, list(range(1, n)), pp.timeout)
    watch.start()
    head = Head(watch, ctx=ctx)
    logs.event("pp head listening", address=ctl.address, stages=n, cut=cid,
               started="by hand" if pp.listen is not None else "forked" if warm is not None else "spawned")
    procs = []
    if pp.listen is None:
        head.spawn = lambda k: _spawn(_stage_args(paths[k], ctl.address, opts, pp, weights), k, warm)
        for k in range(1, n):
            procs.append((k, head.spawn(k)))
        head.procs = dict(procs)
    hellos = _await(watch, "hello", set(range(1, n)), startup_s(pp), procs, n)
    for k, h in hellos.items():
        if h.head["cut"] != cid or int(h.head["stages"]) != n:
            die("pp stage refused", {"stage": k, "reason": f"cut {h.head['cut']} of {h.head['stages']} stages, the head "
                f"serves cut {cid} of {n}"}, code=EXIT_PIPELINE)
    return head, procs, hellos


def _context(manifests) -> int | None:
    """A packed prefill call's context bound through the stages: the least any stage declares."""
    from runtime.protocol import Protocol

    bounds = [b for b in (Protocol(m).context_bound for m in manifests) if b is not None]
    return min(bounds) if bounds else None
