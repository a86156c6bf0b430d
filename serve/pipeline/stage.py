"""A pipeline stage process (`kern serve STAGE.json --pp-head ADDR`): no HTTP, no pool of its own.

    Hello {stage, stages, cut, pages, page_bytes, host_pages, up}  ->  Table {pages, pad, max_seqs,
    host_pages, down}  ->  load  ->  Ready  ->  items, in order, until told to stop.

Each item's plans are carried out on this stage's states first, then its calls; the buffers crossing
out go to the next stage with the item's header, or, from the last stage, each cell's tokens go back
to the head as `done`. An item of an older epoch than one already seen is dropped (a stage was lost
and replaced since); an item whose `route` names a new address for the next stage reconnects to it. One `pp item` line per item. Any error ends the process (after telling the
head); a silent head, a closed connection or a dead parent ends it too (StageWatch).
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass

import zmq

from serve.common import logs
from serve.common.threads import name_native
from serve.pipeline.liveness import EXIT_PIPELINE, StageWatch, die, die_with_parent
from serve.pipeline.transport import Message, ZmqWire
from serve.pipeline.work import StageWork, cells_of

__all__ = ["StageOptions", "cut_of", "serve_stage"]

GIB = 1 << 30


@dataclass(slots=True)
class StageOptions:
    weights: tuple[str, ...] = ()
    config: str | None = None
    capacity: int | None = None
    host_gib: float = 0.0
    backend: str = "cpu"
    device: str | None = None
    reserve_gib: float = 4.0
    timeout: float = 60.0
    bind: str = "127.0.0.1"
    parent: int | None = None
    share: int = 1  # processes sharing this device: the default capacity takes 1/share of its free memory
    connect: float | None = None  # --stage-connect-timeout: how long the head's table may take (None: 180 s,
    # or `timeout` when longer); the head may still be waiting for other stages


def cut_of(m) -> tuple[str, int, int]:
    """(id, stage, stages) of a stage manifest; an uncut manifest is the only stage of itself."""
    c = getattr(m, "cut", None)
    if c is None:
        return "", 0, 1
    if isinstance(c, dict):
        return str(c["id"]), int(c["stage"]), int(c["stages"])
    return str(c.id), int(c.stage), int(c.stages)


def stage_pages(m, geometry, opts: StageOptions, backend) -> int:
    """The pages this stage could hold: --capacity, or the CPU default, or the GPU's free memory."""
    from manifests import derive
    from serve.core.engine import capacity_of

    return capacity_of(opts.capacity, backend, geometry, 0, opts.reserve_gib, opts.share) // derive.page_unit(m)


def serve_stage(what: str, head: str, opts: StageOptions) -> int:
    """Run one stage until the head says stop (0); a lost peer or an error ends it non-zero."""
    die_with_parent(opts.parent)
    from manifests import derive, load
    from manifests.config import resolve
    from pool import Geometry
    from runtime.backends import make_backend

    if opts.device is not None and opts.backend != "cpu":
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", str(opts.device).split(",")[0])
    target = resolve(what, opts.config, list(opts.weights) or None)
    m = load(target.manifest)
    cut, k, stages = cut_of(m)
    if k == 0:
        raise ValueError(f"{target.manifest} is stage 0 of its cut (or no stage at all): stage 0 is the head")
    name_native(f"kern-stage-{k}")
    ctx = zmq.Context()
    watch = StageWatch(ctx, head, k, opts.timeout, opts.parent)
    watch.start()
    ctl = ZmqWire.make(ctx, zmq.DEALER, connect=head, identity=f"s{k}".encode(), send_timeout=opts.timeout)
    up = ZmqWire.make(ctx, zmq.PULL, bind=f"tcp://{opts.bind}:*", send_timeout=opts.timeout)
    try:
        return _run(m, target, k, stages, cut, ctx, ctl, up, watch, opts, make_backend(opts.backend),
                    Geometry(**derive.geometry(m)))
    except Exception as exc:
        msg = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
        try:
            ctl.send(Message("error", {"error": msg}))
            time.sleep(0.2)
        except zmq.ZMQError:
            pass
        die("pp stage failed", {"stage": k, "error": msg}, code=1)
        return 1


