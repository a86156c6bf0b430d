"""The chunked host arena (`runtime/host_arena.py`) against one flat array.

Property: after any sequence of writes, zeroings and copies in either direction between the arena
and a plain array (ranges straddling the arena's pieces included), the arena reads exactly as a
flat zeroed array that took the same operations, and it holds only the pieces some write or copy
reached (reading and zeroing allocate nothing).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.host_arena import ChunkedArena, spans

SIZE, OTHER = 100, 64


def _copy(dst, dst_off, src, src_off, n):
    """What the GPU backend's copy does with an arena on either side, on the CPU."""
    for d, do, s, so, k in spans(dst, dst_off, src, src_off, n):
        assert not isinstance(d, ChunkedArena) and not isinstance(s, ChunkedArena)
        d[do : do + k] = s[so : so + k]


def _range(draw, size):
    off = draw(st.integers(0, size - 1))
    return off, draw(st.integers(0, size - off))


@st.composite
def ops(draw):
    kind = draw(st.sampled_from(["write", "zero", "to_arena", "from_arena", "read"]))
    if kind in ("to_arena", "from_arena"):
        n = draw(st.integers(0, OTHER))
        return kind, draw(st.integers(0, SIZE - n)), draw(st.integers(0, OTHER - n)), n
    off, n = _range(draw, SIZE)
    return kind, off, n, draw(st.integers(0, 255))


@settings(max_examples=300, deadline=None)
@given(chunk=st.integers(1, 40), program=st.lists(ops(), max_size=25), seed=st.integers(0, 2**32 - 1))
def test_the_arena_reads_as_a_flat_array_and_takes_only_what_was_written(chunk, program, seed):
    made = []

    def alloc(n):
        made.append(n)
        return np.zeros(n, np.uint8)

    arena, flat = ChunkedArena(SIZE, alloc, chunk), np.zeros(SIZE, np.uint8)
    other = np.random.default_rng(seed).integers(0, 256, OTHER, dtype=np.uint8)
    touched: set[int] = set()
    for kind, a, b, c in program:
        if kind == "write":
            data = np.full(b, c, np.uint8)
            arena.write(a, data)
            flat[a : a + b] = data
            touched |= {q // chunk for q in range(a, a + b)}
        elif kind == "zero":
            arena.fill_zero(a, b)
            flat[a : a + b] = 0
        elif kind == "to_arena":  # a park: device bytes into the host tier
            _copy(arena, a, other, b, c)
            flat[a : a + c] = other[b : b + c]
            touched |= {q // chunk for q in range(a, a + c)}
        elif kind == "from_arena":  # a wake: host tier bytes back (reading makes what it reads)
            _copy(other, b, arena, a, c)
            other[b : b + c] = flat[a : a + c]
            touched |= {q // chunk for q in range(a, a + c)}
        else:
            assert np.array_equal(arena.read(a, b), flat[a : a + b])
    assert bytes(arena) == flat.tobytes()
    assert len(made) == len(touched) and arena.allocated() == sum(made)
    assert sorted(made) == sorted(min(chunk, SIZE - i * chunk) for i in touched)


def test_out_of_range_is_refused_by_name():
    arena = ChunkedArena(10, lambda n: np.zeros(n, np.uint8), 4)
    with pytest.raises(IndexError, match="outside the host arena"):
        arena.read(8, 3)
    with pytest.raises(IndexError, match="outside the host arena"):
        list(spans(arena, 9, np.zeros(4, np.uint8), 0, 2))
    assert arena.allocated() == 0


@settings(max_examples=200, deadline=None)
@given(chunk=st.integers(1, 40), program=st.lists(ops(), max_size=25), seed=st.integers(0, 2**32 - 1))
def test_the_cpu_backend_on_a_chunked_host_tier_acts_as_on_a_flat_one(chunk, program, seed):
    """`kern serve --host-chunk-bytes` on the CPU: the backend's copy, zero, upload and download on a
    host tier in pieces give what they give on one flat array (so the CPU gate runs the GPU's
    piece-splitting code, and a bug in it changes what a wake restores)."""
    from runtime.backend import CpuBackend

    be = CpuBackend()
    arena, flat = be.host_zeros(SIZE, chunk), be.host_zeros(SIZE)
    assert isinstance(arena, ChunkedArena) and not isinstance(flat, ChunkedArena)
    other = np.random.default_rng(seed).integers(0, 256, OTHER, dtype=np.uint8)
    for kind, a, b, c in program:
        if kind == "write":
            for host in (arena, flat):
                be.copy(host, a, np.full(b, c, np.uint8), 0, b)
        elif kind == "zero":
            for host in (arena, flat):
                be.zero(host, a, b)
        elif kind == "to_arena":
            for host in (arena, flat):
                be.copy(host, a, other, b, c)
        elif kind == "from_arena":
            x, y = other.copy(), other.copy()
            be.copy(x, b, arena, a, c)
            be.copy(y, b, flat, a, c)
            assert np.array_equal(x, y)
    assert np.array_equal(be.download(arena, SIZE), be.download(flat, SIZE))
    be.upload(arena, other[:SIZE % OTHER])
    be.upload(flat, other[:SIZE % OTHER])
    assert np.array_equal(be.download(arena, SIZE), be.download(flat, SIZE))
