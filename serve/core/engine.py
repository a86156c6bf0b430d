"""What one server holds for its target: the runtime, the pool (with its pad), the host tier and the
prefix index, sized from the flags of SPEC §7. Built on the main thread, then owned by the scheduler.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from kern.errors import KernError
from manifests import derive, load
from manifests.config import resolve
from pool import Geometry, Host, Lease, Pool, Prefix, chunk_size, chunks_for
from pool.fair import Rule
from runtime.runtime import Runtime
from serve.common.startup import Phases
from serve.core.device import Device
from serve.core.faults import Faults

__all__ = ["Engine", "EngineError", "Options", "build", "size"]

GIB = 1 << 30
CPU_CAPACITY = 16384


class EngineError(KernError, ValueError):
    """Flags the target cannot be served with (a bad --rows, a pool too small for the pad, ...)."""


@dataclass(slots=True)
class Options:
    capacity: int | None = None
    host_gib: float = 0.0
    max_seqs: int | None = None
    chunk: int | None = None
    rows: int | None = None
    backend: str = "cpu"
    device: str | None = None
    reserve_gib: float = 4.0
    weights: tuple[str, ...] = ()
    config: str | None = None
    faults: Faults = field(default_factory=Faults)
    graphs: bool = True  # capture `graph: true` programs as CUDA graphs (GPU)
    decode_steps: int | None = None  # decode steps a launch (None: DEFAULT_STEPS on a GPU, 1 on the CPU)
    overlap: bool | None = None  # launch the next decode steps before committing the last (None: on a GPU)
    gpu_wait: str = "auto"  # how a thread waits on the GPU: auto (CUDA's choice), spin, yield, blocking
    pack: bool = True  # pack prefill where the manifest's chunk packs (cu_seqlens or independent_rows; --no-pack: never)
    host_chunk: int | None = None  # the host tier in pieces of this many bytes (--host-chunk-bytes)
    admission: Rule = field(default_factory=Rule)  # the admission policy (--admission and its shares)
    queue_timeout: float | None = None  # seconds a request may wait for room; then a 503 queue_timeout


@dataclass(slots=True)
class Engine:
    model: str
    manifest_path: str
    runtime: Device  # the single-process Runtime, a pipeline head's Pipeline, or a test's double
    pool: Pool
    pad: Lease
    host: Host | None
    prefix: Prefix
    rows: int
    chunk: int
    max_seqs: int
    lined: bool
    unit: int
    reach: int
    backend: str
    host_bytes: int
    seq_slots: int
    faults: Faults
    pack: bool = False  # prefill calls take several sequences (split by cu_seqlens, or independent rows)
    context: int | None = None  # the chunk program's context bound, if it declares one
    admission: Rule = field(default_factory=Rule)  # the admission policy (pool/fair.py)
    queue_timeout: float | None = None  # seconds a request may wait for room (None: no bound)
    decode_steps: int = 1  # decode steps a launch (runtime/multistep.py; 1 where the decode program cannot)
    overlap: bool = False  # the next launch goes out before the last one's commit (serve/core/core.py; decode_steps > 1)

    @property
    def pad_pages(self) -> int:
        return len(self.pad.pages)

    @property
    def pages(self) -> int:
        """The pool's page capacity (pages x page is 'the whole pool')."""
        return self.pool.pages_max

    @property
    def max_request_tokens(self) -> int:
        return self.pool.max_seq_tokens

    @property
    def checkpoints(self) -> str:
        return "at request end" if self.lined else "every page"

    def facts(self) -> dict:
        return {
            "model": self.model, "page": self.unit, "pages": self.pages, "pad_pages": self.pad_pages,
            "max_request_tokens": self.max_request_tokens, "rows": self.rows, "chunk": self.chunk,
            "max_seqs": self.max_seqs, "seq_slots": self.seq_slots, "checkpoints": self.checkpoints,
            "host_bytes": self.host_bytes, "reach": self.reach, "backend": self.backend, "pack": self.pack,
            "page_bytes": self.pool.geometry.page_size, "slot_bytes": self.pool.geometry.slot_size,
            "prefill_emits": self.runtime.protocol.prefill_emits,
            "context": self.context,  # a packed prefill call's context bound (None: the manifest declares none)
            "decode_steps": self.decode_steps, "overlap": self.overlap,
        }


