"""The toy model's reference arithmetic (SPEC §2, normative).

`generate(ids, max_tokens, manifest)` is the exact oracle every e2e scenario is gated against.
It computes only heads and carries (never tails), so it stays cheap.  Self-contained on purpose:
`e2e --reference path/to/model.py` loads this file by path, and so does any other gate driver (the Rust
kern's `tools/e2e/e2e.py` runs with no `toy` package on its path).

The toy families, told apart by the manifest's states alone:
- **layered** (`toy-layers`): states named `kv.0`, `kv.1`, ... (one paged state per layer; their
  count is the number of layers). An activation of `ACT` words flows from layer to layer; see
  `generate_layered`.
- **attn** (`toy-attn`): a paged state named `attn` whose token slot holds K and V words, each
  written from a read over every earlier slot; see `generate_attn`.
- **lined**: some state holds one line per sequence (`bytes_per_seq > 0`): next_of(S + C).
- **paged**: otherwise: next_of(S).
"""

import collections
import itertools
import threading
from functools import lru_cache

import numpy as np

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


def slot_sum_words(t: int, p: int) -> int:
    """The head words of the slot (t, p), rotated by p and summed: the definition, word by word.
    `slot_sum` and `slot_sums` compute the same with numpy (tests/test_toy_model.py holds them to it)."""
    return sum(rotl(mark(t, p, w), p) for w in range(WORDS)) & MASK


_U64 = np.uint64


def _splitmix_np(x: np.ndarray) -> np.ndarray:
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


_WORD_KEYS = (np.arange(WORDS, dtype=_U64) * _U64(0xC2B2AE35)) ^ np.array(SALT, dtype=_U64)  # w's part of a mark


def _heads(ts, ps) -> np.ndarray:
    """The head words of each slot (t, p), rotated by p: n x 64 uint64, `rotl(mark(t, p, w), p)` on
    numpy's uint64, which wraps as `& MASK` does, every word of every slot at once."""
    t = np.asarray(ts, dtype=_U64).reshape(-1, 1)
    p = np.asarray(ps, dtype=_U64).reshape(-1, 1)
    x = _splitmix_np(_WORD_KEYS[None, :] ^ (t * _U64(0x100000001B3)) ^ (p * _U64(0x9E3779B1)))
    k = p & _U64(63)  # k = 0: both shifts by 0, x | x
    return (x << k) | (x >> ((_U64(64) - k) & _U64(63)))


def slot_sums(ts, ps) -> int:
    """The sum of `slot_sum(t, p)` over the pairs of `ts` and `ps`, mod 2**64 (a prompt of a hundred
    tokens in about 60 us; word by word it took 7 ms, most of a gate's oracle time)."""
    return int(_heads(ts, ps).sum(dtype=_U64))


@lru_cache(maxsize=1 << 20)  # a pure function of (t, p); a gate asks the same slots again and again
def slot_sum(t: int, p: int) -> int:
    """The head words of the slot (t, p), rotated by p and summed (`slot_sum_words`)."""
    return slot_sums((t,), (p,))


def _carry(ids: list[int]) -> int:
    """The carry C after feeding `ids` from position 0 (a lined state's fold)."""
    c = 0
    for p, t in enumerate(ids):
        c = fold(c, t, p)
    return c


def is_lined(manifest: dict) -> bool:
    return any(s.get("bytes_per_seq", 0) for s in manifest.get("states", {}).values())


def generate(ids: list[int], max_tokens: int, manifest: dict) -> list[int]:
    """The greedy continuation of `ids`, at most `max_tokens` long, stopping before EOS."""
    if is_float(manifest):
        return _generate_float(ids, max_tokens)
    layers = layer_count(manifest)
    if layers:
        return generate_layered(ids, max_tokens, layers)
    if is_attn(manifest):
        return generate_attn(ids, max_tokens)
    lined = is_lined(manifest)
    s = slot_sums(ids, range(len(ids)))
    c = _carry(ids)
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


