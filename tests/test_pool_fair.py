"""pool/fair.py against a reference model written from its docstring: after every step of random
arrivals, withdrawals, admission rounds and finishes, the policy's order of trial equals the model's
(recomputed from scratch from the queue and the running list), its accounting equals the model's
recount, and no head is bypassed more than the bound. A simulated pool seats the first request in
the order whose pages fit, as the core does."""

from __future__ import annotations

import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pool.fair import LOOK, SCAN, Rule, Ticket, Turns

PAGES, ROWS = 40, 6
CLIENTS = ["a", "b", "c"]


def reference_order(rule: Rule, waiting: list[Ticket], running: list[Ticket], pages: int, rows: int) -> list[int]:
    """The order of trial, from the docstring alone."""
    if not waiting:
        return []
    if rule.name == "fifo":
        return [0]
    page_cap, row_cap = max(1, int(rule.page_share * pages)), max(1, int(rule.row_share * rows))

    def over(t: Ticket) -> bool:
        mine = [r for r in running if r.client == t.client]
        return bool(mine) and (sum(r.pages for r in mine) + t.pages > page_cap or len(mine) + 1 > row_cap)

    def deferred(t: Ticket) -> bool:
        return over(t) and any(w.client != t.client for w in waiting)

    seen = waiting[:SCAN]
    line = [i for i, t in enumerate(seen) if not deferred(t)] or list(range(len(seen)))
    head = line[0]
    if waiting[head].passed >= rule.bypass:
        return [head]
    out, smallest = [head], waiting[head].pages
    for i in line[1:]:
        if len(out) > LOOK:
            break
        if waiting[i].pages < smallest:
            out.append(i)
            smallest = waiting[i].pages
    return out


class Machine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.rule_ = None

    @precondition(lambda self: self.rule_ is None)
    @rule(name=st.sampled_from(["fair", "fifo"]), page=st.sampled_from([0.25, 0.5, 1.0]),
          row=st.sampled_from([0.34, 0.5, 1.0]), bypass=st.integers(0, 3))
    def start(self, name, page, row, bypass) -> None:
        self.rule_ = Rule(name, page, row, bypass)
        self.turns = Turns(self.rule_, PAGES, ROWS)
        self.waiting: list[Ticket] = []
        self.running: list[Ticket] = []

    @precondition(lambda self: self.rule_ is not None)
    @rule(client=st.sampled_from(CLIENTS), pages=st.integers(1, 30))
    def arrive(self, client, pages) -> None:
        t = Ticket(client, pages)
        self.turns.arrive(t)
        self.waiting.append(t)

    @precondition(lambda self: self.rule_ is not None and self.waiting)
    @rule(data=st.data())
    def withdraw(self, data) -> None:
        t = self.waiting.pop(data.draw(st.integers(0, len(self.waiting) - 1)))
        self.turns.withdraw(t)

    @precondition(lambda self: self.rule_ is not None and self.running)
    @rule(data=st.data())
    def finish(self, data) -> None:
        t = self.running.pop(data.draw(st.integers(0, len(self.running) - 1)))
        self.turns.leave(t)

    @precondition(lambda self: self.rule_ is not None and self.waiting)
    @rule()
    def admit(self) -> None:
        """One round: try the order, seat the first whose pages fit (while a row is free)."""
        if len(self.running) >= ROWS:
            return
        want = reference_order(self.rule_, self.waiting, self.running, PAGES, ROWS)
        free = PAGES - sum(t.pages for t in self.running)
        tried, seated = [], False
        for i in self.turns.order(list(self.waiting)):
            tried.append(i)
            if self.waiting[i].pages <= free:
                head = self.waiting[tried[0]]
                t = self.waiting.pop(i)
                self.turns.seat(t, head)
                self.running.append(t)
                seated = True
                break
        assert tried == (want[: len(tried)] if seated else want), (tried, want)

    @invariant()
    def accounting(self) -> None:
        if self.rule_ is None:
            return
        pages: dict[str, int] = {}
        rows: dict[str, int] = {}
        waiting: dict[str, int] = {}
        for t in self.running:
            pages[t.client] = pages.get(t.client, 0) + t.pages
            rows[t.client] = rows.get(t.client, 0) + 1
        for t in self.waiting:
            waiting[t.client] = waiting.get(t.client, 0) + 1
        assert (self.turns.pages, self.turns.rows, self.turns.waiting) == (pages, rows, waiting)
        assert self.turns.queued == len(self.waiting)
        assert all(t.passed <= self.rule_.bypass for t in self.waiting), [t.passed for t in self.waiting]


TestFairMachine = Machine.TestCase
TestFairMachine.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)


def test_fair_is_fifo_while_the_head_fits_and_no_one_is_over_a_share():
    """Seeded runs: one client, every request fitting as it comes: fair seats exactly fifo's order."""
    rng = random.Random(41)
    for _ in range(200):
        seated = {}
        sizes = [rng.randint(1, 50) for _ in range(rng.randint(1, 20))]
        for name in ("fair", "fifo"):
            turns, waiting, order = Turns(Rule(name, 1.0, 1.0), 10**6, 10**6), [], []
            for k, n in enumerate(sizes):
                t = Ticket("one", n)
                turns.arrive(t)
                waiting.append((k, t))
            while waiting:
                i = next(turns.order([t for _, t in waiting]))
                k, t = waiting.pop(i)
                turns.seat(t)
                order.append(k)
            seated[name] = order
        assert seated["fair"] == seated["fifo"] == sorted(seated["fifo"])


def test_a_head_bypassed_k_times_is_the_only_one_tried():
    turns = Turns(Rule("fair", 1.0, 1.0, bypass=2), 100, 10)
    head, small = Ticket("a", 90), [Ticket("b", 1) for _ in range(4)]
    for t in [head, *small]:
        turns.arrive(t)
    queue = [head, *small]
    for _ in range(2):  # the head does not fit; the first small one behind it does
        got = list(turns.order(queue))
        assert got[0] == 0 and got[1] == 1
        turns.seat(queue.pop(1), head)
    assert head.passed == 2 and list(turns.order(queue)) == [0]


def test_a_client_over_its_share_waits_while_another_client_waits():
    turns = Turns(Rule("fair", 0.5, 1.0), 100, 10)
    mine = Ticket("a", 40)
    turns.arrive(mine)
    turns.seat(mine)
    more, other = Ticket("a", 20), Ticket("b", 30)
    for t in (more, other):
        turns.arrive(t)
    assert list(turns.order([more, other])) == [1]  # a holds 40 of its 50: 20 more is over
    turns.withdraw(other)
    assert list(turns.order([more])) == [0]  # nobody else waits: a's request is tried


def test_accounting_refuses_to_go_negative():
    turns = Turns(Rule(), 10, 2)
    with pytest.raises(ValueError, match="more taken"):
        turns.leave(Ticket("a", 1))
    with pytest.raises(ValueError, match="admission policy"):
        Rule("lifo")
