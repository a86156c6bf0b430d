"""The reference in a worker process of its own (`Reference(worker=True)`) answers as it does in
process: the same answers, paths and logits, whether asked cold or after `prefetch`; a worker that
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
        os.kill(ref._pool.proc.pid, signal.SIGKILL)
        ref._pool.proc.wait(10)
        with pytest.raises(ReferenceError, match="reference worker"):
            ref.run([9, 9, 9], 4)
    finally:
        ref.close()


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