def _run(m, target, k, stages, cut, ctx, ctl, up, watch, opts, backend, geometry) -> int:
    from manifests import derive
    from runtime.runtime import Runtime

    pages = stage_pages(m, geometry, opts, backend)
    host_page_bytes = derive.page_unit(m) * sum(b for _, b in geometry.paged)  # a host page, on this stage
    host_pages = int(opts.host_gib * GIB) // host_page_bytes if host_page_bytes else 0
    ctl.send(Message("hello", {"stage": k, "stages": stages, "cut": cut, "pages": pages,
                               "page_bytes": host_page_bytes, "host_pages": host_pages, "up": up.address,
                               "pid": os.getpid(), "lined": bool(geometry.has_slots)}))
    wait = opts.connect if opts.connect is not None else max(opts.timeout, 180.0)
    table = _expect(ctl, "table", wait, k)  # the head may still be starting others
    t = table.head
    rt = Runtime(m, list(target.weights), pages=t["pages"], slots=t.get("slots", 0), backend=backend,
                 max_seqs=t["max_seqs"], host_bytes=t["host_pages"] * host_page_bytes)
    rt.set_pad(t["pad_page"], t.get("pad_slot"))
    work = StageWork(rt, t.get("send", []))
    down = None
    down_at = t.get("down")
    if down_at:
        down = ZmqWire.make(ctx, zmq.PUSH, connect=down_at, send_timeout=opts.timeout)
    last = k == stages - 1
    epoch = int(t.get("epoch", 0))  # items of an older epoch are void (a stage was lost since)
    ctl.send(Message("ready", {"stage": k}))
    logs.event("pp stage ready", stage=k, stages=stages, pid=os.getpid(), cut=cut, pages=t["pages"], page_bytes=host_page_bytes,
               host_pages=t["host_pages"], up=up.address, down=t.get("down") or "head")
    while not watch.stopped.is_set():
        msg = up.recv(0.25)
        if msg is None:
            continue
        if msg.kind != "item":
            raise ValueError(f"stage {k} got a {msg.kind!r} message where an item belongs")
        h = msg.head
        if int(h.get("epoch", 0)) < epoch:
            logs.event("pp item dropped", "DEBUG", stage=k, item=h["item"], epoch=h.get("epoch", 0), current=epoch)
            continue
        epoch = int(h.get("epoch", 0))
        route = h.get("route") or []
        if not last and k + 1 < len(route) and route[k + 1] and route[k + 1] != down_at:
            down.close()  # the next stage was replaced: what waited for the old one is void
            down_at = route[k + 1]
            down = ZmqWire.make(ctx, zmq.PUSH, connect=down_at, send_timeout=opts.timeout)
            logs.event("pp stage rewired", stage=k, down=down_at, epoch=epoch)
        issued = time.time()
        work.apply(h["plans"])
        cells = cells_of(h["cells"])
        leave = work.run(h["program"], cells, msg.arrays)
        if last:
            ctl.send(Message("done", {"item": h["item"], "epoch": epoch, "tokens": [c.tokens for c in cells]}))
        else:
            down.send(Message("item", h, leave))
        done = time.time()
        logs.event("pp item", "DEBUG", stage=k, item=h["item"], program=h["program"], rows=sum(len(c.ids) for c in cells),
                   issued_us=int(issued * 1e6), done_us=int(done * 1e6))
    logs.event("pp stage stopped", stage=k)
    return 0


def _expect(ctl: ZmqWire, kind: str, timeout: float, k: int) -> Message:
    msg = ctl.recv(timeout)
    if msg is None:
        die("pp head gone", {"stage": k, "reason": f"no {kind} within {timeout} s"})
    if msg.kind == "refuse":
        die("pp stage refused", {"stage": k, "reason": msg.head.get("reason", "?")}, code=EXIT_PIPELINE)
    if msg.kind != kind:
        raise ValueError(f"stage {k} expected {kind!r} from the head, got {msg.kind!r}")
    return msg
