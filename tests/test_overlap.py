"""The next launch sent before the last one is committed (`kern serve --overlap`: runtime/multistep.py's
`launch(..., follow)`, serve/core/core.py's pending launch), held to the plain path on the CPU backend.

Two properties:

- the runtime: a chain of launches, each issued before the last is collected, each cell of one fed on
  the device from a row of the last (any order, any subset; a sequence sitting a launch out rejoins
  with its anchor from the host), returns for every sequence exactly the tokens single decode steps
  emit, and leaves every page but the pad's byte for byte as they do;
- the core: with overlap on, over random lengths, stop token ids, arrivals and aborts, every answer that
  was not aborted (tokens and finish reason) equals the one-step-a-launch core's and the toy model's,
  launches really were chained, and an idle core holds no lease but the pad's (pages held == pages named).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.step import Cell
from serve.core.answer import Stops
from serve.core.core import Core
from serve.core.request import EOS, Request, Status
from tests.test_multistep import _pages_but_pad, _prefilled, _seqs, _single
from toy import model as tm


def chained(rt, seqs, k: int, launches: list[tuple[list[int], list[int]]]) -> tuple[list[list[int]], list[int]]:
    """Send each launch (the sequences in its rows, their limits) before collecting the one before, each
    sequence that was in that one fed on the device from its row there (`follow`), the others from the
    host. A sequence that ran short of k in the launch before sits the next out (its last row is not its
    token). Each sequence's tokens, and how many each was asked for."""
    pos = [p for _, _, p in seqs]
    anchor = [a for _, a, _ in seqs]
    total = [0] * len(seqs)
    got: list[list[int]] = [[] for _ in seqs]
    rows: dict[int, int] = {}  # sequence -> its row in the launch still open
    full: set[int] = set()  # the sequences of that launch that ran all k steps
    last, last_order = None, []
    for order, limits in launches:
        kept = [(g, m) for g, m in zip(order, limits) if g not in rows or g in full]
        if not kept:
            continue
        order, limits = [g for g, _ in kept], [m for _, m in kept]
        follow = [rows.get(g, -1) for g in order]
        # a followed sequence's position: where the open launch's k steps leave it
        cells = [Cell(seqs[g][0], None, [anchor[g]], pos[g] + (k if g in rows else 0)) for g in order]
        launched = rt.launch_steps("decode", cells, k, limits, follow if last is not None else None)
        if last is not None:
            for g, toks in zip(last_order, rt.collect(last)):
                got[g] += toks
                pos[g] += len(toks)
                anchor[g] = toks[-1]
        last, last_order = launched, order
        rows = {g: i for i, g in enumerate(order)}
        full = {g for g, m in zip(order, limits) if m == k}
        for g, m in zip(order, limits):
            total[g] += m
    if last is not None:
        for g, toks in zip(last_order, rt.collect(last)):
            got[g] += toks
    return got, total


@settings(max_examples=30, deadline=None)
@given(prompts=st.lists(st.binary(min_size=1, max_size=30), min_size=1, max_size=5), k=st.integers(1, 5),
       data=st.data(), name=st.sampled_from(["toy-paged", "toy-attn"]))
def test_chained_launches_fed_on_the_device_equal_single_steps(prompts, k, data, name):
    n = len(prompts)
    seqs = _seqs(prompts)
    launches = []
    for _ in range(data.draw(st.integers(1, 4), label="launches")):
        order = data.draw(st.permutations(range(n)), label="order")[: data.draw(st.integers(1, n), label="size")]
        launches.append((order, data.draw(st.lists(st.integers(1, k), min_size=len(order), max_size=len(order)),
                                          label="limits")))
    many = _prefilled(prompts, name)
    got, total = chained(many, seqs, k, launches)
    live = [g for g in range(n) if total[g]]
    one = _prefilled(prompts, name)
    want = _single(one, [seqs[g] for g in live], [total[g] for g in live])
    assert [got[g] for g in live] == want
    assert all(np.array_equal(a, b) for a, b in zip(_pages_but_pad(many), _pages_but_pad(one)))


def test_a_plain_step_between_chained_launches_leaves_them_their_tokens():
    """A step of another program between two chained launches (a prefill call of a newly admitted request,
    as the overlapped core makes) does not touch what the second reads: its tokens equal single steps'.
    A launch that follows none is refused by name."""
    prompts = [b"first prompt", b"second", b"a third one, to prefill between"]
    seqs = _seqs(prompts)
    rt = _prefilled(prompts[:2])
    cells = [Cell(pages, None, [a], pos) for pages, a, pos in seqs[:2]]
    with pytest.raises(ValueError, match="no launch before"):
        rt.launch_steps("decode", cells, 3, [3, 3], [0, 1])
    first = rt.launch_steps("decode", cells, 3, [3, 3])
    pages, _, pos = seqs[2]
    rt.step("prefill", [Cell(pages, None, list(prompts[2][:-1]), 0)])
    later = [Cell(pages, None, [0], pos + 3) for pages, _, pos in seqs[:2]]
    second = rt.launch_steps("decode", later, 3, [3, 3], [0, 1])
    got = [a + b for a, b in zip(rt.collect(first), rt.collect(second))]
    assert got == _single(_prefilled(prompts[:2]), seqs[:2], [6, 6])


