"""The order in which waiting requests are tried for room: an admission policy with a name.

Two policies (`Rule.name`):

- ``fifo``: first come, first served. Only the head of the queue is tried; while it does not fit,
  nothing behind it starts.
- ``fair`` (kern serve's default): the head is tried first, exactly as ``fifo``; when it does not fit,
  the requests behind it are tried in their order and the first that fits starts (it *bypasses* the
  head): `LOOK` of them at most, among the first `SCAN` waiting, none reserving at least as many
  pages as one already refused in the round. A head bypassed `Rule.bypass` times is not bypassed again: until it starts, it is the only
  request tried, so a long request is not starved by a stream of short ones. And a client (an API key
  or a peer address: whatever the caller names) holding more than its share of pages or of running
  rows is *deferred*: its waiting requests are passed over while another client has one waiting. A
  client holding nothing is never over its share, so its first request is always in the line; when
  every waiting request is deferred, the line is the whole queue again.

With one client, a head that fits and nobody over a share, the two orders are the same.

`Turns` keeps the accounting the policy needs (what each client holds, how many requests each has
waiting) and answers `order`: the positions of the waiting tickets to try, in order. It owns no
queue: the caller keeps its waiting list in arrival order and tells `Turns` what happens to it
(`arrive`, `withdraw`, `seat`, `leave`). Pure: no I/O, no clock.
"""

from __future__ import annotations

from typing import Iterable, Iterator
from dataclasses import dataclass

__all__ = ["LOOK", "POLICIES", "SCAN", "Rule", "Ticket", "Turns"]

POLICIES = ("fair", "fifo")
LOOK = 32  # requests behind the head tried in one round, at most (a long queue costs a bounded round)
SCAN = 1024  # waiting requests read in one round, at most (those further back wait for the next rounds)


@dataclass(frozen=True, slots=True)
class Rule:
    """An admission policy and its bounds (kern serve's --admission, --client-page-share,
    --client-row-share, --max-bypass)."""

    name: str = "fair"
    page_share: float = 0.5  # of the pool's pages one client may hold before it is deferred
    row_share: float = 0.5  # of the running rows (--max-seqs) one client may hold before it is deferred
    bypass: int = 64  # times a head may be bypassed; then it alone is tried until it starts

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"admission policy {self.name!r}: one of {', '.join(POLICIES)}")
        for what, v in (("page share", self.page_share), ("row share", self.row_share)):
            if not 0 < v <= 1:
                raise ValueError(f"{what} {v} must be in (0, 1]")
        if self.bypass < 0:
            raise ValueError(f"bypass bound {self.bypass} must be >= 0")


@dataclass(eq=False, slots=True)
class Ticket:
    """One waiting request as the policy sees it: whose, how many pages it reserves, how many times
    it was bypassed while at the head."""

    client: str
    pages: int
    passed: int = 0


class Turns:
    """What each client holds and has waiting, and the order of trial under `rule`."""

    def __init__(self, rule: Rule, pages: int, rows: int) -> None:
        self.rule = rule
        self.page_cap = max(1, int(rule.page_share * pages))
        self.row_cap = max(1, int(rule.row_share * rows))
        self.pages: dict[str, int] = {}  # client -> pages its running requests reserve
        self.rows: dict[str, int] = {}  # client -> its running requests
        self.waiting: dict[str, int] = {}  # client -> its waiting requests
        self.queued = 0  # waiting requests, all clients

    # what happens to a ticket

    def arrive(self, t: Ticket) -> None:
        self.waiting[t.client] = self.waiting.get(t.client, 0) + 1
        self.queued += 1

    def withdraw(self, t: Ticket) -> None:
        """`t` left the queue without starting (aborted, refused, timed out)."""
        _take(self.waiting, t.client, 1)
        self.queued -= 1

    def seat(self, t: Ticket, head: Ticket | None = None) -> None:
        """`t` left the queue and started; `head` is this round's head when `t` bypassed it."""
        _take(self.waiting, t.client, 1)
        self.queued -= 1
        self.pages[t.client] = self.pages.get(t.client, 0) + t.pages
        self.rows[t.client] = self.rows.get(t.client, 0) + 1
        if head is not None and head is not t:
            head.passed += 1

    def leave(self, t: Ticket) -> None:
        """A started request ended: what it held is its client's no more."""
        _take(self.pages, t.client, t.pages)
        _take(self.rows, t.client, 1)

    def requeue(self, t: Ticket) -> None:
        """A started request went back to the queue (its state was lost)."""
        self.leave(t)
        self.arrive(t)

    # the order

    def over(self, t: Ticket) -> bool:
        """Starting `t` takes its client past a share (a client holding nothing never is)."""
        rows = self.rows.get(t.client, 0)
        return rows > 0 and (self.pages.get(t.client, 0) + t.pages > self.page_cap or rows + 1 > self.row_cap)

    def deferred(self, t: Ticket) -> bool:
        """`t` is passed over: its client is over a share and another client has a request waiting."""
        return self.waiting.get(t.client, 0) < self.queued and self.over(t)

    def order(self, tickets: Iterable[Ticket]) -> Iterator[int]:
        """Positions in `tickets` (the waiting queue, oldest first, not empty) to try, in order; the
        first is this round's head. Lazy, reading `tickets` as far as it goes: the caller stops at the
        first that starts. `tickets` is read twice when every waiting request is deferred."""
        if self.rule.name == "fifo":
            yield 0
            return
        got = yield from self._line(tickets, skip=True)
        if not got:  # every waiting request is deferred: shares say nothing between them
            yield from self._line(tickets, skip=False)

    def _line(self, tickets: Iterable[Ticket], skip: bool) -> Iterator[int]:
        n = 0
        smallest = None  # the fewest pages a request tried this round reserves (one at least as large is skipped)
        for i, t in enumerate(tickets):
            if i >= SCAN:
                break
            if skip and self.deferred(t):
                continue
            if n and smallest is not None and t.pages >= smallest:
                continue
            yield i
            if n == 0 and t.passed >= self.rule.bypass:
                return 1
            n += 1
            smallest = t.pages if smallest is None else min(smallest, t.pages)
            if n > LOOK:
                break
        return n


def _take(d: dict[str, int], k: str, n: int) -> None:
    left = d.get(k, 0) - n
    if left < 0:
        raise ValueError(f"client {k!r}: {n} more taken than it holds")
    if left:
        d[k] = left
    else:
        d.pop(k, None)
