"""The toy's integer arithmetic (SPEC §2, normative), shared by every family of `toy/model.py`, the
reference: the token constants, `splitmix`, a slot's head words (`mark`), their rotation and fold,
and the greedy next token of a sum (`next_of`). toy/model.py re-exports every name here."""

from functools import lru_cache

MASK = (1 << 64) - 1
WORDS = 64
EOS = 256
EOS_EVERY = 96
VOCAB_BYTES = 256
POISON = 0xBAD0BAD0BAD0BAD0


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


@lru_cache(maxsize=1 << 20)  # a pure function of (t, p); a gate asks the same slots again and again
def slot_sum(t: int, p: int) -> int:
    """The head words of the slot (t, p), rotated by p and summed."""
    return sum(rotl(mark(t, p, w), p) for w in range(WORDS)) & MASK
