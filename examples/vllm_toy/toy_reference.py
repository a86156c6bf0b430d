"""Reference for the vLLM toy model (examples/vllm_toy/kern_vllm_toy/model.py): exact integer
arithmetic in numpy (int64, no overflow: every bound is in the model's docstring).

generate(ids, max_tokens, manifest) -> greedy continuation of the prompt `ids`, at most
`max_tokens` ids, stopping BEFORE EOS (EOS is not included).
eos_masked(ids, manifest) -> the token it emits after `ids` with EOS masked (vLLM's min_tokens).

Two layers, as the model computes them through vLLM's paged KV cache:
  layer 1: S_p = sum_{i<=p} h(t_i, i)                      (128 ints, the whole prefix's sum)
  layer 2, per KV head g: from S_i, i: K bits k_i (64), V v_i (64 ints < 16, v_i[0] = [i == 0]),
           and the query's two dims d1, d2; position p reads every i <= p whose k_i is 0 at d1 and d2
           (position 0's k is all 0: it is always read), n_g of them: T_g = sum of their v (T_g[0] = 1)
  next = f(S_p, T_0, T_1, n_0, n_1, p)     (a manifest with "paged": true: next = f(S_p, p), layer 1 alone)
"""

import numpy as np

ACCEPT_PCT = None
EOS = 256

P = 2**31 - 1
NV = 128  # 2 KV heads x 64
HEAD = 64
VOCAB = 257
EOS_EVERY = 96
K_BIT = 7  # the bit of a key's hash that is its K bit


def _constants():
    """The model's constants, from one 64-bit LCG ("KERN"): layer 1's A, B, C; the readout D, E; then
    layer 2's V and K matrices (Wv, Wk: 128 x 128) and offsets (Yv, Yk), the query's (Wq: 4 x 128, Yq),
    the readout of T (D2) and of the counts (E2: 2)."""
    x = 0x4B45524E  # "KERN"

    def take(n):
        nonlocal x
        out = []
        for _ in range(n):
            x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
            out.append((x >> 33) % P)
        return out

    A, B, C, D = take(NV), take(NV), take(NV), take(NV)
    E = take(1)[0]
    Wv, Yv = take(NV * NV), take(NV)
    Wk, Yk = take(NV * NV), take(NV)
    Wq, Yq = take(4 * NV), take(4)
    D2, E2 = take(NV), take(2)
    i64 = lambda v, *shape: np.array(v, dtype=np.int64).reshape(*shape) if shape else np.array(v, dtype=np.int64)
    return dict(A=i64(A), B=i64(B), C=i64(C), D=i64(D), E=E, Wv=i64(Wv, NV, NV), Yv=i64(Yv), Wk=i64(Wk, NV, NV),
                Yk=i64(Yk), Wq=i64(Wq, 4, NV), Yq=i64(Yq), D2=i64(D2), E2=i64(E2))


K = _constants()


def h(tokens, positions):
    """Layer 1's V: [n, 128] ints < 16."""
    t1 = np.asarray(tokens, dtype=np.int64)[:, None] + 1
    p1 = np.asarray(positions, dtype=np.int64)[:, None] + 1
    return ((t1 * K["A"] + p1 * K["B"] + (t1 * p1) * K["C"]) % P) % 16


def layer2(S, positions):
    """Layer 2's K bits [n, 128], V [n, 128] and query dims [n, 2 heads, 2] from the prefix sums S [n, 128]."""
    p1 = np.asarray(positions, dtype=np.int64)[:, None] + 1
    v = ((S @ K["Wv"].T + p1 * K["Yv"]) % P) % 16
    k = (((S @ K["Wk"].T + p1 * K["Yk"]) % P) >> K_BIT) & 1
    q = ((S @ K["Wq"].T + p1 * K["Yq"]) % P) % HEAD
    first = np.asarray(positions) == 0
    k[first] = 0
    v[:, 0] = first
    v[:, HEAD] = first
    return k, v, q.reshape(-1, 2, 2)


def _z(S_p, T, n, p, paged=False):
    if paged:  # the manifest's "paged": layer 1 alone (model-paged/config.json's kern_paged)
        return (int((S_p * K["D"]).sum()) + (p + 1) * K["E"]) % P
    return (int((S_p * K["D"]).sum()) + int((T * K["D2"]).sum()) + int((n * K["E2"]).sum()) + (p + 1) * K["E"]) % P


def readout(S_p, T, n, p, paged=False):
    """The next token from position p's layer-1 sum, layer-2 sums T [128] and counts n [2]."""
    z = _z(S_p, T, n, p, paged)
    return EOS if (z // VOCAB) % EOS_EVERY == 0 else z % 256


def _paged(manifest) -> bool:
    return bool((manifest or {}).get("paged"))


def eos_masked(ids, manifest=None):
    """The token the model emits after `ids` with EOS masked (vLLM's `min_tokens`): z % 256, EOS's
    runner-up in the model's logits (the same token as `generate` gives where the next is not EOS)."""
    ids = [int(t) for t in ids]
    pos = np.arange(len(ids))
    S = np.cumsum(h(ids, pos), axis=0)
    k, v, q = layer2(S, pos)
    T, n = _read(k, v, q[-1])
    return _z(S[-1], T, n, len(ids) - 1, _paged(manifest)) % 256


def _read(k, v, q_p):
    """Position p's layer 2 over k, v [p+1, 128]: (T [128], n [2])."""
    T = np.zeros(NV, dtype=np.int64)
    n = np.zeros(2, dtype=np.int64)
    for g in range(2):
        kg = k[:, g * HEAD:(g + 1) * HEAD]
        sel = (kg[:, q_p[g, 0]] == 0) & (kg[:, q_p[g, 1]] == 0)
        n[g] = int(sel.sum())
        T[g * HEAD:(g + 1) * HEAD] = v[sel, g * HEAD:(g + 1) * HEAD].sum(axis=0)
    return T, n


def generate(ids, max_tokens, manifest=None):
    ids = [int(t) for t in ids]
    if not ids or max_tokens <= 0:
        return []
    pos = np.arange(len(ids))
    S = np.cumsum(h(ids, pos), axis=0)
    k, v, q = layer2(S, pos)
    p = len(ids) - 1
    out = []
    while len(out) < max_tokens:
        T, n = _read(k, v, q[-1])
        nxt = readout(S[-1], T, n, p, _paged(manifest))
        if nxt == EOS:
            break
        out.append(nxt)
        p += 1
        s = S[-1] + h([nxt], [p])[0]
        k1, v1, q1 = layer2(s[None, :], [p])
        S, k, v, q = np.vstack([S, s]), np.vstack([k, k1]), np.vstack([v, v1]), np.vstack([q, q1])
    return out
