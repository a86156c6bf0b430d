"""Continuous batching over the block pool: requests wait, are admitted into a running batch when their
blocks fit, and every step computes one chunk of each running prefill and one token of each decode
together, then samples every sequence whose known tokens are all computed.

A lined family also keeps one line per sequence; a finished sequence leaves a checkpoint (its line,
its partial last block's entries) that a later prompt extending it resumes from.
"""

from __future__ import annotations

import threading
import traceback
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from .blocks import ROOT, Pool, chain_key
from .bugs import bug
from .toy import EOS


class Refused(ValueError):
    """A request the engine can never serve (too long for its cache)."""


@dataclass
class Seq:
    tokens: list[int]
    prompt_len: int
    max_tokens: int
    blocks: list[int] = field(default_factory=list)
    keys: list[bytes] = field(default_factory=list)  # chain keys of its full blocks so far
    computed: int = 0
    cached: int = 0
    line: tuple[int, int] = (0, 0)
    boundary_line: tuple[int, int] = (0, 0)
    finish: str | None = None
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def out(self) -> list[int]:
        return self.tokens[self.prompt_len:]


@dataclass
class Checkpoint:
    line: tuple[int, int]
    tail: tuple[int, ...]
    rows: np.ndarray


class Engine:
    def __init__(self, family, blocks: int, block_size: int, chunk: int = 16, budget: int = 256,
                 max_seqs: int = 64, checkpoints: int = 256):
        self.family = family
        self.pool = Pool(blocks, block_size, family.width)
        self.B = block_size
        self.chunk, self.budget, self.max_seqs = chunk, budget, max_seqs
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.ckpts: OrderedDict[tuple[bytes, tuple[int, ...]], Checkpoint] = OrderedDict()
        self.max_ckpts = checkpoints
        self.cv = threading.Condition()
        self.steps = 0

    # -- the front door (HTTP threads) ---------------------------------------------------------

    def submit(self, prompt: list[int], max_tokens: int) -> Seq:
        need = -(-(len(prompt) + max_tokens) // self.B)
        if need > self.pool.blocks:
            raise Refused(f"prompt ({len(prompt)}) + max_tokens ({max_tokens}) needs {need} blocks of "
                          f"{self.B}; the cache has {self.pool.blocks} (--cache-tokens)")
        seq = Seq(list(prompt), len(prompt), max_tokens)
        with self.cv:
            self.waiting.append(seq)
            self.cv.notify()
        return seq

    def run(self) -> None:
        """The step loop (one thread owns the pool)."""
        while True:
            with self.cv:
                while not self.waiting and not self.running:
                    self.cv.wait()
                self.admit()
            try:
                self.step()
            except Exception:  # a broken step fails its requests, it never hangs them
                msg = traceback.format_exc()
                print(msg, flush=True)
                for s in self.running:
                    s.error = msg.strip().splitlines()[-1]
                    s.done.set()
                self.running = []

    # -- admission: prefix lookup and allocation -------------------------------------------------

    def keys_of(self, tokens: list[int], n_blocks: int) -> list[bytes]:
        """The chain keys of the first n_blocks full blocks of `tokens`."""
        keys: list[bytes] = []
        for i in range(n_blocks):
            keys.append(chain_key(keys[-1] if keys else None, tokens[i * self.B:(i + 1) * self.B]))
        return keys

    def add_key(self, s: Seq) -> bytes:
        """The key of the sequence's next full block, appended to its keys."""
        i = len(s.keys)
        s.keys.append(chain_key(s.keys[-1] if s.keys else None, s.tokens[i * self.B:(i + 1) * self.B]))
        return s.keys[-1]

    def admit(self) -> None:
        while self.waiting and len(self.running) < self.max_seqs:
            seq = self.waiting[0]
            n = seq.prompt_len
            limit = n if bug("last-token") else n - 1  # BUG(last-token): the last token may be a hit
            keys = self.keys_of(seq.tokens, limit // self.B)
            hits = self.pool.cached(keys)
            need = -(-(n + seq.max_tokens) // self.B) - len(hits)
            if self.pool.free_after(hits) < need:
                if not self.running:  # nothing will free a block: say so rather than hang
                    self.waiting.popleft()
                    seq.error = f"no room: {need} blocks needed, {self.pool.free_after(hits)} free"
                    seq.done.set()
                    continue
                return  # first come, first served: it waits for blocks to be freed
            self.waiting.popleft()
            self.pool.take(hits)
            seq.blocks = hits + self.pool.allocate(need)
            seq.keys = keys[:len(hits)]
            seq.computed = seq.cached = len(hits) * self.B
            if self.family.lined:
                self.resume_line(seq, self.checkpoint_for(seq, keys[:len(hits)], limit))
            if bug("same-step"):  # BUG(same-step): prompt blocks enter the table before they are written
                for i in range(len(hits), n // self.B):
                    self.pool.register(seq.blocks[i], self.add_key(seq))
            self.running.append(seq)

    def checkpoint_for(self, seq: Seq, keys: list[bytes], limit: int) -> tuple[int, Checkpoint] | None:
        """The longest checkpoint whose blocks are among the hit ones and whose tokens are a prefix of
        the prompt no longer than `limit`, with the position its line continues at."""
        for nb in range(len(keys), -1, -1):
            parent = keys[nb - 1] if nb else ROOT
            best = None
            for (p, tail), ck in self.ckpts.items():
                end = nb * self.B + len(tail)
                if p == parent and end <= limit and tuple(seq.tokens[nb * self.B:end]) == tail:
                    if best is None or end > best[0]:
                        best = (end, ck, (p, tail))
            if best is not None:
                self.ckpts.move_to_end(best[2])
                return best[0], best[1]
        return None

    def resume_line(self, seq: Seq, found: tuple[int, Checkpoint] | None) -> None:
        """A lined sequence's line: from its checkpoint (those tokens count as cached), brought up to the
        hit blocks' end by folding; without one, folded from the start over the hit tokens, and then
        only the entries were reused: nothing counts as cached (a repeat hits 0, docs/checks.md)."""
        hit_end = seq.computed
        m, line = (found[0], found[1].line) if found else (0, (0, 0))
        if found and m >= hit_end:
            self.pool.write(seq.blocks, hit_end, found[1].rows[hit_end - (m - len(found[1].tail)):])
            seq.computed = m
        elif hit_end > m:
            line = self.family.fold(line, np.asarray(seq.tokens[m:hit_end]), np.arange(m, hit_end))
        seq.line, seq.cached = line, m

    # -- one step: prefill chunks and decodes together -------------------------------------------

    def schedule(self) -> list[tuple[Seq, int, int]]:
        work, budget = [], self.budget
        for s in sorted(self.running, key=lambda s: s.computed < s.prompt_len):  # decodes first
            count = min(len(s.tokens) - s.computed, self.chunk, budget)
            if count > 0:
                work.append((s, s.computed, count))
                budget -= count
        return work

    def step(self) -> None:
        self.steps += 1
        work = self.schedule()
        if work:
            toks = np.concatenate([np.asarray(s.tokens[a:a + c], dtype=np.int64) for s, a, c in work])
            pos = np.concatenate([np.arange(a, a + c) for s, a, c in work])
            rows = None if self.family.reads_context else self.family.entries(toks, pos)
            i = 0
            for s, a, c in work:
                mine = rows[i:i + c] if rows is not None else self.context_rows(s, toks[i:i + c], pos[i:i + c])
                self.pool.write(s.blocks, a, mine)
                if self.family.lined:
                    self.fold(s, toks[i:i + c], pos[i:i + c])
                s.computed = a + c
                i += c
        for s in list(self.running):
            self.cache_full_blocks(s)
            if s.computed == len(s.tokens):
                self.sample(s)

    def context_rows(self, s: Seq, toks: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """A chunk's entries when each reads every earlier one: the cached part is read from the pool."""
        k_pos = None
        if bug("k-only") and s.cached:  # BUG(k-only): after a hit, K's positions count from the hit
            k_pos = pos - s.cached
        return self.family.compute(self.pool.rows(s.blocks, int(pos[0])), toks, pos, k_pos)

    def fold(self, s: Seq, toks: np.ndarray, pos: np.ndarray) -> None:
        if bug("line-boundary"):  # BUG(line-boundary): the line as of each block boundary is what a
            cut = (int(pos[-1]) + 1) // self.B * self.B - int(pos[0])  # checkpoint keeps
            if cut > 0:
                s.boundary_line = self.family.fold(s.line, toks[:cut], pos[:cut])
        s.line = self.family.fold(s.line, toks, pos)

    def cache_full_blocks(self, s: Seq) -> None:
        full = (len(s.tokens) if bug("partial-full") else s.computed) // self.B  # BUG(partial-full)
        for i in range(len(s.keys), full):
            self.pool.register(s.blocks[i], self.add_key(s))

    def sample(self, s: Seq) -> None:
        t = self.family.predict(self.pool.rows(s.blocks, s.computed), s.tokens[s.computed - 1],
                                s.line[0] if self.family.lined else 0)
        if t == EOS and not (bug("eos-after-hit") and s.cached):  # BUG(eos-after-hit)
            s.tokens.append(EOS)
            self.end(s, "stop")
            return
        s.tokens.append(t)
        if len(s.out) >= s.max_tokens:
            self.end(s, "length")

    def end(self, s: Seq, reason: str) -> None:
        s.finish = reason
        self.running.remove(s)
        self.cache_full_blocks(s)
        if self.family.lined:
            self.checkpoint(s)
        self.pool.release(s.blocks)
        s.done.set()

    def checkpoint(self, s: Seq) -> None:
        """Keep the line where the sequence's computed tokens end, with its partial block's entries."""
        nb = s.computed // self.B
        if len(s.keys) < nb:
            return
        tail = tuple(s.tokens[nb * self.B:s.computed])
        line = s.boundary_line if bug("line-boundary") else s.line
        rows = self.pool.rows(s.blocks, s.computed)[nb * self.B:].copy()
        where = (s.keys[nb - 1] if nb else ROOT, tail)
        self.ckpts[where] = Checkpoint(line, tail, rows)
        self.ckpts.move_to_end(where)
        while len(self.ckpts) > self.max_ckpts:
            self.ckpts.popitem(last=False)
