"""A paged request's checkpoints extend one packed key (`serve/core/admission.py`'s `checkpoint`): each
checkpoint packs only the new pages' tokens onto the last one's key.

Property: over random prompts, lengths, stop ids and steps a launch (one step, or several with the next
launch sent before the last commit), every key the core inserts into the prefix index equals its
request's tokens up to the checkpoint packed afresh (`Tokens.of(req.fed(0, n))`)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pool import Tokens
from serve.core.answer import Stops
from serve.core.core import Core
from serve.core.request import Request

PROMPTS = [b"The lighthouse keeper", b"To make a proper risotto of the old kind", b"kern"]


def _core(k: int) -> Core:
    from serve.core.engine import Options, build

    return Core(build("toy-paged", Options(backend="cpu", decode_steps=k, overlap=k > 1, capacity=8192, max_seqs=4)))


@settings(max_examples=20, deadline=None)
@given(asks=st.lists(st.tuples(st.integers(0, len(PROMPTS) - 1), st.integers(1, 60),
                               st.one_of(st.none(), st.integers(32, 126))), min_size=1, max_size=5),
       k=st.sampled_from([1, 3, 16]))
def test_every_checkpoint_key_is_the_requests_tokens_packed_afresh(asks, k):
    core = _core(k)
    e = core.engine
    inserted: list[tuple[Request, bytes, int]] = []
    insert = e.prefix.insert
    admission_checkpoint = core.admission.checkpoint

    def checkpoint(req, full):
        seen = len(inserted)
        admission_checkpoint(req, full)
        assert len(inserted) == seen + 1
        inserted[-1] = (req, inserted[-1][1], full * e.unit)

    def spy(key, store):
        inserted.append((None, bytes(Tokens.of(key).packed()), 0))
        return insert(key, store)

    e.prefix.insert = spy
    core.admission.checkpoint = checkpoint
    reqs = []
    for i, (p, m, stop) in enumerate(asks):
        stops = Stops([], [stop], False) if stop is not None else None
        reqs.append(Request(f"r{i}", list(PROMPTS[p]) + [i], m, 1, lambda u: None, stops=stops))
        core.submit(reqs[-1])
    for _ in range(2000):
        if not (core.waiting or core.running):
            break
        core.admit()
        core.run(core.schedule())
    assert not core.waiting and not core.running
    for req, packed, n in inserted:
        assert req is not None
        assert packed == Tokens.of(req.fed(0, n)).packed(), (req.id, n)
    assert inserted or all(len(r.ids) + len(r.out) < 2 * e.unit for r in reqs)
