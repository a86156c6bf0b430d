"""The state tiers through a real server: snapshots park to the host tier when the pool is small and a
later turn wakes them; a lined target started with 2 slots grows them by remaps; --rows 1 on a spec
target answers the same. Answers equal toy/model.py throughout, and nothing is leaked.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from conftest import PROMPTS, SUFFIX, ask, assert_nothing_leaked, oracle

M = 32


def turn2(ids: list[int], answer: list[int]) -> list[int]:
    return ids + answer + list(SUFFIX.encode())


def lined_hit(ids: list[int], answer: list[int]) -> int:
    """A plain-decode lined snapshot holds the prompt and every answer token fed back: all but the
    last it emitted (the stop token, or the last one at length)."""
    return len(ids) + len(answer) - 1


@pytest.mark.parametrize("target", ["toy-stateful", "toy-paged"])
def test_snapshots_park_and_wake(kern_server, target):
    page = 16
    prompts = [list(p.encode()) for p in PROMPTS]
    longest = max(len(p) for p in prompts) + M + len(SUFFIX) + 1
    capacity = (4 * math.ceil((longest + 16) / page) + 1) * page
    server = kern_server(target, "--capacity", str(capacity), "--host-gib", "0.25", "--max-seqs", "4")
    firsts = []
    for ids in prompts[:4]:
        got = ask(server, ids, M)
        assert got["ids"] == oracle(target, ids, M)
        firsts.append(got["ids"])
    # fill until a turn-2 snapshot has parked
    n = 4
    while n < 48:
        parked = set(server.stats()["parked_lengths"])
        if n >= 12 and parked:
            break
        ids = list(((f"{n}. " if n >= 12 else "") + PROMPTS[n % 12]).encode())
        assert ask(server, ids, M)["ids"] == oracle(target, ids, M)
        n += 1
    for ids, first in zip(prompts[:4], firsts):
        ids2 = turn2(ids, first)
        assert ask(server, ids2, M)["ids"] == oracle(target, ids2, M)
    c = assert_nothing_leaked(server)["counters"]
    assert c["parks"] >= 1 and c["wakes"] >= 1 and c["host_hits"] >= 1, c
    assert c["wake_tokens"] == c["host_hit_tokens"]


def test_lined_slots_grow_by_remaps(kern_server):
    target = "toy-stateful"
    server = kern_server(target, "--max-seqs", "2")
    facts = server.stats()["facts"]
    assert facts["seq_slots"] == 4
    prompts = [list(p.encode()) for p in PROMPTS]
    with ThreadPoolExecutor(12) as pool:
        firsts = list(pool.map(lambda ids: ask(server, ids, M, stream=True), prompts))
    for ids, got in zip(prompts, firsts):
        assert got["ids"] == oracle(target, ids, M)
        assert got["kern"]["snapshot"] == "kept"
    for ids, got in zip(prompts[:4], firsts):
        ids2 = turn2(ids, got["ids"])
        again = ask(server, ids2, M)
        assert again["ids"] == oracle(target, ids2, M)
        assert again["cached"] == lined_hit(ids, got["ids"])
    s = assert_nothing_leaked(server)
    assert s["counters"]["remaps"] >= 1
    assert s["gauges"]["slots"] > facts["seq_slots"]


@pytest.mark.parametrize("target", ["toy-spec", "toy-stateful-spec"])
def test_rows_1_answers_the_same(kern_server, target):
    server = kern_server(target, "--rows", "1")
    assert server.stats()["facts"]["rows"] == 1
    for p in PROMPTS[:4]:
        ids = list(p.encode())
        assert ask(server, ids, M)["ids"] == oracle(target, ids, M)
    s = assert_nothing_leaked(server)
    assert s["counters"]["rounds"] == 0


@pytest.mark.parametrize("target, parks", [("toy-stateful", 1), ("toy-paged", 0)])
def test_wake_room_fits_exactly_one_turn_2(kern_server, target, parks):
    # the pool holds one worst-case turn 2 and the pad: a lined target parks its snapshot once and
    # wakes it into the lease; a paged one continues in place; a request filling the pool is refused
    page = 16
    ids = list(PROMPTS[0].encode())
    first = oracle(target, ids, M)
    ids2 = turn2(ids, first)
    capacity = (math.ceil((len(ids2) + M) / page) + 1) * page
    server = kern_server(target, "--capacity", str(capacity), "--host-gib", "0.25")
    assert ask(server, ids, M)["ids"] == first
    got = ask(server, ids2, M)
    assert got["ids"] == oracle(target, ids2, M) and got["cached"] > 0
    c = assert_nothing_leaked(server)["counters"]
    assert c["parks"] == parks and c["wakes"] == parks
    r = httpx.post(server.url + "/v1/completions", json={"prompt": [65] * 8, "max_tokens": capacity - 8}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
