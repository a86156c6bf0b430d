"""abort: read 3 stream chunks and hang up; the next answer is unchanged and nothing leaked.

Nothing leaked, when idle (SPEC §7): no lease, every used page the pad's or a snapshot's, and on
lined targets every used slot a snapshot's or the pad's.
"""

from __future__ import annotations

import time

from e2e.prompts import PROMPTS
from verdicts import Same

CHUNKS = 3


def leaks(s: dict) -> list[str]:
    if "leases" not in s:
        return []
    out = []
    facts = s.get("facts", {})
    if s["leases"] != 0:
        out.append(f"leases={s['leases']}")
    pad = facts.get("pad_pages")
    if pad is not None and s.get("pages_used") != pad + s.get("snapshot_pages", 0):
        out.append(f"pages_used={s.get('pages_used')} != pad {pad} + snapshot {s.get('snapshot_pages')}")
    if s.get("slots") and "snapshot_slots" in s and s.get("slots_used") != s["snapshot_slots"] + 1:
        out.append(f"slots_used={s.get('slots_used')} != snapshot {s['snapshot_slots']} + pad 1")
    return out


def run(r) -> None:
    live = r.need("default")
    got = live.client.hang_up(PROMPTS[5], CHUNKS)
    time.sleep(1.0)
    a = r.answer(PROMPTS[0])
    same = Same(r.oracle, r.rows)
    same.add("prompt 1", r.cold[0].prompt_ids, a.ids, r.cold[0].ids)
    idle = live.stats.idle()
    leaked = leaks(idle) if live.stats.has_endpoint else []
    note = f"read {got}/{CHUNKS} chunks then hung up; next answer {same}"
    note += f"; leaked: {', '.join(leaked)}" if leaked else ("; nothing leaked" if live.stats.has_endpoint
                                                             else "; no /stats to check leaks")
    r.checks.add("abort", got == CHUNKS and same.ok and not leaked, note)
