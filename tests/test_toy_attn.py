"""The attn toy (`toy-attn`, issue 39): every cached entry (K and V) depends on the whole prefix.

The reference (`toy/model.py`'s `generate_attn`, running sums) is held to a naive reading of
docs/toy.md's arithmetic here (a list of entries, every read over all of them); then the point
of the family: the same block content at the same positions after another prefix gives other
entries and other answers, where toy-paged gives the same; K alone or V alone corrupted changes
the answer.
"""

import pytest

from toy import model

MANIFEST = {"states": {model.ATTN_STATE: {"bytes_per_token": 1024}}}
PAGED = {"states": {"kv": {"bytes_per_token": 4096}}}
PROMPT = list(b"The lighthouse keeper had not seen a ship in eleven days")


def naive_read(entries, query, upto):
    """read(Q, {q < upto}) over explicit entries (K, V), as docs/toy.md states it."""
    total = 0
    for q, (k, v) in enumerate(entries[:upto]):
        weight = 3 if (k[0] >> 62) == (query >> 62) else 1
        ks = sum(model.rotl(x, q) for x in k)
        vs = sum(model.rotl(x, q + 32) for x in v)
        total += ks + weight * vs
    return total & model.MASK


def naive_step(entries, t, p, corrupt=None):
    """Token t at position p after `entries` (positions 0..p-1): its entry appended; O returned.
    `corrupt(p, k, v)` may change the entry once written (before any later position reads it)."""
    query = model.mark(t, p, 16)
    r = naive_read(entries, query, p)
    k = [model.splitmix(model.mark(t, p, w) ^ model.rotl(r, w)) for w in range(8)]
    v = [model.splitmix(model.mark(t, p, 8 + w) ^ model.rotl(r, 8 + w)) for w in range(8)]
    if corrupt:
        k, v = corrupt(p, k, v)
    entries.append((k, v))
    return naive_read(entries, query, p + 1)


def naive_entries(ids, corrupt=None):
    """The entries of `ids` and the read O after the last."""
    entries, o = [], 0
    for p, t in enumerate(ids):
        o = naive_step(entries, t, p, corrupt)
    return entries, o


def naive_generate(ids, max_tokens, corrupt=None):
    ids, out = list(ids), []
    while len(out) < max_tokens:
        _, o = naive_entries(ids, corrupt)
        t = model.next_of(model.splitmix(o))
        if t == model.EOS:
            break
        out.append(t)
        ids.append(t)
    return out


def test_the_documented_test_vectors():
    """docs/toy.md's vectors, which an outside engine checks itself against."""
    assert model.generate(list(b"Hello"), 12, MANIFEST) == [220, 237, 28, 61, 39, 209, 84, 1, 16, 90, 241, 42]
    assert model.generate([], 3, MANIFEST) == [175, 18, 53]
    o, _, k, v = model.attn_feed(72, 0, (0,) * (1 + model.ATTN_BUCKETS))
    assert (k[0], v[0], o) == (0x541575C217D0FF84, 0xF274189C2A7AEC2F, 0x94963ED0247A6791)


def test_the_family_is_told_by_its_state():
    assert model.is_attn(MANIFEST) and not model.is_attn(PAGED)
    assert model.layer_count(MANIFEST) == 0 and not model.is_lined(MANIFEST)


@pytest.mark.parametrize("ids", [PROMPT, [], [0], [256, 3, 256], list(range(40))])
def test_the_running_sums_agree_with_the_naive_reading(ids):
    assert model.generate(ids, 12, MANIFEST) == naive_generate(ids, 12)


def test_attn_feed_gives_the_entries_the_naive_reading_writes():
    entries, o = naive_entries(PROMPT)
    sums = (0,) * (1 + model.ATTN_BUCKETS)
    for p, t in enumerate(PROMPT):
        got_o, sums, k, v = model.attn_feed(t, p, sums)
        assert (k, v) == entries[p]
    assert got_o == o


def test_the_path_of_an_attn_target_emits_at_prefill():
    path = model.path(PROMPT, 5, MANIFEST)
    assert path["first"] == 1 and path["answer"] == model.generate(PROMPT, 5, MANIFEST)
    with pytest.raises(ValueError):
        model.path(PROMPT, 5, MANIFEST, rows=4)


def blocks(seed, n=16):
    return [(seed * 37 + i * 11) % 256 for i in range(n)]


def test_the_same_block_after_another_prefix_writes_other_entries():
    """X·S and Y·S: the block S at positions 16..31 behind a different first block. Every K and
    every V word of S differs (toy-paged's slots, a function of token and position, are equal)."""
    x, y, s = blocks(1), blocks(2), blocks(3)
    ex, _ = naive_entries(x + s)
    ey, _ = naive_entries(y + s)
    for p in range(16, 32):
        (kx, vx), (ky, vy) = ex[p], ey[p]
        assert all(a != b for a, b in zip(kx + vx, ky + vy)), p
        assert model.slot_sum(s[p - 16], p) == model.slot_sum((y + s)[p], p)


def test_over_a_few_prompts_a_changed_first_block_changes_the_answer():
    """Six first blocks before one 32-token tail: six answers, and six sets of tail entries."""
    s = blocks(9, 32)
    answers, tails = set(), set()
    for seed in range(6):
        ids = blocks(seed) + s
        answers.add(tuple(model.generate(ids, 8, MANIFEST)))
        tails.add(tuple(w for k, v in naive_entries(ids)[0][16:] for w in k + v))
    assert len(answers) == 6 and len(tails) == 6


def _flip(which, at):
    def corrupt(p, k, v):
        if p != at:
            return k, v
        k, v = list(k), list(v)
        half = k if which == "K" else v
        half[3] ^= 1 << 40  # one bit of one word
        return k, v
    return corrupt


@pytest.mark.parametrize("which", ["K", "V"])
def test_one_bit_of_one_half_of_one_entry_changes_the_answer(which):
    """A wrong K (or V) at position 20 changes the read of every later position and the answer."""
    ids = PROMPT[:40]
    clean = naive_generate(ids, 4)
    assert len(clean) == 4
    changed = 0
    for at in range(20, 40, 4):
        if naive_generate(ids, 4, _flip(which, at)) != clean:
            changed += 1
    assert changed == 5


def test_the_gate_and_the_reference_tell_every_packaged_target_s_family_alike():
    """e2e's `family_of` (which skips an engine's lacked families) agrees with toy/model.py's order of
    tests on every packaged manifest: toy-attn is attn, not paged (else an engine that computes only
    the paged family would be gated on it, and fail it)."""
    import json

    from e2e.config import family_of
    from tests.toyrun import CONFIG

    want = {"toy-paged": "paged", "toy-spec": "paged", "toy-big": "paged", "toy-stateful": "lined",
            "toy-stateful-spec": "lined", "toy-float": "float", "toy-layers": "layered", "toy-attn": "attn"}
    got = {name: family_of(json.loads(t.manifest.read_text())) for name, t in CONFIG.targets.items()}
    assert {n: f for n, f in got.items() if n in want} == want
    for name, t in CONFIG.targets.items():
        m = json.loads(t.manifest.read_text())
        assert model.is_attn(m) == (got[name] == "attn"), name
