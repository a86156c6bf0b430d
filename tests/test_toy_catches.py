"""The toy catches what it exists to catch: each test names the exact poisoned or shifted answer the
kernel must give, so a kernel that stopped reading heads, checking tails, rotating by position or
checking a line's position word fails here."""

import numpy as np
import pytest

from runtime.sequence import single
from runtime.step import Cell
from tests.toyrun import target
from toy import model

M = (1 << 64) - 1
PROMPT = list(b"Photosynthesis converts light into chemical energy in two stages. In the first")


def prefill(shape, ids):
    m, w = target(shape)
    rt, cell = single(m, w, len(ids), 4, 1)
    fed = ids if rt.protocol.prefill_emits else ids[:-1]
    c = Cell(cell.pages, cell.slot, fed, 0)
    rt.step("prefill", [c])
    return rt, cell, c.tokens


def decode(rt, cell, token, pos):
    c = Cell(cell.pages, cell.slot, [token], pos)
    rt.step("decode", [c])
    return c.tokens[0]


def kv_words(rt):
    return rt.arenas["kv"].view(np.uint64)


def word_index(rt, cell, q, w, words=512):
    slot = cell.pages[q // rt.unit] * rt.unit + q % rt.unit
    return slot * words + w


def true_sum(ids):
    return sum(model.slot_sum(t, p) for p, t in enumerate(ids)) & M


def test_baseline_decode_equals_the_model():
    rt, cell, _ = prefill("toy-paged", PROMPT)
    assert decode(rt, cell, PROMPT[-1], len(PROMPT) - 1) == model.generate(PROMPT, 1, target("toy-paged")[0].raw)[0]


def test_one_head_word_overwritten_changes_the_answer():
    rt, cell, _ = prefill("toy-paged", PROMPT)
    q, w = 5, 3
    kv = kv_words(rt)
    i = word_index(rt, cell, q, w)
    old, new = int(kv[i]), int(kv[i]) ^ 0x5A5A
    kv[i] = np.uint64(new)
    s = (true_sum(PROMPT) - model.rotl(old, q) + model.rotl(new, q)) & M
    want = model.next_of(s ^ model.POISON)  # the head moved, and its tails no longer agree with it
    got = decode(rt, cell, PROMPT[-1], len(PROMPT) - 1)
    assert want != model.next_of(true_sum(PROMPT)), "pick another word: this one cannot show the change"
    assert got == want


@pytest.mark.parametrize("w", [64, 100, 127, 128, 511])  # the first tail word, rows' edges, the last word
def test_one_tail_word_overwritten_poisons_the_sum(w):
    rt, cell, _ = prefill("toy-paged", PROMPT)
    kv = kv_words(rt)
    i = word_index(rt, cell, 7, w)
    kv[i] = kv[i] ^ np.uint64(1)
    s = true_sum(PROMPT)
    assert model.next_of(s ^ model.POISON) != model.next_of(s), "pick another prompt"
    assert decode(rt, cell, PROMPT[-1], len(PROMPT) - 1) == model.next_of(s ^ model.POISON)


def test_swapping_two_page_table_entries_changes_the_answer():
    rt, cell, _ = prefill("toy-paged", PROMPT)
    assert len(PROMPT) > 3 * rt.unit
    swapped = Cell([cell.pages[1], cell.pages[0], *cell.pages[2:]], None, [], 0)
    n = len(PROMPT)
    got = decode(rt, swapped, PROMPT[-1], n - 1)
    # positions 0..15 now read the slots written for 16..31 (and back), rotated by where they are read
    u = rt.unit
    src = [q + u if q < u else q - u if q < 2 * u else q for q in range(n)]
    s = sum(sum(model.rotl(model.mark(PROMPT[src[q]], src[q], w), q) for w in range(64)) for q in range(n)) & M
    assert model.next_of(s) != model.next_of(true_sum(PROMPT)), "pick another prompt"
    assert got == model.next_of(s)


def lined_state(ids):
    s = true_sum(ids)
    c = 0
    for p, t in enumerate(ids):
        c = model.fold(c, t, p)
    return s, c


def test_a_line_whose_position_word_is_stale_is_poisoned():
    rt, cell, first = prefill("toy-stateful", PROMPT)
    n = len(PROMPT)
    mem = rt.arenas["mem"].view(np.uint64)
    base = cell.slot * (1 << 20) // 8
    assert int(mem[base + 1]) == n
    mem[base + 1] = np.uint64(n - 1)  # a stale copy: it says it continues one position earlier
    t = first[0]
    s, c = lined_state(PROMPT)
    s = (s + model.slot_sum(t, n)) & M
    clean = model.next_of((s + model.fold(c, t, n)) & M)
    want = model.next_of((s + model.fold(c ^ model.POISON, t, n)) & M)
    assert want != clean, "pick another prompt"
    assert decode(rt, cell, t, n) == want


@pytest.mark.parametrize("w", [2, 63, 64, 1000, (1 << 17) - 1])  # the first tail word, a row's edge, the last
def test_a_line_tail_word_that_disagrees_poisons_the_carry(w):
    rt, cell, first = prefill("toy-stateful", PROMPT)
    n = len(PROMPT)
    mem = rt.arenas["mem"].view(np.uint64)
    base = cell.slot * (1 << 20) // 8
    mem[base + w] ^= np.uint64(1 << 40)
    t = first[0]
    s, c = lined_state(PROMPT)
    s = (s + model.slot_sum(t, n)) & M
    want = model.next_of((s + model.fold(c ^ model.POISON, t, n)) & M)
    assert want != model.next_of((s + model.fold(c, t, n)) & M), "pick another prompt"
    assert decode(rt, cell, t, n) == want


@pytest.mark.parametrize("shape", ["toy-paged", "toy-stateful"])
def test_an_untampered_state_is_not_poisoned(shape):
    rt, cell, first = prefill(shape, PROMPT)
    m = target(shape)[0]
    n = len(PROMPT)
    token, pos = (first[0], n) if first else (PROMPT[-1], n - 1)
    want = model.generate(PROMPT, 2, m.raw)
    assert decode(rt, cell, token, pos) == want[1 if first else 0]
