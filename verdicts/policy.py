"""The policy oracle: a brute-force reference of the cache policy (SPEC §6-§7), independent of `pool/`.

It predicts, for requests served one at a time, each request's `cached_tokens`, cache tier and
snapshot verdict, and the counters and gauges after them. It keeps plain data and recounts by scan:

- **entries**: key (a token tuple) -> tier, recency tick, stateful flag, the device pages and slot it
  holds (page ids from a counter, never reused) and its host copy (host page ids and slot);
- **device**: a page is used while a lease, the pad or a resident entry names it; a slot likewise;
- **host**: one byte per grain; pages first fit from the low end, slots from the top of the highest
  free run that fits; `twin[device page] = host offset`, live while a parked entry names it.

The rules it follows, written out (the index's own docs say the same; ties are fixed here):
- `lookup(prompt)` works on `q = prompt[:-1]` and advances the clock by `len(q) + 2` to `base`.
  Entries whose key is a prefix of `q` are offered at their own length and restamped `base - i`
  in root-to-leaf order. Stateless entries off the path are grouped by the tokens they share with
  `q` (D); a group with `D >= page` offers `D` rounded down to whole pages, resident when any of its
  entries is resident, from its lexicographically smallest (resident, if resident) key; of the
  groups, the largest rounded length wins, resident over parked, the deeper group at a tie; only the
  winner is restamped (`base - touched`). The best offer by (length, resident) wins, the later offer
  (off-path after on-path, deeper after shallower) at a tie.
- `insert(key)` advances the clock by 1 and stamps; an existing parked entry becomes resident (its
  host copy stays); a stateless whole-page key removes the stateless, resident, host-less entry one
  page shorter.
- `evict()` takes the resident entry with the smallest tick: it keeps its host copy if it has one,
  else parks (copying only pages without a live twin), dropping the parked entry with the smallest
  tick while the host is full; with no host tier, or nothing parked left to drop, it is dropped.
- Room (one request): look up; ask for ceil(room/page) pages (a resident hit shares its whole pages,
  a parked one is woken into fresh pages, twinned); on Busy evict once, look up again, ask again.
- Steps (from the answer's path): a paged target checkpoints the whole pages each step completed
  unless the step ends the request; a lined one retires at the end, kept iff nothing past the answer
  (but a lone stop token on a stop) was folded.

What it does not model raises `Unmodelled`: a slot shortage (the pool would remap pages into slots)
and a request that would wait for room.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kern.errors import KernError
from kern.tokens import EOS

__all__ = ["POLICY_COUNTERS", "Policy", "Prediction", "Unmodelled"]

_FREE_RUN = re.compile(b"\x00+")  # a run of free host grains
POLICY_COUNTERS = ("resident_hits", "resident_hit_tokens", "host_hits", "host_hit_tokens", "prefix_hit_tokens",
            "parks", "wakes", "wake_tokens", "evictions", "host_evictions", "not_kept")


class Unmodelled(KernError):
    """The policy would take a path this oracle does not model (a slot remap, a wait for room)."""


@dataclass
class _Entry:
    key: tuple[int, ...]
    stateful: bool
    tick: int
    pages: tuple[int, ...] | None  # device pages (None: parked only)
    slot: bool  # holds a device slot
    host: tuple[int, ...] | None = None  # host pages (ids; `Policy.host_at` gives their offsets)
    host_slot: int | None = None

    @property
    def resident(self) -> bool:
        return self.pages is not None


@dataclass
class Prediction:
    """What one request's response must say."""

    cached: int
    tier: str | None
    snapshot: str  # "kept" | "not kept" | "none"
    woken: bool


@dataclass
class _Lease:
    pages: list[int]
    slot: bool
    mark: int = 0  # whole pages already checkpointed


