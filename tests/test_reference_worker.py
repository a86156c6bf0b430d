"""The reference in a worker process of its own (`Reference(worker=True)`), or several
(`worker=N`, calls routed by their prompt's start), answers as it does in process: the same answers, paths and logits, whether asked cold or after `prefetch`; a worker that
dies fails the calls left with `ReferenceError` instead of hanging them. And the policy oracle's
free-run scan (the regex engine over the host's grains) against the grain-by-grain walk it replaced."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from e2e.prompts import PROMPTS
from oracle.reference import Reference, ReferenceError
from verdicts.policy import Policy

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "toy" / "model.py"
TOY = ROOT / "manifests" / "toy"


@pytest.mark.parametrize("target", ["toy-stateful-spec", "toy-float", "toy-layers"])
def test_a_worker_answers_as_the_reference_in_process(target):
    """Each kind of toy (integer with spec rows, float, layered): generate, path and logits through
    the worker equal the module's own, prefetched or not."""
    here = Reference(MODEL, TOY / f"{target}.json")
    there = Reference(MODEL, TOY / f"{target}.json", worker=True)
    try:
        prompts = [list(p.encode()) for p in PROMPTS[:4]]
        there.prefetch(prompts[0], 24, 1, path=(2, True))
        for ids in prompts:
            assert there.run(ids, 24) == here.run(ids, 24)
            try:
                want = here.path_of(ids, 24, 2, True)
            except ValueError as exc:  # the layered toy refuses two rows: so does its worker, as it did
                with pytest.raises(type(exc), match=str(exc)[:40]):
                    there.path_of(ids, 24, 2, True)
                continue
            assert there.path_of(ids, 24, 2, True) == want
        if here.floats:
            assert there.logits(prompts[1]) == here.logits(prompts[1])
        p = there.path_of(prompts[0], 24, 1, True)
        if p is not None:  # a remembered answer is handed out as a copy: the caller may change its own
            p["counts"].append(99)
            assert there.path_of(prompts[0], 24, 1, True) == here.path_of(prompts[0], 24, 1, True)
    finally:
        there.close()
    assert there._pool is None


def test_a_worker_that_dies_fails_its_calls_instead_of_hanging():
    ref = Reference(MODEL, TOY / "toy-paged.json", worker=True)
    try:
        assert ref.run([1, 2, 3], 4) == Reference(MODEL, TOY / "toy-paged.json").run([1, 2, 3], 4)
        (w,) = ref._pool.started
        os.kill(w.proc.pid, signal.SIGKILL)
        w.proc.wait(10)
        with pytest.raises(ReferenceError, match="reference worker"):
            ref.run([9, 9, 9], 4)
    finally:
        ref.close()


def test_several_workers_answer_as_one_and_keep_a_prompts_calls_together():
    """`Reference(worker=3)`: every answer equals the in-process one; calls whose ids share their
    first 16 tokens (a prompt and its longer turns) go to one worker, a worker starts only when a
    call is routed to it, and prompts that differ early spread over more than one."""
    here = Reference(MODEL, TOY / "toy-layers.json")
    there = Reference(MODEL, TOY / "toy-layers.json", worker=3)
    try:
        pool = there._pool
        assert pool.started == []
        rng = random.Random(7)
        prompts = [[rng.randrange(256) for _ in range(rng.randrange(1, 40))] for _ in range(12)]
        for ids in prompts:
            there.prefetch(ids, 16)
        assert [there.run(ids, 16) for ids in prompts] == [here.run(ids, 16) for ids in prompts]
        turn = prompts[0] + here.run(prompts[0], 16) + [1, 2, 3]
        assert pool.index(turn) == pool.index(prompts[0])
        assert there.run(turn, 8) == here.run(turn, 8)
        assert 1 < len(pool.started) <= 3
        assert len({pool.index(ids) for ids in prompts}) == len(pool.started)
    finally:
        there.close()


def _walk(h: bytearray) -> list[tuple[int, int]]:
    """The grain-by-grain scan the policy oracle used: the reference model of `_runs`."""
    runs, i = [], 0
    while i < len(h):
        if h[i]:
            i += 1
            continue
        j = i
        while j < len(h) and not h[j]:
            j += 1
        runs.append((i, j - i))
        i = j
    return runs


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 1), max_size=200))
def test_free_runs_are_the_walks_runs(bits):
    """Property: for any host occupancy, `_runs` gives the same (start, length) runs, in order, as
    walking the grains one by one."""
    p = Policy(page=16, pages=64, lined=False, emits=False, rows=1, chunk=64, slots=0,
               host_bytes=max(len(bits), 1) * 16, page_bytes=16, slot_bytes=0)
    p.host = bytearray(bits)
    assert p._runs() == _walk(p.host)


def test_free_runs_on_a_large_host():
    rng = random.Random(5)
    h = bytearray(rng.choice((0, 0, 1)) for _ in range(100_000))
    p = Policy(page=16, pages=64, lined=False, emits=False, rows=1, chunk=64, slots=0,
               host_bytes=len(h) * 16, page_bytes=16, slot_bytes=0)
    p.host = h
    assert p._runs() == _walk(h)


def test_how_many_reference_workers_and_hosts_by_default():
    """Reference workers: none below 8 cores unless asked (then one), a quarter of the cores from 8
    on, at most 4; --reference-in-process none. Hosts: none on the CPU, 4 per target gated on a GPU
    up to 8 (skipped targets do not count)."""
    import dataclasses

    from e2e.config import load_targets
    from e2e.spawners import default_hosts, reference_workers

    assert [reference_workers(None, c) for c in (1, 2, 7, 8, 12, 16, 64)] == [0, 0, 0, 2, 3, 4, 4]
    assert [reference_workers(True, c) for c in (1, 2, 16)] == [1, 1, 4]
    assert [reference_workers(False, c) for c in (2, 16)] == [0, 0]
    _, every = load_targets(None, None)
    assert default_hosts(True, every) == 0
    assert [default_hosts(False, every[:n]) for n in (1, 2, 3)] == [4, 8, 8]
    skipped = [dataclasses.replace(t, skipped="no") for t in every[:2]]
    assert default_hosts(False, skipped + every[2:3]) == 4
