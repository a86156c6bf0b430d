"""The explore session's generator (e2e/scenarios/explore.py): a seed gives one plan, and the plan
reaches each limit it claims. The plans are checked without a server (the packed calls through
`serve.core.pack.pack` itself, EOS through the reference); the last test gates the session on the shipped
code of a target that packs prefill.
"""

from __future__ import annotations

import json
import random
import types
from pathlib import Path

import pytest

from e2e.scenarios import explore
from oracle.reference import Reference
from serve.core.pack import Bounds, Waiting, pack

ROOT = Path(__file__).resolve().parent.parent
TOY = ROOT / "manifests" / "toy"


def calls_of(lengths: list[int], b: Bounds) -> list[tuple[list[tuple[int, int]], int]]:
    """The packed prefill calls of prompts all waiting at once, oldest first: [(plan, call context)]."""
    state = [[0, n] for n in lengths]  # pos, left
    out = []
    while any(left for _, left in state):
        plan = pack([Waiting(p, left) for p, left in state], b)
        assert plan, state
        out.append((plan, sum(state[i][0] + n for i, n in plan)))
        for i, n in plan:
            state[i][0] += n
            state[i][1] -= n
    return out


def fake_run(seed: int, model: str = "toy-layers", pack_facts: bool = True):
    facts = {"page": 16, "rows": 1, "chunk": 2048}
    server = dict(facts, pack=pack_facts, context=16384 if pack_facts else None)
    return types.SimpleNamespace(opts=types.SimpleNamespace(seed=seed), target=types.SimpleNamespace(model=model),
                                 page=16, rows=1, facts={"default": facts}, server_facts={"default": server},
                                 host_page_bytes=lambda: 4096)


@pytest.mark.parametrize("bound,chunk", [(16384, 2048), (1000, 64), (300, 40)])
def test_the_packed_burst_meets_the_context_bound_exactly_with_one_row_left_over(bound, chunk):
    """Each drawn plan: one call holds the long prompt's last chunk and the short one's first rows, its
    context the bound exactly; the bound (not the call's rows) leaves the short prompt's last row to
    the next call, so a bound off by one would make that call's context bound + 1."""
    for seed in range(40):
        p = explore.draw_pack(bound, chunk, random.Random(seed))
        assert p["bound"] == bound and chunk // 2 <= p["chunk"] <= chunk and len(p["bursts"]) == 1
        (burst,) = p["bursts"]
        calls = calls_of(burst["fed"], Bounds(p["chunk"], 8, bound))
        assert max(c for _, c in calls) == bound
        both = [plan for plan, c in calls if c == bound]
        assert both and [i for i, _ in both[0]] == [0, 1]
        a, b = burst["fed"]
        split = [plan for plan, _ in calls if 1 in dict(plan)]
        assert [dict(x)[1] for x in split] == [b - 1, 1], split  # the bound cut B one row short
        assert sum(n for _, n in split[0]) < p["chunk"]  # ... and not the call's rows
        off = calls_of(burst["fed"], Bounds(p["chunk"], 8, bound + 1))
        assert max(c for _, c in off) == bound + 1  # what `pack-context-bound-off-by-one` sends
        late = explore.draw_pack(bound, chunk, random.Random(seed), emits=False)  # the last token goes with a step
        assert [n - 1 for n in late["bursts"][0]["lengths"]] == burst["fed"]


def test_a_packing_target_gets_a_chunk_and_a_pool_for_the_bound():
    flags = explore.flags(fake_run(0))
    p = explore.pack_plan(fake_run(0))
    assert flags[flags.index("--chunk") + 1] == str(p["chunk"])
    capacity = int(flags[flags.index("--capacity") + 1])
    assert capacity >= p["bound"] + p["chunk"] + 4 * explore.PACK_TOKENS and capacity % 16 == 0
    assert explore.compaction_plan(fake_run(0)) is None