def _gpu_capacity(backend, geometry: Geometry, first_slots: int, reserve_gib: float) -> int:
    """Free device memory less 1 GiB less the reserve, in tokens. The runtime backs the page arena
    and the slot arena each at its full reservation (the whole budget), so a lined target gets half."""
    import cupy

    free, _ = cupy.cuda.runtime.memGetInfo()
    left = free - GIB - int(reserve_gib * GIB)
    if geometry.has_slots:
        left = left // 2 - first_slots * geometry.slot_size
    per_token = sum(b for _, b in geometry.paged) or 1
    return max(left // per_token, 0)


def size(geometry: Geometry, capacity: int, first_slots: int, host_bytes: int) -> tuple[Pool, Host | None]:
    """The pool for `capacity` tokens (rounded down to a page) and the host tier of `host_bytes`
    (rounded down to a page; None when under one): what a server with these flags holds, and what
    `kern replay` replays against."""
    unit = geometry.unit
    capacity = capacity // unit * unit
    chunk_bytes = chunk_size(geometry)
    chunks = chunks_for(geometry, capacity, first_slots, chunk_bytes)
    pool = Pool(geometry, chunk_bytes, chunks, first_slots, tokens=capacity)
    host = None
    if host_bytes > 0:
        grain = geometry.page_size or geometry.slot_size
        host_bytes = host_bytes // grain * grain
        if host_bytes > 0:
            host = Host(host_bytes, grain, geometry.page_size, geometry.slot_size)
    return pool, host


@dataclass(frozen=True, slots=True)
class Sizing:
    """What a server is sized to: rows per step, the prefill chunk, sequences at once, the pool's tokens."""

    rows: int
    chunk: int
    max_seqs: int
    capacity: int


def capacity_of(capacity: int | None, backend, geometry: Geometry, first_slots: int, reserve_gib: float,
                share: int = 1) -> int:
    """The pool's tokens: --capacity, else the CPU's default, else this device's free memory shared by
    `share` processes (a pipeline's stages on one GPU). One rule for a server, a pipeline's head and its stages."""
    if capacity is not None:
        return capacity
    if backend.name == "cpu":
        return CPU_CAPACITY
    return _gpu_capacity(backend, geometry, first_slots, reserve_gib) // max(share, 1)


def sizing(m, first, last, opts: Options, backend, geometry: Geometry, share: int = 1) -> Sizing:
    """Rows, chunk, sequences and capacity from the flags, bounded by the manifest: `first` is the
    protocol that declares the sequences' axis (the whole manifest's, or a pipeline's stage 0), `last` the
    one whose programs run the steps (the same, or the last stage's). `EngineError` for a flag past a bound."""
    unit = derive.page_unit(m)
    rows = opts.rows if opts.rows is not None else last.widest
    last.check_rows(rows, unit)
    chunk_max = last.chunk_max
    chunk = opts.chunk if opts.chunk is not None else chunk_max
    if not 1 <= chunk <= chunk_max:
        raise EngineError(f"--chunk {chunk} must be in 1..{chunk_max} (it may only be lowered)")
    max_seqs = opts.max_seqs if opts.max_seqs is not None else 256
    if max_seqs < 1:
        raise EngineError(f"--max-seqs {max_seqs} must be >= 1")
    max_seqs = min(max_seqs, m.vars[first.groups_var].max, chunk_max // rows, last.max_groups)
    first_slots = max_seqs + 2 if geometry.has_slots else 0
    capacity = capacity_of(opts.capacity, backend, geometry, first_slots, opts.reserve_gib, share)
    return Sizing(rows, chunk, max_seqs, capacity)


def build(what: str, opts: Options, phases: Phases | None = None) -> Engine:
    """Resolve the target, size the pool, load the runtime, lease the pad; each timed in `phases`
    (``manifest``, ``device``, ``pool``, ``runtime``) when given."""
    mark = phases.mark if phases is not None else (lambda _name: None)
    if opts.device is not None and opts.backend != "cpu":
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", str(opts.device).split(",")[0])
    target = resolve(what, opts.config, list(opts.weights) or None)
    m = load(target.manifest)
    from runtime.backends import make_backend
    from runtime.protocol import Protocol

    proto = Protocol(m)
    mark("manifest")
    backend = make_backend(opts.backend, opts.gpu_wait)
    mark("device")
    unit, reach, lined = derive.page_unit(m), derive.reach(m), derive.is_lined(m)
    geometry = Geometry(**derive.geometry(m))
    sized = sizing(m, proto, proto, opts, backend, geometry)
    rows, chunk, max_seqs, capacity = sized.rows, sized.chunk, sized.max_seqs, sized.capacity
    first_slots = max_seqs + 2 if geometry.has_slots else 0
    if capacity // unit < 2:
        raise EngineError(f"--capacity {capacity} tokens is under two pages of {unit} (the pad takes one)")
    pool, host = size(geometry, capacity, first_slots, int(opts.host_gib * GIB))
    host_bytes = host.units * host.grain if host is not None else 0
    mark("pool")
    rt = Runtime(m, list(target.weights), pages=max(pool.pages_max, 1), slots=pool.slots_max, backend=backend,
                 max_seqs=max_seqs, host_bytes=host_bytes, graphs=opts.graphs, host_chunk=opts.host_chunk)
    mark("runtime")
    pad = pool.lease_pad()
    if not isinstance(pad, Lease):
        raise EngineError(f"the pool cannot lease the pad ({pad!r}); raise --capacity")
    rt.set_pad(pad.pages[0], pad.slot)
    steps = decode_steps(rt, rows, opts.decode_steps)
    overlap = steps > 1 and (opts.overlap if opts.overlap is not None else backend.name == "gpu")
    return Engine(
        model=m.model, manifest_path=str(target.manifest), runtime=rt, pool=pool, pad=pad, host=host,
        prefix=Prefix(unit), rows=rows, chunk=chunk, max_seqs=max_seqs, lined=lined, unit=unit, reach=reach,
        backend=backend.name, host_bytes=host_bytes, seq_slots=pool.slots, faults=opts.faults,
        pack=opts.pack and proto.packs, context=proto.context_bound, admission=opts.admission,
        queue_timeout=opts.queue_timeout, decode_steps=steps, overlap=overlap,
    )


DEFAULT_STEPS = 8
"""`--decode-steps`' default on a GPU (bench/step_device.sh measures it against 1 and 16)."""


def decode_steps(rt, rows: int, asked: int | None) -> int:
    """Decode steps a launch: as asked (default: `DEFAULT_STEPS` on a GPU, where the host's fixed cost
    a launch is the step's bound; 1 on the CPU, where the kernels are), or 1 where the one-row decode
    program cannot run several (runtime/multistep.py's `eligible`; rows > 1)."""
    k = asked if asked is not None else (DEFAULT_STEPS if rt.backend.name == "gpu" else 1)
    if k < 1:
        raise EngineError(f"--decode-steps {k} must be >= 1")
    if k == 1 or rows != 1:
        return 1
    from runtime.multistep import eligible

    return 1 if eligible(rt, rt.protocol.forward(1, 1).program) is not None else k
