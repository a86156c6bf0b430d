"""Session generated: a workload drawn from `--seed` for any engine (issue 40), in a cache of about four
of its largest requests, so it churns: every few requests evict what earlier ones left. Judged by the
answers and ``cached_tokens`` alone (`e2e/scenarios/wild.py`): no /stats, no kern flags; the cache is
sized through ``{cache_tokens}`` (kern: ``--capacity``, no host tier). kern's own generated workload, which reads its
/stats and its policy, is `explore`.

Each serial request is one of these, drawn by a PRNG seeded from ``--seed`` and the model's name:

- fresh: random bytes, one to five blocks and a ragged tail;
- next turn: an earlier sequence (its prompt and the answer fed back) and a fresh suffix;
- branch: an earlier prompt's first whole blocks and a fresh tail of its own;
- spliced: an earlier prompt's first whole blocks, then another earlier prompt's blocks from there on,
  so those come again at the same positions behind another cached prefix (a cache whose block key
  ignores the parent serves them as hits);
- repeat: an earlier prompt again, right after it (its hit is then the whole blocks below its last
  token, as `repeat_hit` wants: nothing evicts the sequence served last) or later (anything within
  the bound: it may have been evicted);
- each with 1 to 24 answer tokens (1: the prefill's token alone).

Then bursts of four to six calls at once, of the same kinds, some holding the same new prompt twice
(one call may read blocks the other is still writing). `generated_equals_run`: every answer identical
to the reference, every ``cached_tokens`` within what the session could have left in the cache (the
longest prefix it shares with anything sent before or beside it, less the last token), and every
immediate repeat's hit as `repeat_hit` wants it. The note counts each kind, the hits and, where the
engine has /stats, its evictions.
"""

from __future__ import annotations

import random

from e2e.scenarios.repeat import want_cached
from e2e.scenarios.wild import Judge, block, counted, draw

__all__ = ["cache", "run"]

SERIAL = 24
BURSTS = 3
M = 24
KINDS = ("fresh", "next turn", "branch", "spliced", "repeat")
WEIGHTS = (3, 3, 2, 2, 2)


def _largest(b: int, rows: int) -> int:
    """The largest room a request of the session asks: a next turn on the longest fresh prompt, fed twice."""
    fresh = 5 * b + b
    return fresh + 2 * (M + b) + M + rows


def cache(r) -> int:
    """About four of its largest requests, whole blocks, and a block (kern's pad)."""
    b = r.page
    return (4 * -(-_largest(b, r.rows) // b) + 1) * b


def _rng(r) -> random.Random:
    return random.Random(f"{getattr(r.opts, 'seed', 0)}:{r.target.model}:generated")


class Workload:
    def __init__(self, r, j: Judge) -> None:
        self.r, self.j = r, j
        self.b = block(r)
        self.room = _largest(self.b, r.rows) - M - r.rows  # the longest prompt it sends
        self.rng = _rng(r)
        self.prompts: list[list[int]] = []  # every prompt sent, in order
        self.seqs: list[list[int]] = []  # every prompt with its answer fed back
        self.kinds: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.repeats_right_after: list[str] = []  # immediate repeats whose hit was not the whole blocks

    def fresh(self) -> list[int]:
        return draw(self.rng, self.b * self.rng.randint(1, 5) + self.rng.randrange(self.b))

    def draw_prompt(self) -> tuple[str, list[int]]:
        kind = self.rng.choices(KINDS, WEIGHTS)[0] if self.prompts else "fresh"
        rng = self.rng
        if kind == "fresh":
            return kind, self.fresh()
        if kind == "next turn":
            recent = [s for s in self.seqs[-6:] if len(s) + self.b <= self.room]  # it may still be cached
            if not recent:
                return "fresh", self.fresh()
            seq = rng.choice(recent)
            return kind, seq + draw(rng, rng.randint(1, min(self.b, self.room - len(seq))))
        if kind == "spliced":  # the same blocks at the same positions behind another cached prefix
            longer = [p for p in self.prompts if len(p) > self.b]
            p = rng.choice(longer) if longer else None
            heads = [q for q in self.prompts if p is not None and len(q) >= self.b and q[:self.b] != p[:self.b]]
            if not heads:
                return "fresh", self.fresh()
            q = rng.choice(heads)
            head = self.b * rng.randint(1, min(len(q), len(p) - 1) // self.b)
            return kind, q[:head] + p[head:]
        if kind == "branch":
            p = rng.choice(self.prompts)
            keep = self.b * rng.randint(0, min(len(p), self.room - 1) // self.b)
            return kind, p[:keep] + draw(rng, rng.randint(1, min(2 * self.b, self.room - keep)))
        return kind, list(rng.choice(self.prompts[-3:]) if rng.random() < 0.5 else rng.choice(self.prompts))

    def serial(self, i: int) -> None:
        kind, ids = self.draw_prompt()
        right_after = kind == "repeat" and ids == self.prompts[-1]
        m = 1 if self.rng.random() < 0.15 else self.rng.randint(2, M)
        label = f"{i + 1} {kind} ({len(ids)} tokens)"
        a = self.j.serial(label, ids, m)
        self.kinds[kind] += 1
        if right_after:
            want = want_cached(len(ids), self.b, self.r.stateful)
            if self.r.opts.engine.has("cached-tokens") and a.cached < want:
                self.repeats_right_after.append(f"{label}: cached_tokens {a.cached} right after the same prompt, "
                                                f"want {want} (the whole blocks below its last token)")
        self.prompts.append(ids)
        self.seqs.append(ids + a.fed)

    def burst(self, k: int) -> None:
        calls = []
        for _ in range(self.rng.randint(4, 6)):
            kind, ids = self.draw_prompt()
            self.kinds[kind] += 1
            calls.append((ids, self.rng.randint(2, M)))
        twin = self.fresh()
        calls += [(twin, M), (list(twin), M // 2)]  # the same new prompt twice, at once
        self.rng.shuffle(calls)
        got = self.j.burst(f"burst {k + 1}", calls)
        for (ids, _), a in zip(calls, got):
            self.prompts.append(ids)
            if a is not None:
                self.seqs.append(ids + a.fed)


def run(r) -> None:
    j = Judge(r, "generated_equals_run")
    w = Workload(r, j)
    before = counted(r)
    for i in range(SERIAL):
        w.serial(i)
    r.serial_ends("generated_equals_run (bursts)")
    for k in range(BURSTS):
        w.burst(k)
    after = counted(r)
    kinds = ", ".join(f"{k} {n}" for k, n in w.kinds.items())
    extra = [f"seed {getattr(r.opts, 'seed', 0)}: {kinds}; a cache of {cache(r)} tokens"
             + (f", /stats: {after - before} evictions" if before is not None and after is not None else "")]
    j.add(not w.repeats_right_after, "; ".join(extra + w.repeats_right_after[:3]))