# -- the float toy (toy-float): logits in float32, rounded to bf16 -------------------------------
#
# A float manifest (its `buffers` has a `logits` buffer) predicts by logits, not by `next_of`. The
# state keeps BANKS * 256 float32 sums ("features"); feature f gets, from each position q < n:
#
#     y(q, f) = (int(z >> 40) - 2**23) * 2**-23,   z = splitmix(rotl(head_q[f & 63], q) ^ f)
#     B(q)    = (2**23 + (splitmix(q ^ BIAS_SALT) >> 41)) * 2**(BIAS_EXP - 23 + (q & 3))
#     a       = fl(fl(a + fl(y(q, f) + B(q))) - B(q))                   (one position's step)
#
# B(q) is a large bias a position adds and takes back; it makes the rounding of each step depend
# on what the accumulator already holds, so two orders of addition round differently, now and
# then by about a bf16 ULP of the result. The reference (here) adds every position in order into
# one accumulator. The runtime (toy/float_kernels) adds tiles of `block // 32` positions, each
# into its own accumulator from 0.0, then the tiles' results in order: another order, fixed by the
# build and the positions alone.
#
# A step reads S, the integer sequence sum (exact, poisoned by a bad tail, as the integer toy's).
# EOS stays exact: the next token is EOS when next_of(S) says so, and EOS's logit is then bf16's
# largest finite value, else its lowest. Byte token v's logit is feature
# bank * 256 + (v ^ perm) rounded to bf16 (nearest, ties to even), bank = (S >> 8) % BANKS and
# perm = (S >> 16) & 255, so a near tie seldom lasts from one step to the next; the next token
# is the first byte token with the largest logit.


FLOAT_VOCAB = VOCAB_BYTES + 1
BANKS = 16
FEATURES = BANKS * VOCAB_BYTES
BIAS_EXP = 12
BIAS_SALT = 0xF10A7F10A7F10A7
EOS_TOP, EOS_LOW = 0x7F7F, 0xFF7F  # bf16 bits of the largest and lowest finite values

_F = np.arange(FEATURES, dtype=np.uint64)
_W = (np.arange(FEATURES) & 63)


def is_float(manifest: dict) -> bool:
    return "logits" in manifest.get("buffers", {})


def bias(q: int) -> np.float32:
    mant = (1 << 23) + (splitmix(q ^ BIAS_SALT) >> 41)
    return np.float32(mant * 2.0 ** (BIAS_EXP - 23 + (q & 3)))


def contributions(t: int, q: int) -> np.ndarray:
    """y(q, f) of the slot (t, q) for every feature: float32 in [-1, 1), exact."""
    return contributions_of([t], [q])[0]


def contributions_of(ts, qs) -> np.ndarray:
    """y(q, f) of each slot (t, q), a row a slot (n x FEATURES float32): `head_q[f & 63]` rotated by q
    for all slots at once (`_heads`)."""
    z = _splitmix_np(_heads(ts, qs)[:, _W] ^ _F[None, :])
    return ((z >> np.uint64(40)).astype(np.int64) - (1 << 23)).astype(np.float32) * np.float32(2.0**-23)


def add_position(acc: np.ndarray, t: int, q: int, y: np.ndarray | None = None) -> np.ndarray:
    """One position's step of the reference order, for every feature (`y`: its contributions, if made)."""
    b = bias(q)
    return (acc + ((contributions(t, q) if y is None else y) + b)) - b


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, round to nearest, ties to even."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)).astype(np.uint16)


def bf16_value(bits) -> np.ndarray:
    return (np.asarray(bits, np.uint32) << np.uint32(16)).view(np.float32)


def float_logits(acc: np.ndarray, s: int) -> np.ndarray:
    """The 257 bf16 logits (bits) of a step from the feature sums and the integer sum."""
    bank, perm = (s >> 8) % BANKS, (s >> 16) & 255
    out = np.empty(FLOAT_VOCAB, np.uint16)
    out[:VOCAB_BYTES] = bf16_bits(acc[bank * VOCAB_BYTES + (np.arange(VOCAB_BYTES) ^ perm)])
    out[EOS] = EOS_TOP if next_of(s) == EOS else EOS_LOW
    return out


def float_next(logits_bits: np.ndarray) -> int:
    if logits_bits[EOS] == EOS_TOP:
        return EOS
    return int(np.argmax(bf16_value(logits_bits[:VOCAB_BYTES])))


