"""The runtime: executes a verified manifest's programs on a backend (SPEC §5).

Load: resolve kernel modules, allocate buffers at the var maxima, back each state arena at its
full reservation (`pages` pages, `slots` line slots), bind weights; then run the `derive` programs
(each `source` staged only from the first derive program that reads it to the last), then the
`once` programs. `load_report` says what load held at its peak. Then `step` runs one program over
a list of cells (a packed chunk: several sequences' rows in one call), and
`copy`/`park`/`wake`/`land` execute the pool's plans as data.
"""

from __future__ import annotations

import importlib
import time
from typing import Any, Callable

import numpy as np

from manifests import derive, expr
from manifests.schema import Manifest
from runtime.backend import Backend, KernelError, graphed, map_kernel_exceptions
from runtime.backends import make_backend
from runtime.load import run_derives
from runtime.protocol import Protocol
from runtime.runs import host_runs, page_runs
from runtime.step import _IDS, Cell, LineTable, PageTable, bucket, stage
from runtime.tables import NoPages, Resident
from runtime.timing import StepTiming
from runtime.weights import bind, bound_tensors, read_tensors


class Runtime:
    # the serving core's Device (serve/core/device.py) beside step, logits and the plans: one process loses no stage
    epoch = 0
    broken = None
    while_waiting = None  # never called: a step here waits on nothing else

    def __init__(
        self,
        manifest: Manifest,
        weights: list | dict,
        pages: int,
        slots: int = 0,
        backend: str | Backend = "cpu",
        max_seqs: int | None = None,
        host_bytes: int = 0,
        graphs: bool = True,
        host_chunk: int | None = None,
    ):
        self.manifest = m = manifest
        self.backend = make_backend(backend) if isinstance(backend, str) else backend
        self.protocol = Protocol(m)
        self.unit = derive.page_unit(m)
        self.reach = derive.reach(m)
        self.lined = derive.is_lined(m)
        self.pages = pages
        self.slots = slots if self.lined else 0
        self.max_seqs = min(max_seqs or self.protocol.max_groups, self.protocol.max_groups)
        self.rows_var = self.protocol.rows_var
        self.groups_var = self.protocol.groups_var
        self.groups_max = m.vars[self.groups_var].max
        self._load(weights)
        self._allocate_states(pages, host_bytes, host_chunk)
        self._index_tables()
        self._staged: dict[str, tuple] = {}  # program -> what its steps stage (`_staging`)
        self._forwards: dict[str, Any] = {}  # program -> its Forward (looked up once)
        self.pad: Cell | None = None
        # graphs: (program, bucket) -> a captured graph, or None where capture failed (run plainly)
        self.graphs = graphs
        self._graphs: dict[tuple[str, int], Any] = {}
        self._warm: set[tuple[str, int]] = set()
        self.timing = StepTiming()
        self._multistep = None  # several decode steps a launch, made at its first use (`steps`)
        self.last_env: dict[str, int] = {}  # the vars of the last step (what a cut stage hands on is sized by them)

    # -- load ------------------------------------------------------------------------------------

    def _load(self, weights: list | dict) -> None:
        """The kernel modules and buffers (at the var maxima), the weights bound and uploaded, then the
        `derive` programs and the `once` programs run."""
        m, be = self.manifest, self.backend
        self.modules = {n: importlib.import_module(mod.impl) for n, mod in m.modules.items()}
        self._kernels: dict[tuple[str, str], Any] = {}
        env = m.var_max()
        self.buffers: dict[str, Any] = {}
        for b in m.buffers.values():
            if b.kind != "source":  # a source is staged only while derive programs read it
                self.buffers[b.name] = be.view(be.zeros(b.nbytes(env)), b.dtype)
        tensors = weights if isinstance(weights, dict) else read_tensors(weights, m.weights, bound_tensors(m))
        bound = bind(m, tensors)
        for name, data in bound.items():
            if m.buffers[name].kind == "weight":
                be.upload(be.view(self._raw(name), "u8"), data)
        self.load_report = run_derives(self, bound)
        for prog in m.programs.values():
            if prog.once:
                for call in prog.calls:
                    self.run_call(call, env)

    def _allocate_states(self, pages: int, host_bytes: int, host_chunk: int | None) -> None:
        """The state arenas: paged arenas hold `pages` pages, lined arenas `slots` slots; and the host tier."""
        m, be = self.manifest, self.backend
        self.paged = [s for s in sorted(m.states.values(), key=lambda s: s.name) if s.paged]
        self.lined_states = [s for s in sorted(m.states.values(), key=lambda s: s.name) if s.lined]
        self.page_bytes = {s.name: self.unit * s.bytes_per_token for s in self.paged}
        self.slot_bytes = {s.name: s.bytes_per_seq for s in self.lined_states}
        self.arenas: dict[str, Any] = {}
        for s in m.states.values():
            n = self.page_bytes[s.name] * pages if s.paged else s.bytes_per_seq * self.slots if s.lined else s.bytes
            self.arenas[s.name] = be.zeros(max(n, 8))
        self.host_page_bytes = sum(self.page_bytes.values())
        self.host_slot_bytes = sum(self.slot_bytes.values())
        self.host = be.host_zeros(host_bytes, host_chunk) if host_bytes else None

    def _index_tables(self) -> None:
        """The fills, the page and line tables, and the tables kept between steps (`Resident`)."""
        m = self.manifest
        self.fills: dict[str, list[str]] = {}
        for b in m.buffers.values():
            if b.kind == "input" and b.fill:
                self.fills.setdefault(b.fill, []).append(b.name)
        self.page_tables = [
            PageTable(b.name, b.shape[-1], self.unit // b.domain.stride) for b in derive.page_tables(m)
        ]
        self.line_tables = [
            LineTable(b.name, b.shape[0], m.states[b.domain.index_into].bytes_per_seq // b.domain.stride)
            for b in derive.line_tables(m)
        ]
        # the page tables and slot map kept between steps (runtime/tables.py), unless a kernel writes a table
        written = {a.value for prog in m.programs.values() for call in prog.calls
                   for a, prm in zip(call.args, m.ops[call.op].params) if a.kind == "buf" and prm.writes}
        self.resident: Resident | None = None
        if (self.page_tables or self.fills.get("slot")) and not written & {t.name for t in self.page_tables}:
            self.resident = Resident(self.unit, self.page_tables, self.groups_max,
                                     {t.name: np.dtype(self.buffers[t.name].dtype) for t in self.page_tables})
        self._widths = {t.name: t.width for t in self.page_tables}

    # -- memory ----------------------------------------------------------------------------------

    def _raw(self, name: str):
        return self.buffers[name]

    def set_pad(self, page: int, slot: int | None) -> None:
        """The pad lease's page and slot, which padding cells write and read."""
        self.pad = Cell([page], slot, [], 0)
        if slot is not None:
            self.zero_slot(slot)

    def zero_slot(self, slot: int) -> None:
        for s in self.lined_states:
            self.backend.zero(self.arenas[s.name], slot * s.bytes_per_seq, s.bytes_per_seq)

    def zero_page(self, page: int) -> None:
        for s in self.paged:
            pb = self.page_bytes[s.name]
            self.backend.zero(self.arenas[s.name], page * pb, pb)

    def land(self, remap) -> None:
        """Execute a pool Remap: the arenas are backed whole, so mapping is bookkeeping; zero what is made."""
        for kind, ident in getattr(remap, "made", ()):
            if kind == "slot" or getattr(kind, "value", None) == "slot":
                self.zero_slot(ident)
            else:
                self.zero_page(ident)

    def copy(self, copies) -> None:
        """Device-to-device page and slot copies (a pool Copies plan)."""
        be = self.backend
        for s in self.paged:
            pb, arena = self.page_bytes[s.name], self.arenas[s.name]
            for src, dst, n in page_runs(copies.pages):
                be.copy(arena, dst * pb, arena, src * pb, n * pb)
        if copies.slot is not None:
            src, dst = copies.slot
            for s in self.lined_states:
                sb, arena = s.bytes_per_seq, self.arenas[s.name]
                be.copy(arena, dst * sb, arena, src * sb, sb)

    def park(self, copies) -> None:
        """Device to host: pages (id -> host offset), slot (id -> host offset)."""
        self._host_copy(copies, to_host=True)

    def wake(self, copies) -> None:
        """Host to device: pages (host offset -> id), slot (host offset -> id)."""
        self._host_copy(copies, to_host=False)

    def _host_copy(self, copies, to_host: bool) -> None:
        be, host = self.backend, self.host
        if host is None:
            raise KernelError("no host tier was allocated (host_bytes=0)")
        hp = self.host_page_bytes
        pairs = [(a, b) if to_host else (b, a) for a, b in copies.pages]  # (device page, host offset)
        off = 0
        for s in self.paged:
            pb, arena = self.page_bytes[s.name], self.arenas[s.name]
            if len(self.paged) == 1:
                for dev, h, n in host_runs(pairs, hp):
                    if to_host:
                        be.copy(host, h, arena, dev * pb, n * pb)
                    else:
                        be.copy(arena, dev * pb, host, h, n * pb)
            else:
                for dev, h in pairs:
                    if to_host:
                        be.copy(host, h + off, arena, dev * pb, pb)
                    else:
                        be.copy(arena, dev * pb, host, h + off, pb)
            off += pb
        if copies.slot is not None:
            dev, h = copies.slot if to_host else (copies.slot[1], copies.slot[0])
            off = 0
            for s in self.lined_states:
                sb, arena = s.bytes_per_seq, self.arenas[s.name]
                if to_host:
                    be.copy(host, h + off, arena, dev * sb, sb)
                else:
                    be.copy(arena, dev * sb, host, h + off, sb)
                off += sb

    def read_state(self, pages: list[int], slot: int | None, tokens: int) -> bytes:
        """The bytes of a sequence's first `tokens` token slots and its line (for A/B comparisons):
        every paged state by name, then every lined state by name."""
        out = [self.read_state_of(s.name, pages, slot, tokens) for s in self.paged]
        if slot is not None:
            out += [self.read_state_of(s.name, pages, slot, tokens) for s in self.lined_states]
        return b"".join(out)

    def read_state_of(self, name: str, pages: list[int], slot: int | None, tokens: int) -> bytes:
        """One state's bytes for a sequence: its first `tokens` token slots, or its line."""
        self.backend.synchronize()
        s = self.manifest.states[name]
        if s.paged:
            tb = s.bytes_per_token
            arena = self.backend.download(self.arenas[name], self.pages * self.page_bytes[name])
            out = []
            for q in range(tokens):
                slot_id = pages[q // self.unit] * self.unit + q % self.unit
                out.append(arena[slot_id * tb : (slot_id + 1) * tb].tobytes())
            return b"".join(out)
        arena = self.backend.download(self.arenas[name], self.slots * s.bytes_per_seq)
        return arena[slot * s.bytes_per_seq : (slot + 1) * s.bytes_per_seq].tobytes()

    def logits(self, groups: int) -> np.ndarray | None:
        """The bf16 bits of the last step's `logits` output, one row per group (its first `groups`),
        or None when the manifest has no `logits` buffer (the integer toy's)."""
        b = self.manifest.buffers.get("logits")
        if b is None:
            return None
        vocab = int(b.shape[-1])
        self.backend.synchronize()
        return self.backend.download(self.buffers["logits"], groups * vocab).reshape(groups, vocab)

    # -- running -----------------------------------------------------------------------------------

    def hold_partial(self) -> bool:
        """A partial prefill call never waits here (a pipeline holds one while full of items)."""
        return False

    def trouble(self) -> dict | None:
        """Nothing for /health to report: one process has no stage to lose."""
        return None

    def step(self, program: str, cells: list[Cell], arrive: dict | None = None,
             leave: dict | None = None) -> list[list[int]]:
        """Run `program` over `cells`; returns each cell's emitted tokens (also left in its `tokens`).

        A batched program's cells each feed its `rows` rows, padded to a bucket. A chunk program
        (prefill) takes up to its `groups` cells unpadded, each with its own rows: a packed call
        when there are several, split by `cu_seqlens`, bounded by the rows var and its context var.

        A pipeline stage passes `arrive` (buffers crossing in, uploaded before the calls) and `leave`
        (a dict keyed by the names crossing out; each gets its host bytes after the calls, at this
        step's size)."""
        m = self.manifest
        prog = m.programs[program]
        fwd = self._forward(program)
        if not cells:
            return []
        per = len(cells[0].ids)
        padded, b, env = self._padded(program, fwd, cells, per)
        self.last_env = env
        pad_slot = self.pad.slot if self.pad is not None and self.pad.slot is not None else 0
        t0 = time.perf_counter()
        host, res, tables = self._stage(program, padded, per, pad_slot, fwd.rows is not None)
        t1 = time.perf_counter()
        be = self.backend
        self._upload(host, res, tables, arrive)
        t2 = time.perf_counter()
        m0 = be.mark()
        self._run_calls(program, b, lambda: [self.run_call(call, env) for call in prog.calls], prog.graph)
        m1 = be.mark()
        t3 = time.perf_counter()
        for name in leave or ():
            leave[name] = be.download(self.buffers[name], m.buffers[name].nbytes(env) // self.buffers[name].itemsize)
        self._read_tokens(fwd, cells, b)
        t4 = time.perf_counter()
        decode = fwd.rows is not None
        if fwd.emits or leave:  # the step waited for its kernels: theirs and every earlier step's time is known
            kernel = be.elapsed_ms(m0, m1) / 1000.0
            self.timing.settle(be)
        else:  # nothing read back (a non-emitting prefill call): not waited for, its kernels timed later
            kernel = 0.0
            self.timing.unsettled.append((m0, m1, decode))
        self.timing.add(decode, t1 - t0, t2 - t1, t3 - t2, t4 - t3, kernel)
        return [c.tokens for c in cells]

    def _forward(self, program: str):
        fwd = self._forwards.get(program)
        if fwd is None:
            fwd = self._forwards[program] = next(f for f in self.protocol.forwards if f.program == program)
        return fwd

    def steps(self, program: str, cells: list[Cell], k: int, limits: list[int]) -> list[list[int]]:
        """`k` decode steps of `program` in one launch (runtime/multistep.py); cell g emits at most
        `limits[g]` tokens. Each cell's emitted tokens."""
        return self.collect(self.launch_steps(program, cells, k, limits))

    def launch_steps(self, program: str, cells: list[Cell], k: int, limits: list[int], follow: list[int] | None = None):
        """`steps` issued without waiting (`collect` gives the tokens); with `follow`, each cell's first
        token is the previous launch's last in that row, read on the device (`Multistep.launch`)."""
        if self._multistep is None or self._multistep.kmax < k:
            from runtime.multistep import Multistep

            if self._multistep is not None and self._multistep._open:
                raise ValueError(f"{k} steps a launch is over the {self._multistep.kmax} of launches not collected")
            self._multistep = Multistep(self, max(k, 8))
        return self._multistep.launch(program, cells, k, limits, follow)

    def collect(self, launched) -> list[list[int]]:
        """Wait for a `launch_steps`' steps: each cell's emitted tokens."""
        return self._multistep.collect(launched)

    def _padded(self, program: str, fwd, cells: list[Cell], per: int) -> tuple[list[Cell], int, dict[str, int]]:
        """(the cells padded to the call's size, that size, the call's vars): a chunk program's cells
        as they are, a batched program's padded with the pad cell to a bucket."""
        n = len(cells)
        if fwd.rows is None:
            if n > fwd.groups:
                raise ValueError(f"{n} cells is over program {program}'s {fwd.groups} groups")
            env = self._chunk_env(program, fwd, cells)
            padded, b = list(cells), n
        else:
            if len(set(map(len, map(_IDS, cells)))) != 1:
                raise ValueError("every cell of a step feeds the same number of rows")
            if per != fwd.rows:
                raise ValueError(f"program {program} takes {fwd.rows} row(s) per sequence, got {per}")
            cap = min(self.max_seqs, fwd.groups)
            if n > cap:
                raise ValueError(f"{n} cells is over program {program}'s {cap} groups")
            b = bucket(n, cap)
            if self.pad is None and b > n:
                raise ValueError("padding needs a pad page (set_pad)")
            padded = list(cells)
            if b > n:
                pad = Cell(self.pad.pages, self.pad.slot, [0] * per, 0)
                padded += [pad] * (b - n)
            env = {self.rows_var: b * per, self.groups_var: b}
        return padded, b, env

    def _stage(self, program: str, padded: list[Cell], per: int, pad_slot: int, uniform: bool):
        """(host arrays to upload, the resident tables used or None, the page tables read): the step's
        fills and tables staged on the host. `uniform`: a batched step (every cell feeds `per` rows)."""
        fills, tables, lines = self._staging(program)
        res = self.resident if tables else None
        try:
            host = stage(padded, per, self.unit, fills, tables, lines, self.groups_max, pad_slot, res, uniform)
        except NoPages:  # a cell with no pages (no page-table row): staged whole, the rows rebuilt next time
            res.invalidate()
            res = None
            host = stage(padded, per, self.unit, fills, tables, lines, self.groups_max, pad_slot, uniform=uniform)
        return host, res, tables

    def _upload(self, host: dict, res, tables: list, arrive: dict | None) -> None:
        """Upload what was staged (a resident table: only its rows rewritten since), then what arrives
        from the stage before (a pipeline stage's `arrive`)."""
        be = self.backend
        widths = self._widths if res is not None else {}
        for name, arr in host.items():
            buf = self.buffers[name]
            w = widths.get(name)
            if w is None:
                be.upload(buf, arr.astype(buf.dtype, copy=False))
            else:  # a resident table: only the rows rewritten since the buffer last got them
                runs = res.dirty
                if len(runs) > 2:  # scattered rows: one copy from the first to the last (the rows
                    runs = [(runs[0][0], runs[-1][1])]  # between hold what the buffer holds)
                for lo, hi in runs:
                    be.upload(buf[lo * w : hi * w], arr[lo * w : hi * w])
        if self.resident is not None and res is None and tables:  # a table written whole: the rows kept are stale
            self.resident.invalidate()
        for name, arr in (arrive or {}).items():
            buf = self.buffers[name]
            be.upload(buf, np.asarray(arr).reshape(-1).view(buf.dtype))
            if name in self._widths and self.resident is not None:
                self.resident.invalidate()

    def _read_tokens(self, fwd, cells: list[Cell], b: int) -> None:
        """Each cell's emitted tokens, read back into its `tokens` (none for a program that emits none)."""
        be = self.backend
        if fwd.emits:
            k = fwd.width
            toks = be.download(self.buffers[fwd.emits], b * k)
            got = toks.tolist()
            if fwd.count:
                counts = be.download(self.buffers[fwd.count], b).tolist()
                for g, c in enumerate(cells):
                    c.tokens = got[g * k : g * k + counts[g]]
            elif k == 1:
                for c, t in zip(cells, got):
                    c.tokens = [t]
            else:
                for g, c in enumerate(cells):
                    c.tokens = got[g * k : g * k + 1]
        else:
            for c in cells:
                c.tokens = []

    def _staging(self, program: str) -> tuple[dict[str, list[str]], list, list]:
        """The fills, page tables and line tables `program`'s calls read: a step stages and uploads
        only those. A prefill call that reads the slot map but no page table computes its slots from
        its cell and leaves the page-table rows the decode batch keeps (`Resident`) alone: staged
        through them, it took row 0 from the batch's first sequence, and the next decode step rebuilt
        and uploaded it again (and uploaded a page table and lengths the call never read)."""
        got = self._staged.get(program)
        if got is None:
            reads = {a.value for call in self.manifest.programs[program].calls for a in call.args if a.kind == "buf"}
            fills = {kind: [n for n in names if n in reads] for kind, names in self.fills.items()}
            got = self._staged[program] = ({k: v for k, v in fills.items() if v},
                                           [t for t in self.page_tables if t.name in reads],
                                           [t for t in self.line_tables if t.name in reads])
        return got

    def _run_calls(self, program: str, b: int, run: Callable[[], Any], graph: bool) -> None:
        """Run a step's calls: plainly, or for a `graph: true` program as a captured graph per bucket
        (`graphed`). The graph holds the buffers' and arenas' addresses, which never move after load,
        and reads its inputs from the buffers the step just uploaded."""
        graphed(self.backend, self._graphs, self._warm, (program, b), run, graph and self.graphs)

    def _chunk_env(self, program: str, fwd, cells: list[Cell]) -> dict[str, int]:
        """The vars of one chunk call over `cells`: rows, sequences and (if declared) the context."""
        m = self.manifest
        lens = [len(c.ids) for c in cells]
        if min(lens) < 1:
            raise ValueError(f"every cell of a {program} call feeds at least one row")
        rows = sum(lens)
        if rows > m.vars[self.rows_var].max:
            raise ValueError(f"{rows} rows is over vars.{self.rows_var}.max {m.vars[self.rows_var].max}")
        env = {self.rows_var: rows, self.groups_var: len(cells)}
        if fwd.context:
            ctx = sum(c.pos + len(c.ids) for c in cells)
            bound = m.vars[fwd.context].max
            if ctx > bound:
                raise ValueError(f"{program}: the call's context {ctx} (sum of pos + rows) is over vars.{fwd.context}.max {bound}")
            env[fwd.context] = ctx
        return env

    def run_call(self, call, env: dict[str, int]) -> None:
        """One call of a program: its arguments bound (buffers, states, vars, expressions), its kernels launched."""
        m = self.manifest
        op = m.ops[call.op]
        vals: list[Any] = []
        for a in call.args:
            if a.kind == "buf":
                buf = self.buffers[a.value]
                vals.append(buf[a.offset // buf.itemsize :] if a.offset else buf)
            elif a.kind == "state":
                arena = self.arenas[a.value]
                vals.append(self.backend.view(arena[a.offset :] if a.offset else arena, "u64"))
            elif a.kind == "var":
                vals.append(env[a.value])
            elif a.kind == "expr":
                vals.append(expr.evaluate(a.value, env))
            else:
                vals.append(a.value)
        for launch in op.launches:
            key = (launch.module, launch.entry)
            fn = self._kernels.get(key)
            if fn is None:
                fn = self._kernels[key] = self.backend.kernel(self.modules[launch.module], launch.entry)
            args = [vals[v] if kind == "param" else v for kind, v in launch.args]
            grid = 1
            for g in launch.grid:
                grid *= expr.evaluate(g, env)
            with map_kernel_exceptions(call.op, launch.entry):
                self.backend.launch(fn, grid, launch.block[0], args)