def _core(target: str, k: int, overlap: bool, max_seqs: int) -> Core:
    from serve.core.engine import Options, build

    e = build(target, Options(backend="cpu", decode_steps=k, overlap=overlap, capacity=8192, max_seqs=max_seqs))
    assert e.overlap is overlap and e.decode_steps == k
    return Core(e)


PROMPTS = [b"The lighthouse keeper", b"To make a proper risotto", b"A hash map trades", b"kern"]


def _serve(core: Core, asks: list, aborts: dict[int, int], arrivals: dict[int, int],
           ignore_eos: bool = False) -> dict[str, tuple]:
    """Drive `core` as the scheduler thread does: request i arrives at iteration `arrivals[i]` (else at
    the start), is aborted at iteration `aborts[i]`; the answers (tokens, reason) of those not aborted."""
    sinks: dict[str, list] = {}
    reqs = []
    for i, (p, m, stop) in enumerate(asks):
        sinks[f"r{i}"] = sink = []
        stops = Stops([], [stop], False) if stop is not None else None
        reqs.append(Request(f"r{i}", list(PROMPTS[p]) + [i], m, 1, sink.append, stops=stops,
                            ignore_eos=ignore_eos))
    for it in range(2000):
        for i, req in enumerate(reqs):
            if arrivals.get(i, 0) == it:
                core.submit(req)
            if aborts.get(i) == it and arrivals.get(i, 0) <= it and req.status in (Status.WAITING, Status.RUNNING):
                core.abort(req)
        if it > max(arrivals.values(), default=0) and not (core.waiting or core.running):
            break
        core.admit()
        core.run(core.schedule())
    assert not core.waiting and not core.running and core.pending is None
    e = core.engine
    assert e.pool.leases == 1, "an idle core holds a lease besides the pad's"
    assert core.gauges()["pages_used"] == e.pad_pages + core.gauges()["snapshot_pages"]
    return {r.id: ([t for u in sinks[r.id] for t in u.tokens], sinks[r.id][-1].done.reason)
            for r in reqs if r.status is Status.FINISHED}


@settings(max_examples=25, deadline=None)
@given(asks=st.lists(st.tuples(st.integers(0, len(PROMPTS) - 1), st.integers(1, 40),
                               st.one_of(st.none(), st.integers(32, 126))), min_size=1, max_size=8),
       k=st.integers(2, 6), max_seqs=st.integers(1, 6), data=st.data(),
       target=st.sampled_from(["toy-paged", "toy-attn"]))
def test_an_overlapped_core_answers_as_one_step_a_launch_does(asks, k, max_seqs, data, target):
    n = len(asks)
    aborts = data.draw(st.dictionaries(st.integers(0, n - 1), st.integers(0, 30), max_size=2), label="aborts")
    arrivals = data.draw(st.dictionaries(st.integers(0, n - 1), st.integers(0, 20), max_size=n), label="arrivals")
    core = _core(target, k, True, max_seqs)
    chained = []
    launch = core.device.launch_steps

    def spy(program, cells, k, limits, follow=None):
        chained.append(follow is not None)
        return launch(program, cells, k, limits, follow)

    core.device.launch_steps = spy
    got = _serve(core, asks, aborts, arrivals)
    want = _serve(_core(target, 1, False, max_seqs), asks, {}, arrivals)
    manifest = json.load(open(f"manifests/toy/{target}.json"))
    for rid, (toks, reason) in got.items():
        assert (toks, reason) == want[rid], rid
        i = int(rid[1:])
        ref = tm.generate(list(PROMPTS[asks[i][0]]) + [i], asks[i][1], manifest)
        assert toks == (ref + [EOS])[: len(toks)], rid
    # a request that needs more than three launches had the next launch chained to it
    if not aborts and any(m > 3 * k for _, m, stop in asks if stop is None):
        assert any(chained), "no launch was chained"


def test_a_steady_batch_chains_every_launch_after_its_first():
    """Sixteen requests admitted at once, 48 tokens each at 8 steps a launch: after the first launch of the
    batch, every launch is fed on the device (the batch never changes until all finish together)."""
    core = _core("toy-paged", 8, True, 16)
    follows = []
    launch = core.device.launch_steps

    def spy(program, cells, k, limits, follow=None):
        follows.append(follow)
        return launch(program, cells, k, limits, follow)

    core.device.launch_steps = spy
    got = _serve(core, [(i % len(PROMPTS), 48, None) for i in range(16)], {}, {}, ignore_eos=True)
    assert len(got) == 16 and all(reason == "length" and len(t) == 48 for t, reason in got.values())
    assert follows[0] is None and len(follows) == 6  # 48 = 1 (prefill) + 47: 6 launches, the last of 7 steps
    assert all(f == list(range(16)) for f in follows[1:]), follows