def test_the_compaction_phase_compacts_the_heap_then_must_evict():
    """A paged target that does not pack: prefill one page per call; the churn's rounds (each leaves
    one stale item in the device heap) outnumber `Prefix._compact`'s 2 * resident + 64 less the
    resident entries, with every entry any earlier request can have left; the pool then has too
    little room left for each fresh prompt after the long one, which must evict. A lined target
    (checkpoints at request end) gets no such phase. (That the session compacts and the evictions
    tell a lost recency: CI gates the mutant `compaction-forgets-recency`.)"""
    for seed in range(20):
        r = fake_run(seed, model="toy-paged", pack_facts=False)
        flags = explore.flags(r)
        c = explore.compaction_plan(r)
        assert flags[flags.index("--chunk") + 1] == "16" == str(c["chunk"])
        assert int(flags[flags.index("--capacity") + 1]) == c["pages"] * 16
        # each earlier request leaves at most two entries (a new branch and its conversation's), the edges
        # three requests, then the conversations and the churn's three
        resident = 2 * (explore.REQUESTS + 3) + explore.CONVERSATIONS + 3
        assert c["cycles"] > resident + 64
        assert sorted(c["touch"]) == list(range(explore.CONVERSATIONS)) and c["touch"] != sorted(c["touch"]) or seed
        held = 1 + -(-(c["g"] + 1) // 16) + sum(n // 16 for n in c["conversations"])  # pad, long prompt, their pages
        slack = c["pages"] - held
        # the long prompt's lease fills the pool but for what the churn keeps (a's and b's entries: x's two
        # pages and one each); once it ends, its last page alone is free, and each fresh prompt's three pages
        # need one conversation (two pages) evicted
        assert slack == explore.CHURN_PAGES == 2 + 2 and all(-(-(n + 1) // 16) == 3 for n in c["f"])
    stateful = fake_run(0, model="toy-stateful", pack_facts=False)
    stateful.stateful = True
    assert explore.compaction_plan(stateful) is None and "--chunk" not in explore.flags(stateful)


def test_a_seed_gives_one_plan():
    """`--seed S` replays: flags, the serial workload and the packed plan are the seed's alone."""
    def plan(seed):
        r = fake_run(seed)
        rng = explore.rng_of(r)
        return explore.draw_flags(r, rng), explore.workload(r, rng), explore.pack_plan(r), explore.room_edge(
            1000, 1, rng)

    assert plan(3) == plan(3)
    assert len({json.dumps(plan(s)) for s in range(8)}) == 8


@pytest.mark.parametrize("room,rows", [(8192, 1), (304, 1), (16368, 4)])
def test_the_room_edge_is_the_room_exactly(room, rows):
    for seed in range(30):
        ids, m = explore.room_edge(room, rows, random.Random(seed))
        assert m >= 1 and len(ids) + m + rows - 1 == room


def test_the_eos_edge_puts_eos_at_the_last_allowed_token():
    """With `max_tokens` k the reference's answer ends on EOS as its k-th (last allowed) token; with
    k - 1 it ends by length, one token short of it."""
    ref = Reference(ROOT / "toy" / "model.py", TOY / "toy-paged.json")
    found = 0
    for seed in range(10):
        got = explore.eos_edge(ref, 1, random.Random(seed))
        if got is None:
            continue
        found += 1
        ids, k = got
        assert len(ref.run(ids, k)) == k - 1  # k - 1 tokens, then EOS: the k-th
        assert len(ref.run(ids, k - 1)) == k - 1  # ends by length
    assert found >= 8


def test_the_session_passes_on_the_shipped_code_and_records_its_requests(tmp_path):
    """toy-layers packs prefill under a context bound: the gate's explore session reaches it, passes,
    and writes the requests it sent as plain dicts."""
    from e2e.cli import main

    out = tmp_path / "results"
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(out), "--backend", "cpu", "--port", "0", "--max-tokens", "12", "--targets", "toy-layers",
              "--scenarios", "explore_equals_run", "policy_explore"])
    report = json.loads((out / "toy-layers" / "report.json").read_text())
    assert exc.value.code == 0, report["checks"]
    rec = json.loads((out / "toy-layers" / "explore-requests.json").read_text())
    assert rec["seed"] == 0 and "--chunk" in rec["flags"]
    labels = [q["label"] for q in rec["requests"]]
    assert any("packed call at the context bound, one row left over" in x for x in labels)
    assert any(q["expect"] == "context_length_exceeded" for q in rec["requests"])
    assert any(q["concurrent"] for q in rec["requests"])
    for q in rec["requests"]:
        assert set(q) == {"label", "prompt", "max_tokens", "concurrent", "expect"}
        assert all(isinstance(t, int) for t in q["prompt"])
