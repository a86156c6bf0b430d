"""toy/model.py pinned to values anyone can check, and to an independent numpy implementation."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toy import model

M = (1 << 64) - 1


def np_splitmix(x: int) -> int:
    """splitmix64 in numpy uint64 (wrapping), a second implementation to hold model.py to."""
    with np.errstate(over="ignore"):
        x = np.uint64(x) + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return int(x ^ (x >> np.uint64(31)))


def test_splitmix_of_zero_is_the_published_constant():
    assert model.splitmix(0) == 0xE220A8397B1DCDAF


@pytest.mark.parametrize("x", [1, 0x7071, M, 0x0123456789ABCDEF, 1 << 63])
def test_splitmix_agrees_with_numpy(x):
    assert model.splitmix(x) == np_splitmix(x)


def test_salt_is_splitmix_of_0x7071_plus_i_halved():
    assert len(model.SALT) == 64
    assert model.SALT[0] == np_splitmix(0x7071) >> 1 == 0x37C8F7D1654C9D97
    assert model.SALT[63] == np_splitmix(0x7071 + 63) >> 1
    assert all(s < 1 << 63 for s in model.SALT)


@pytest.mark.parametrize(
    "t,p,w,want",
    [(0, 0, 0, 0x6CFC5522B257D38B), (65, 3, 7, 0xBED3CFCE5B5D8AAC)],
)
def test_mark_hand_worked(t, p, w, want):
    x = ((t * 0x100000001B3) & M) ^ ((p * 0x9E3779B1) & M) ^ ((w * 0xC2B2AE35) & M) ^ model.SALT[w & 63]
    assert model.mark(t, p, w) == np_splitmix(x) == want


def test_mark_uses_the_salt_of_w_mod_64():
    # w = 64 and w = 0 share a salt but not the w product, so they differ
    assert model.mark(1, 2, 64) != model.mark(1, 2, 0)


@pytest.mark.parametrize(
    "x,k,want",
    [(1, 0, 1), (1, 1, 2), (1, 64, 1), (1 << 63, 1, 1), (0x8000000000000001, 4, 0x18), (0xF0, 65, 0x1E0)],
)
def test_rotl(x, k, want):
    assert model.rotl(x, k) == want


def test_fold_rotates_the_carry_by_7_and_xors_the_mark_of_word_0():
    assert model.fold(0, 65, 0) == model.mark(65, 0, 0) == 0x82CC24D2D79D0B20
    c = 0x0123456789ABCDEF
    assert model.fold(c, 66, 1) == model.rotl(c, 7) ^ model.mark(66, 1, 0) == 0xFBBA8BF623F6E370


@pytest.mark.parametrize(
    "s,want",
    [(0, model.EOS), (96 << 56, model.EOS), (192 << 56, model.EOS), ((1 << 56) | 0x41, 0x41), ((95 << 56) | 0xFF, 0xFF)],
)
def test_next_of(s, want):
    assert model.next_of(s) == want


def test_slot_sum_rotates_heads_by_position():
    assert model.slot_sum(65, 0) == sum(model.mark(65, 0, w) for w in range(64)) & M == 0xF3005AA875EA6F5C
    assert model.slot_sum(65, 5) == sum(model.rotl(model.mark(65, 5, w), 5) for w in range(64)) & M


@settings(max_examples=300, deadline=None)
@given(pairs=st.lists(st.tuples(st.integers(0, 256), st.integers(0, (1 << 40) - 1)), max_size=40))
def test_numpy_slot_sums_equal_the_word_by_word_definition(pairs):
    """`slot_sums` (numpy's wrapping uint64, every word at once: what the oracle computes prompts with)
    equals the sum of `slot_sum_words` (the definition: `mark`, `rotl`, `& MASK` word by word), for
    any tokens and positions up to 2**40 (rotations by 0 and by 63 among them); so does `slot_sum`."""
    ts, ps = [t for t, _ in pairs], [p for _, p in pairs]
    assert model.slot_sums(ts, ps) == sum(model.slot_sum_words(t, p) for t, p in pairs) & M
    assert all(model.slot_sum(t, p) == model.slot_sum_words(t, p) for t, p in pairs[:5])


@settings(max_examples=60, deadline=None)
@given(pairs=st.lists(st.tuples(st.integers(0, 256), st.integers(0, (1 << 40) - 1)), min_size=1, max_size=6),
       features=st.lists(st.integers(0, 16 * 256 - 1), min_size=1, max_size=8))
def test_float_contributions_of_many_slots_equal_the_definition_word_by_word(pairs, features):
    """`contributions_of` (every feature of every slot at once, numpy) gives, for any slot (t, q) and
    feature f, y = (int(z >> 40) - 2**23) * 2**-23 with z = splitmix(rotl(mark(t, q, f & 63), q) ^ f),
    computed here in Python integers; `contributions` (one slot) is its row."""
    got = model.contributions_of([t for t, _ in pairs], [q for _, q in pairs])
    for i, (t, q) in enumerate(pairs):
        for f in features:
            z = model.splitmix(model.rotl(model.mark(t, q, f & 63), q) ^ f)
            assert got[i, f] == np.float32(((z >> 40) - (1 << 23)) * 2.0**-23), (t, q, f)
    t, q = pairs[0]
    assert np.array_equal(model.contributions(t, q), got[0])


PAGED = {"states": {"kv": {"bytes_per_token": 4096}}}
LINED = {"states": {"kv": {"bytes_per_token": 4096}, "mem": {"bytes_per_seq": 1 << 20}}}


def test_generate_pins():
    assert model.generate(list(b"Hi"), 10, PAGED) == [113, 235, 227, 168, 38, 146, 149, 247, 141, 123]
    assert model.generate(list(b"Hi"), 10, LINED) == [190, 167, 184, 221, 192, 29, 185, 85, 166, 142]


def test_generate_follows_the_sum_token_by_token():
    ids = list(b"abc")
    out = model.generate(ids, 5, PAGED)
    s = sum(model.slot_sum(t, p) for p, t in enumerate(ids)) & M
    for i, t in enumerate(out):
        assert t == model.next_of(s)
        s = (s + model.slot_sum(t, len(ids) + i)) & M


def test_generate_stops_before_eos_and_never_returns_it():
    # find a prompt whose continuation ends on EOS within 300 tokens
    for first in range(256):
        out = model.generate([first], 300, PAGED)
        if len(out) < 300:
            break
    else:
        pytest.fail("no prompt ended on EOS")
    assert model.EOS not in out
    ids = [first] + out
    s = sum(model.slot_sum(t, p) for p, t in enumerate(ids)) & M
    assert model.next_of(s) == model.EOS


def test_generate_respects_max_tokens_and_accepts_eos_in_the_prompt():
    assert len(model.generate(list(b"Hello"), 3, PAGED)) <= 3
    assert model.generate([1, 2, model.EOS, 3], 4, LINED) == model.generate([1, 2, model.EOS, 3], 8, LINED)[:4]


def test_lined_and_paged_answers_differ():
    assert model.generate(list(b"Hi"), 10, PAGED) != model.generate(list(b"Hi"), 10, LINED)


def test_accept_pct_bounds():
    assert model.ACCEPT_PCT == (40, 60)


def test_the_reference_loads_by_path_with_no_toy_package_importable(tmp_path):
    """Any gate driver loads toy/model.py by path (the Rust kern's tools/e2e/e2e.py with nothing of this
    project on its path): the file stands alone. A split into a shared `toy/arith.py` broke that once."""
    import subprocess
    import sys
    from pathlib import Path

    file = Path(__file__).resolve().parent.parent / "toy" / "model.py"
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('ref', sys.argv[1]); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); print(m.EOS, m.mark(1, 2, 3))")
    got = subprocess.run([sys.executable, "-I", "-c", code, str(file)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert got.returncode == 0, got.stderr[-2000:]
    assert got.stdout.split() == [str(model.EOS), str(model.mark(1, 2, 3))]


FLOAT = {"buffers": {"logits": {}}}


@settings(max_examples=15, deadline=None)
@given(head=st.binary(min_size=0, max_size=40), tails=st.lists(st.binary(max_size=30), min_size=1, max_size=4),
       n=st.integers(1, 24))
def test_the_float_reference_answers_the_same_from_its_kept_prefixes(head, tails, n):
    """The float toy keeps its features every 16 positions, keyed by the tokens fed (prompts and the
    answers made from them), and starts a later prompt from the longest kept prefix. The property: every
    answer, and every next turn's (prompt + answer + more, which starts inside a kept answer), equals the
    answer made from nothing (the kept prefixes dropped before each)."""
    prompts = [list(head + t) or [0] for t in tails]
    warm = [model.generate(p, n, FLOAT) for p in prompts]
    turns = [model.generate(p + a + [63], n, FLOAT) for p, a in zip(prompts, warm)]
    cold = []
    for p in prompts:
        model._FLOAT_KEPT.clear()
        cold.append(model.generate(p, n, FLOAT))
    assert warm == cold
    for p, a, got in zip(prompts, warm, turns):
        model._FLOAT_KEPT.clear()
        assert got == model.generate(p + a + [63], n, FLOAT)
