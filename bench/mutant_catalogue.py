"""The mutant catalogue: real bug classes planted in the source, each naming the check that must catch it.

A mutant is a search/replace of one small snippet in one file (robust to edits elsewhere in the file;
a snippet that no longer matches exactly once is reported *stale*, never killed). `origin` names the
bug class: kern's history (reference/kern-pool.md §4, kern-e2e.md) or a peer's (reference/peers.md §3,
by number). `targets` and `checks` are what `bench/mutants.py` gates the mutant with (`--targets`,
`--scenarios`); the mutant is killed when that gate exits 1. `kernel` mutants change a kernel source,
so the manifests are regenerated first (the pinned sha256 must not be what catches them).
`equivalent` carries the argument when a mutant cannot change any observable behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CATALOGUE", "Mutant"]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    find: str
    replace: str
    checks: tuple[str, ...]
    targets: tuple[str, ...]
    origin: str
    kernel: bool = False
    equivalent: str | None = None


HOST = ("policy_host", "park_wake")
CHURN = ("policy_churn", "host_churn")
DEFAULT = ("policy_default", "repeat_hit", "turn2_hit", "turn2_warm_equals_run")
TIES = ("policy_ties",)  # e2e/scenarios/ties.py: ties, parked-then-resident entries, a squeezed single eviction

CATALOGUE: tuple[Mutant, ...] = (
    # --- the index: recency, candidates, growth ---
    Mutant("lookup-stamps-on-a-miss", "pool/prefix.py",
           "            if nxt.paged_below > 0 and matched >= unit:",
           "            if nxt.paged_below > 0 and matched >= 1:",
           TIES, ("toy-paged",),
           "kern-pool §4: a lookup restamped an off-path candidate sharing no whole page (a miss warmed the "
           "coldest entry, the wrong entry was evicted)"),
    Mutant("lookup-deeper-warmer", "pool/prefix.py",
           "                    e.used = base - touched\n                    touched += 1\n                    on = node",
           "                    e.used = base - (end >> 2) + touched\n                    touched += 1\n                    on = node",
           TIES, ("toy-stateful",),
           "kern-pool §1.9: entries nearer the root must stay warmer, a chain's leaf is evicted first"),
    Mutant("lookup-parked-wins-ties", "pool/prefix.py",
           "            if offer[0] > 0 and (best is None or offer[:2] >= best[:2]):",
           "            if offer[0] > 0 and (best is None or offer[0] >= best[0]):",
           TIES, ("toy-paged",),
           "kern-pool §5: Resident must win ties over Parked (a needless wake)"),
    Mutant("lookup-covers-last-token", "pool/prefix.py",
           "        end = t.n * WIDTH - WIDTH\n",
           "        end = t.n * WIDTH\n",
           DEFAULT, ("toy-paged",),
           "peers §3.15 (vLLM #11186): the last token must still run; a hit covering it breaks the step"),
    Mutant("off-path-prefers-parked", "pool/prefix.py",
           "            if warm:\n                for t in cand._keys:",
           "            if False:  # the first paged child, parked or not\n                for t in cand._keys:",
           TIES, ("toy-paged",),
           "kern-pool §1.9 step 4: a resident off-path candidate must be preferred to a parked one"),
    Mutant("growth-rule-off", "pool/prefix.py",
           "            if old is not None and not old.slot and old.device is not None and old.host is None:",
           "            if False:",
           ("policy_default",), ("toy-paged",),
           "kern-pool §1.9: a sequence checkpointed every page keeps one growing entry (else entries pile up)"),
    Mutant("growth-rule-drops-host-copy", "pool/prefix.py",
           "            if old is not None and not old.slot and old.device is not None and old.host is None:",
           "            if old is not None and not old.slot and old.device is not None:",
           TIES, ("toy-paged",),
           "peers §3.10 (SGLang #33713): an entry with a host copy pruned instead of kept (0 host hits)"),
    Mutant("reinsert-keeps-parked", "pool/prefix.py",
           "            if e.device is None:\n                e.device = store",
           "            if False:\n                e.device = store",
           HOST, ("toy-paged",),
           "kern-pool §1.9 insert: a parked entry re-inserted must become resident (else every turn wakes)"),
    Mutant("park-restamps", "pool/prefix.py",
           "                self._stamp(e, e.used)",
           "                self._clock += 1\n                self._stamp(e, self._clock)",
           CHURN, ("toy-stateful",),
           "kern-pool §1.9 evict: the same tick moves to the parked tier (else the host drops the wrong copy)"),
    # --- the host tier ---
    Mutant("stale-twin-counted-live", "pool/store.py",
           "        if twin is not None and twin.refs > 0 and twin.depth == self.depth",
           "        if twin is not None and twin.depth == self.depth",
           CHURN, ("toy-stateful",),
           "kern-pool §4 review P1 / peers §3.12: a dropped host copy still counted live (a stale twin)"),
    Mutant("park-records-no-twin", "pool/host.py",
           "            node.twin = tip\n",
           "            pass\n",
           CHURN, ("toy-paged",),
           "kern-pool §4: a woken session parked again re-copied everything (no twin link recorded)"),
    Mutant("restore-twins-wrong-pages", "pool/host.py",
           "            chain = Node(fresh[at:at + n], chain, pool)\n            chain.twin = node\n",
           "            chain = Node(fresh[at:at + n], chain, pool)\n            chain.twin = node.parent or node\n",
           CHURN, ("toy-paged",),
           "issue 10: a re-park after a wake copies the wrong device pages (twins off by one)"),
    Mutant("restore-twins-none", "pool/host.py",
           "            chain = Node(fresh[at:at + n], chain, pool)\n            chain.twin = node\n",
           "            chain = Node(fresh[at:at + n], chain, pool)\n            chain.twin = None\n",
           CHURN, ("toy-paged",),
           "kern-pool §4: twins set at restore, so the next park of a woken session is free"),
    Mutant("host-free-no-coalesce", "pool/host.py",
           "            self._runs[self._starts[i - 1]] += n",
           "            self._put(start, n)",
           ("policy_frag",), ("toy-stateful",),
           "peers §3.13 (SGLang #35270): allocator accounting that drifts; free runs never merge back"),
    Mutant("twins-not-a-prefix", "pool/host.py",
           "            twin = None if fresh else node.live_twin()",
           "            twin = node.live_twin() if node.parent is None else None",
           CHURN, ("toy-paged",),
           "kern-pool §1.6: park copies only pages without a live twin (here: all but the first, always)"),
    # --- admission, eviction, counters ---
    Mutant("no-lookup-after-evict", "serve/admission.py",
           "                hit = self._lookup(req.ids)\n                continue",
           "                hit = None\n                continue",
           HOST, ("toy-paged",),
           "kern-pool §4: look up again after making room (a stale or missed hit)"),
    Mutant("evictions-not-counted", "serve/admission.py",
           '            self.counters.add("evictions")',
           "            pass",
           ("policy_drop",), ("toy-paged",),
           "issue 10: eviction counter never incremented"),
    Mutant("parks-not-counted", "serve/admission.py",
           '            self.counters.add("parks")',
           "            pass",
           ("policy_host",), ("toy-paged",),
           "peers §3.10: a tier's counter missing (SGLang never created cache_source=host)"),
    Mutant("wakes-not-counted", "serve/admission.py",
           '                self.counters.add("wakes")',
           "                pass",
           ("policy_churn",), ("toy-paged",),
           "issue 10: woken counter never incremented"),
    Mutant("host-evictions-dropped", "serve/admission.py",
           '        self.counters.add("host_evictions", ev.dropped)',
           "        pass",
           ("policy_churn",), ("toy-paged",),
           "kern-pool §4: host_evictions undercount (dropped parked entries not counted)"),
    Mutant("resident-hits-not-counted", "serve/admission.py",
           '                self.counters.add("resident_hits")',
           "                pass",
           ("policy_default",), ("toy-paged",),
           "peers §3.5 (vLLM PR #17251 fixed stats): hit counters that miss hits"),
    Mutant("never-park", "serve/admission.py",
           '        park = self._park if e.host is not None and "no-park" not in e.faults else None',
           "        park = None",
           HOST, ("toy-paged",),
           "peers §3.10: device eviction drops instead of downgrading to the host tier"),
    Mutant("page-mark-from-zero", "serve/admission.py",
           "        req.page_mark = req.cached // e.unit",
           "        req.page_mark = 0",
           ("policy_default", "policy_host"), ("toy-paged",),
           "peers §3.15: checkpoints re-inserted under restored pages (entries and recency drift)"),
    # --- the pool: copies of partial pages ---
    Mutant("restore-skips-partial-copy", "pool/pages.py",
           "        copies = Copies()\n        if len % self.unit:\n            copies.pages.append((cp._tip.page, fresh[0]))",
           "        copies = Copies()\n        if False:\n            copies.pages.append((cp._tip.page, fresh[0]))",
           ("turn2_warm_equals_run",), ("toy-stateful",),
           "peers §3.1-3.3: a restored hit's partial page not copied (warm differs from cold)"),
    # --- serving: snapshots and the checkpoint policy ---
    Mutant("keep-one-overshoot", "serve/core.py",
           '            kept = req.pos <= known or (req.pos == known + 1 and req.reason == "stop")',
           "            kept = req.pos <= known + 1",
           ("policy_default",), ("toy-stateful-spec",),
           "issue 10 / SPEC §7: a lined snapshot kept with one overshoot token"),
    Mutant("not-kept-not-counted", "serve/core.py",
           '                self.counters.add("not_kept")',
           "                pass",
           ("policy_default",), ("toy-stateful-spec",),
           "SPEC §7: a snapshot not kept is logged, counted and reported"),
    Mutant("checkpoint-at-request-end", "serve/core.py",
           "        if req.reason is None:\n            full = req.pos // e.unit",
           "        if True:\n            full = req.pos // e.unit",
           ("policy_default",), ("toy-paged",),
           "SPEC §7: the step that ends a request inserts nothing (its last pages hold tokens nobody sends)"),
    Mutant("retire-short-of-stop", "serve/core.py",
           "                e.prefix.insert(req.fed(0, req.pos), e.pool.retire(lease, req.pos))",
           "                e.prefix.insert(req.fed(0, known), e.pool.retire(lease, known))",
           ("turn2_warm_equals_run", "policy_default"), ("toy-stateful",),
           "peers §3.15 (SGLang PR #16521): a finished request inserted under the wrong key length"),
    Mutant("abort-leaks-lease", "serve/core.py",
           "            else:\n                req.lease.release()\n            req.lease = None",
           "            else:\n                pass\n            req.lease = None",
           ("abort",), ("toy-paged",),
           "peers §3.13: an aborted request's pages never come back (vLLM #5543 poison batches end by abort)"),
    # --- the runtime ---
    Mutant("host-runs-ignore-offsets", "runtime/runtime.py",
           "        if out and out[-1][0] + out[-1][2] == d and out[-1][1] + out[-1][2] * host_page == h:",
           "        if out and out[-1][0] + out[-1][2] == d:",
           ("park_wake", "host_churn"), ("toy-paged",),
           "peers §3.7-3.8: offload copies to the wrong host blocks (coalesced runs with gaps)"),
    Mutant("device-runs-ignore-dst", "runtime/runtime.py",
           "        if out and out[-1][0] + out[-1][2] == s and out[-1][1] + out[-1][2] == d:",
           "        if out and out[-1][0] + out[-1][2] == s:",
           ("turn2_warm_equals_run", "host_churn"), ("toy-stateful",),
           "peers §3.4: a copy lands on the wrong pages",
           equivalent="every device-to-device plan the pool makes copies at most one page (checkpoint, restore "
                      "and fork copy only the partial page; whole pages are shared, never copied), so `_runs` "
                      "never sees a second pair and the destination test it drops is never evaluated"),
    # --- a kernel (manifests regenerated) ---
    Mutant("kernel-rotation-off", "toy/kernels/cpu.py",
           "            part += rotl(kv[base + w], q)",
           "            part += rotl(kv[base + w], q + 1)",
           ("conc1_equals_run",), ("toy-paged",),
           "SPEC §2: page order lost in the sum (a kernel that disagrees with the reference)", kernel=True),
    # --- tiers through the API, hangs (issue 25) ---
    Mutant("kern-object-omits-tier", "serve/app.py",
           '''        return {"request_id": self.req.id, "cache_tier": d.tier if d else None, "snapshot": d.snapshot if d else "none",''',
           '''        return {"request_id": self.req.id, "snapshot": d.snapshot if d else "none",''',
           ("conc1_equals_run",), ("toy-paged",),
           "issue 25: a server that tells its tiers only in a debug log line (the gate must read them from the "
           "API, so the response's kern object is required)"),
    Mutant("woken-never-told", "serve/admission.py",
           "                req.woken = True\n",
           "                pass\n",
           ("park_wake",), ("toy-paged",),
           "LMCache/vLLM KV-offload: a load from the CPU tier that the request's stats never record (hits by tier "
           "miscounted in the API while the counters move)"),
    Mutant("host-hit-told-as-device", "serve/admission.py",
           "            req.cached, req.tier = n, hit.tier.value\n",
           "            req.cached, req.tier = n, \"device\"\n",
           ("policy_host",), ("toy-paged",),
           "vLLM #14069-style: a hit's source tier misreported (every hit said to be a GPU hit)"),
    Mutant("abort-not-counted", "serve/core.py",
           '''        self.counters.add("aborted")\n''',
           "",
           ("abort",), ("toy-paged",),
           "vLLM: aborted requests missing from the finished-request accounting"),
    Mutant("finish-leaks-lease", "serve/core.py",
           "        else:\n            lease.release()\n        logs.event(\"finished\"",
           "        else:\n            pass\n        logs.event(\"finished\"",
           ("policy_default",), ("toy-paged",),
           "kern-pool §4 / vLLM block leaks: a finished request's lease never returned; the pool fills and a "
           "later request waits forever (a hang the watch must name within seconds)"),
)
