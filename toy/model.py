"""The toy model's reference arithmetic (SPEC §2, normative).

`generate(ids, max_tokens, manifest)` is the exact oracle every e2e scenario is gated against.
It computes only heads and carries (never tails), so it stays cheap.  Self-contained on purpose:
`e2e --reference path/to/model.py` loads this file by path.
"""

MASK = (1 << 64) - 1
WORDS = 64
EOS = 256
EOS_EVERY = 96
VOCAB_BYTES = 256
POISON = 0xBAD0BAD0BAD0BAD0
ACCEPT_PCT = (40, 60)


def splitmix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


SALT = tuple(splitmix(0x7071 + i) >> 1 for i in range(WORDS))


def mark(t: int, p: int, w: int) -> int:
    return splitmix(
        ((t * 0x100000001B3) & MASK)
        ^ ((p * 0x9E3779B1) & MASK)
        ^ ((w * 0xC2B2AE35) & MASK)
        ^ SALT[w & 63]
    )


def rotl(x: int, k: int) -> int:
    k &= 63
    if k == 0:
        return x
    return ((x << k) | (x >> (64 - k))) & MASK


def fold(c: int, t: int, p: int) -> int:
    return rotl(c, 7) ^ mark(t, p, 0)


def next_of(s: int) -> int:
    return EOS if (s >> 56) % EOS_EVERY == 0 else s % VOCAB_BYTES


def slot_sum(t: int, p: int) -> int:
    """The head words of the slot (t, p), rotated by p and summed."""
    return sum(rotl(mark(t, p, w), p) for w in range(WORDS)) & MASK


def is_lined(manifest: dict) -> bool:
    return any(s.get("bytes_per_seq", 0) for s in manifest.get("states", {}).values())


def generate(ids: list[int], max_tokens: int, manifest: dict) -> list[int]:
    """The greedy continuation of `ids`, at most `max_tokens` long, stopping before EOS."""
    lined = is_lined(manifest)
    s = c = 0
    for p, t in enumerate(ids):
        s = (s + slot_sum(t, p)) & MASK
        c = fold(c, t, p)
    out: list[int] = []
    n = len(ids)
    while len(out) < max_tokens:
        t = next_of((s + c) & MASK if lined else s)
        if t == EOS:
            break
        out.append(t)
        s = (s + slot_sum(t, n)) & MASK
        c = fold(c, t, n)
        n += 1
    return out
