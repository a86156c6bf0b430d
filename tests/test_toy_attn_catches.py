"""toy-attn catches what toy-paged cannot (issue 39), through the real kernels (CPU):

- a block reused under the wrong prefix: X·S is cached in two pages; then a request Y·S·z is served
  from Y's own page and X·S's second page (the S block: the right tokens at the right positions,
  written after X), as an engine whose block key ignores the block's parent does. toy-paged answers
  right (its slots are a function of token and position); toy-attn does not.
- K alone corrupted (the vLLM toy plugin never read K): one K word of one cached slot rewritten,
  with its tails made to agree (no poison to give it away), changes toy-attn's answer, exactly as
  the naive reading of docs/toy.md with that K predicts; the same for V.
"""

import numpy as np
import pytest

from runtime.runtime import Runtime
from runtime.step import Cell
from tests.test_toy_attn import naive_entries, naive_step
from tests.toyrun import target
from toy import model

PAGE = 16
X = list(b"Once upon a time")  # 16 tokens each: one page
Y = list(b"In a galaxy far ")
S = list(b"there lived a ca")
Z = ord("t")
STEPS = 8


def runtime(name):
    m, w = target(name)
    rt = Runtime(m, w, pages=8, slots=3, backend="cpu", max_seqs=1)
    rt.set_pad(0, None)
    return rt


def feed(rt, pages, ids, pos):
    """Write ids at pos.. into pages with the prefill program: what it emitted (toy-attn: the
    token after the last row; toy-paged's prefill emits nothing)."""
    c = Cell(pages, None, ids, pos)
    rt.step("prefill", [c])
    return c.tokens


def decode(rt, pages, token, pos, steps=STEPS):
    """Feed `token` at pos, then each emitted token: the `steps` tokens the decode program emits."""
    out = []
    for i in range(steps):
        c = Cell(pages, None, [token], pos + i)
        rt.step("decode", [c])
        token = c.tokens[0]
        out.append(token)
    return out


def served_with_a_foreign_block(name):
    """Y·S·z's answer served with the S block taken from X·S's cache (pages: X=1, S=2, Y=3, z=4)."""
    rt = runtime(name)
    feed(rt, [1, 2], X + S, 0)
    feed(rt, [3], Y, 0)
    return decode(rt, [3, 2, 4], Z, 2 * PAGE)


@pytest.mark.parametrize("name, fooled", [("toy-paged", True), ("toy-attn", False)])
def test_a_block_reused_under_the_wrong_prefix(name, fooled):
    m, _ = target(name)
    want = model.generate(Y + S + [Z], STEPS, m.raw)
    assert len(want) == STEPS and want != model.generate(X + S + [Z], STEPS, m.raw)
    rt = runtime(name)  # the honest way first: Y·S computed in its own pages gives the answer
    feed(rt, [3, 5], Y + S, 0)
    assert decode(rt, [3, 5, 4], Z, 2 * PAGE) == want
    got = served_with_a_foreign_block(name)
    assert (got == want) is fooled, f"{name}: {got} vs {want}"


PROMPT = list(b"The lighthouse keeper had not seen a ship in eleven days")


def _rewrite(kv, base, w, new):
    """Word w of the slot at kv[base:] set to `new`, its tails made to agree (no poison)."""
    words = 1024 // 8
    kv[base + w] = np.uint64(new)
    for u in range(16, words):
        if u & 15 == w:
            kv[base + u] = np.uint64(model.splitmix(new ^ u))


def naive_continue(entries, token, steps):
    """Decode from explicit entries (positions 0..len-1): feed token, then each one predicted."""
    entries, out = [(list(k), list(v)) for k, v in entries], []
    for _ in range(steps):
        token = model.next_of(model.splitmix(naive_step(entries, token, len(entries))))
        out.append(token)
    return out


@pytest.mark.parametrize("word, half", [(3, "K"), (0, "K"), (11, "V")])
def test_one_cached_word_of_one_half_rewritten_changes_the_answer(word, half):
    """Position 20's word `word` (K: 0..7, V: 8..15) gets one bit flipped after the prompt is cached;
    the answer decoded after it is the naive reading's from the entries so corrupted."""
    rt = runtime("toy-attn")
    pages = [1, 2, 3, 4]
    first = feed(rt, pages, PROMPT, 0)[0]
    kv = rt.arenas[model.ATTN_STATE].view(np.uint64)
    base = (pages[20 // PAGE] * PAGE + 20 % PAGE) * 128
    _rewrite(kv, base, word, int(kv[base + word]) ^ (1 << 40))
    entries, _ = naive_entries(PROMPT)
    (entries[20][0] if word < 8 else entries[20][1])[word % 8] ^= 1 << 40

    got = decode(rt, pages, first, len(PROMPT), 4)
    clean = model.generate(PROMPT, 5, target("toy-attn")[0].raw)
    assert first == clean[0]  # the prefill ran before the corruption
    assert got == naive_continue(entries, first, 4), half
    assert got != clean[1:], half
