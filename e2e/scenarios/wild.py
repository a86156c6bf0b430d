"""What the workloads from the wild share (sessions blocks, cold_burst, tight: issue 39): drawing
block-aligned segments, and judging each answer and its ``cached_tokens`` from outside.

Every answer is held token for token to the reference. Every ``cached_tokens`` is held to what the
engine could have cached: at most the longest common prefix of the prompt with any sequence the
session sent before (a prompt and its answer as fed back), or with another call of the same burst,
and at most the prompt less its last token. A block reused under the wrong prefix (a hash that
ignores its parent or its position), or a hit covering a prompt's last token, claims more than that,
even on a target whose answers it leaves right (toy-paged: a slot is a function of token and
position). Nothing here reads /stats: it works against any engine (docs/engine-contract.md).
"""

from __future__ import annotations

import random
import weakref
from dataclasses import dataclass, field

from e2e.client import Answer
from verdicts import Same

__all__ = ["Judge", "block", "counted", "draw", "segment"]

SEEN: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
"""Per session client: every sequence it sent (prompt + answer fed), what a later hit may reuse."""


def block(r) -> int:
    """The engine's cache block in tokens: the open session's facts.page (ours: the pool's page)."""
    live = r.need_any()
    return max(1, int((r.facts.get(live.session.name) or {}).get("page") or r.page))


def segment(b: int, at_least: int = 8) -> int:
    """A block-aligned segment length: whole blocks, at least `at_least` tokens."""
    return b * max(1, -(-at_least // b))


def draw(rng: random.Random, n: int) -> list[int]:
    """`n` random byte ids."""
    return [rng.randrange(256) for _ in range(n)]


def counted(r, name: str = "evictions") -> int | None:
    """A /stats counter, where the engine has /stats (ours: evidence a note adds, never what a check
    needs: an engine without /stats is judged from its answers and hits alone); else None."""
    if not r.opts.engine.has("stats"):
        return None
    got = (r.need_any().client.stats() or {}).get("counters") or {}
    return int(got[name]) if isinstance(got.get(name), (int, float)) else None


def lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Judge:
    """One check's answers and hits; `seen` is the session's (shared by its steps)."""

    r: object
    name: str
    same: Same = field(init=False)
    over: list[str] = field(default_factory=list)  # hits beyond what could have been cached
    hits: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.same = Same(self.r.oracle, self.r.rows)
        self.client = self.r.need_any().client
        self.seen: list[list[int]] = SEEN.setdefault(self.client, [])

    def bound(self, ids: list[int], others: list[list[int]] = ()) -> int:
        """The most `ids` may have been served from the cache."""
        best = max((lcp(ids, s) for s in [*self.seen, *others]), default=0)
        return max(0, min(best, len(ids) - 1))

    def judge(self, label: str, ids: list[int], m: int, a: Answer, limit: int) -> None:
        self.same.add(label, ids, a.ids, self.r.oracle.run(ids, m, self.r.rows))
        self.hits.append(a.cached)
        if self.r.opts.engine.has("cached-tokens") and a.cached > limit:
            self.over.append(f"{label}: cached_tokens {a.cached} > {limit}, the most it shares with anything sent")

    def serial(self, label: str, ids: list[int], m: int) -> Answer:
        limit = self.bound(ids)
        a = self.r.answer(ids, m)
        self.judge(label, ids, m, a, limit)
        self.seen.append(ids + a.fed)
        return a

    def burst(self, label: str, calls: list[tuple[list[int], int]]) -> list[Answer | None]:
        """Every call at once; each judged, its bound counting the burst's other calls as sent."""
        for ids, m in calls:  # the reference works ahead meanwhile
            self.r.oracle.prefetch(ids, m, self.r.rows)
        got = self.r.need_any().client.run_all(calls)
        done = [ids + a.fed if isinstance(a, Answer) else ids for (ids, _), a in zip(calls, got)]
        out: list[Answer | None] = []
        for i, ((ids, m), a) in enumerate(zip(calls, got)):
            if not isinstance(a, Answer):
                self.errors.append(f"{label} {i + 1}: {type(a).__name__}: {a}")
                out.append(None)
                continue
            self.judge(f"{label} {i + 1}", ids, m, a, self.bound(ids, done[:i] + done[i + 1:]))
            out.append(a)
        self.seen.extend(done)
        return out

    def ok(self) -> bool:
        return self.same.ok and not self.over and not self.errors

    def note(self) -> str:
        head = f"{self.same}; hits {sum(h > 0 for h in self.hits)}/{len(self.hits)}, {sum(self.hits)} tokens cached"
        return "; ".join([head, *self.over[:4], *self.errors[:4]])

    def add(self, extra_ok: bool = True, extra: str = "") -> None:
        """Record the check: answers, bounds and errors, and what the workload adds."""
        self.r.checks.add(self.name, self.ok() and extra_ok, self.note() + (f"; {extra}" if extra else ""),
                          self.same.excused)