@dataclass
class Policy:
    """Sized from the server's facts: `page` tokens a page, `pages` made (the pad's included),
    `slots` made (null and pad included, lined targets), `host_bytes` of host tier in grains of
    `page_bytes` (or `slot_bytes` with no paged state), `rows`, `chunk`, `lined`, `emits`."""

    page: int
    pages: int
    lined: bool
    emits: bool
    rows: int = 1
    chunk: int = 2048
    slots: int = 0
    host_bytes: int = 0
    page_bytes: int = 0
    slot_bytes: int = 0
    entries: dict[tuple[int, ...], _Entry] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(POLICY_COUNTERS, 0))
    woken: int = 0
    clock: int = 0

    def __post_init__(self) -> None:
        self._next_page = 0
        self.leases: list[_Lease] = []
        self.twin: dict[int, int] = {}  # device page -> host page id (live while an entry names it)
        self.host_at: dict[int, int] = {}  # host page id -> offset in grains
        self._next_host = 0
        grain = self.page_bytes or self.slot_bytes
        self.grain = grain
        self.host = bytearray(self.host_bytes // grain) if grain and self.host_bytes else None
        self.page_units = max(1, -(-self.page_bytes // grain)) if grain else 1
        self.slot_units = max(1, -(-self.slot_bytes // grain)) if grain else 1
        self.pad = _Lease(self._fresh(1), self.lined)

    # device

    def _fresh(self, n: int) -> list[int]:
        out = list(range(self._next_page, self._next_page + n))
        self._next_page += n
        return out

    def used_pages(self) -> set[int]:
        held = set(self.pad.pages)
        for lease in self.leases:
            held.update(lease.pages)
        for e in self.entries.values():
            if e.pages is not None:
                held.update(e.pages)
        return held

    def used_slots(self) -> int:
        """Slots held, the pad's included (the null slot is not)."""
        return (self.lined + sum(lz.slot for lz in self.leases)
                + sum(1 for e in self.entries.values() if e.slot))

    def _room_ok(self, pages: int, slot: bool) -> bool:
        if slot and self.used_slots() + 1 > self.slots - 1:
            raise Unmodelled("a lease needs a slot the pool has not made (it would remap pages into slots)")
        return len(self.used_pages()) + pages <= self.pages

    # host

    def _runs(self) -> list[tuple[int, int]]:
        """The host's free runs, (start, length) in order (found by the regex engine: a host of a
        million grains is scanned in C, not grain by grain)."""
        return [(m.start(), m.end() - m.start()) for m in _FREE_RUN.finditer(self.host)]

    def _host_take(self, n: int, high: bool) -> int | None:
        runs = self._runs()
        for s, length in (reversed(runs) if high else runs):
            if length >= n:
                at = s + length - n if high else s
                self.host[at:at + n] = b"\x01" * n
                return at
        return None

    def _host_give(self, at: int, n: int) -> None:
        self.host[at:at + n] = b"\x00" * n

    def _host_live(self) -> set[int]:
        return {h for e in self.entries.values() if e.host is not None for h in e.host}

    def _release_host(self, hids, slot: int | None) -> None:
        """Give back the host pages no entry names any more, and the slot."""
        live = self._host_live()
        for h in hids or ():
            if h not in live and h in self.host_at:
                self._host_give(self.host_at.pop(h), self.page_units)
        if slot is not None:
            self._host_give(slot, self.slot_units)

    def host_used_bytes(self) -> int:
        return sum(self.host) * self.grain if self.host is not None else 0

    def _park(self, e: _Entry) -> bool:
        """A host copy of `e`'s device state; False (nothing kept) when the host is full. Pages whose
        twin is live are not copied; once one page is copied, every later one is."""
        live = self._host_live()
        hids: list[int] = []
        fresh: list[int] = []
        copying = False
        for p in e.pages:
            t = self.twin.get(p)
            if not copying and t is not None and t in live:
                hids.append(t)
                continue
            copying = True
            at = self._host_take(self.page_units, high=False)
            if at is None:
                self._unpark(fresh)
                return False
            h = self._next_host
            self._next_host += 1
            self.host_at[h] = at
            self.twin[p] = h
            fresh.append(h)
            hids.append(h)
        slot = None
        if e.slot:
            slot = self._host_take(self.slot_units, high=True)
            if slot is None:
                self._unpark(fresh)
                return False
        e.host, e.host_slot = tuple(hids), slot
        return True

    def _unpark(self, fresh: list[int]) -> None:
        for h in fresh:
            self._host_give(self.host_at.pop(h), self.page_units)

    # the index

    def _remove(self, e: _Entry) -> None:
        del self.entries[e.key]
        if e.host is not None:
            self._release_host(e.host, e.host_slot)

    def _coldest(self, resident: bool) -> _Entry | None:
        es = [e for e in self.entries.values() if e.resident == resident]
        return min(es, key=lambda e: e.tick) if es else None

    def insert(self, key, pages: list[int], slot: bool) -> None:
        key = tuple(key)
        self.clock += 1
        e = self.entries.get(key)
        if e is not None:
            if e.pages is None:
                e.pages, e.slot = tuple(pages), slot
            e.tick = self.clock
        else:
            e = _Entry(key, self.lined, self.clock, tuple(pages), slot)
            self.entries[key] = e
        if not e.stateful and len(key) > self.page and len(key) % self.page == 0:
            old = self.entries.get(key[:-self.page])
            if old is not None and not old.stateful and old.resident and old.host is None:
                self._remove(old)

    def lookup(self, ids) -> tuple[int, _Entry, bool] | None:
        if not ids:
            return None
        q = tuple(ids[:-1])
        self.clock += len(q) + 2
        base = self.clock
        touched = 0
        offers: list[tuple[int, bool, _Entry]] = []
        for e in sorted((e for e in self.entries.values() if q[:len(e.key)] == e.key), key=lambda e: len(e.key)):
            e.tick = base - touched
            touched += 1
            offers.append((len(e.key), e.resident, e))
        groups: dict[int, list[_Entry]] = {}
        for e in self.entries.values():
            if e.stateful or q[:len(e.key)] == e.key:
                continue
            d = 0
            while d < len(q) and e.key[d] == q[d]:
                d += 1
            groups.setdefault(d, []).append(e)
        best = None
        for d in sorted(groups):
            if d < self.page:
                continue
            members = groups[d]
            resident = any(e.resident for e in members)
            pick = min((e for e in members if e.resident or not resident), key=lambda e: e.key)
            k = (d // self.page * self.page, resident)
            if best is None or k >= best[:2]:
                best = (*k, pick)
        if best is not None:
            best[2].tick = base - touched
            offers.append(best)
        win = None
        for o in offers:
            if o[0] > 0 and (win is None or o[:2] >= win[:2]):
                win = o
        return None if win is None else (win[0], win[2], win[1])

    def evict(self) -> bool:
        e = self._coldest(resident=True)
        if e is None:
            return False
        while self.host is not None:
            if e.host is not None or self._park(e):
                e.pages, e.slot = None, False
                self.counters["parks"] += 1
                return True
            victim = self._coldest(resident=False)
            if victim is None:
                break
            self._remove(victim)
            self.counters["host_evictions"] += 1
        self._remove(e)
        self.counters["evictions"] += 1
        return True

    # one request

    def admit(self, ids: list[int], max_tokens: int) -> tuple[_Lease, Prediction] | None:
        """Room for one request (SPEC §6 "Room"); None when it would wait (Busy, nothing to evict)."""
        room = len(ids) + max_tokens + self.rows - 1
        need = -(-room // self.page)
        hit = self.lookup(ids)
        while True:
            if hit is None:
                if self._room_ok(need, self.lined):
                    lease = _Lease(self._fresh(need), self.lined)
                    break
            else:
                n, e, resident = hit
                if resident:
                    whole = n // self.page
                    if self._room_ok(need - whole, self.lined):
                        lease = _Lease(list(e.pages[:whole]) + self._fresh(need - whole), self.lined)
                        break
                else:
                    if self._room_ok(need, self.lined):
                        fresh = self._fresh(need)
                        for i in range(n // self.page):
                            self.twin[fresh[i]] = e.host[i]
                        lease = _Lease(fresh, self.lined)
                        break
            if not self.evict():
                return None
            hit = self.lookup(ids)
        self.leases.append(lease)
        cached, tier, woken = 0, None, False
        if hit is not None:
            n, e, resident = hit
            cached, tier = n, ("device" if resident else "host")
            c = self.counters
            c["prefix_hit_tokens"] += n
            if resident:
                c["resident_hits"] += 1
                c["resident_hit_tokens"] += n
            else:
                c["host_hits"] += 1
                c["host_hit_tokens"] += n
                c["wakes"] += 1
                c["wake_tokens"] += n
                woken = True
                self.woken += 1
        lease.mark = cached // self.page
        return lease, Prediction(cached, tier, "none", woken)

    def step(self, lease: _Lease, fed: list[int], pos: int, ends: bool) -> None:
        """After a step that left the state at `pos` tokens of `fed`: a paged target checkpoints the
        whole pages it completed, unless the step ended the request."""
        full = pos // self.page
        if self.lined or ends or full <= lease.mark:
            return
        self.insert(fed[:full * self.page], lease.pages[:full], False)
        lease.mark = full

    def finish(self, lease: _Lease, fed: list[int], pos: int, prompt: int, answer: int, reason: str) -> str:
        """The request ended by stop or length with `answer` tokens (stop excluded) and `pos` folded:
        a lined target keeps its snapshot iff nothing the client never receives was folded."""
        self.leases.remove(lease)
        if not self.lined:
            return "none"
        known = prompt + answer
        kept = pos <= known or (pos == known + 1 and reason == "stop")
        if kept:
            self.insert(fed[:pos], lease.pages[:-(-pos // self.page)], True)
            return "kept"
        self.counters["not_kept"] += 1
        return "not kept"

    def abort(self, lease: _Lease) -> None:
        self.leases.remove(lease)

    def serve(self, ids: list[int], max_tokens: int, path: dict) -> Prediction:
        """One request start to end, alone on the server; `path` is `toy.model.path`'s for it."""
        ids = list(ids)
        got = self.admit(ids, max_tokens)
        if got is None:
            raise Unmodelled("the request would wait for room with nothing resident to evict")
        lease, pred = got
        fed = ids + list(path["answer"]) + ([EOS] if path["reason"] == "stop" else [])
        end = len(ids) if self.emits else len(ids) - 1
        pos = pred.cached
        chunks = []
        while pos < end:
            chunks.append(min(self.chunk, end - pos))
            pos += chunks[-1]
        pos = pred.cached
        for i, n in enumerate(chunks):
            pos += n
            # an emitting prefill whose token ended the request ends it in its last chunk
            self.step(lease, fed, pos, self.emits and not path["counts"] and i == len(chunks) - 1)
        for i, n in enumerate(path["counts"]):
            pos += n
            self.step(lease, fed, pos, i == len(path["counts"]) - 1)
        assert pos == path["fed"], f"{pos=} {path['fed']=}"
        pred.snapshot = self.finish(lease, fed, pos, len(ids), len(path["answer"]), path["reason"])
        return pred

    # views

    def gauges(self) -> dict[str, int]:
        resident = [e for e in self.entries.values() if e.resident]
        snap = {p for e in resident for p in e.pages}
        return {
            "pages_used": len(self.used_pages()), "snapshot_pages": len(snap),
            "resident_entries": len(resident), "parked_entries": len(self.entries) - len(resident),
            "snapshot_slots": sum(e.slot for e in resident), "host_used_bytes": self.host_used_bytes(),
        }

    def parked_lengths(self) -> list[int]:
        return sorted(len(k) for k, e in self.entries.items() if not e.resident)
