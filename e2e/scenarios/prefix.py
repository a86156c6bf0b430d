"""prefix_cold_warm_restored: one prompt family's answers cold, warm, under a burst and after an evicting
flood, each identical to the reference (docs/engine-contract.md: the check every engine is gated on).

What it proves of an engine with a prefix cache, an offload tier, chunked prefill or preemption: that
none of them changes a token. Prompts are families (stems shared by several tails, stem lengths at,
one under and one over a multiple of the engine's cache block) of random byte ids, sent as ids:

1. cold: every prompt once, one at a time (the first of each stem misses, the others share it);
2. warm: each prompt again right after its cold answer (a cache of any size holds it: with
   ``cached-tokens`` at least one hit);
3. turn 2: each prompt + its answer (+ the stop token) + a suffix, one at a time;
4. burst: every turn 2 at once (a small KV budget preempts here);
5. flood: unrelated prompts in bursts, enough to evict a small cache;
6. restored: after the flood, every conversation comes back for a third turn (turn 2 + its answer + a
   new suffix: a lookup reads the state at the end of an answer only when a later turn asks for it, so
   a wrongly restored answer block shows here), then every first prompt again (recomputed, or restored
   from wherever the engine keeps what it evicted).

240 requests in all. The note counts each phase's identical answers and hits, and, for an
engine with vLLM's /metrics, the preemptions it counted.
"""

from __future__ import annotations

import random

from e2e.client import Answer
from verdicts import Same

__all__ = ["run"]

STEMS = 8
TAILS = 4
FLOOD = 48
FLOOD_BURST = 16
SUFFIX_IDS = list(b"\nand then?")
RETURN_IDS = list(b"Why?")  # a conversation's third turn, after the flood (not sharing turn 2's first byte)
PREEMPTIONS = ("vllm:num_preemptions_total", "vllm:num_preemptions")


def family(rng: random.Random, page: int, longest: int) -> list[list[int]]:
    """STEMS x TAILS prompts: each stem at a multiple of `page`, one under or one over, tails 1-40."""
    out = []
    for i in range(STEMS):
        blocks = rng.randint(1, max(1, longest // max(page, 1)))
        n = max(2, min(longest, blocks * page + (i % 3) - 1))
        stem = [rng.randrange(256) for _ in range(n)]
        out += [stem + [rng.randrange(256) for _ in range(rng.randint(1, 40))] for _ in range(TAILS)]
    return out


def _longest(r) -> int:
    """The longest stem: two turns and their answers fit the engine's room (facts.max_request_tokens)."""
    room = int((r.facts.get("prefix") or r.facts.get("default") or {}).get("max_request_tokens") or 1024)
    return max(8, min(300, (room - 3 * (r.m + 1) - 40 - len(SUFFIX_IDS) - len(RETURN_IDS)) // 2))


def _preemptions(client) -> float | None:
    text = client.metrics()
    if not text:
        return None
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in PREEMPTIONS:
            try:
                return float(line.rsplit(" ", 1)[1])
            except ValueError:
                return None
    return None


def _evicted(r, hits: dict[str, list[int]], ends: list[int]) -> str:
    """Whether the flood evicted anything: a first prompt that hit fewer tokens after it than warm (a
    lined target: a returning turn that hit less than its turn 2's whole sequence, where its state was kept)."""
    if r.stateful:
        lost = sum(h < end for h, end in zip(hits["returning"], ends))
        what = "returning turns hit less than their turn 2's whole sequence"
    else:
        lost = sum(after < warm for warm, after in zip(hits["warm"], hits["restored"]))
        what = "first prompts hit fewer tokens after the flood than warm"
    if not lost:
        return "nothing was evicted by the flood (eviction not exercised: the cache held it all)"
    return f"evicted: {lost} {what}"


def run(r) -> None:
    live = r.need("prefix")
    rng = random.Random(f"prefix-{r.opts.seed}")
    longest = _longest(r)
    prompts = family(rng, r.page, longest)
    r.serial_ends("prefix_cold_warm_restored (bursts)")
    phases: dict[str, Same] = {k: Same(r.oracle, r.rows) for k in
                               ("cold", "warm", "turn 2", "burst", "flood", "returning", "restored")}
    hits: dict[str, list[int]] = {k: [] for k in phases}
    errors: list[str] = []
    before = _preemptions(live.client)

    def serial(phase: str, ids: list[int]) -> Answer:
        a = r.answer(ids)
        phases[phase].add(f"{phase} {len(hits[phase]) + 1}", ids, a.ids, r.oracle.run(ids, r.m, r.rows), a.served)
        hits[phase].append(a.cached)
        return a

    def burst(phase: str, calls: list[list[int]]) -> None:
        for ids in calls:  # the reference works ahead while the engine answers
            r.oracle.prefetch(ids, r.m, r.rows)
        got = live.client.run_all([(ids, r.m) for ids in calls])
        for ids, a in zip(calls, got):
            if not isinstance(a, Answer):
                errors.append(f"{phase}: {type(a).__name__}: {a}")
                continue
            phases[phase].add(f"{phase} {len(hits[phase]) + 1}", ids, a.ids, r.oracle.run(ids, r.m, r.rows), a.served)
            hits[phase].append(a.cached)

    cold = []
    for ids in prompts:
        cold.append(serial("cold", ids))
        serial("warm", ids)
    second = [ids + a.fed + SUFFIX_IDS for ids, a in zip(prompts, cold)]
    turn2 = [serial("turn 2", ids) for ids in second]
    burst("burst", second)
    flood = [[rng.randrange(256) for _ in range(rng.randint(longest // 2, longest))] for _ in range(FLOOD)]
    for i in range(0, FLOOD, FLOOD_BURST):
        burst("flood", flood[i:i + FLOOD_BURST])
    for ids, a in zip(second, turn2):
        serial("returning", ids + a.fed + RETURN_IDS)
    for ids in prompts:
        serial("restored", ids)
    after = _preemptions(live.client)
    _verdict(r, phases, hits, errors, [len(ids) + len(a.fed) for ids, a in zip(second, turn2)],
             None if after is None else after - (before or 0))


def _verdict(r, phases: dict[str, Same], hits: dict[str, list[int]], errors: list[str], returning: list[int],
             preempted: float | None) -> None:
    """`prefix_cold_warm_restored`: every phase's answers, and (an engine that tells its hits) a warm
    hit at least, and what the flood evicted of the `returning` sequences' lengths."""
    ok = all(s.ok for s in phases.values()) and not errors
    parts = [f"{k} {s}" + (f" (hits {sum(c > 0 for c in hits[k])}, {sum(hits[k])} tokens cached)"
                           if r.opts.engine.has("cached-tokens") else "")
             for k, s in phases.items()]
    note = f"{sum(len(h) for h in hits.values())} requests; " + "; ".join(parts)
    # a lined (stateful) target keeps a sequence's state at its end only: its prompts hit as turn 2s
    warm = "turn 2" if r.stateful else "warm"
    if r.opts.engine.has("cached-tokens") and not any(hits[warm]):
        ok = False
        note += f"; no {warm} request was served from the cache: the prefix cache was never exercised"
    if r.opts.engine.has("cached-tokens"):
        note += "; " + _evicted(r, hits, returning)
    if preempted is not None:
        note += f"; preemptions {preempted:.0f} (the engine's /metrics)"
    if errors:
        note += "; " + "; ".join(errors[:5])
    r.checks.add("prefix_cold_warm_restored", ok, note, sum(s.excused for s in phases.values()),
                 next((s.first for s in phases.values() if s.first), None))
