"""`Same`: answers identical to the oracle's, with bounded near-tie excuses.

The oracle is duck-typed (`Oracle` below): `near_tie` returns evidence text for one disputed
token, and only evidence that starts with ``"near-tie"`` excuses it; `run` greedily continues a
context. An excused token is replaced in the oracle's answer by the server's, and the oracle
continues from there, so a later divergence is judged on the sequence the server actually ran.
The continuation may run as far as the longer of the two answers (kern's kept the oracle's first
length): after a near-tie the sequence differs, so it may stop (EOS) later than the oracle's first
answer did; if it stops elsewhere than the server's, the lengths still differ and that fails.
Length mismatches are never excused: they have no disputed token to ask about.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kern.tokens import BYTES

__all__ = ["EXCUSED_MAX", "PROMPT_CHARS", "Oracle", "Same", "divergence", "prompt_text", "served_text"]

EXCUSED_MAX = 3
"""Near-tie tokens excused per answer; the next divergence after these fails it."""


class Oracle(Protocol):
    """What `Same` asks of an oracle (kern run, or an exact reference)."""

    def near_tie(self, context: list[int], a: int, b: int, rows: int) -> str | None:
        """Evidence on `a` (server) vs `b` (oracle) after `context`; None when there is none."""
        ...

    def run(self, ids: list[int], steps: int, rows: int) -> list[int] | None:
        """The greedy continuation of `ids`, at most `steps` long; None when unavailable."""
        ...


def _first_mismatch(a: Sequence[int], b: Sequence[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def divergence(a: Sequence[int], b: Sequence[int]) -> str:
    """Where `a` (the answer got) and `b` (the one wanted) part, with four tokens from there on each side:
    ``first differs at token K (got N tokens, want M): got [...] want [...]``.

    `K` is the first differing index or, when one is a prefix of the other, the shorter length (then
    one side's list is empty: it stopped there).
    """
    a, b = list(a), list(b)
    if a == b:
        return f"identical ({len(a)} tokens)"
    k = _first_mismatch(a, b)
    if k is None:
        k = min(len(a), len(b))
    return f"first differs at token {k} (got {len(a)} tokens, want {len(b)}): got {a[k:k + 4]} want {b[k:k + 4]}"


PROMPT_CHARS = 60  # how much of a prompt a note quotes


def prompt_text(prompt: Sequence[int]) -> str:
    """A prompt in a note: its length and its start, as text when its ids are bytes (the toys' tokenizer)."""
    ids = list(prompt)
    if all(0 <= t < BYTES for t in ids):
        text = bytes(ids).decode("utf-8", "replace")
        quoted = repr(text[:PROMPT_CHARS] + ("..." if len(text) > PROMPT_CHARS else ""))
    else:
        quoted = str(ids[:12])[:-1] + (", ...]" if len(ids) > 12 else "]")
    return f"prompt ({len(ids)} tokens) {quoted}"


def served_text(cached: int | None, tier: str | None, prompt: Sequence[int]) -> str:
    """What an answer was served from, for a note: its ``cached_tokens``, its tier where told, its prompt."""
    head = "cached_tokens not told" if cached is None else f"cached_tokens {cached}"
    return head + (f", tier {tier}" if tier else "") + "; " + prompt_text(prompt)


class Same:
    """Counts answers identical to the oracle's; `ok` when every answer was (after excuses).

    ``same`` counts answers identical with nothing excused, ``matched`` those identical only after
    near-tie excuses, ``excused`` the excused tokens over all answers, and ``notes`` one entry per
    answer that diverged: ``"{label}: "`` (``"{label} [served from ...]: "`` for a server's answer: its
    ``cached_tokens`` and tier where told, and its prompt) and its divergences joined with ``"; then "``. ``first`` is the
    first answer that failed, as fields: ``label``, ``cached``, ``tier``, ``prompt`` (`prompt_text`),
    ``divergence``.
    """

    def __init__(self, oracle: Oracle, rows: int) -> None:
        self.oracle = oracle
        self.rows = rows
        self.n = 0
        self.same = 0
        self.matched = 0
        self.excused = 0
        self.notes: list[str] = []
        self.first: dict | None = None

    def add(self, label: str, prompt: Sequence[int], got: Sequence[int], want: Sequence[int],
            served: tuple[int | None, str | None] | None = None) -> bool:
        """Judge one answer `got` against the oracle's `want` for `prompt`; True when it counts.
        `served`: what a server's answer said it was served from, ``(cached_tokens, tier)`` (each None
        when not told), for the note; None for an answer that came from no server.

        Internal updates: ``n``, then ``same`` or ``matched``, ``excused``, ``notes`` and ``first``.
        """
        self.n += 1
        prompt, got, want = list(prompt), list(got), list(want)
        excused = 0
        notes: list[str] = []
        while got != want:
            k = _first_mismatch(got, want)
            # a prefix of the other: no disputed token, so nothing to ask the oracle about
            verdict = None if k is None else self.oracle.near_tie(prompt + want[:k], got[k], want[k], self.rows)
            notes.append(divergence(got, want) + (f" ({verdict})" if verdict else ""))
            if k is None or not (verdict or "").startswith("near-tie") or excused == EXCUSED_MAX:
                break
            excused += 1
            # continue from the server's token; the oracle supplies the rest, as far as either
            # answer reached: the excused token may move where the answer stops (its EOS)
            head = want[:k] + [got[k]]
            steps = max(len(want), len(got)) - k - 1
            rest = self.oracle.run(prompt + head, steps, self.rows) if steps > 0 else []
            if rest is None:
                notes.append("no continuation from the oracle")
                break
            want = head + rest
        self.excused += excused
        if notes:
            cached, tier = served or (None, None)
            told = f" [served from {served_text(cached, tier, prompt)}]" if served is not None else ""
            self.notes.append(f"{label}{told}: " + "; then ".join(notes))
        if got != want:
            if self.first is None:
                self.first = {"label": label, "cached": cached, "tier": tier, "prompt": prompt_text(prompt),
                              "divergence": notes[-1] if notes else divergence(got, want)}
            return False
        if excused:
            self.matched += 1
        else:
            self.same += 1
        return True

    @property
    def ok(self) -> bool:
        """Every answer was identical, some after excused near-ties."""
        return self.same + self.matched == self.n

    def __str__(self) -> str:
        head = f"{self.same}/{self.n} identical"
        if self.excused:
            head += f", {self.matched} after {self.excused} near-tie tokens"
        return "; ".join([head, *self.notes])