def _float_state(ids: list[int]) -> tuple[np.ndarray, int]:
    """The features and the slot sum after feeding `ids`: from the longest prefix of `ids` whose features
    are kept (`_FLOAT_KEPT`, every `_FLOAT_EVERY` positions), then position by position in the reference
    order (256 positions' contributions made at once)."""
    ids = list(ids)
    start, acc = 0, np.zeros(FEATURES, np.float32)
    with _FLOAT_LOCK:
        for m in range(len(ids) // _FLOAT_EVERY * _FLOAT_EVERY, 0, -_FLOAT_EVERY):
            hit = _FLOAT_KEPT.get(key := tuple(ids[:m]))
            if hit is not None:
                _FLOAT_KEPT.move_to_end(key)
                start, acc = m, hit
                break
    for at in range(start, len(ids), 256):
        ys = contributions_of(ids[at : at + 256], range(at, min(at + 256, len(ids))))
        for j, y in enumerate(ys):
            acc = add_position(acc, ids[at + j], at + j, y)
            _keep_float(ids, at + j + 1, acc)
    return acc, slot_sums(ids, range(len(ids)))


_FLOAT_EVERY = 16  # the features after every 16th position are kept, keyed by the tokens fed
_FLOAT_KEPT: "collections.OrderedDict[tuple[int, ...], np.ndarray]" = collections.OrderedDict()
_FLOAT_CAP = 4096  # prefixes kept (16 KiB each), the least recently used dropped
_FLOAT_LOCK = threading.Lock()


def _keep_float(seq: list[int], n: int, acc: np.ndarray) -> None:
    """Keep the features after the first `n` tokens of `seq` when n is a multiple of `_FLOAT_EVERY`
    (`acc` is never written in place: every step makes a new array)."""
    if n % _FLOAT_EVERY:
        return
    with _FLOAT_LOCK:
        _FLOAT_KEPT[tuple(seq[:n])] = acc
        if len(_FLOAT_KEPT) > _FLOAT_CAP:
            _FLOAT_KEPT.popitem(last=False)


def logits(ids: list[int], manifest: dict) -> list[int]:
    """The bf16 bits of the 257 logits that predict the token after `ids` (float manifests)."""
    acc, s = _float_state(ids)
    return [int(b) for b in float_logits(acc, s)]


def _generate_float(ids: list[int], max_tokens: int) -> list[int]:
    acc, s = _float_state(ids)
    out: list[int] = []
    n = len(ids)
    while len(out) < max_tokens:
        t = float_next(float_logits(acc, s))
        if t == EOS:
            break
        out.append(t)
        s = (s + slot_sum(t, n)) & MASK
        acc = add_position(acc, t, n)
        n += 1
        if n % _FLOAT_EVERY == 0:  # a next turn's prompt extends this answer
            _keep_float(ids + out, n, acc)
    return out


# -- the layered toy ----------------------------------------------------------------------------
#
# Every word is u64 and wraps. Layer l (0 <= l < L) owns a paged state `kv.l`; its token slot holds
# LAYER_HEAD head words then tail words `splitmix(head[w % LAYER_HEAD] ^ w)` (the reference never
# computes tails). A token t at position p:
#   x = embed(t, p)                                  the activation, ACT words
#   for each layer l:
#     h = heads(x, p, TABLE[l])                      written into kv.l's slot for p
#     S_l += sum_w rotl(h[w], p)                     layer l's read of its own state, positions <= p
#     x = update(x, S_l, MIX[l])                     the activation the next layer reads
#   next = next_of(sum_j rotl(x[j], 8 j))            the head: the token after t
# Weights: SOURCE is the checkpoint's `source` tensor (from constants, as the salt is); a derive
# program turns it into MIX at load (MIX[i] = splitmix(SOURCE[i] ^ DERIVE_KEY)); a once program
# fills TABLE from MIX and the salt after load. Prefill emits: every prompt token runs the stack.

ACT = 8
LAYER_HEAD = 16
DERIVE_KEY = 0xD371_5EED_0000_0001


def layer_count(manifest: dict) -> int:
    """The number of layers of a layered manifest (states kv.0 .. kv.{L-1}), else 0."""
    states = manifest.get("states", {})
    n = 0
    while f"kv.{n}" in states:
        n += 1
    return n


def source(layers: int) -> list[int]:
    """The checkpoint's `source` tensor: ACT words per layer, each < 2^63 (an i64)."""
    return [splitmix(0x50C3 + i) >> 1 for i in range(layers * ACT)]


def derive_mix(src: list[int]) -> list[int]:
    """What the derive program makes of the source at load: the `mix` weight."""
    return [splitmix(v ^ DERIVE_KEY) for v in src]


def table(mix: list[int], layers: int) -> list[int]:
    """What the once program fills after load: LAYER_HEAD words per layer, from mix and the salt."""
    out = []
    for i in range(layers * LAYER_HEAD):
        l, w = divmod(i, LAYER_HEAD)
        out.append(splitmix(mix[l * ACT + (w & 7)] ^ SALT[i & 63] ^ w))
    return out


def embed(t: int, p: int) -> list[int]:
    return [mark(t, p, j) for j in range(ACT)]


def heads(x: list[int], p: int, tab: list[int]) -> list[int]:
    """The head words a layer writes for position p from the activation entering it."""
    pk = (p * 0x9E3779B1) & MASK
    return [splitmix(x[w & 7] ^ rotl(x[(w + 3) & 7], w + 1) ^ tab[w] ^ pk) for w in range(LAYER_HEAD)]


def update(x: list[int], s: int, mix: list[int]) -> list[int]:
    """The activation leaving a layer: every word from the layer's read `s`, its weights and x."""
    return [splitmix(x[j] ^ rotl(s, 8 * j + 1) ^ mix[j] ^ x[(j + 1) & 7]) for j in range(ACT)]


def head_sum(x: list[int]) -> int:
    return sum(rotl(v, 8 * j) for j, v in enumerate(x)) & MASK


@lru_cache(maxsize=16)
def _layered_weights(layers: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    mix = derive_mix(source(layers))
    return tuple(mix), tuple(table(mix, layers))


def _feed(t: int, p: int, sums: tuple[int, ...], layers: int) -> tuple[list[int], tuple[int, ...]]:
    """Token t at position p through every layer: the activation leaving the last, and each layer's
    read after it (its sum over the heads written so far)."""
    mix, tab = _layered_weights(layers)
    x = embed(t, p)
    out = list(sums)
    for l in range(layers):
        h = heads(x, p, tab[l * LAYER_HEAD : (l + 1) * LAYER_HEAD])
        out[l] = (out[l] + sum(rotl(v, p) for v in h)) & MASK
        x = update(x, out[l], mix[l * ACT : (l + 1) * ACT])
    return x, tuple(out)


# What feeding a prefix leaves (`generate_layered` is a pure function of it): a trie of prefixes,
# (layers, parent node, token) -> (node, activation, sums). A gate asks prompts that extend earlier
# prompts and answers (turn 2, the policy oracle's paths), so most of a prefix is found, not fed.
_PREFIXES: dict[tuple[int, int, int], tuple[int, list[int], tuple[int, ...]]] = {}
_NODES = itertools.count(1)
_PREFIX_CAP = 1 << 20


def generate_layered(ids: list[int], max_tokens: int, layers: int) -> list[int]:
    """The layered toy's greedy continuation of `ids` (prefill emits the first token)."""
    node, x, sums = 0, [], (0,) * layers

    def feed(t: int, p: int) -> list[int]:
        nonlocal node, sums
        key = (layers, node, t)
        hit = _PREFIXES.get(key)
        if hit is None:
            fx, fs = _feed(t, p, sums, layers)
            hit = (next(_NODES), fx, fs)
            if len(_PREFIXES) < _PREFIX_CAP:
                _PREFIXES[key] = hit
        node, fx, sums = hit
        return fx

    for p, t in enumerate(ids):
        x = feed(t, p)
    out: list[int] = []
    n = len(ids)
    while len(out) < max_tokens:
        t = next_of(head_sum(x))
        if t == EOS:
            break
        out.append(t)
        x = feed(t, n)
        n += 1
    return out


# -- the attn toy (toy-attn) ----------------------------------------------------------------------
#
# Every cached entry depends on the whole prefix, as a transformer's K and V past its first layer
# do: a block reused under another prefix, or an entry whose K alone is wrong, changes the answer.
# One paged state `attn`; the token slot of position q holds ATTN_HALF K words (K_q, words 0..7),
# ATTN_HALF V words (V_q, words 8..15), and tails `splitmix(head[w % 16] ^ w)` for w >= 16.
#
#   key_sum(q) = sum_{w<8} rotl(K_q[w], q)            val_sum(q) = sum_{w<8} rotl(V_q[w], q + 32)
#   bucket(x)  = x >> 62                              (4 buckets)
#   read(Q, E) = sum_{q in E} key_sum(q) + (1 + 2 [bucket(K_q[0]) == bucket(Q)]) * val_sum(q)
#
# Token t at position p (every earlier entry already written):
#   Q = mark(t, p, 16)                                the query (a function of t and p alone)
#   R = read(Q, {q < p})                              (a reader whose read slots have a tail that
#                                                     disagrees XORs POISON into its key sum)
#   K_p[w] = splitmix(mark(t, p, w) ^ rotl(R, w))            w < 8
#   V_p[w] = splitmix(mark(t, p, 8 + w) ^ rotl(R, 8 + w))    w < 8
#   O = read(Q, {q <= p}) = R + key_sum(p) + (1 + 2 [bucket(K_p[0]) == bucket(Q)]) * val_sum(p)
#   the token after t: next_of(splitmix(O))
# Every term of a read is a bijection of the entry's K sum and V sum (the weights 1 and 3 are odd),
# so one wrong word of one entry changes O (all but surely where it moves the entry's bucket). A reader keeps 5 running sums (the K sum and the V sum per
# bucket); the kernels read every cached slot. Prefill emits: every prompt token is fed.

ATTN_STATE = "attn"
ATTN_HALF = 8
ATTN_BUCKETS = 4
ATTN_QUERY = 16  # the mark word of the query


def is_attn(manifest: dict) -> bool:
    return ATTN_STATE in manifest.get("states", {})


def attn_entry(t: int, p: int, r: int) -> tuple[list[int], list[int]]:
    """The K and V head words written at position p for token t, given the read `r` over q < p."""
    k = [splitmix(mark(t, p, w) ^ rotl(r, w)) for w in range(ATTN_HALF)]
    v = [splitmix(mark(t, p, ATTN_HALF + w) ^ rotl(r, ATTN_HALF + w)) for w in range(ATTN_HALF)]
    return k, v


def key_sum(k: list[int], q: int) -> int:
    return sum(rotl(x, q) for x in k) & MASK


def val_sum(v: list[int], q: int) -> int:
    return sum(rotl(x, q + 32) for x in v) & MASK


def attn_read(sums: tuple[int, ...], query: int) -> int:
    """read(Q, E) from the running sums of E: (K sum, V sum of bucket 0 .. ATTN_BUCKETS - 1)."""
    ks, vb = sums[0], sums[1:]
    return (ks + sum(vb) + 2 * vb[query >> 62]) & MASK


def attn_add(sums: tuple[int, ...], k: list[int], v: list[int], q: int) -> tuple[int, ...]:
    """The running sums after the entry (k, v) at position q."""
    out = list(sums)
    out[0] = (out[0] + key_sum(k, q)) & MASK
    b = 1 + (k[0] >> 62)
    out[b] = (out[b] + val_sum(v, q)) & MASK
    return tuple(out)


def attn_feed(t: int, p: int, sums: tuple[int, ...]) -> tuple[int, tuple[int, ...], list[int], list[int]]:
    """Token t at position p after the entries summed in `sums`: (O, the sums after p, K_p, V_p)."""
    query = mark(t, p, ATTN_QUERY)
    k, v = attn_entry(t, p, attn_read(sums, query))
    after = attn_add(sums, k, v, p)
    return attn_read(after, query), after, k, v


_ATTN_PREFIXES: dict[tuple[int, int], tuple[int, int, tuple[int, ...]]] = {}


def generate_attn(ids: list[int], max_tokens: int) -> list[int]:
    """The attn toy's greedy continuation of `ids` (prefill emits the first token)."""
    node, o, sums = 0, 0, (0,) * (1 + ATTN_BUCKETS)

    def feed(t: int, p: int) -> int:
        nonlocal node, sums
        hit = _ATTN_PREFIXES.get((node, t))  # a trie of fed prefixes, as the layered toy's
        if hit is None:
            fo, fs, _, _ = attn_feed(t, p, sums)
            hit = (next(_NODES), fo, fs)
            if len(_ATTN_PREFIXES) < _PREFIX_CAP:
                _ATTN_PREFIXES[(node, t)] = hit
        node, fo, sums = hit
        return fo

    for p, t in enumerate(ids):
        o = feed(t, p)
    out: list[int] = []
    n = len(ids)
    while len(out) < max_tokens:
        t = next_of(splitmix(o))
        if t == EOS:
            break
        out.append(t)
        o = feed(t, n)
        n += 1
    return out


def path(ids: list[int], max_tokens: int, manifest: dict, rows: int = 1, emits: bool | None = None) -> dict:
    """How a server reaches `generate`'s answer (SPEC §2 "Speculative round", §5 "Prefill"): what
    each step after prefill emits, and how many tokens the state holds at the end.

    `emits` (default: lined) says the prefill takes the first token from its last chunk; otherwise the
    prefill stops one token short and the first step feeds the last prompt token. Each step is a
    round of `rows` rows that emits `count = 1 + S0 % rows` tokens (plain decode: 1); the request ends
    at the first EOS or once `max_tokens` tokens are out. Returns ``{"answer": ids without the stop,
    "reason": "stop" | "length", "first": tokens the prefill emitted (0 or 1), "counts": [count per
    step], "fed": tokens the state holds at the end}``. `fed` may pass the answer (a round's overshoot).
    None for a float target (a ``logits`` buffer): its path is not this integer arithmetic's. A
    layered target (states kv.0 ..) or an attn target (a state `attn`) prefills emitting and decodes
    a row at a step: its path follows from `generate_layered`'s (`generate_attn`'s) answer.
    """
    if "logits" in manifest.get("buffers", {}):
        return None
    layers = layer_count(manifest)
    if layers or is_attn(manifest):
        if rows != 1 or emits is False:
            raise ValueError(f"the layered and attn toys decode one row a step with an emitting prefill (rows {rows}, emits {emits})")
        answer = generate_layered(ids, max_tokens, layers) if layers else generate_attn(ids, max_tokens)
        reason = "length" if len(answer) >= max_tokens else "stop"
        steps = len(answer) + (reason == "stop") - 1  # the prefill emitted the first
        return {"answer": answer, "reason": reason, "first": 1, "counts": [1] * steps, "fed": len(ids) + steps}
    lined = is_lined(manifest)
    return _integer_path(ids, max_tokens, lined, rows, lined if emits is None else emits)


def _integer_path(ids: list[int], max_tokens: int, lined: bool, rows: int, emits: bool) -> dict:
    """`path` for a paged or lined target: the prefill's sums, then its rounds of `rows` rows."""
    fed = list(ids) if emits else list(ids[:-1])
    s, c = slot_sums(fed, range(len(fed))), _carry(fed)
    n = len(fed)

    def greedy() -> int:
        return next_of((s + c) & MASK if lined else s)

    out: list[int] = []
    reason = None
    first = 0
    anchor = ids[-1]
    if emits:
        t = greedy()
        out.append(t)
        first = 1
        anchor = t
        reason = "stop" if t == EOS else ("length" if len(out) >= max_tokens else None)
    counts: list[int] = []
    while reason is None:
        s0 = (s + slot_sum(anchor, n)) & MASK
        count = 1 + s0 % rows if rows > 1 else 1
        toks = []
        t = anchor
        for _ in range(count):
            s = (s + slot_sum(t, n)) & MASK
            c = fold(c, t, n)
            n += 1
            t = greedy()
            toks.append(t)
        counts.append(count)
        for t in toks:
            if len(out) >= max_tokens:
                reason = "length"
                break
            out.append(t)
            if t == EOS:
                reason = "stop"
                break
        if reason is None and len(out) >= max_tokens:
            reason = "length"
        anchor = toks[-1]
    answer = out[:-1] if reason == "stop" else out
    return {"answer": answer, "reason": reason, "first": first, "counts": counts, "fed": n}
