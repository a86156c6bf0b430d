"""Pure-Python reference for the vLLM toy model (examples/vllm_toy/kern_vllm_toy/model.py).

generate(ids, max_tokens, manifest) -> greedy continuation of the prompt `ids`, at most
`max_tokens` ids, stopping BEFORE EOS (EOS is not included). No torch, no numpy.
"""

ACCEPT_PCT = None
EOS = 256

P = 2**31 - 1
NV = 128
VOCAB = 257
EOS_EVERY = 96


def _constants():
    x = 0x4B45524E  # "KERN"
    out = []
    for _ in range(3 * NV + NV + 1):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append((x >> 33) % P)
    A, B, C = out[0:NV], out[NV:2 * NV], out[2 * NV:3 * NV]
    D, E = out[3 * NV:4 * NV], out[4 * NV]
    return A, B, C, D, E


_A, _B, _C, _D, _E = _constants()
_ABC = list(zip(_A, _B, _C))


def _h(t, p):
    t1, p1 = t + 1, p + 1
    tp = t1 * p1
    return [((t1 * a + p1 * b + tp * c) % P) % 16 for a, b, c in _ABC]


def _next(S, p):
    z = (sum(s * d for s, d in zip(S, _D)) + (p + 1) * _E) % P
    return EOS if (z // VOCAB) % EOS_EVERY == 0 else z % 256


def generate(ids, max_tokens, manifest=None):
    ids = [int(t) for t in ids]
    if not ids or max_tokens <= 0:
        return []
    S = [0] * NV
    for p, t in enumerate(ids):
        S = [s + v for s, v in zip(S, _h(t, p))]
    p = len(ids) - 1
    out = []
    while len(out) < max_tokens:
        nxt = _next(S, p)
        if nxt == EOS:
            break
        out.append(nxt)
        p += 1
        S = [s + v for s, v in zip(S, _h(nxt, p))]
    return out
